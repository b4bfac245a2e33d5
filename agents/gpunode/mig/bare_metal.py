"""Bare-metal mode of the MIG manager (``--selected-config-file``): the config name comes from a file
(a bare name, or the ``MIG_PARTED_SELECTED_CONFIG=name`` line NVIDIA's systemd override holds), watched
with inotify; the outcome goes to a JSON state file. No Kubernetes, no operands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpunode.common.atomic import atomic_write_json
from gpunode.common.logging import Logger
from gpunode.mig.decisions import State

if TYPE_CHECKING:
    from gpunode.mig.manager import MigManager

__all__ = [
    "REBOOT_MARKER",
    "SELECTED_VAR",
    "FileSource",
    "NoOperands",
    "StateFile",
    "parse_selected_config",
]

SELECTED_VAR = "MIG_PARTED_SELECTED_CONFIG"
REBOOT_MARKER = "reboot-pending.json"  # beside the journal: survives the reboot (the state file does not)


_SELECTED_RE = re.compile(rf"{SELECTED_VAR}=[\"']?([^\"'\s]*)")


def parse_selected_config(text: str) -> str | None:
    """The config name a selected-config file holds: the value of the last
    ``MIG_PARTED_SELECTED_CONFIG=name`` (as NVIDIA's systemd override writes it,
    ``Environment="MIG_PARTED_SELECTED_CONFIG=name"``), or else the first line that is a bare name.
    Blank lines, ``#`` / ``;`` comments and ``[Section]`` headers are ignored; None when empty."""
    assigned: str | None = None
    bare: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or (line.startswith("[") and line.endswith("]")):
            continue
        found = _SELECTED_RE.findall(line)
        if found:
            assigned = found[-1]
            continue
        if "=" not in line and bare is None:
            bare = line.strip("\"'").strip()
    value = assigned if assigned is not None else bare
    return value or None


class StateFile:
    """Bare metal: ``{state, reason, config, time}`` written atomically as JSON. The file usually lives
    in /run, which a reboot empties, so ``rebooting`` is also recorded in ``marker`` (persistent) to
    stop a reboot loop."""

    def __init__(self, path: Path, marker: Path | None = None) -> None:
        self.path = path
        self.marker = marker

    def read(self) -> dict[str, Any]:  # Any: JSON
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    async def previous(self) -> str | None:
        if self.marker is not None and self.marker.exists():
            return "rebooting"
        state = self.read().get("state")
        return state if isinstance(state, str) else None

    async def set(self, state: State, reason: str, config: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc = {"state": state, "reason": reason, "config": config, "time": now}
        await asyncio.to_thread(self._write, doc)

    def _write(self, doc: dict[str, str]) -> None:
        if self.marker is not None:
            if doc["state"] == "rebooting":
                self.marker.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(self.marker, doc, 0o600)
            elif doc["state"] != "pending":
                with contextlib.suppress(FileNotFoundError):
                    self.marker.unlink()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, doc)


class NoOperands:
    """Bare metal: nothing to pause."""

    @contextlib.asynccontextmanager
    async def paused(self, timeout: float) -> AsyncIterator[None]:
        yield None


class FileSource:
    """The name in ``--selected-config-file``, followed through its directory with inotify."""

    def __init__(self, path: Path, log: Logger) -> None:
        self.path = path
        self.log = log

    def read(self) -> str:
        try:
            return parse_selected_config(self.path.read_text()) or ""
        except FileNotFoundError:
            return ""
        except (OSError, UnicodeDecodeError) as exc:
            self.log.error("mig_selected_config_unreadable", file=str(self.path), error=str(exc))
            return ""

    async def start(self, manager: MigManager) -> None:
        manager.selected = self.read()

    async def follow(self, manager: MigManager) -> None:
        from gpunode.common.fswatch import watch_directory

        async for event in watch_directory(self.path.parent, writes=True):
            name = self.read()
            if event.name == self.path.name or name != manager.selected:
                if name != manager.selected:
                    self.log.info("mig_selected_config_changed", config=name or None, file=str(self.path))
                manager.selected = name
                manager.trigger("file")

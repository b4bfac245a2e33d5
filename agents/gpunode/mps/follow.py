"""The MPS agent's config taken from the node's device plugin (``--follow-device-plugin``).

The device plugin writes the config it serves, each time one comes into force, to
``<mps root>/.device-plugin-config.yaml`` (:meth:`gpunode.device_plugin.mps.MpsWatch.publish_config`):
the file its node label chose in its ConfigMap, its single config file, or ``version: v1`` for the
built-in defaults. Following that file, the MPS daemons always match what the plugin advertises, the node
has one choice of config (no second label watch that could see a change at another moment), and this
agent needs neither the Kubernetes API nor RBAC on nodes, nor the client's memory (docs/mps.md).

The interface is :class:`gpunode.mps.labelled.LabelledConfig`'s: ``bind()`` to the agent, ``path`` for the
planning child, ``first()`` before the first plan (here: wait until the plugin has published),
``follow(replan)`` after.
A published file the planning step refuses leaves the daemons as they are (``config_rejected``); a
config the plugin refuses is never published (it never comes into force there).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.fswatch import watch_directory

if TYPE_CHECKING:
    from gpunode.common.logging import Logger

__all__ = ["FollowedConfig"]

SETTLE = 0.05  # let a burst of events (the rename after the write) end before reading
RECHECK_S = 10.0  # and look at the file this often anyway (a few bytes hashed: no cost worth naming)


class FollowedConfig:
    """The device plugin's published config (``path``, once it exists)."""

    def __init__(
        self,
        file: Path,
        *,
        log: Logger,
        waiting: Callable[[str], object] = lambda reason: None,
    ) -> None:
        self.file = file
        self.path: str | None = None  # set by first(): the planning child reads the file there
        self.log = log
        self.waiting = waiting  # the agent's not-ready reason while nothing is published
        self.digest: str | None = None

    def bind(self, count_error: Callable[[str], object], unready: Callable[[str], object]) -> None:
        """The agent's hooks: ``unready`` says what it waits for (/readyz); no API, no selection, so
        nothing of its own to count (the plan's errors are the agent's)."""
        self.waiting = unready

    def _read_digest(self) -> str | None:
        try:
            with self.file.open("rb") as f:  # streamed: a huge file costs no memory (the plan refuses it)
                return hashlib.file_digest(f, "sha256").hexdigest()
        except OSError:
            return None

    async def _watch(self, changed: asyncio.Event) -> None:
        async for event in watch_directory(self.file.parent, writes=True):
            if event.name == self.file.name:
                changed.set()

    @staticmethod
    async def _wait(changed: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), RECHECK_S)
        changed.clear()
        await asyncio.sleep(SETTLE)

    async def first(self) -> None:
        """Wait until the device plugin has published its config (inotify on the root)."""
        self.file.parent.mkdir(parents=True, exist_ok=True)
        changed = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            watcher = tg.create_task(self._watch(changed), name="published-config")
            await asyncio.sleep(0)  # the watch is in place: a file published from now on is seen
            self.digest = self._read_digest()
            if self.digest is None:
                reason = f"waiting for the device plugin to publish its config at {self.file}"
                self.log.info("mps_waiting_for_device_plugin", file=str(self.file))
                self.waiting(reason)
            while self.digest is None:
                await self._wait(changed)
                self.digest = self._read_digest()
            watcher.cancel()
        self.path = str(self.file)
        self.log.info("config_selected", source="device-plugin", file=self.path)

    async def follow(self, replan: Callable[[], Awaitable[str | None]]) -> None:
        """Forever: a changed published file plans again; ``replan()`` returns None when the agent took
        it, else why it was refused (logged; the daemons stay as they are)."""
        changed = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(changed), name="published-config")
            await asyncio.sleep(0)
            changed.set()  # once at once: a file published before the watch was in place
            while True:
                await self._wait(changed)
                digest = self._read_digest()
                if digest is None or digest == self.digest:
                    continue  # removed (the plugin never removes it: keep what runs), or unchanged
                self.digest = digest
                refused = await replan()
                if refused is not None:
                    self.log.error(
                        "config_rejected", error=refused, file=self.path, keeping="the current daemons"
                    )
                else:
                    self.log.info("config_reloaded", source="device-plugin", file=self.path)

"""The files other components read: readiness markers, the config digest, the status report, the lock.

The readiness files' names and text are the shared format of :mod:`gpunode.api.readiness`.

All under the host root, written atomically (temporary file in the same directory, then rename):

========================================== =============================================================
``/run/nvidia/validations/.driver-ctr-ready`` ``GDRCOPY_ENABLED: false`` / ``GDS_ENABLED: false`` /
                                           ``GPU_DIRECT_RDMA_ENABLED: <bool>`` (the startup probe's file)
``/run/nvidia/validations/driver-ready``   the validator's env file: ``IS_HOST_DRIVER``,
                                           ``NVIDIA_DRIVER_ROOT``, ``DRIVER_ROOT_CTR_PATH``,
                                           ``NVIDIA_DEV_ROOT``, ``DEV_ROOT_CTR_PATH``
``/run/nvidia/validations/.driver-daemons-status`` ``NotReady`` during init, ``Ready`` once the daemons run
``/run/nvidia/nvidia-driver.state``        the configuration digest of the loaded modules (fast path)
``/run/nvidia/nvidia-driver.pid``          single-instance lock (``flock``), holding the owner's pid
``/run/nvidia/gpunode-driver/status.json`` every step's state, rewritten at each change
========================================== =============================================================
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from gpunode.api.readiness import CTR_READY, DAEMONS_STATUS, DRIVER_READY, ctr_ready_text, driver_ready_text
from gpunode.common.atomic import atomic_write
from gpunode.common.bounds import read_head
from gpunode.common.hostpaths import HostPaths

__all__ = [
    "Files",
    "InstanceLock",
    "LoaderBusy",
    "LockFileRefused",
    "StatusBook",
    "Step",
    "iso",
    "read_status",
    "render_status",
]

StepState = Literal["pending", "running", "done", "failed", "skipped"]


class Files:
    """The loader's files under one host root and validations directory."""

    def __init__(self, paths: HostPaths, validations_dir: str = "/run/nvidia/validations") -> None:
        self.paths = paths
        self.validations = paths.host(validations_dir)
        self.state = paths.run_nvidia / "nvidia-driver.state"
        self.pid = paths.run_nvidia / "nvidia-driver.pid"
        self.status = paths.run_nvidia / "gpunode-driver" / "status.json"
        self.modprobe_conf = paths.etc / "modprobe.d" / "nvidia-gpunode.conf"
        self.nouveau_blacklist = paths.etc / "modprobe.d" / "blacklist-nouveau.conf"
        self.persistenced_pid = paths.host("/var/run/nvidia-persistenced/nvidia-persistenced.pid")

    def write(self, path: Path, text: str) -> bool:
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(path, text, 0o644, only_if_changed=True)

    def write_readiness(self, *, rdma: bool, host_driver: bool, driver_root: str) -> None:
        self.write(self.validations / CTR_READY, ctr_ready_text(rdma))
        self.write(
            self.validations / DRIVER_READY,
            driver_ready_text(host_driver=host_driver, driver_root=driver_root),
        )

    def daemons_status(self, ready: bool) -> None:
        self.write(self.validations / DAEMONS_STATUS, "Ready\n" if ready else "NotReady\n")

    def remove_readiness(self, *, daemons_status: bool = True) -> list[Path]:
        names = [CTR_READY, DRIVER_READY] + ([DAEMONS_STATUS] if daemons_status else [])
        removed = []
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (self.validations / name).unlink()
                removed.append(self.validations / name)
        return removed

    def ready(self) -> bool:
        return (self.validations / CTR_READY).exists() and (self.validations / DRIVER_READY).exists()

    def recorded_digest(self) -> str | None:
        try:
            return read_head(self.state, 4096).decode(errors="replace").strip() or None
        except OSError:
            return None

    def record_digest(self, digest: str) -> None:
        self.write(self.state, digest)  # no newline: NVIDIA's manager compares the file's whole content

    def forget_digest(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.state.unlink()

    def persistenced_pid_value(self) -> int | None:
        try:
            return int(read_head(self.persistenced_pid, 64).split()[0])
        except (OSError, ValueError, IndexError):
            return None


# ------------------------------------------------------------------------------------- lock


class LoaderBusy(Exception):
    """Another loader (or NVIDIA's driver container) holds the single-instance lock."""


class LockFileRefused(Exception):
    """The lock file is a symlink, a hard link or not a regular file: nothing was written through it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            f"{path} {why}; refusing to open it as root (remove it: the loader creates a plain file)"
        )
        self.path = path


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


class InstanceLock:
    """``flock`` on ``/run/nvidia/nvidia-driver.pid`` (NVIDIA's driver container uses the same file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> None:
        """Take the lock; :class:`LoaderBusy` when another loader holds it, ``OSError`` when the file
        cannot be opened. The file is opened without following a symlink (``O_NOFOLLOW``) and must be a
        regular file with one link: a planted link or hard link is refused (``LockFileRefused``) and what
        it points at is left untouched, since the lock file is truncated and written as root."""
        if self.fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                raise LockFileRefused(self.path, f"is a symlink (to {_link_target(self.path)})") from None
            raise
        st = os.fstat(fd)
        why = (
            "is not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else f"has {st.st_nlink} hard links"
            if st.st_nlink != 1
            else ""
        )
        if why:
            os.close(fd)
            raise LockFileRefused(self.path, why)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LoaderBusy(
                f"another driver loader (pid {owner}) holds {self.path}; stop it first "
                f"(NVIDIA's driver container uses the same lock)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)  # closing drops the flock; the file stays (unlinking would race a new owner)
        self.fd = None


# ----------------------------------------------------------------------------------- status


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Step:
    name: str
    state: StepState = "pending"
    detail: str = ""
    started_at: str | None = None
    finished_at: str | None = None


@dataclass
class StatusBook:
    """Every step's state, written to ``status.json`` atomically after each change."""

    path: Path
    command: str
    steps: list[Step]
    clock: Callable[[], float] = field(default=time.time, repr=False)
    phase: str = "running"
    info: dict[str, Any] = field(default_factory=dict)
    health: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    on_change: Callable[[StatusBook], None] | None = field(default=None, repr=False)

    @classmethod
    def create(
        cls, path: Path, command: str, names: Sequence[str], clock: Callable[[], float] = time.time
    ) -> StatusBook:
        return cls(path, command, [Step(n) for n in names], clock, started_at=iso(clock()))

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def index(self, name: str) -> int:
        return next(i for i, s in enumerate(self.steps) if s.name == name)

    def set(self, name: str, state: StepState, detail: str | None = None) -> Step:
        step = self.step(name)
        now = iso(self.clock())
        if state == "running":
            step.started_at, step.finished_at = now, None
        elif state in ("done", "failed", "skipped"):
            step.started_at = step.started_at or now
            step.finished_at = now
        step.state = state
        if detail is not None:
            step.detail = detail
        self.save()
        return step

    def finish(self, phase: str) -> None:
        self.phase = phase
        self.save()

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "pid": os.getpid(),
            "phase": self.phase,
            "startedAt": self.started_at,
            "updatedAt": iso(self.clock()),
            **self.info,
            "health": self.health or None,
            "steps": [
                {
                    "name": s.name,
                    "state": s.state,
                    "detail": s.detail,
                    "startedAt": s.started_at,
                    "finishedAt": s.finished_at,
                }
                for s in self.steps
            ],
        }

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(self.path, json.dumps(self.to_json(), separators=(",", ":")) + "\n")
        if self.on_change is not None:
            self.on_change(self)


def replace_file(path: Path, text: str) -> None:
    """Atomic replacement by rename, without fsync: for the status report, rewritten at every step.

    It lives on /run (tmpfs) where fsync buys nothing, while on a disk-backed root two fsyncs per step
    change would be most of a fast-path init. The files other components act on (readiness, digest,
    modprobe.d) go through :func:`~gpunode.common.atomic.atomic_write`, fsync included.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            os.fchmod(out.fileno(), 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_status(path: Path) -> dict[str, Any]:
    """The status document; ``OSError``/``ValueError`` when missing or unreadable."""
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise ValueError(f"{path} is not a driver loader status file")
    return doc


def render_status(doc: dict[str, Any], *, alive: bool | None = None) -> str:
    """The human report of a status document."""
    phase = str(doc.get("phase", "?"))
    if alive is False and phase in ("running", "serving"):
        phase += f" (process {doc.get('pid')} is gone: it was stopped or crashed)"
    lines = [f"gpunode-driver-loader {doc.get('command', '?')} (pid {doc.get('pid', '?')}): {phase}"]
    facts = [f"{key}={doc[key]}" for key in ("kernel", "driverVersion", "moduleSource") if doc.get(key)]
    if doc.get("digest"):
        facts.append(f"digest={str(doc['digest'])[:12]}")
    if facts:
        lines.append("  " + "  ".join(facts))
    steps = doc.get("steps", [])
    width = max((len(str(s.get("name", ""))) for s in steps), default=4)
    for number, step in enumerate(steps, 1):
        when = step.get("finishedAt") or step.get("startedAt") or ""
        lines.append(
            f"  {number:>2}/{len(steps)} {step.get('name', ''):<{width}}  {step.get('state', ''):<8} "
            f"{when:<24}  {step.get('detail', '')}".rstrip()
        )
    health = doc.get("health")
    if isinstance(health, dict) and health:
        lines.append(
            f"  health: {health.get('state', '?')} (checked {health.get('checkedAt', '?')})"
            + (f": {health['detail']}" if health.get("detail") else "")
        )
    return "\n".join(lines)

"""One simulated node in this process, optionally shared with other processes through a state file.

Sharing: every NVML call first checks (one `stat`) whether the file changed and reloads it if so; every
change takes an exclusive `flock` on `<file>.lock`, re-reads, applies, and replaces the file atomically.
So a change one process makes is visible to the others on their next call, and writers never corrupt it.
A host tree linked to the state file (``gpunode sim init --host-root``) follows every change's MIG layout
(:func:`gpunode.sim.hosttree.follow`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gpunode.common.atomic import atomic_write
from gpunode.sim import hosttree
from gpunode.sim.nvml.state import SimNodeState, StateError


def read_state_file(path: Path) -> SimNodeState:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StateError(
            f"{path}: simulator state file does not exist (create it with `gpunode sim init`)"
        ) from None
    except OSError as exc:
        raise StateError(f"{path}: cannot read simulator state: {exc.strerror}") from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"{path}: simulator state is not valid JSON ({exc})") from None
    return SimNodeState.from_json(data, str(path))


def write_state_file(path: Path, state: SimNodeState) -> None:
    atomic_write(path, json.dumps(state.to_json(), separators=(",", ":")).encode(), mode=0o644)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class SimNode:
    """The simulated node as this process sees it."""

    def __init__(
        self, state: SimNodeState, path: Path | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.state = state
        self.path = path
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._path_text = str(path) if path else ""
        self._stamp: tuple[int, int, int] | None = self._stat() if path else None

    @classmethod
    def open(cls, path: Path, clock: Callable[[], float] = time.time) -> SimNode:
        return cls(read_state_file(path), path, clock)

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self._path_text)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def refresh(self) -> SimNodeState:
        """The current state, reloaded first if another process changed the file."""
        if self.path is None:
            return self.state
        stamp = self._stat()
        if stamp != self._stamp and stamp is not None:
            with self.lock:
                self.state = read_state_file(self.path)
                self._stamp = stamp
        return self.state

    @contextlib.contextmanager
    def mutate(self) -> Iterator[SimNodeState]:
        """Change the state as a transaction: an exception inside leaves it (and the file) untouched."""
        with self.lock:
            if self.path is None:
                fresh = SimNodeState.from_json(self.state.to_json(), "<memory>")
                yield fresh
                fresh.generation += 1
                self.state = fresh
            else:
                with file_lock(self.path):
                    fresh = read_state_file(self.path)
                    yield fresh
                    fresh.generation += 1
                    write_state_file(self.path, fresh)
                    self.state = fresh
                    self._stamp = self._stat()
                    hosttree.follow(self.path, fresh)  # a linked host tree's MIG capabilities follow
            self.changed.notify_all()


def init_state_file(path: Path, preset: str, seed: int = 0, force: bool = False) -> SimNodeState:
    """Create a state file for a fresh node; refuses to overwrite unless `force`."""
    import secrets

    state = SimNodeState.new(preset, seed=seed, node_id=secrets.token_hex(16))
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        if path.exists() and not force:
            raise StateError(f"{path}: already exists; pass --force to replace it")
        write_state_file(path, state)
    return state

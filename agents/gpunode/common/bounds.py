"""Bounds on what comes from outside: echoed text cut with a count of what was left out, lists cut
after N items ("and M more"), and a subprocess's output kept as a bounded tail while it streams.

Everything an agent echoes (a device ID in a gRPC status, a value in a log line, a command's stderr in
an error) passes through here, so a hostile input of megabytes costs at most a few kilobytes of memory
and output. :class:`Tail` keeps the last ``limit`` bytes of a stream without ever holding the rest;
:func:`communicate` reads a subprocess's stdout and stderr into two of them (the asyncio twin of
``proc.communicate()``) and :func:`run_tail` does the same for a blocking ``subprocess`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

__all__ = [
    "MAX_ECHO_CHARS",
    "MAX_LISTED",
    "TAIL_BYTES",
    "Completed",
    "Tail",
    "clip",
    "clip_list",
    "clip_tail",
    "communicate",
    "read_head",
    "run_tail",
]

MAX_ECHO_CHARS = 256  # one echoed value (an ID, a label value, a name): the rest is counted
MAX_LISTED = 10  # values listed in one message; the rest are counted ("and 3 more")
TAIL_BYTES = 64 * 1024  # what is kept of a subprocess's stdout and of its stderr
_CHUNK = 64 * 1024
_JOIN_S = 5.0


def clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit`` and a count of the
    rest: ``"abc... (4093 more characters)"``."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def clip_tail(text: str, limit: int = 2000) -> str:
    """The last ``limit`` characters of ``text`` after a count of the rest (for a command's output, whose
    end says why it failed): ``"(123 earlier characters) ...the end"``."""
    if len(text) <= limit:
        return text
    return f"({len(text) - limit} earlier characters) ...{text[-limit:]}"


def clip_list(
    items: Iterable[str], limit: int = MAX_LISTED, *, each: int = MAX_ECHO_CHARS, sep: str = ", "
) -> str:
    """At most ``limit`` items, each :func:`clip`-ped to ``each`` characters, joined by ``sep``, then
    ``" and M more"`` for the rest. Consumes ``items`` once without keeping more than ``limit``."""
    shown: list[str] = []
    more = 0
    for item in items:
        if len(shown) < limit:
            shown.append(clip(item, each))
        else:
            more += 1
    return sep.join(shown) + (f" and {more} more" if more else "")


def read_head(path: str | os.PathLike[str], limit: int = 4096, *, follow: bool = True) -> bytes:
    """At most the first ``limit`` bytes of a small file (a pid file, a digest): a planted link to
    ``/dev/zero`` or a FIFO costs one bounded read, never a hang or unbounded memory (``O_NONBLOCK``).
    ``follow=False`` refuses a symlink (``OSError`` ELOOP). ``OSError`` as ``open``/``read`` raise it."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0 and (data := os.read(fd, min(left, _CHUNK))):
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


class Tail:
    """The last ``limit`` bytes fed to it, and how many bytes it was fed in all (``total``)."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        if limit <= 0:
            raise ValueError("a tail keeps at least one byte")
        self.limit = limit
        self.total = 0
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if len(data) >= self.limit:
            self._buf[:] = data[-self.limit :]
            return
        self._buf += data
        if len(self._buf) > 2 * self.limit:  # trimmed now and then: amortised O(1) per byte
            del self._buf[: -self.limit]

    @property
    def data(self) -> bytes:
        """The kept bytes (at most ``limit``)."""
        return bytes(self._buf[-self.limit :])

    @property
    def dropped(self) -> int:
        """How many bytes came before the kept ones."""
        return self.total - min(len(self._buf), self.limit)

    def text(self) -> str:
        """The kept bytes as text (invalid UTF-8 replaced), after ``[N earlier bytes left out]`` when
        something was dropped."""
        body = self.data.decode("utf-8", errors="replace")
        return f"[{self.dropped} earlier bytes left out] {body}" if self.dropped else body


async def _drain(stream: asyncio.StreamReader | None, tail: Tail) -> None:
    if stream is None:
        return
    while data := await stream.read(_CHUNK):
        tail.feed(data)


async def communicate(
    proc: asyncio.subprocess.Process,
    out: Tail | None = None,
    err: Tail | None = None,
) -> tuple[Tail, Tail]:
    """Read ``proc``'s stdout and stderr (the pipes it has) to their end into two tails, then wait for
    it: ``proc.communicate()`` in bounded memory. Pass the tails to keep what was read when the caller
    times out or is cancelled."""
    out = out if out is not None else Tail()
    err = err if err is not None else Tail()
    await asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
    await proc.wait()
    return out, err


@dataclass(frozen=True)
class Completed:
    """What :func:`run_tail` got: the exit status and the tails of stdout and stderr."""

    argv: tuple[str, ...]
    returncode: int
    stdout: Tail
    stderr: Tail


def _pump(pipe: IO[bytes] | None, tail: Tail) -> None:
    if pipe is None:
        return
    with contextlib.closing(pipe):
        while data := os.read(pipe.fileno(), _CHUNK):
            tail.feed(data)


def run_tail(
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    limit: int = TAIL_BYTES,
    env: Mapping[str, str] | None = None,
) -> Completed:
    """``subprocess.run(argv, capture_output=True, timeout=timeout)`` keeping only the last ``limit``
    bytes of each stream. Raises ``OSError`` when it cannot start and ``subprocess.TimeoutExpired``
    (after killing it) when it outlives ``timeout``."""
    out, err = Tail(limit), Tail(limit)
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
    )
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        for reader in readers:
            reader.join(_JOIN_S)
        raise
    for reader in readers:
        reader.join(_JOIN_S)  # a daemon it left behind may hold the pipes open: stop waiting then
    return Completed(tuple(argv), code, out, err)

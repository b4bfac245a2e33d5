"""Polling with a deadline, for tests and benchmarks that watch another process's effects, and the
means to wait for a count of something instead of sleeping a fixed time to show that nothing happened:
a clock a test moves forward, and the log events a process wrote."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it is true; AssertionError once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(interval)


async def until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> None:
    """:func:`wait_until` for a test on the event loop (the code under test keeps running meanwhile)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(interval)


class SkewedClock:
    """``time.monotonic`` that a test moves forward: a hold-down period passes without waiting for it."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The names of the structlog events captured in this process, in order."""
    return [r.msg["event"] for r in caplog.records if isinstance(r.msg, dict) and "event" in r.msg]


class EventLog:
    """A process's JSON log lines (its stdout), read on a thread as they come.

    Lets a test wait until a process has logged an event a number of times: for a loop that logs every
    pass, that counts passes. Use it instead of the process's ``communicate()``: it consumes the stream.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self.lines.append(line)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            lines = list(self.lines)
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                out.append(event)
        return out

    def count(self, name: str) -> int:
        return len(self.events(name))

    def wait_for(self, name: str, count: int = 1, timeout: float = 10.0) -> None:
        """Until the process has logged ``name`` at least ``count`` times in all."""
        wait_until(lambda: self.count(name) >= count, timeout=timeout, interval=0.02)

    def text(self, timeout: float = 10.0) -> str:
        """Everything read, once the process has closed its output (call after it exited)."""
        self._thread.join(timeout)
        with self._lock:
            return "".join(self.lines)

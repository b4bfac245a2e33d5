"""Polling with a deadline, for tests and benchmarks that watch another process's effects."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it is true; AssertionError once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(interval)

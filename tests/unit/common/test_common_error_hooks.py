"""Errors nobody catches are structured events: thread_error, loop_error, unraisable_error, uncaught_error
and log_error, each one JSON line with the exception rendered as a field."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from gpunode.common import logging as glog
from gpunode.common.logging import configure_logging, install_error_hooks, log_loop_exception
from gpunode.common.runtime import run


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    configure_logging("json", "info", agent="test-agent", node="node-a", stream=out)
    yield out
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.contextvars.clear_contextvars()


@pytest.fixture
def hooks() -> Iterator[None]:
    restore = install_error_hooks()
    yield
    restore()


def _events(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]  # every line is JSON


def _only(stream: io.StringIO, event: str) -> dict[str, Any]:
    found = [e for e in _events(stream) if e["event"] == event]
    assert len(found) == 1, _events(stream)
    return found[0]


def test_a_thread_that_raises_is_one_thread_error_event(stream: io.StringIO, hooks: None) -> None:
    def serve() -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    thread = threading.Thread(target=serve, name="http-9400")
    thread.start()
    thread.join()
    event = _only(stream, "thread_error")
    assert event["level"] == "error"
    assert event["thread"] == "http-9400"
    assert event["error"] == "ConnectionResetError: [Errno 104] Connection reset by peer"
    assert event["exception"].startswith("Traceback (most recent call last):")
    assert "in serve" in event["exception"]
    assert (event["agent"], event["node"], event["logger"]) == ("test-agent", "node-a", "gpunode.errors")


def test_a_thread_ending_with_system_exit_is_no_error(stream: io.StringIO, hooks: None) -> None:
    thread = threading.Thread(target=sys.exit, args=(3,))
    thread.start()
    thread.join()
    assert _events(stream) == []


def test_an_unraisable_exception_is_one_event(stream: io.StringIO, hooks: None) -> None:
    class Leaky:
        def __del__(self) -> None:
            raise OSError("close failed")

    Leaky()
    gc.collect()
    event = _only(stream, "unraisable_error")
    assert event["error"] == "OSError: close failed"
    assert "Leaky.__del__" in event["object"]
    assert event["message"].startswith("Exception ignored")
    assert "OSError: close failed" in event["exception"]


def test_an_uncaught_exception_is_one_event(stream: io.StringIO, hooks: None) -> None:
    try:
        raise KeyError("gpu")
    except KeyError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    event = _only(stream, "uncaught_error")
    assert event["error"] == "KeyError: 'gpu'"
    assert "Traceback" in event["exception"]


def test_the_loop_exception_handler_logs_a_failing_callback(stream: io.StringIO) -> None:
    def callback() -> None:
        raise RuntimeError("callback failed")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(log_loop_exception)
        asyncio.get_running_loop().call_soon(callback)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    event = _only(stream, "loop_error")
    assert event["message"].startswith("Exception in callback")
    assert event["error"] == "RuntimeError: callback failed"
    assert "callback" in event["handle"]
    assert "raise RuntimeError" in event["exception"]


def test_the_loop_exception_handler_logs_a_context_without_exception(stream: io.StringIO) -> None:
    loop = asyncio.new_event_loop()
    try:
        log_loop_exception(loop, {"message": "socket closed unexpectedly", "socket": "<socket fd=7>"})
    finally:
        loop.close()
    event = _only(stream, "loop_error")
    assert event["message"] == "socket closed unexpectedly"
    assert event["socket"] == "'<socket fd=7>'"
    assert "exception" not in event


def test_a_record_logging_cannot_format_is_a_log_error_event(stream: io.StringIO) -> None:
    # pytest's own capture handler (also on the root logger) raises on such a record: ours alone here
    ours = [h for h in logging.getLogger().handlers if isinstance(h, glog._Handler)]
    record = logging.LogRecord("grpc._server", logging.ERROR, __file__, 1, "%d handlers", ("no",), None)
    ours[-1].handle(record)
    event = _only(stream, "log_error")
    assert event["logger"] == "grpc._server"
    assert event["error"].startswith("TypeError")
    assert event["record"] == "'%d handlers'"


def test_restore_puts_the_previous_hooks_back() -> None:
    before = (threading.excepthook, sys.unraisablehook, sys.excepthook)
    restore = install_error_hooks()
    assert threading.excepthook is glog._thread_excepthook
    assert sys.unraisablehook is glog._unraisablehook
    assert sys.excepthook is glog._excepthook
    restore()
    assert (threading.excepthook, sys.unraisablehook, sys.excepthook) == before


def test_runtime_run_logs_every_uncaught_error_as_an_event_and_restores_the_hooks(
    stream: io.StringIO,
) -> None:
    before = (threading.excepthook, sys.unraisablehook, sys.excepthook)

    def thread_fails() -> None:
        raise ValueError("in a server thread")

    async def main() -> int:
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: 1 / 0)
        lost: asyncio.Future[None] = loop.create_future()
        lost.set_exception(ConnectionResetError(104, "Connection reset by peer"))
        del lost  # never retrieved: the loop's handler reports it when the future is collected
        worker = threading.Thread(target=thread_fails, name="worker")
        worker.start()
        await asyncio.to_thread(worker.join)
        gc.collect()
        await asyncio.sleep(0.01)
        return 0

    assert run(main, grace=-1) == 0
    assert (threading.excepthook, sys.unraisablehook, sys.excepthook) == before
    events = _events(stream)
    errors = sorted((e["event"], e["error"]) for e in events if e["level"] == "error")
    assert errors == [
        ("loop_error", "ConnectionResetError: [Errno 104] Connection reset by peer"),
        ("loop_error", "ZeroDivisionError: division by zero"),
        ("thread_error", "ValueError: in a server thread"),
    ]

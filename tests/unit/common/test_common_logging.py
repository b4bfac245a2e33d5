"""gpunode.common.logging: one JSON (or console) line per event, stdlib records included."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from gpunode.common.logging import configure_logging, get_logger, parse_level

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.contextvars.clear_contextvars()


def _events(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_event_has_standard_keys() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", "device-plugin", "node-1", stream=stream, version="1.2.3")
    get_logger("gpunode.test").warning("device_unhealthy", uuid="GPU-1", xid=79)
    (event,) = _events(stream)
    assert event == {
        "ts": event["ts"],
        "level": "warning",
        "event": "device_unhealthy",
        "logger": "gpunode.test",
        "agent": "device-plugin",
        "node": "node-1",
        "version": "1.2.3",
        "uuid": "GPU-1",
        "xid": 79,
    }
    assert TS.match(event["ts"])
    assert list(event)[:3] == ["ts", "level", "event"]


def test_stdlib_records_use_the_same_format() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", "exporter", None, stream=stream)
    logging.getLogger("grpc._cython").warning("channel %s closed", "c1")
    (event,) = _events(stream)
    assert event["event"] == "channel c1 closed"
    assert event["logger"] == "grpc._cython"
    assert event["level"] == "warning"
    assert event["agent"] == "exporter"
    assert event["node"] is None
    assert TS.match(event["ts"])


@pytest.mark.parametrize(
    ("level", "emitted"),
    [
        pytest.param("debug", ["debug", "info", "warning", "error"], id="debug"),
        pytest.param("INFO", ["info", "warning", "error"], id="info-uppercase"),
        pytest.param("warn", ["warning", "error"], id="warn-alias"),
        pytest.param("error", ["error"], id="error"),
    ],
)
def test_level_filters_both_structlog_and_stdlib(level: str, emitted: list[str]) -> None:
    stream = io.StringIO()
    configure_logging("json", level, "a", None, stream=stream)
    log = get_logger("gpunode.x")
    for name in ("debug", "info", "warning", "error"):
        getattr(log, name)(f"ev_{name}")
        getattr(logging.getLogger("lib"), name)(f"lib_{name}")
    events = _events(stream)
    assert [e["level"] for e in events if e["logger"] == "gpunode.x"] == emitted
    assert [e["level"] for e in events if e["logger"] == "lib"] == emitted


def test_exceptions_render_as_a_string_field() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", "a", None, stream=stream)
    try:
        raise RuntimeError("kaput")
    except RuntimeError:
        get_logger("x").error("fatal_error", exc_info=True)
        logging.getLogger("lib").exception("lib_failed")
    events = _events(stream)
    assert len(events) == 2
    for event in events:
        assert "Traceback (most recent call last)" in event["exception"]
        assert "RuntimeError: kaput" in event["exception"]


def test_calling_twice_does_not_duplicate_lines() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("json", "info", "a", None, stream=first)
    configure_logging("json", "info", "b", "n", stream=second)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_gpunode_handler", False)]
    assert len(ours) == 1
    get_logger("x").info("once")
    assert first.getvalue() == ""
    (event,) = _events(second)
    assert (event["agent"], event["node"]) == ("b", "n")


def test_logger_created_before_configuration_follows_it() -> None:
    early = get_logger("gpunode.early")  # module-level loggers are created at import time
    stream = io.StringIO()
    configure_logging("json", "info", "a", None, stream=stream)
    early.info("late_event")
    assert _events(stream)[0]["event"] == "late_event"


@pytest.mark.parametrize(
    ("fmt", "stream_type", "is_json"),
    [
        pytest.param("json", _Tty, True, id="json-forced-on-tty"),
        pytest.param("console", io.StringIO, False, id="console-forced"),
        pytest.param(None, _Tty, False, id="auto-tty-console"),
        pytest.param(None, io.StringIO, True, id="auto-pipe-json"),
    ],
)
def test_format_selection(fmt: Any, stream_type: type[io.StringIO], is_json: bool) -> None:
    stream = stream_type()
    configure_logging(fmt, "info", "a", "n", stream=stream)
    get_logger("x").info("hello_world", k="v")
    line = stream.getvalue().strip()
    if is_json:
        assert json.loads(line)["event"] == "hello_world"
    else:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", line)
        assert not plain.startswith("{")
        assert "hello_world" in plain
        assert "k=v" in plain
        assert "agent=a" in plain


def test_contextvars_are_merged() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", "a", None, stream=stream)
    structlog.contextvars.bind_contextvars(request_id="r1")
    get_logger("x").info("with_context")
    assert _events(stream)[0]["request_id"] == "r1"


def test_agent_and_node_reach_records_from_other_threads() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", "mig-manager", "node-9", stream=stream)
    thread = threading.Thread(target=lambda: get_logger("worker").info("from_thread"))
    thread.start()
    thread.join()
    (event,) = _events(stream)
    assert (event["agent"], event["node"]) == ("mig-manager", "node-9")


@pytest.mark.parametrize(
    ("text", "level"),
    [("debug", logging.DEBUG), ("Info", logging.INFO), ("WARN", logging.WARNING), ("critical", 50), (30, 30)],
    ids=str,
)
def test_parse_level(text: str | int, level: int) -> None:
    assert parse_level(text) == level


def test_parse_level_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="must be one of debug, info, warning, error, critical"):
        parse_level("verbose")

"""Structured logging: one event per line, JSON unless a person is watching a terminal.

Every record, whether it comes from structlog (``get_logger(__name__).info("device_unhealthy", ...)``) or
from a library using the standard ``logging`` module (grpc, asyncio), goes through one root handler
whose ``structlog.stdlib.ProcessorFormatter`` renders it the same way, with ``agent``, ``node`` and
``version`` added to every line. Keys: ``event`` (constant snake_case name), ``level``, ``logger``,
``ts`` (RFC 3339 UTC, milliseconds), then the event's own fields; exceptions as an ``exception`` string.

Errors nobody catches are events too (:func:`install_error_hooks`, which :func:`gpunode.common.runtime.run`
installs for the agent's life, and :func:`log_loop_exception` on every event loop an agent runs):
``thread_error`` (an exception ending a thread: the HTTP transport's, gRPC's, an executor's),
``loop_error`` (the event loop's exception handler: a callback that raised, a future's exception never
retrieved, a transport's fatal error), ``unraisable_error`` (``sys.unraisablehook``: ``__del__``,
finalisers) and ``uncaught_error`` (``sys.excepthook``), each with the traceback as ``exception``.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TextIO, TypeAlias

# structlog imports rich at import time when it is installed (a development tool pulls it in), which
# costs every agent about 90 ms of start-up and several MB; we never use it (tracebacks are rendered
# plainly: rich's show local variables, which may hold secrets). Keep it out unless already loaded.
if "rich" not in sys.modules:
    sys.modules["rich"] = None  # type: ignore[assignment]

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "LOG_LEVELS",
    "Logger",
    "configure_logging",
    "get_logger",
    "install_error_hooks",
    "log_loop_exception",
    "parse_level",
]

LogFormat = Literal["json", "console"]
#: What :func:`get_logger` returns, and so the type of every ``log`` a function or class takes.
Logger: TypeAlias = structlog.stdlib.BoundLogger

LOG_LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

_HANDLER_MARK = "_gpunode_handler"
_structlog_ready = False


def parse_level(level: str | int) -> int:
    """``"info"``/``"INFO"``/``20`` -> ``logging.INFO``; ``ValueError`` naming the valid levels otherwise."""
    if isinstance(level, int):
        return level
    try:
        return LOG_LEVELS[level.strip().lower()]
    except KeyError:
        valid = ", ".join(name for name in LOG_LEVELS if name != "warn")
        raise ValueError(f"invalid log level {level!r}: must be one of {valid}") from None


def _add_timestamp(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    if "ts" not in event_dict:
        now = _dt.datetime.now(_dt.UTC)
        event_dict["ts"] = now.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return event_dict


class _StaticFields:
    """Adds the process-wide fields (agent, node, version) to every event, from any thread."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        for key, value in self.fields.items():
            event_dict.setdefault(key, value)
        return event_dict


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _add_timestamp,
    ]


def _ensure_structlog() -> None:
    """Route structlog through the standard library once; the handler decides the format.

    The structlog side never changes afterwards, so loggers may be created at import time and cached
    on first use; ``configure_logging`` only swaps the root handler and level.
    """
    global _structlog_ready
    if _structlog_ready:
        return
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        context_class=dict,
        cache_logger_on_first_use=True,
    )
    _structlog_ready = True


def get_logger(name: str | None = None, **initial_values: Any) -> Logger:
    """A structlog logger named ``name`` (use ``__name__``), optionally with fields bound."""
    _ensure_structlog()
    logger: Logger = structlog.stdlib.get_logger(name, **initial_values)
    return logger


def _wants_console(fmt: LogFormat | None, stream: TextIO) -> bool:
    if fmt is not None:
        return fmt == "console"
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):  # closed or odd stream
        return False


def configure_logging(
    fmt: LogFormat | None = None,
    level: str | int = "info",
    agent: str = "gpunode",
    node: str | None = None,
    *,
    stream: TextIO | None = None,
    version: str | None = None,
    extra_fields: MutableMapping[str, Any] | None = None,
) -> None:
    """Send every log record (structlog and stdlib) to ``stream`` (default stderr) as one line each.

    ``fmt`` None picks console when the stream is a TTY, JSON otherwise. ``agent``, ``node`` and
    ``version`` (default: the package version) are added to every line. Calling it again replaces the
    previous configuration instead of adding a second handler.
    """
    _ensure_structlog()
    numeric_level = parse_level(level)
    out: TextIO = stream if stream is not None else sys.stderr
    console = _wants_console(fmt, out)

    if version is None:
        from gpunode import __version__ as version

    fields: dict[str, Any] = {"agent": agent, "node": node, "version": version}
    if extra_fields:
        fields.update(extra_fields)

    renderer: Processor
    final: list[Processor] = [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        _StaticFields(fields),
    ]
    if console:
        colors = bool(getattr(out, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ
        # plain tracebacks: the rich one prints local variables, which may hold secrets
        renderer = structlog.dev.ConsoleRenderer(
            colors=colors, timestamp_key="ts", exception_formatter=structlog.dev.plain_traceback
        )
    else:
        final += [structlog.processors.format_exc_info, _order_keys]
        renderer = structlog.processors.JSONRenderer(default=_json_fallback)
    final.append(renderer)

    formatter = structlog.stdlib.ProcessorFormatter(
        processors=final,
        foreign_pre_chain=[*_shared_processors(), structlog.stdlib.ExtraAdder()],
    )
    handler = _Handler(out)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _HANDLER_MARK, False):
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    root.setLevel(numeric_level)
    logging.captureWarnings(True)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler: a record it cannot format (bad %-arguments, a failing ``__repr__``) becomes a
    ``log_error`` event instead of the standard library's plain "--- Logging error ---" traceback."""

    def handleError(self, record: logging.LogRecord) -> None:  # logging's name
        exc = sys.exc_info()[1]
        line = {
            "ts": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": "error",
            "event": "log_error",
            "logger": record.name,
            "error": _describe(exc),
            "record": _safe_repr(record.msg),
        }
        try:
            self.stream.write(json.dumps(line, default=repr) + self.terminator)
            self.flush()
        except Exception:  # the stream itself is gone: nowhere left to say so
            pass


# -- errors nobody caught ------------------------------------------------------------------------------
_ERRORS_LOGGER = "gpunode.errors"
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _describe(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    text = _safe_str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _safe_str(value: object) -> str:
    try:
        return str(value)
    except Exception:  # a broken __str__ must not hide the error being reported
        return f"<{type(value).__name__}>"


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _exc_info(exc_type: type[BaseException], exc: BaseException | None, tb: TracebackType | None) -> ExcInfo:
    if exc is None:  # raised as a class whose instance could not be kept
        try:
            exc = exc_type()
        except Exception:
            exc = RuntimeError(exc_type.__name__)
    return (exc_type, exc, tb)


def _emit(event: str, exc_info: ExcInfo | None, **fields: Any) -> None:
    """Log one error event; if logging itself fails (interpreter shutdown), one JSON line by hand."""
    try:
        get_logger(_ERRORS_LOGGER).error(event, exc_info=exc_info, **fields)
    except Exception:
        line = {"level": "error", "event": event, "logger": _ERRORS_LOGGER, **fields}
        if exc_info is not None:
            line["exception"] = "".join(traceback.format_exception(*exc_info))
        try:
            sys.stderr.write(json.dumps(line, default=repr) + "\n")
            sys.stderr.flush()
        except Exception:  # no stderr left
            pass


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if issubclass(args.exc_type, SystemExit):
        return  # as the default hook: a thread ending itself is no error
    thread = args.thread.name if args.thread is not None else None
    exc_info = _exc_info(args.exc_type, args.exc_value, args.exc_traceback)
    _emit("thread_error", exc_info, thread=thread, error=_describe(exc_info[1]))


def _unraisablehook(unraisable: Any) -> None:  # sys.UnraisableHookArgs
    exc_info = _exc_info(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)
    message = unraisable.err_msg or "Exception ignored in"  # None: the interpreter's default wording
    fields = {"error": _describe(exc_info[1]), "message": message, "object": _safe_repr(unraisable.object)}
    _emit("unraisable_error", exc_info, **fields)


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    exc_info = _exc_info(exc_type, exc, tb)
    _emit("uncaught_error", exc_info, error=_describe(exc_info[1]))


def log_loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: one ``loop_error`` event per call, the traceback (when the
    context has an exception) as ``exception``, the other context entries (task, future, handle,
    transport, protocol, socket) as their repr."""
    exc = context.get("exception")
    fields: dict[str, Any] = {"message": context.get("message") or "unhandled exception in the event loop"}
    if isinstance(exc, BaseException):
        fields["error"] = _describe(exc)
    for key, value in context.items():
        if key in ("message", "exception"):
            continue
        if key == "source_traceback" and isinstance(value, list):  # asyncio debug mode
            fields[key] = "".join(traceback.format_list(value))
        else:
            fields[key] = _safe_repr(value)
    exc_info = (type(exc), exc, exc.__traceback__) if isinstance(exc, BaseException) else None
    _emit("loop_error", exc_info, **fields)


def install_error_hooks() -> Callable[[], None]:
    """Make the errors nobody catches structured events (``thread_error``, ``unraisable_error``,
    ``uncaught_error``; :func:`log_loop_exception` is per loop). Returns the function that puts the
    previous hooks back, so a caller inside a larger process (a test) leaves them as it found them."""
    previous = (threading.excepthook, sys.unraisablehook, sys.excepthook)
    threading.excepthook = _thread_excepthook
    sys.unraisablehook = _unraisablehook
    sys.excepthook = _excepthook

    def restore() -> None:
        threading.excepthook, sys.unraisablehook, sys.excepthook = previous

    return restore


_FIRST_KEYS = ("ts", "level", "event", "logger", "agent", "node", "version")


def _order_keys(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Put the fixed keys first so JSON lines read well; the event's own fields follow."""
    ordered: EventDict = {key: event_dict.pop(key) for key in _FIRST_KEYS if key in event_dict}
    ordered.update(event_dict)
    return ordered


def _json_fallback(value: object) -> object:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return repr(value)

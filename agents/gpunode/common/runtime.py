"""Process lifecycle: run the main coroutine, stop it on SIGTERM/SIGINT, map the outcome to an exit code.

Exit codes (a contract, see DESIGN.md): 0 clean stop, 1 runtime failure, 2 usage or config error.

Shutdown: the first SIGTERM/SIGINT cancels the main task (which cancels its TaskGroup, so every task
gets to clean up) and starts a grace timer on a separate thread; a second signal, or the grace timer
running out, ends the process at once with exit code 1. The timer lives outside the event loop so that
even a wedged loop, or an executor thread that never returns, cannot keep the process alive.

Structured concurrency helpers: :func:`supervise` (retry a task with capped exponential backoff,
logging and counting each failure) and :func:`on_sighup` (a reload hook that runs as a task).

SIGHUP never kills an agent: from the start of :func:`run` it is only noted, and the agent's
:func:`on_sighup`, once it runs, reloads for a SIGHUP that came before it (a ``systemctl reload`` or the
MIG manager's SIGHUP right after a start used to end the process with the signal's default action).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpunode.common import sdnotify
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.logging import Logger, get_logger, install_error_hooks, log_loop_exception

if TYPE_CHECKING:
    from gpunode.common.metrics import AgentMetrics

__all__ = [
    "DEFAULT_GRACE_S",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "Backoff",
    "exit_code_for",
    "on_sighup",
    "run",
    "settle",
    "sleep_or",
    "supervise",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
DEFAULT_GRACE_S = 10.0

MainResult = int | None
Main = Coroutine[Any, Any, MainResult] | Callable[[], Awaitable[MainResult]]
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_sighup_pending = False  # a SIGHUP came before on_sighup took the signal over


def _note_sighup(_signum: int, _frame: FrameType | None) -> None:
    global _sighup_pending
    _sighup_pending = True


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an exception that ended the main task (groups: 2 only if all leaves are 2)."""
    if isinstance(exc, ConfigError | UsageError):
        return EXIT_USAGE
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return EXIT_OK
        return code if isinstance(code, int) else EXIT_FAILURE
    if isinstance(exc, BaseExceptionGroup):
        codes = {exit_code_for(inner) for inner in exc.exceptions}
        return codes.pop() if len(codes) == 1 else EXIT_FAILURE
    return EXIT_FAILURE


class _Lifecycle:
    """Signal state shared between the signal handler (main thread), the loop and the grace timer."""

    def __init__(self, grace: float, log: Logger, force_exit: Callable[[int], object]) -> None:
        self.grace = grace
        self.log = log
        self.force_exit = force_exit
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Future[MainResult] | None = None
        self.signals = 0
        self.stop_requested = False
        self.signame = ""
        self.shutdown_started = False
        self.timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def handle_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Runs in the main thread between bytecodes; only thread-safe loop calls from here.
        with self._lock:
            self.signals += 1
            first = self.signals == 1
        name = signal.Signals(signum).name
        if not first:
            self.force("second_signal", name)
            return
        self.stop_requested = True
        self.signame = name
        if self.grace >= 0:
            self.timer = threading.Timer(self.grace, self.force, args=("grace_timeout", name))
            self.timer.daemon = True
            self.timer.start()
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self.begin_shutdown, name)
            except RuntimeError:  # the loop already closed: run() is returning anyway
                pass

    def begin_shutdown(self, signame: str) -> None:
        """On the loop: cancel the main task (idempotent)."""
        if self.task is None or self.shutdown_started:
            return  # called again once the task exists
        self.shutdown_started = True
        self.log.info("shutdown_requested", signal=signame, grace_s=self.grace)
        sdnotify.notify(stopping=True, status=f"stopping on {signame}")
        if not self.task.done():
            self.task.cancel(f"received {signame}")

    def force(self, why: str, signame: str) -> None:
        try:
            self.log.error("forced_exit", reason=why, signal=signame, grace_s=self.grace)
            sys.stderr.flush()
        finally:
            self.force_exit(EXIT_FAILURE)

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


def run(
    main: Main,
    *,
    grace: float = DEFAULT_GRACE_S,
    log: Logger | None = None,
    force_exit: Callable[[int], object] = os._exit,
) -> int:
    """Run ``main`` (a coroutine, or a function returning one) until it ends or a signal stops it.

    Returns the exit code: 0 when ``main`` returns (or returns 0/None) or is stopped by SIGTERM/SIGINT;
    the int ``main`` returns; 2 for :class:`ConfigError`/:class:`UsageError` (logged as ``config_error``);
    1 for any other exception (logged as ``fatal_error`` with the traceback), and when a stop outlasts
    ``grace`` seconds after the first signal (negative: no limit) or a second signal arrives.
    Must be called from the main thread (it installs signal handlers, restored on return).
    Errors nobody catches while it runs (a thread's, an unraisable one, the loop's) are logged as
    events (:func:`gpunode.common.logging.install_error_hooks`); the previous hooks come back on return.
    """
    logger = log if log is not None else get_logger("gpunode.runtime")
    life = _Lifecycle(grace, logger, force_exit)
    global _sighup_pending
    previous = {sig: signal.signal(sig, life.handle_signal) for sig in SHUTDOWN_SIGNALS}
    _sighup_pending = False
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, _note_sighup)
    restore_hooks = install_error_hooks()
    try:
        with asyncio.Runner() as runner:
            return runner.run(_main(main, life))
    except (SystemExit, KeyboardInterrupt) as exc:  # asyncio re-raises these out of the loop
        return _outcome(exc, life)
    finally:
        life.cancel_timer()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        restore_hooks()


async def _main(main: Main, life: _Lifecycle) -> int:
    life.loop = asyncio.get_running_loop()
    life.loop.set_exception_handler(log_loop_exception)
    try:
        task = asyncio.ensure_future(main() if callable(main) else main)
    except Exception as exc:  # a factory that fails, or returns something that cannot be awaited
        return _outcome(exc, life)
    if isinstance(task, asyncio.Task):
        task.set_name("main")
    life.task = task
    if life.stop_requested:  # a signal arrived before the task existed
        life.begin_shutdown(life.signame)
    await asyncio.wait([task])
    if task.cancelled():
        if life.stop_requested:
            life.log.info("stopped")
            return EXIT_OK
        life.log.error("fatal_error", error="main task cancelled without a stop signal")
        return EXIT_FAILURE
    failure = task.exception()
    if failure is not None:
        return _outcome(failure, life)
    result = task.result()
    life.log.info("stopped", exit_code=result or 0)
    return result or 0


def _outcome(exc: BaseException, life: _Lifecycle) -> int:
    code = exit_code_for(exc)
    if code == EXIT_USAGE:
        life.log.error("config_error", error=str(_first_leaf(exc)))
    elif isinstance(exc, SystemExit):
        life.log.info("stopped", exit_code=code)
    else:
        leaf = _first_leaf(exc)  # the TaskGroup's first real error, not "unhandled errors in a TaskGroup"
        life.log.error("fatal_error", error=f"{type(leaf).__name__}: {leaf}", exc_info=exc)
    return code


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


# ------------------------------------------------------------------------------------------- helpers


async def supervise(
    name: str,
    fn: Callable[[], Awaitable[object]],
    *,
    metrics: AgentMetrics | None = None,
    reason: str | None = None,
    initial_backoff: float = 1.0,
    max_backoff: float = 60.0,
    factor: float = 2.0,
    reset_after: float = 60.0,
    max_failures: int | None = None,
    restart_on_return: bool = False,
    fatal: tuple[type[BaseException], ...] = (ConfigError, UsageError),
    log: Logger | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run ``fn()`` as the task ``name``, restarting it after failures; await it, never fire and forget.

    Each exception (not cancellation) is logged as ``task_failed`` with its traceback, counted in
    ``gpunode_errors_total{agent, reason}`` (``reason`` defaults to ``name``), and followed by a retry
    after a backoff that starts at ``initial_backoff``, grows by ``factor`` up to ``max_backoff``, and
    resets once a run lasted ``reset_after`` seconds. After ``max_failures`` consecutive failures, or for
    a ``fatal`` exception type, the exception is re-raised (ending the TaskGroup, exit code 1 or 2).
    When ``fn`` returns normally, ``supervise`` returns too, unless ``restart_on_return``.
    """
    logger = log if log is not None else get_logger("gpunode.runtime")
    label = reason or name
    delay = initial_backoff
    failures = 0
    while True:
        started = clock()
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except fatal:
            logger.error("task_failed", task=name, fatal=True, exc_info=True)
            if metrics is not None:
                metrics.count_error(label)
            raise
        except Exception:
            if clock() - started >= reset_after:
                delay, failures = initial_backoff, 0
            failures += 1
            if metrics is not None:
                metrics.count_error(label)
            if max_failures is not None and failures >= max_failures:
                logger.error("task_failed", task=name, failures=failures, giving_up=True, exc_info=True)
                raise
            logger.error("task_failed", task=name, failures=failures, retry_in_s=delay, exc_info=True)
            await sleep(delay)
            delay = min(delay * factor, max_backoff)
            continue
        if not restart_on_return:
            return
        logger.info("task_returned", task=name, restarting=True)
        if clock() - started >= reset_after:
            delay, failures = initial_backoff, 0
        await sleep(delay)
        delay = min(delay * factor, max_backoff)


async def on_sighup(
    callback: Callable[[], object],
    *,
    metrics: AgentMetrics | None = None,
    log: Logger | None = None,
) -> None:
    """Call ``callback`` (sync, or returning an awaitable) on every SIGHUP until cancelled.

    Run it as a task in the agent's TaskGroup. A failing reload is logged as ``reload_failed`` and
    counted (reason ``reload``) but does not stop the agent: it keeps the configuration it has. Only one
    ``on_sighup`` may be active per event loop.
    """
    global _sighup_pending
    logger = log if log is not None else get_logger("gpunode.runtime")
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    before = signal.getsignal(signal.SIGHUP)  # run()'s note-taker, or whatever a caller had
    loop.add_signal_handler(signal.SIGHUP, wake.set)
    if _sighup_pending:  # it came while the agent was starting: reload now
        _sighup_pending = False
        wake.set()
    try:
        while True:
            await wake.wait()
            wake.clear()
            logger.info("reload_requested", signal="SIGHUP")
            try:
                result = callback()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.error("reload_failed", exc_info=True)
                if metrics is not None:
                    metrics.count_error("reload")
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        with contextlib.suppress(ValueError, TypeError):  # back to what it was (not the default action)
            signal.signal(signal.SIGHUP, before)


def trim_memory() -> None:
    """Give freed heap pages back to the OS (glibc's malloc_trim) after a burst of work.

    Start-up parses descriptors, inventories and configs whose temporaries stay in the process heap;
    trimming keeps a long-running agent's resident memory at what it actually uses. No-op elsewhere.
    Cheap after the first call (the libc handle is kept), so periodic work may call it too.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


class Backoff:
    """Retry delays: quick at first, doubling, capped (the kubelet or the API server being away)."""

    def __init__(self, first: float = 0.05, cap: float = 5.0, factor: float = 2.0) -> None:
        self.first, self.cap, self.factor = first, cap, factor
        self.delay = first

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.cap, self.delay * self.factor)
        return delay

    def reset(self) -> None:
        self.delay = self.first


async def sleep_or(event: asyncio.Event, seconds: float) -> bool:
    """Sleep, waking early when `event` is set; returns whether it was set."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def settle(event: asyncio.Event, quiet: float, cap: float) -> None:
    """Return once ``event`` has not been set for ``quiet`` seconds, or ``cap`` seconds from now (a MIG
    layout being applied step by step: wait until it is quiet before publishing it).

    ``event`` is cleared on the way: set again when this returns, it tells of a change that came after."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cap
    while True:
        event.clear()
        left = deadline - loop.time()
        if left <= 0 or not await sleep_or(event, min(quiet, left)):
            return

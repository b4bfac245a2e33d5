"""gpunode.common.runtime in-process: exit codes, signal handling, supervise, SIGHUP reloads.

The signal tests deliver real signals to this process (``os.kill(os.getpid(), ...)``) from inside
``run()``, whose handlers are restored afterwards; forced exits are recorded by an injected
``force_exit`` instead of ending the test process (the real ``os._exit`` path is covered by the
subprocess tests in tests/integration/common).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from gpunode.common.cli import UsageError
from gpunode.common.config import ConfigError
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import exit_code_for, on_sighup, run, supervise


class RecordingLog:
    """Stands in for a structlog logger: records (level, event, fields)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def _record(self, level: str) -> Callable[..., None]:
        def log(event: str, **fields: Any) -> None:
            self.records.append((level, event, fields))

        return log

    def __getattr__(self, level: str) -> Callable[..., None]:
        return self._record(level)

    def events(self) -> list[str]:
        return [event for _, event, _ in self.records]

    def find(self, event: str) -> dict[str, Any]:
        return next(fields for _, name, fields in self.records if name == event)


# ---------------------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(RuntimeError("x"), 1, id="runtime-error"),
        pytest.param(ConfigError("f", ["p"]), 2, id="config-error"),
        pytest.param(UsageError("u"), 2, id="usage-error"),
        pytest.param(SystemExit(0), 0, id="system-exit-0"),
        pytest.param(SystemExit(None), 0, id="system-exit-none"),
        pytest.param(SystemExit(4), 4, id="system-exit-4"),
        pytest.param(SystemExit("message"), 1, id="system-exit-str"),
        pytest.param(
            ExceptionGroup("g", [ConfigError("f", ["p"]), UsageError("u")]), 2, id="group-all-usage"
        ),
        pytest.param(ExceptionGroup("g", [ConfigError("f", ["p"]), OSError()]), 1, id="group-mixed"),
        pytest.param(
            ExceptionGroup("g", [ExceptionGroup("h", [ConfigError("f", ["p"])])]), 2, id="nested-group"
        ),
    ],
)
def test_exit_code_for(exc: BaseException, code: int) -> None:
    assert exit_code_for(exc) == code


async def _returns_none() -> None:
    await asyncio.sleep(0)


async def _returns_3() -> int:
    return 3


async def _raises_runtime_error() -> None:
    raise RuntimeError("disk on fire")


async def _raises_config_error() -> None:
    raise ConfigError("/etc/x.yaml", ["flags.migStrategy: must be one of none, single, mixed"])


async def _task_group_with_config_error() -> None:
    async with asyncio.TaskGroup() as tg:
        tg.create_task(asyncio.sleep(10))
        tg.create_task(_raises_config_error())


async def _task_group_with_crash() -> None:
    async with asyncio.TaskGroup() as tg:
        tg.create_task(asyncio.sleep(10))
        tg.create_task(_raises_runtime_error())


async def _system_exit() -> None:
    raise SystemExit(5)


async def _cancels_itself() -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    await asyncio.sleep(1)


def _failing_factory() -> Any:
    raise UsageError("--bogus is not a flag")


@pytest.mark.parametrize(
    ("main", "code", "event"),
    [
        pytest.param(_returns_none, 0, "stopped", id="returns-none"),
        pytest.param(_returns_3, 3, "stopped", id="returns-int"),
        pytest.param(_raises_runtime_error, 1, "fatal_error", id="exception"),
        pytest.param(_raises_config_error, 2, "config_error", id="config-error"),
        pytest.param(_task_group_with_config_error, 2, "config_error", id="taskgroup-config-error"),
        pytest.param(_task_group_with_crash, 1, "fatal_error", id="taskgroup-crash"),
        pytest.param(_system_exit, 5, "stopped", id="system-exit"),
        pytest.param(_cancels_itself, 1, "fatal_error", id="cancelled-without-signal"),
        pytest.param(_failing_factory, 2, "config_error", id="factory-raises-usage-error"),
        pytest.param(lambda: 42, 1, "fatal_error", id="factory-returns-non-awaitable"),
    ],
)
def test_run_exit_codes(main: Callable[[], Any], code: int, event: str) -> None:
    log = RecordingLog()
    assert run(main, log=log) == code
    assert event in log.events()


def test_run_accepts_a_coroutine_object() -> None:
    assert run(_returns_3(), log=RecordingLog()) == 3


def test_fatal_error_is_logged_with_exc_info() -> None:
    log = RecordingLog()
    run(_raises_runtime_error, log=log)
    fields = log.find("fatal_error")
    assert isinstance(fields["exc_info"], RuntimeError)
    assert fields["error"] == "RuntimeError: disk on fire"


def test_task_group_failure_names_the_real_error() -> None:
    log = RecordingLog()
    run(_task_group_with_crash, log=log)
    fields = log.find("fatal_error")
    assert fields["error"] == "RuntimeError: disk on fire"
    assert isinstance(fields["exc_info"], ExceptionGroup)


def test_config_error_message_is_logged() -> None:
    log = RecordingLog()
    run(_task_group_with_config_error, log=log)
    assert "flags.migStrategy: must be one of none, single, mixed" in log.find("config_error")["error"]


# ------------------------------------------------------------------------------------------ signals


def test_sigterm_cancels_the_task_group_and_exits_0() -> None:
    cleaned_up: list[str] = []

    async def worker(name: str) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned_up.append(name)

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(worker("grpc"))
            tg.create_task(worker("http"))
            await asyncio.sleep(0)
            os.kill(os.getpid(), signal.SIGTERM)

    log = RecordingLog()
    before = signal.getsignal(signal.SIGTERM)
    assert run(main, log=log, force_exit=lambda code: pytest.fail("forced")) == 0
    assert sorted(cleaned_up) == ["grpc", "http"]
    assert log.find("shutdown_requested")["signal"] == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigint_is_a_clean_stop_too() -> None:
    async def main() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(60)

    assert run(main, log=RecordingLog()) == 0


def test_second_signal_forces_exit() -> None:
    forced: list[int] = []

    async def stubborn() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            os.kill(os.getpid(), signal.SIGTERM)  # an impatient operator
            await asyncio.sleep(0)

    log = RecordingLog()
    run(stubborn, log=log, force_exit=forced.append)
    assert forced == [1]
    assert log.find("forced_exit")["reason"] == "second_signal"


def test_grace_timeout_forces_exit() -> None:
    forced = threading.Event()
    codes: list[int] = []

    def force_exit(code: int) -> None:
        codes.append(code)
        forced.set()

    async def ignores_cancellation() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.to_thread(forced.wait, 10)  # wedged until the grace timer fires

    log = RecordingLog()
    run(ignores_cancellation, grace=0.05, log=log, force_exit=force_exit)
    assert codes == [1]
    assert log.find("forced_exit")["reason"] == "grace_timeout"


# ----------------------------------------------------------------------------------------- supervise


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _flaky(failures: int, *, runtime: float = 0.0, clock: FakeTime | None = None) -> Callable[[], Any]:
    calls = {"n": 0}

    async def fn() -> None:
        calls["n"] += 1
        if clock is not None:
            clock.now += runtime
        if calls["n"] <= failures:
            raise ConnectionError(f"attempt {calls['n']}")

    return fn


async def test_supervise_retries_with_capped_exponential_backoff() -> None:
    fake = FakeTime()
    metrics = create_metrics("test", "1", process_metrics=False)
    log = RecordingLog()
    await supervise(
        "register",
        _flaky(6),
        metrics=metrics,
        initial_backoff=1,
        max_backoff=10,
        sleep=fake.sleep,
        clock=fake.clock,
        log=log,
    )
    assert fake.sleeps == [1, 2, 4, 8, 10, 10]
    assert metrics.error_count("register") == 6
    failures = [fields for _, event, fields in log.records if event == "task_failed"]
    assert [f["failures"] for f in failures] == [1, 2, 3, 4, 5, 6]
    assert all(f["exc_info"] is True for f in failures)


async def test_supervise_resets_backoff_after_a_long_healthy_run() -> None:
    fake = FakeTime()
    await supervise(
        "watch",
        _flaky(4, runtime=100.0, clock=fake),
        initial_backoff=1,
        reset_after=60,
        sleep=fake.sleep,
        clock=fake.clock,
        log=RecordingLog(),
    )
    assert fake.sleeps == [1, 1, 1, 1]


async def test_supervise_gives_up_after_max_failures() -> None:
    fake = FakeTime()
    metrics = create_metrics("test", "1", process_metrics=False)
    log = RecordingLog()
    with pytest.raises(ConnectionError, match="attempt 3"):
        await supervise(
            "x", _flaky(10), metrics=metrics, reason="kubelet", max_failures=3, sleep=fake.sleep, log=log
        )
    assert fake.sleeps == [1, 2]
    assert metrics.error_count("kubelet") == 3
    assert log.records[-1][2]["giving_up"] is True


@pytest.mark.parametrize(
    "exc", [ConfigError("f", ["p"]), UsageError("u")], ids=["config-error", "usage-error"]
)
async def test_supervise_does_not_retry_fatal_errors(exc: Exception) -> None:
    fake = FakeTime()

    async def fn() -> None:
        raise exc

    with pytest.raises(type(exc)):
        await supervise("reload", fn, sleep=fake.sleep, log=RecordingLog())
    assert fake.sleeps == []


async def test_supervise_propagates_cancellation() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(supervise("loop", forever, log=RecordingLog()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_supervise_restart_on_return() -> None:
    fake = FakeTime()
    runs = {"n": 0}

    async def fn() -> None:
        runs["n"] += 1
        if runs["n"] == 3:
            raise asyncio.CancelledError  # stands in for the TaskGroup cancelling us

    with pytest.raises(asyncio.CancelledError):
        await supervise(
            "poll", fn, restart_on_return=True, sleep=fake.sleep, clock=fake.clock, log=RecordingLog()
        )
    assert runs["n"] == 3
    assert fake.sleeps == [1, 2]


async def test_supervise_returns_when_fn_returns() -> None:
    fake = FakeTime()
    await supervise("once", _flaky(0), sleep=fake.sleep, log=RecordingLog())
    assert fake.sleeps == []


# -------------------------------------------------------------------------------------------- SIGHUP


async def test_on_sighup_calls_the_callback_and_survives_failures() -> None:
    calls: list[int] = []
    called = asyncio.Event()
    metrics = create_metrics("test", "1", process_metrics=False)
    log = RecordingLog()

    async def reload() -> None:
        calls.append(len(calls))
        called.set()
        if len(calls) == 1:
            raise ValueError("bad config on first reload")

    task = asyncio.create_task(on_sighup(reload, metrics=metrics, log=log))
    await asyncio.sleep(0)  # let it install the handler
    for _ in range(2):
        called.clear()
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.wait_for(called.wait(), 5)
    task.cancel()
    await asyncio.wait([task])
    assert calls == [0, 1]
    assert log.events().count("reload_requested") == 2
    assert "reload_failed" in log.events()
    assert metrics.error_count("reload") == 1
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL


def test_a_sighup_before_the_reload_hook_runs_is_a_reload_not_death() -> None:
    """A SIGHUP while the agent starts (a systemctl reload, the MIG manager's SIGHUP) used to end the
    process by the signal's default action; now it is noted and reloads once the hook runs."""
    calls: list[str] = []

    async def main() -> None:
        os.kill(os.getpid(), signal.SIGHUP)  # the hook does not exist yet
        await asyncio.sleep(0.05)
        called = asyncio.Event()
        task = asyncio.create_task(
            on_sighup(lambda: (calls.append("reload"), called.set()), log=RecordingLog())
        )
        await asyncio.wait_for(called.wait(), 5)
        task.cancel()
        await asyncio.wait([task])

    before = signal.getsignal(signal.SIGHUP)
    assert run(main, log=RecordingLog()) == 0
    assert calls == ["reload"]
    assert signal.getsignal(signal.SIGHUP) is before


async def test_on_sighup_accepts_a_sync_callback() -> None:
    called = asyncio.Event()
    task = asyncio.create_task(on_sighup(called.set, log=RecordingLog()))
    await asyncio.sleep(0)
    os.kill(os.getpid(), signal.SIGHUP)
    await asyncio.wait_for(called.wait(), 5)
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()

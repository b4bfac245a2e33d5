"""gpunode.common.sdnotify without a socket: addresses, watchdog interval, the feeding loop."""

from __future__ import annotations

import asyncio
import os

import pytest

from gpunode.common.sdnotify import notify, notify_socket_address, watchdog_interval, watchdog_task


@pytest.mark.parametrize(
    ("value", "address"),
    [
        pytest.param(None, None, id="unset"),
        pytest.param("", None, id="empty"),
        pytest.param("/run/systemd/notify", "/run/systemd/notify", id="path"),
        pytest.param("@gpunode/notify", b"\0gpunode/notify", id="abstract"),
        pytest.param("vsock:2:1234", None, id="vsock-unsupported"),
    ],
)
def test_notify_socket_address(value: str | None, address: str | bytes | None) -> None:
    environ = {} if value is None else {"NOTIFY_SOCKET": value}
    assert notify_socket_address(environ) == address


def test_notify_is_a_noop_without_notify_socket() -> None:
    assert notify(ready=True, status="serving", environ={}) is False


def test_notify_with_nothing_to_say_sends_nothing() -> None:
    assert notify(environ={"NOTIFY_SOCKET": "/nonexistent/socket"}) is False


def test_notify_failure_does_not_raise() -> None:
    assert notify(ready=True, environ={"NOTIFY_SOCKET": "/nonexistent/dir/notify.sock"}) is False


PID = str(os.getpid())


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        pytest.param({}, None, id="unset"),
        pytest.param({"WATCHDOG_USEC": "30000000"}, 30.0, id="30s"),
        pytest.param({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": PID}, 0.5, id="pid-matches"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None, id="pid-is-another-process"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None, id="pid-garbage"),
        pytest.param({"WATCHDOG_USEC": "0"}, None, id="zero-disabled"),
        pytest.param({"WATCHDOG_USEC": "-5"}, None, id="negative"),
        pytest.param({"WATCHDOG_USEC": "soon"}, None, id="garbage"),
    ],
)
def test_watchdog_interval(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval(environ) == interval


async def test_watchdog_task_feeds_at_half_the_interval() -> None:
    sent: list[str] = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await watchdog_task(
            environ={"WATCHDOG_USEC": "30000000"}, send=lambda: sent.append("WATCHDOG=1"), sleep=sleep
        )
    assert sent == ["WATCHDOG=1"] * 3
    assert sleeps == [15.0] * 3


async def test_watchdog_task_interval_argument_wins() -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await watchdog_task(4.0, environ={"WATCHDOG_USEC": "30000000"}, send=lambda: None, sleep=sleep)
    assert sleeps == [2.0]


async def test_watchdog_task_returns_at_once_without_a_watchdog() -> None:
    sent: list[int] = []
    await asyncio.wait_for(watchdog_task(environ={}, send=lambda: sent.append(1)), 1)
    assert sent == []

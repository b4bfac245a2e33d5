"""gpunode.common.sdnotify against a real AF_UNIX datagram socket (path and abstract namespace)."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.common.sdnotify import notify, watchdog_task


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    """A bound datagram socket standing in for systemd, and the environment naming it."""
    path = tmp_path / "notify.sock"
    if len(os.fsencode(path)) > 100:  # sun_path is 108 bytes
        path = Path(tempfile.mkdtemp(prefix="gpn-")) / "n.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.fspath(path))
    sock.settimeout(5)
    try:
        yield sock, {"NOTIFY_SOCKET": os.fspath(path)}
    finally:
        sock.close()


def _receive(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().splitlines()


@pytest.mark.parametrize(
    ("kwargs", "lines"),
    [
        pytest.param({"ready": True}, ["READY=1"], id="ready"),
        pytest.param(
            {"ready": True, "status": "serving 8 GPUs"},
            ["READY=1", "STATUS=serving 8 GPUs"],
            id="ready-status",
        ),
        pytest.param({"stopping": True}, ["STOPPING=1"], id="stopping"),
        pytest.param({"watchdog": True}, ["WATCHDOG=1"], id="watchdog"),
        pytest.param(
            {"status": "line one\nline two"}, ["STATUS=line one line two"], id="status-newlines-flattened"
        ),
        pytest.param({"extra": {"ERRNO": "5"}}, ["ERRNO=5"], id="extra-fields"),
    ],
)
def test_notify_sends_one_datagram(
    receiver: tuple[socket.socket, dict[str, str]], kwargs: dict[str, object], lines: list[str]
) -> None:
    sock, environ = receiver
    assert notify(environ=environ, **kwargs) is True  # type: ignore[arg-type]
    assert _receive(sock) == lines


def test_reloading_carries_monotonic_usec(receiver: tuple[socket.socket, dict[str, str]]) -> None:
    sock, environ = receiver
    assert notify(reloading=True, environ=environ)
    lines = _receive(sock)
    assert lines[0] == "RELOADING=1"
    key, _, value = lines[1].partition("=")
    assert key == "MONOTONIC_USEC"
    assert int(value) > 0


def test_abstract_namespace_socket() -> None:
    name = f"gpunode-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        assert notify(ready=True, environ={"NOTIFY_SOCKET": "@" + name}) is True
        assert _receive(sock) == ["READY=1"]


def test_notify_uses_the_process_environment(
    receiver: tuple[socket.socket, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, environ = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", environ["NOTIFY_SOCKET"])
    assert notify(status="from os.environ") is True
    assert _receive(sock) == ["STATUS=from os.environ"]


async def test_watchdog_task_sends_watchdog_datagrams(receiver: tuple[socket.socket, dict[str, str]]) -> None:
    sock, environ = receiver
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await watchdog_task(environ={**environ, "WATCHDOG_USEC": "2000000"}, sleep=sleep)
    assert [_receive(sock) for _ in range(3)] == [["WATCHDOG=1"]] * 3
    assert slept == [1.0, 1.0, 1.0]

"""Every line a real agent writes is a JSON event, errors nobody catches included.

Two agents on the simulator, each run through a small wrapper that injects the errors no code catches
(a server thread that raises, a failing callback and a never-retrieved future on the main loop and on
the HTTP endpoint's loop, an exception in ``__del__``) before the agent's own main runs, while the test
resets connections in the middle of requests: the exporter (its endpoint on the main loop) and feature
discovery (the threaded transport: the endpoint on a private loop in the ``http-PORT`` thread), and
the device plugin (gRPC server threads: calls that fail, garbage, streams the client drops mid-answer).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpunode._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gpunode.sim import nvml as sim

WRAPPER = r"""
import asyncio, gc, importlib, sys, threading
import gpunode.agent.main as agent_main
import gpunode.common.asynchttp as asynchttp

def lose_a_future(loop, where):
    future = loop.create_future()
    future.set_exception(ConnectionResetError(104, "Connection reset by peer (" + where + ")"))

_start = asynchttp.AsyncEndpoint.start
async def start(self, *args, **kwargs):
    await _start(self, *args, **kwargs)
    loop = asyncio.get_running_loop()
    loop.call_soon(lambda: {}["raised on the endpoint's loop"])
    lose_a_future(loop, "endpoint loop")
asynchttp.AsyncEndpoint.start = start

class Leaky:
    def __del__(self):
        raise OSError("close failed in __del__")

def serve():
    raise ConnectionResetError(104, "Connection reset by peer (server thread)")

_run = agent_main.run
def run(main, **kwargs):
    async def injected():
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: 1 / 0)
        lose_a_future(loop, "main loop")
        threading.Thread(target=serve, name="server-thread").start()
        Leaky()
        gc.collect()
        return await (main() if callable(main) else main)
    return _run(injected, **kwargs)
agent_main.run = run

module, args = sys.argv[1], sys.argv[2:]
sys.exit(importlib.import_module(module).main(args))
"""

EXPECTED_ERRORS = {
    ("thread_error", "ConnectionResetError: [Errno 104] Connection reset by peer (server thread)"),
    ("loop_error", "ZeroDivisionError: division by zero"),
    ("loop_error", "ConnectionResetError: [Errno 104] Connection reset by peer (main loop)"),
    ("loop_error", 'KeyError: "raised on the endpoint\'s loop"'),
    ("loop_error", "ConnectionResetError: [Errno 104] Connection reset by peer (endpoint loop)"),
    ("unraisable_error", "OSError: close failed in __del__"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reset_mid_request(port: int, request: bytes) -> None:
    """Send (part of) a request and close with RST (SO_LINGER 0) before the answer is read."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.sendall(request)
    s.close()


def wait_http(port: int, path: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2)
            return
        except OSError:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "agent did not answer"
            time.sleep(0.1)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


def run_agent(
    module: str, args: list[str], port: int, path: str, traffic: Callable[[], None] | None = None
) -> list[dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_http(port, path, proc)
        for _ in range(20):
            reset_mid_request(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            reset_mid_request(port, b"GET /metr")  # half a request line
        if traffic is not None:
            traffic()
        wait_http(port, path, proc)  # still serving
        time.sleep(0.3)  # the loop's handler reports the lost futures once they are collected
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out == ""
    lines = err.splitlines()
    assert lines
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a line that is not a JSON event: {line!r}\n--- all of stderr:\n{err}")
    return events


def check(events: list[dict[str, Any]], *, only: bool = True) -> None:
    errors = {(e["event"], e.get("error")) for e in events if e["level"] == "error"}
    assert errors == EXPECTED_ERRORS if only else errors >= EXPECTED_ERRORS, errors
    for event in events:
        if event["logger"] == "gpunode.errors":
            assert event["logger"] == "gpunode.errors"
            assert event["exception"].rstrip().endswith(event["error"]), event  # rendered as a field
    assert any(e["event"] == "loop_error" and "Exception in callback" in e["message"] for e in events)
    thread = next(e for e in events if e["event"] == "thread_error")
    assert thread["thread"] == "server-thread"
    assert thread["exception"].startswith("Traceback (most recent call last):")


def test_exporter_stderr_is_json_only(node: Path) -> None:
    port = free_port()
    args = ["--sim-state", str(node), "-a", f"127.0.0.1:{port}", "--node-name", "node-a"]
    check(run_agent("gpunode.exporter.cli", args, port, "/metrics"))


def test_feature_discovery_stderr_is_json_only(node: Path, tmp_path: Path) -> None:
    port = free_port()
    args = ["--sim-state", str(node), "-o", str(tmp_path / "gfd"), "--sleep-interval", "60s"]
    args += ["--http-port", str(port), "--node-name", "node-a"]
    check(run_agent("gpunode.feature_discovery.cli", args, port, "/healthz"))


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: a unix socket path may have at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gpunode-logs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_device_plugin_stderr_is_json_only(short_tmp: Path) -> None:
    tmp_path = short_tmp
    port = free_port()
    plugin_dir = tmp_path / "var/lib/kubelet/device-plugins"
    plugin_dir.mkdir(parents=True)
    sock = plugin_dir / "nvidia-gpu.sock"
    args = ["--simulate", "dgx-a100", "--sim-state", str(tmp_path / "node.json"), "--kubelet-socket", ""]
    args += ["--host-root", str(tmp_path), "--http-port", str(port), "--log-format", "json"]

    def traffic() -> None:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert time.monotonic() < deadline, "plugin did not start serving"
            time.sleep(0.05)
        for _ in range(5):
            with grpc.insecure_channel(f"unix://{sock}") as ch:
                stub = pb_grpc.DevicePluginStub(ch)
                stream = stub.ListAndWatch(pb.Empty(), timeout=10)
                ids = [d.ID for d in next(iter(stream)).devices]
                stream.cancel()  # the client goes away in the middle of the stream
                stub.Allocate(
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:1])]),
                    timeout=5,
                )
                for request in (b"\xff\xff garbage", b""):
                    try:
                        raw: Any = ch.unary_unary("/v1beta1.DevicePlugin/Allocate")
                        raw(request, timeout=5)
                    except grpc.RpcError:
                        pass
                try:
                    stub.Allocate(
                        pb.AllocateRequest(
                            container_requests=[pb.ContainerAllocateRequest(devices_ids=["nope"])]
                        ),
                        timeout=5,
                    )
                except grpc.RpcError:
                    pass

    check(run_agent("gpunode.device_plugin.cli", args, port, "/healthz", traffic), only=False)

"""`gpunode-device-plugin` as a real process: exit codes, signals, and requests that must never crash it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpunode._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

PLUGIN = str(Path(sys.executable).parent / "gpunode-device-plugin")
PLUGIN_DIR = "var/lib/kubelet/device-plugins"


def sliced(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


def run_plugin(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PLUGIN, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_malformed_config_exits_2_naming_file_path_and_reason(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    out = run_plugin("--simulate", "t4x4", "--config-file", str(cfg), "--kubelet-socket", "")
    assert out.returncode == 2
    assert str(cfg) in out.stderr
    assert "flags.migStrategy" in out.stderr
    assert "none, single, mixed" in out.stderr


def test_bad_replicas_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(sliced(1))
    out = run_plugin("--simulate", "t4x4", "--config-file", str(cfg), "--kubelet-socket", "")
    assert out.returncode == 2
    assert "sharing.timeSlicing.resources[0].replicas" in out.stderr


def test_a_listandwatch_message_over_4_mib_is_refused_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(sliced(20000))
    state = tmp_path / "node.json"
    out = run_plugin(
        "--simulate",
        "dgx-a100",
        "--sim-state",
        str(state),
        "--config-file",
        str(cfg),
        "--kubelet-socket",
        "",
        "--host-root",
        str(tmp_path),
        "--http-port",
        "-1",
    )
    assert out.returncode == 2, out.stderr
    assert "4 MiB" in out.stderr or "4 MiB" in out.stdout


def test_unknown_preset_exits_2_listing_presets() -> None:
    out = run_plugin("--simulate", "dgx-z9", "--kubelet-socket", "")
    assert out.returncode == 2
    assert "dgx-a100" in out.stderr
    assert "t4x4" in out.stderr


def test_bad_health_check_env_exits_2() -> None:
    env = {**os.environ, "DP_DISABLE_HEALTHCHECKS": "48,banana"}
    out = run_plugin("--simulate", "t4x4", "--kubelet-socket", "", env=env)
    assert out.returncode == 2
    assert "DP_DISABLE_HEALTHCHECKS" in out.stderr


def test_init_failure_exits_1_when_fail_on_init_error(tmp_path: Path) -> None:
    from gpunode.sim import nvml as sim

    state = tmp_path / "node.json"
    sim.init_state_file(state, "t4x4")
    with sim.SimNode.open(state).mutate() as s:
        s.init_fault = "library-not-found"
    out = run_plugin(
        "--sim-state", str(state), "--kubelet-socket", "", "--host-root", str(tmp_path), "--http-port", "-1"
    )
    assert out.returncode == 1
    assert "NVML Shared Library Not Found" in out.stderr


@pytest.fixture(scope="module")
def serving(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], Path, list[str]]]:
    """A plugin process serving (without a kubelet) on a simulated dgx-a100, 2 replicas per GPU."""
    root = tmp_path_factory.mktemp("host")
    (root / PLUGIN_DIR).mkdir(parents=True)
    cfg = root / "config.yaml"
    cfg.write_text(sliced(2))
    proc = subprocess.Popen(
        [
            PLUGIN,
            "--simulate",
            "dgx-a100",
            "--sim-state",
            str(root / "node.json"),
            "--kubelet-socket",
            "",
            "--host-root",
            str(root),
            "--config-file",
            str(cfg),
            "--http-port",
            "-1",
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    sock = root / PLUGIN_DIR / "nvidia-gpu.sock"
    deadline = time.monotonic() + 20
    while not sock.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "plugin did not start serving"
        time.sleep(0.05)
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        msg = next(iter(pb_grpc.DevicePluginStub(ch).ListAndWatch(pb.Empty(), timeout=10)))
    ids = [d.ID for d in msg.devices]
    yield proc, sock, ids
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


ids_strategy = st.lists(
    st.one_of(st.text(max_size=80), st.sampled_from(["", "::", "GPU-", "MIG-x::1"])), max_size=20
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_requests_never_crash_the_server(
    serving: tuple[subprocess.Popen[str], Path, list[str]], data: st.DataObject
) -> None:
    proc, sock, ids = serving
    known = st.sampled_from(ids)
    mixed_ids = st.lists(st.one_of(known, st.text(max_size=40)), max_size=12)
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = pb_grpc.DevicePluginStub(ch)
        kind = data.draw(st.sampled_from(["allocate", "preferred", "raw"]))
        try:
            if kind == "allocate":
                reqs = data.draw(st.lists(mixed_ids, max_size=3))
                stub.Allocate(
                    pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=r) for r in reqs]
                    ),
                    timeout=5,
                )
            elif kind == "preferred":
                req = pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=data.draw(mixed_ids),
                    must_include_deviceIDs=data.draw(
                        st.lists(st.one_of(known, st.text(max_size=10)), max_size=4)
                    ),
                    allocation_size=data.draw(st.integers(min_value=-5, max_value=600)),
                )
                stub.GetPreferredAllocation(
                    pb.PreferredAllocationRequest(container_requests=[req]), timeout=5
                )
            else:
                raw = ch.unary_unary("/v1beta1.DevicePlugin/Allocate")
                raw(data.draw(st.binary(max_size=200)), timeout=5)
        except grpc.RpcError as exc:
            error: grpc.RpcError | None = exc
        else:
            error = None
        if error is not None:  # a clear refusal naming the problem, never an internal failure
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
            assert error.details()
        opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        assert opts.get_preferred_allocation_available
    assert proc.poll() is None


def test_sigterm_stops_cleanly_and_removes_the_socket(
    serving: tuple[subprocess.Popen[str], Path, list[str]],
) -> None:
    proc, sock, ids = serving
    assert len(ids) == 16
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert not sock.exists()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def _wait_for(
    port: int, *series: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 10
) -> str:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"plugin exited with {proc.returncode}:\n{err[-2000:]}")
        try:
            body = _scrape(port)
        except OSError:
            body = ""
        if all(s in body for s in series):
            return body
        assert time.monotonic() < deadline, f"never saw {series}; last scrape:\n{body}"
        time.sleep(0.1)


def test_devices_gauge_follows_health_without_a_kubelet(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The README's walkthrough: no kubelet listening, yet /metrics shows what is advertised."""
    tmp_path = tmp_path_factory.mktemp("host")  # short: a unix socket path has at most 107 bytes
    (tmp_path / PLUGIN_DIR).mkdir(parents=True)
    state = tmp_path / "node.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = ["--simulate", "dgx-a100", "--sim-state", str(state), "--kubelet-socket", ""]
    args += ["--host-root", str(tmp_path), "--http-port", str(port)]
    proc = subprocess.Popen(
        [PLUGIN, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        healthy = 'gpunode_device_plugin_devices{health="Healthy",resource="nvidia.com/gpu"}'
        _wait_for(port, f"{healthy} 8.0", proc=proc)
        gpunode = str(Path(sys.executable).parent / "gpunode")
        subprocess.run(
            [gpunode, "sim", "xid", "--state", str(state), "--gpu", "3", "--xid", "79"], check=True
        )
        unhealthy = 'gpunode_device_plugin_devices{health="Unhealthy",resource="nvidia.com/gpu"}'
        _wait_for(port, f"{healthy} 7.0", f"{unhealthy} 1.0")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_a_socket_path_too_long_for_unix_sockets_exits_2_saying_so(tmp_path: Path) -> None:
    root = tmp_path / ("deep" * 12)
    (root / PLUGIN_DIR).mkdir(parents=True)
    out = run_plugin(
        "--simulate", "t4x4", "--kubelet-socket", "", "--host-root", str(root), "--http-port", "-1"
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "a unix socket path can be at most 107 bytes" in out.stdout + out.stderr
    assert "--kubelet-socket" in out.stdout + out.stderr
    assert not list((root / PLUGIN_DIR).iterdir())  # nothing half-created

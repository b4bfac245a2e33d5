"""Bounds, symlinks, arguments and test hooks (issue 14 items 2, 4, 6, 7), each as a real process under
a 1 GiB address-space limit and a time limit: absurd counts and sizes end in a clear error within
seconds and a few tens of MB; a planted symlink is refused with its target untouched; option-like
names never reach ``systemctl``; the crash-test hook cannot be switched on from the environment."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpunode._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gpunode.sim.host import FakeHost
from helpers.hostile import BIN, GIB, GOOD_MIG_CONFIG, clean_env, run_limited

MIB = 1 << 20


# A process forked from this (large) pytest process reports at least pytest's RSS as its own peak (the
# kernel keeps the pre-exec high-water mark). So each command runs under a small Python wrapper that
# forks and execs it and writes the command's own peak RSS (KiB, from wait4) to a file.
WRAPPER = """
import ctypes, os, sys
out, argv = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: dies with the wrapper at the time limit
    os.execv(argv[0], argv)
_, status, usage = os.wait4(pid, 0)
with open(out, "w") as f:
    f.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class Measured:
    returncode: int
    stderr: str
    seconds: float
    peak_rss_mb: float  # the command's own peak


def run(argv: list[str], *, timeout: float = 20.0, env: dict[str, str] | None = None) -> Measured:
    with tempfile.NamedTemporaryFile(prefix="bounds-rss-") as rss:
        o = run_limited(
            [sys.executable, "-c", WRAPPER, rss.name, *argv],
            env={**clean_env(), **(env or {})},
            memory=GIB,
            timeout=timeout,
        )
        kib = rss.read().strip()
    return Measured(o.returncode, o.stderr, o.seconds, int(kib) / 1024 if kib else float("inf"))


# ---------------------------------------------------------------------------------- MIG counts (item 2)


@pytest.mark.parametrize("count", ["8", "50000000", "2000000000", "1.0e+23", "1e23", "-1", "9" * 40])
def test_mig_counts_beyond_any_gpu_exit_2_fast_and_small(tmp_path: Path, count: str) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        "version: v1\nmig-configs:\n  huge:\n    - devices: all\n      mig-enabled: true\n"
        f'      mig-devices: {{"1g.5gb": {count}}}\n'
    )
    argv = [str(BIN / "gpunode-mig"), "apply", "--simulate", "dgx-a100", "-f", str(layout), "-c", "huge"]
    o = run([*argv, "--journal-file", str(tmp_path / "journal.json")])
    assert o.returncode == 2, o.stderr
    assert f"{layout}: mig-configs.huge[0].mig-devices" in o.stderr
    assert o.seconds < 5
    assert o.peak_rss_mb < 100
    assert not (tmp_path / "journal.json").exists()  # nothing was applied


# ------------------------------------------------------------------------- subprocess output (item 2)


def test_a_hook_printing_200_mb_costs_a_tail(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.yaml"
    script = "head -c 200000000 /dev/zero; echo the-reason >&2; exit 1"
    hooks.write_text(
        f"version: v1\nhooks:\n  apply-start:\n    - command: /bin/sh\n      args: ['-c', '{script}']\n"
    )
    good = ["-f", str(GOOD_MIG_CONFIG), "-c", "all-disabled", "--journal-file", str(tmp_path / "j.json")]
    o = run([str(BIN / "gpunode-mig"), "apply", "--simulate", "t4x4", *good, "-k", str(hooks)])
    assert o.returncode == 1, o.stderr
    assert "apply-start hook /bin/sh: exited with status 1: the-reason" in o.stderr
    assert o.peak_rss_mb < 100  # captured whole, it took 2 x 200 MB
    assert len(o.stderr) < 20_000


# -------------------------------------------------------------------- problems listed per file (item 2)


def test_a_counters_csv_with_500000_bad_lines_lists_20(tmp_path: Path) -> None:
    csv = tmp_path / "counters.csv"
    csv.write_text("".join(f"DCGM_FI_BAD_{k}, gauge, x\n" for k in range(500_000)))
    o = run([str(BIN / "gpunode-exporter"), "--simulate", "t4x4", "-f", str(csv)])
    assert o.returncode == 2, o.stderr[-2000:]
    assert f"{csv}:1: unknown field DCGM_FI_BAD_0" in o.stderr
    assert f"{csv}: ... and 499980 more problems" in o.stderr
    assert len(o.stderr.splitlines()) < 30
    assert o.peak_rss_mb < 100
    assert o.seconds < 15


# -------------------------------------------------------------------------- echoed device IDs (item 2)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path: a unix socket path holds at most 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="gb-", dir="/tmp") as tmp:
        yield Path(tmp)


def test_allocate_with_a_4_mib_id_gets_a_short_status_and_log_line(short_tmp: Path) -> None:
    tmp_path = short_tmp
    (tmp_path / "var/lib/kubelet/device-plugins").mkdir(parents=True)
    log = tmp_path / "plugin.log"
    argv = [str(BIN / "gpunode-device-plugin"), "--simulate", "t4x4", "--kubelet-socket", ""]
    argv += ["--host-root", str(tmp_path), "--http-port", "-1", "--log-format", "json"]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB))

    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(), preexec_fn=limit)
    try:
        sock = tmp_path / "var/lib/kubelet/device-plugins/nvidia-gpu.sock"
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the plugin did not start serving"
            time.sleep(0.05)
        huge = "GPU-" + "0" * int(3.9 * MIB)
        ids = [huge, *(f"GPU-{k}" + "y" * 1000 for k in range(40))]  # all in one 4 MiB message
        options = [("grpc.max_send_message_length", 16 * MIB)]
        with grpc.insecure_channel(f"unix://{sock}", options=options) as ch:
            stub = pb_grpc.DevicePluginStub(ch)
            request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
            with pytest.raises(grpc.RpcError) as info:
                stub.Allocate(request, timeout=15)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # not refused by the client
            details = info.value.details() or ""
            assert "unknown device IDs" in details
            assert f"... ({len(huge) - 256} more characters)" in details
            assert details.endswith(" and 31 more")
            assert len(details) < 4000
            preferred = pb.PreferredAllocationRequest(
                container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=[huge])]
            )
            with pytest.raises(grpc.RpcError) as info:
                stub.GetPreferredAllocation(preferred, timeout=15)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert len(info.value.details() or "") < 400
            stub.GetDevicePluginOptions(pb.Empty(), timeout=5)  # still serving
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    lines = log.read_bytes().splitlines()
    assert max(len(line) for line in lines) < 8000
    (rejected,) = [json.loads(line) for line in lines if b"allocate_rejected" in line]
    assert rejected["id_count"] == 41
    assert all(len(i) <= 256 + 40 for i in rejected["ids"])


# ------------------------------------------------------------------- arguments, not options (item 6)

FAKE_SYSTEMCTL = '#!/bin/sh\necho "$@" >> {log}\nprintf "LoadState=loaded\\nActiveState=active\\n"\n'


@pytest.mark.parametrize("unit", ["--host=evil", "-M=x", "--root=/tmp/x"])
def test_option_like_gpu_clients_are_a_config_error_before_systemctl(tmp_path: Path, unit: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    (bindir / "systemctl").write_text(FAKE_SYSTEMCTL.format(log=calls))
    (bindir / "systemctl").chmod(0o755)
    clients = tmp_path / "clients.yaml"
    clients.write_text(f"version: v1\nsystemd-services:\n  - nvidia-dcgm.service\n  - '{unit}'\n")
    (tmp_path / "selected").write_text("all-disabled\n")
    argv = [str(BIN / "gpunode-mig-manager"), "--simulate", "t4x4", "-f", str(GOOD_MIG_CONFIG), "--oneshot"]
    argv += ["--selected-config-file", str(tmp_path / "selected"), "--state-file", str(tmp_path / "s.json")]
    argv += ["--journal-file", str(tmp_path / "j.json"), "-g", str(clients)]
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "WITH_SHUTDOWN_HOST_GPU_CLIENTS": "true"}
    o = run(argv, env=env)
    assert o.returncode == 2, o.stderr
    assert f"{clients}: systemd-services[1]: '{unit}' starts with '-'" in o.stderr
    assert not calls.exists()  # systemctl never ran


def test_an_option_like_kubelet_unit_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "selected").write_text("all-disabled\n")
    argv = [str(BIN / "gpunode-mig-manager"), "--simulate", "t4x4", "-f", str(GOOD_MIG_CONFIG), "--oneshot"]
    argv += ["--selected-config-file", str(tmp_path / "selected"), "--state-file", str(tmp_path / "s.json")]
    o = run([*argv, "--host-kubelet-systemd-service=-M=x"])
    assert o.returncode == 2, o.stderr
    assert "--host-kubelet-systemd-service" in o.stderr
    assert "starts with '-'" in o.stderr


DL = [str(BIN / "gpunode-driver-loader")]


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--kernel-version", "-a"), ("--kernel-version", "../../etc"), ("--driver-version", "--help")],
)
def test_driver_loader_values_for_argv_are_checked(tmp_path: Path, flag: str, value: str) -> None:
    host = FakeHost(tmp_path)
    try:
        o = run([*DL, "init", "--oneshot", *host.cli_args(), f"{flag}={value}"])
    finally:
        host.kill_daemons()
    assert o.returncode == 2, o.stderr
    assert flag in o.stderr
    assert host.calls("modprobe") == []


# ----------------------------------------------------------------------------- planted symlinks (item 4)


@pytest.mark.parametrize("planted", ["symlink", "dangling"])
def test_driver_loader_refuses_a_planted_pid_file_link(tmp_path: Path, planted: str) -> None:
    host = FakeHost(tmp_path / "host")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    pid = host.root / "run/nvidia/nvidia-driver.pid"
    pid.parent.mkdir(parents=True, exist_ok=True)
    pid.symlink_to(victim if planted == "symlink" else tmp_path / "created")
    try:
        host.add_precompiled()
        o = run([*DL, "init", "--oneshot", *host.cli_args()])
    finally:
        host.kill_daemons()
    assert o.returncode == 1, o.stderr
    assert f"{pid} is a symlink" in o.stderr
    assert "refusing to open it as root" in o.stderr
    assert victim.read_text() == "precious\n"  # not truncated, no pid written
    assert not (tmp_path / "created").exists()
    assert pid.is_symlink()
    assert host.loaded() == []  # it stopped before touching anything


# ------------------------------------------------------------------------ no test hooks (item 7)


def test_the_old_kill_variable_does_nothing(tmp_path: Path) -> None:
    layouts = ["-f", str(GOOD_MIG_CONFIG), "-c", "all-1g.10gb", "--journal-file", str(tmp_path / "j.json")]
    o = run(
        [str(BIN / "gpunode-mig"), "apply", "--simulate", "dgx-h100", *layouts],
        env={"GPUNODE_MIG_KILL_AFTER_STEP": "1"},
    )
    assert o.returncode == 0, o.stderr  # applied to the end, not SIGKILLed after its first step
    assert not (tmp_path / "j.json").exists()


def test_no_production_module_reads_a_fault_variable() -> None:
    agents = Path(__file__).resolve().parents[2] / "agents" / "gpunode"
    offenders = [str(p) for p in agents.rglob("*.py") if "KILL_AFTER" in p.read_text()]
    assert offenders == []

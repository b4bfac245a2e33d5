"""gpunode-mps-control-daemon as a process, with the fake nvidia-cuda-mps-control in a fake driver root.

Real processes throughout: the agent, the control daemon it forks with ``-d``, the control clients it
pipes commands into; the simulator stands in for the GPUs only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpunode.sim import mps_control
from gpunode.sim import nvml as sim
from helpers.mounts import unmount_under
from helpers.waiting import EventLog, wait_until

AGENT = str(Path(sys.executable).parent / "gpunode-mps-control-daemon")
GPU = "nvidia.com/gpu"
CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"


@pytest.fixture
def short() -> Iterator[Path]:
    """A short base directory: a control socket's path must fit in 107 bytes, as on a real host."""
    base = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    yield base
    unmount_under(base)  # the agent's <root>/shm tmpfs (mounted when the tests run as root)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


def control(root: Path, *commands: str) -> subprocess.CompletedProcess[str]:
    """Ask the daemon of nvidia.com/gpu something, as an MPS client's tools would."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(root / GPU / "pipe")}
    binary = root.parent / "drv/usr/bin/nvidia-cuda-mps-control"
    return subprocess.run(
        [str(binary)], input="\n".join(commands) + "\n", capture_output=True, text=True, env=env, timeout=30
    )


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


Start = Callable[..., tuple[subprocess.Popen[str], EventLog]]


@pytest.fixture
def agent(short: Path, node: Path) -> Iterator[Start]:
    procs: list[subprocess.Popen[str]] = []

    def start(
        *args: str, config: str = CONFIG, install: bool = True
    ) -> tuple[subprocess.Popen[str], EventLog]:
        if install:
            mps_control.install(short / "drv")
        (short / "config.yaml").write_text(config)
        p = subprocess.Popen(
            [
                AGENT,
                "--sim-state",
                str(node),
                "--driver-root",
                str(short / "drv"),
                "--mps-root",
                str(short / "mps"),
                "--config-file",
                str(short / "config.yaml"),
                "--watch-interval",
                "0.1",
                "--retry-interval",
                "0.2",
                "--http-port",
                "-1",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(p)
        assert p.stdout is not None
        return p, EventLog(p.stdout)

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    pid_file = short / "mps" / GPU / "pipe" / "nvidia-cuda-mps-control.pid"
    if pid_file.exists():  # never leave a daemon behind, whatever the test did
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_daemon_started_with_limits_ready_watched_and_quit(agent: Start, short: Path) -> None:
    root = short / "mps"
    p, log = agent()
    wait_until(lambda: (root / ".ready").exists(), timeout=20)
    doc = json.loads((root / ".ready").read_text())
    assert doc["sharing"]["resources"] == [{"name": GPU, "replicas": 4, "devices": "all"}]
    ready = doc["resources"][GPU]
    assert ready["activeThreadPercentage"] == 25
    assert set(ready["pinnedDeviceMemLimitMiB"].values()) == {10240}  # 40 GiB / 4
    assert (root / GPU / ".started").exists()
    assert (root / GPU / "log").is_dir()
    # the daemon answers with what the agent set
    assert control(root, "get_default_active_thread_percentage").stdout.strip() == "25.0"
    assert control(root, "get_default_device_pinned_mem_limit 7").stdout.strip() == "10240M"
    started = log.events("mps_daemon_started")[0]
    assert started["resource"] == GPU
    assert len(started["gpus"]) == 8
    # the daemon dies: .ready goes, the agent starts it again
    pid = int((root / GPU / "pipe/nvidia-cuda-mps-control.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    log.wait_for("mps_daemon_died", timeout=20)
    log.wait_for("mps_daemon_started", count=2, timeout=20)
    wait_until(lambda: (root / ".ready").exists(), timeout=20)
    new_pid = int((root / GPU / "pipe/nvidia-cuda-mps-control.pid").read_text())
    assert new_pid != pid
    # SIGTERM: .ready first, then quit; the daemon is gone
    p.send_signal(signal.SIGTERM)
    assert p.wait(20) == 0
    assert not (root / ".ready").exists()
    assert not (root / GPU / ".started").exists()
    assert not (root / GPU / "pipe/control").exists()
    wait_until(lambda: gone(new_pid))
    commands = (root / GPU / "log/control.log").read_text()
    assert "CMD set_default_device_pinned_mem_limit 0 10240M" in commands
    assert "CMD set_default_active_thread_percentage 25" in commands
    assert commands.rstrip().endswith("Exit")


def test_missing_binary_is_not_ready_with_the_reason_and_recovers(agent: Start, short: Path) -> None:
    p, log = agent("--http-port", "0", "--http-address", "127.0.0.1", install=False)
    log.wait_for("http_listening", timeout=20)
    port = log.events("http_listening")[0]["port"]
    log.wait_for("mps_not_ready", timeout=20)
    reason = log.events("mps_not_ready")[0]["reason"]
    assert "nvidia-cuda-mps-control not found under the driver root" in reason
    assert str(short / "drv" / "usr/bin/nvidia-cuda-mps-control") in reason
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
    assert info.value.code == 503
    assert not (short / "mps" / ".ready").exists()
    assert p.poll() is None  # nothing crashed: still running, still retrying
    mps_control.install(short / "drv")  # the driver arrives
    wait_until(lambda: (short / "mps" / ".ready").exists(), timeout=20)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
        assert resp.status == 200


@pytest.mark.parametrize(
    ("config", "args", "expected"),
    [
        pytest.param(
            CONFIG.replace("version: v1\n", "version: v1\nflags: {migStrategy: mixed}\n"),
            (),
            "sharing: MPS sharing (sharing.mps) is not supported with mig-strategy mixed",
            id="mixed-in-file",
        ),
        pytest.param(
            CONFIG, ("--mig-strategy", "mixed"), "not supported with mig-strategy mixed", id="mixed-flag"
        ),
        pytest.param(
            CONFIG.replace("replicas: 4", "replicas: 49"),
            (),
            "sharing.mps.resources[0].replicas: 49",
            id="49",
        ),
    ],
)
def test_refusals_exit_2_with_path_and_reason(
    agent: Start, short: Path, config: str, args: tuple[str, ...], expected: str
) -> None:
    p, log = agent(*args, config=config)
    assert p.wait(30) == 2
    assert expected in log.text()
    assert not (short / "mps" / ".ready").exists()


def test_mps_on_a_mig_node_is_refused(agent: Start, short: Path, node: Path) -> None:
    with sim.SimNode.open(node).mutate() as st:
        st.set_mig_mode(0, 1)
        st.reset_gpu(0)
    p, log = agent()
    assert p.wait(30) == 2
    text = log.text()
    assert "sharing.mps: MPS sharing is not supported for MIG devices (MIG is enabled on GPU 0)" in text


FD = str(Path(sys.executable).parent / "gpunode-feature-discovery")


def test_feature_discovery_labels_mps_as_nvidias_gfd(node: Path, short: Path) -> None:
    (short / "config.yaml").write_text(CONFIG)
    out = short / "gfd"
    args = [
        FD,
        "--oneshot",
        "--sim-state",
        str(node),
        "-o",
        str(out),
        "--config-file",
        str(short / "config.yaml"),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    labels = dict(
        line.split("=", 1) for line in out.read_text().splitlines() if "=" in line and line[0] != "#"
    )
    assert labels["nvidia.com/mps.capable"] == "true"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    with sim.SimNode.open(node).mutate() as st:  # MIG on one GPU: NVIDIA's GFD fails, this one exits 2
        st.set_mig_mode(3, 1)
        st.reset_gpu(3)
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "sharing.mps: MPS sharing is not supported for MIG devices (MIG is enabled on GPU 3)" in (
        done.stdout + done.stderr
    )


DP = str(Path(sys.executable).parent / "gpunode-device-plugin")


def test_device_plugin_refuses_mps_on_a_mig_node_with_exit_2(node: Path, short: Path) -> None:
    (short / "config.yaml").write_text(CONFIG)
    with sim.SimNode.open(node).mutate() as st:
        st.set_mig_mode(5, 1)
        st.reset_gpu(5)
    args = [DP, "--sim-state", str(node), "--config-file", str(short / "config.yaml")]
    args += ["--kubelet-socket", "", "--host-root", str(short / "host"), "--http-port", "-1"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "sharing.mps: MPS sharing is not supported for MIG devices (MIG is enabled on GPU 5)" in (
        done.stdout + done.stderr
    )
    mixed = subprocess.run([*args, "--mig-strategy", "mixed"], capture_output=True, text=True, timeout=60)
    assert mixed.returncode == 2
    assert "MPS sharing (sharing.mps) is not supported with mig-strategy mixed" in mixed.stdout + mixed.stderr

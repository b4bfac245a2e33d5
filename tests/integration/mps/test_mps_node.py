"""What gpunode-mps-control-daemon does to the node besides the daemons, as NVIDIA's does: the GPUs'
compute mode, the ``<root>/shm`` tmpfs, the daemons' ``control.log`` in the agent's log, and the config a
node label chooses in a config directory (the device plugin's way).

Real processes (the agent, the fake control daemon, the planning and compute-mode children, a fake API
server); the simulator stands in for the GPUs. Mounts the agent makes (the tests run as root here) are
taken away in the fixture's teardown.
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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpunode.sim import mps_control
from gpunode.sim import nvml as sim
from gpunode.sim.apiserver import FakeApiServer
from helpers.mounts import mounts_under, unmount_under
from helpers.waiting import EventLog, wait_until

AGENT = str(Path(sys.executable).parent / "gpunode-mps-control-daemon")
GPU = "nvidia.com/gpu"
NODE = "node-1"
LABEL = "nvidia.com/device-plugin.config"
EXCLUSIVE_PROCESS, DEFAULT = 3, 0


def mps_config(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  mps:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


@pytest.fixture
def short() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # control socket paths stay under 107 bytes
    yield base
    unmount_under(base)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def node(short: Path) -> Path:
    state = short / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


def modes(node: Path) -> list[int]:
    return [g.compute_mode for g in sim.SimNode.open(node).refresh().gpus]


def control(root: Path, *commands: str) -> str:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(root / GPU / "pipe")}
    binary = root.parent / "drv/usr/bin/nvidia-cuda-mps-control"
    done = subprocess.run(
        [str(binary)], input="\n".join(commands) + "\n", capture_output=True, text=True, env=env, timeout=30
    )
    return done.stdout.strip()


Start = Callable[..., tuple[subprocess.Popen[str], EventLog]]


@pytest.fixture
def agent(short: Path, node: Path) -> Iterator[Start]:
    procs: list[subprocess.Popen[str]] = []
    mps_control.install(short / "drv")

    def start(*args: str, config: str | None = None) -> tuple[subprocess.Popen[str], EventLog]:
        if config is not None:
            (short / "config.yaml").write_text(config)
            args = ("--config-file", str(short / "config.yaml"), *args)
        p = subprocess.Popen(
            [
                AGENT,
                *("--sim-state", str(node), "--driver-root", str(short / "drv")),
                *("--mps-root", str(short / "mps"), "--http-port", "-1", "--log-format", "json"),
                *("--watch-interval", "0.1", "--retry-interval", "0.2", "--log-interval", "0.05"),
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
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    pid_file = short / "mps" / GPU / "pipe" / "nvidia-cuda-mps-control.pid"
    if pid_file.exists():
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_compute_mode_exclusive_while_running_default_after(agent: Start, short: Path, node: Path) -> None:
    root = short / "mps"
    assert modes(node) == [DEFAULT] * 8
    p, log = agent(config=mps_config(4))
    wait_until(lambda: (root / ".ready").exists(), timeout=30)
    assert modes(node) == [EXCLUSIVE_PROCESS] * 8
    set_event = log.events("mps_compute_mode_set")[0]
    assert set_event["mode"] == "EXCLUSIVE_PROCESS"
    assert len(set_event["gpus"]) == 8
    # the mode is set before the daemon starts (NVIDIA's order)
    names = [e["event"] for e in log.events()]
    assert names.index("mps_compute_mode_set") < names.index("mps_daemon_started")
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    assert modes(node) == [DEFAULT] * 8
    assert log.events("mps_compute_mode_set")[-1]["mode"] == "DEFAULT"


def test_compute_mode_refused_is_not_ready_with_the_reason(agent: Start, short: Path, node: Path) -> None:
    with sim.SimNode.open(node).mutate() as st:  # NVML answers NO_PERMISSION, as for a non-root caller
        st.gpus[2].compute_mode_locked = True
    root = short / "mps"
    p, log = agent(config=mps_config(4))
    log.wait_for("mps_compute_mode_failed", timeout=30)
    failed = log.events("mps_compute_mode_failed")[0]
    assert "Insufficient Permissions" in failed["error"]
    assert "GPU 2 (GPU-" in failed["error"]
    reasons = [e["reason"] for e in log.events("mps_not_ready")]
    assert any(r.startswith(f"compute mode EXCLUSIVE_PROCESS for {GPU} not set:") for r in reasons), reasons
    assert not (root / ".ready").exists()
    assert not (root / GPU / "pipe/control").exists()  # no daemon was started
    assert p.poll() is None  # not a crash: retried
    with sim.SimNode.open(node).mutate() as st:
        st.gpus[2].compute_mode_locked = False
    wait_until(lambda: (root / ".ready").exists(), timeout=30)
    assert modes(node) == [EXCLUSIVE_PROCESS] * 8


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_shm_is_a_tmpfs_mounted_once(agent: Start, short: Path) -> None:
    root = short / "mps"
    p, log = agent("--shm-size", "32m", config=mps_config(4))
    wait_until(lambda: (root / ".ready").exists(), timeout=30)
    assert mounts_under(root) == [str(root / "shm")]
    info = Path("/proc/self/mountinfo").read_text()
    line = next(x for x in info.splitlines() if x.split()[4] == str(root / "shm"))
    assert " - tmpfs " in line
    assert "size=32768k" in line
    assert "nosuid" in line
    assert "noexec" in line
    assert log.events("mps_shm_mounted")[0]["path"] == str(root / "shm")
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    assert mounts_under(root) == [str(root / "shm")]  # kept for the clients, as NVIDIA's is
    # started again: already there, nothing mounted twice
    p, log = agent(config=mps_config(4))
    wait_until(lambda: (root / ".ready").exists(), timeout=30)
    assert log.events("mps_shm_present")[0]["fstype"] == "tmpfs"
    assert mounts_under(root) == [str(root / "shm")]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed")
def test_shm_without_the_privilege_is_skipped_with_the_reason(short: Path, node: Path) -> None:
    """Without CAP_SYS_ADMIN (dropped from the bounding set, as in a container without it): skipped and
    logged, the daemons run all the same."""
    mps_control.install(short / "drv")
    (short / "config.yaml").write_text(mps_config(4))
    root = short / "mps"
    cmd = ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", AGENT]
    cmd += ["--sim-state", str(node), "--driver-root", str(short / "drv"), "--mps-root", str(root)]
    cmd += ["--config-file", str(short / "config.yaml"), "--http-port", "-1", "--watch-interval", "0.1"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None
    log = EventLog(p.stdout)
    try:
        wait_until(lambda: (root / ".ready").exists() or p.poll() is not None, timeout=30)
        assert p.poll() is None, log.text()
        skipped = log.events("mps_shm_not_mounted")[0]
        assert skipped["path"] == str(root / "shm")
        assert "Operation not permitted" in skipped["reason"]
        assert "CAP_SYS_ADMIN" in skipped["reason"]
        assert mounts_under(root) == []
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0


def test_control_log_lines_forwarded_and_truncation_followed(agent: Start, short: Path) -> None:
    root = short / "mps"
    p, log = agent("--shm-size", "", config=mps_config(4))
    wait_until(lambda: (root / ".ready").exists(), timeout=30)
    wait_until(
        lambda: any(
            "CMD get_default_active_thread_percentage" in e["line"] for e in log.events("mps_control_log")
        )
    )
    lines = [e["line"] for e in log.events("mps_control_log")]
    assert any(line.endswith("CMD set_default_active_thread_percentage 25") for line in lines), lines
    assert all(e["resource"] == GPU for e in log.events("mps_control_log"))
    # the log is cut to nothing (logrotate's copytruncate): followed from its start again
    (root / GPU / "log/control.log").write_text("")
    assert control(root, "get_default_device_pinned_mem_limit 3") == "10240M"
    log.wait_for("mps_control_log_reset", timeout=10)
    assert log.events("mps_control_log_reset")[0]["reason"] == "truncated"
    wait_until(
        lambda: any(
            e["line"].endswith("CMD get_default_device_pinned_mem_limit 3")
            for e in log.events("mps_control_log")
        )
    )
    # replaced by a new file (rotation by rename): followed too
    os.rename(root / GPU / "log/control.log", root / GPU / "log/control.log.1")
    control(root, "get_default_active_thread_percentage")
    log.wait_for("mps_control_log_reset", count=2, timeout=10)
    assert log.events("mps_control_log_reset")[1]["reason"] == "rotated"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    assert log.events("mps_control_log")[-1]["line"].endswith("Exit")  # the last words, before it left


# ------------------------------------------------------------------------------- a node label chooses
@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node(NODE)
        info = {
            "architecture": "amd64",
            "bootID": "b00t",
            "containerRuntimeVersion": "containerd://2.0.0",
            "kernelVersion": "6.8.0",
            "kubeProxyVersion": "v1.31.0",
            "kubeletVersion": "v1.31.0",
            "machineID": "m4ch1ne",
            "operatingSystem": "linux",
            "osImage": "Ubuntu 24.04",
            "systemUUID": "5y5-uu1d",
        }
        server.patch_node(NODE, {"status": {"nodeInfo": info}})
        yield server


def ready_threads(root: Path) -> int | None:
    try:
        doc = json.loads((root / ".ready").read_text())
    except (OSError, ValueError):
        return None
    return int(doc["resources"][GPU]["activeThreadPercentage"])


def test_node_label_chooses_the_config_as_for_the_device_plugin(
    agent: Start, api: FakeApiServer, short: Path
) -> None:
    configs = short / "available-configs"
    configs.mkdir()
    (configs / "four").write_text(mps_config(4))
    (configs / "two").write_text(mps_config(2))
    (configs / "bad").write_text(mps_config(49))
    kubeconfig = api.write_kubeconfig(short / "kubeconfig")
    root = short / "mps"
    args = ("--config-file", str(configs), "--default-config", "four", "--shm-size", "")
    p, log = agent(*args, "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--kube-api-timeout", "2")
    # no label: DEFAULT_CONFIG
    wait_until(lambda: ready_threads(root) == 25, timeout=30)
    selected = log.events("config_selected")[0]
    assert (selected["name"], selected["source"]) == ("four", "default-config")
    # the label names another config: planned again, the daemon restarted with its limits
    api.patch_node(NODE, {"metadata": {"labels": {LABEL: "two"}}})
    wait_until(lambda: ready_threads(root) == 50, timeout=30)
    assert control(root, "get_default_active_thread_percentage") == "50.0"
    assert log.events("mps_config_changed")
    # a config the planning step refuses: the daemons stay as they are
    api.patch_node(NODE, {"metadata": {"labels": {LABEL: "bad"}}})
    log.wait_for("config_rejected", timeout=30)
    assert "replicas" in log.events("config_rejected")[0]["error"]
    assert ready_threads(root) == 50
    assert p.poll() is None
    # the chosen file's content changes: followed
    (configs / "two").write_text(mps_config(5))
    api.patch_node(NODE, {"metadata": {"labels": {LABEL: "two"}}})
    wait_until(lambda: ready_threads(root) == 20, timeout=30)
    assert control(root, "get_default_active_thread_percentage") == "20.0"


# ------------------------------------------------------------------------- the device plugin's config
def publish(root: Path, text: str) -> None:
    """As the device plugin publishes the config it serves: atomically (a rename)."""
    tmp = root / ".device-plugin-config.yaml.tmp"
    tmp.write_text(text)
    tmp.rename(root / ".device-plugin-config.yaml")


def test_following_the_device_plugin_waits_for_its_config_then_follows_it(agent: Start, short: Path) -> None:
    root = short / "mps"
    p, log = agent("--follow-device-plugin", "--shm-size", "")
    log.wait_for("mps_waiting_for_device_plugin", timeout=30)
    assert not (root / ".ready").exists()
    publish(root, mps_config(4))
    wait_until(lambda: ready_threads(root) == 25, timeout=30)
    assert log.events("config_selected")[0]["source"] == "device-plugin"
    # the plugin takes another config: planned again, the daemon restarted with its limits
    publish(root, mps_config(2))
    wait_until(lambda: ready_threads(root) == 50, timeout=30)
    assert control(root, "get_default_active_thread_percentage") == "50.0"
    # one the planning step refuses (the plugin refuses it too): the daemons stay as they are
    publish(root, mps_config(49))
    log.wait_for("config_rejected", timeout=30)
    assert ready_threads(root) == 50
    # a huge file planted there: refused by the size limit, in bounded time; the daemons stay
    publish(root, mps_config(4) + "#" * (3 << 20) + "\n")
    log.wait_for("config_rejected", count=2, timeout=30)
    assert ready_threads(root) == 50
    # the built-in defaults (no sharing): the daemons stop, nothing to share
    publish(root, "version: v1\n")
    log.wait_for("mps_not_configured", timeout=30)
    assert p.poll() is None


def test_following_the_device_plugin_and_a_config_file_is_refused(agent: Start) -> None:
    p, log = agent("--follow-device-plugin", config=mps_config(4))
    assert p.wait(30) == 2
    text = log.text()
    assert "--follow-device-plugin" in text
    assert "--config-file" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_mount_shm_alone_as_the_init_container_runs_it(short: Path) -> None:
    root = short / "mps"
    cmd = [AGENT, "--mount-shm", "--mps-root", str(root), "--shm-size", "16m", "--log-format", "json"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stdout + first.stderr
    assert '"mps_shm_mounted"' in first.stdout + first.stderr
    assert mounts_under(root) == [str(root / "shm")]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0
    assert '"mps_shm_present"' in again.stdout + again.stderr
    assert mounts_under(root) == [str(root / "shm")]  # once
    if shutil.which("setpriv") is not None:  # without CAP_SYS_ADMIN: exit 1 with the reason
        other = [*cmd[:3], str(short / "other"), *cmd[4:]]
        denied = subprocess.run(
            ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", *other],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert denied.returncode == 1
        assert "CAP_SYS_ADMIN" in denied.stdout + denied.stderr
        assert mounts_under(short / "other") == []

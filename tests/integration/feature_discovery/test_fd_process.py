"""`gpunode-feature-discovery` as a real process on a shared simulated node: files, signals, exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpunode.nvml import mig
from gpunode.sim import nvml as sim
from helpers.waiting import EventLog, wait_until

FD = str(Path(sys.executable).parent / "gpunode-feature-discovery")


def sliced(replicas: object) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


def labels_of(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line:
            continue
        key, _, value = line.partition("=")
        out[key] = value
    return out


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


def fd(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FD, *args], capture_output=True, text=True, timeout=60, **kw)  # type: ignore[call-overload]


def test_oneshot_writes_the_labels_atomically(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "features.d" / "gfd"
    out.parent.mkdir()
    machine = tmp_path / "product_name"
    machine.write_text("DGX A100 (920-23687-2530-000)\n")
    r = fd(
        "--sim-state", str(node), "--oneshot", "--output-file", str(out), "--machine-type-file", str(machine)
    )
    assert r.returncode == 0, r.stderr
    labels = labels_of(out)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "40960"
    assert labels["nvidia.com/gpu.machine"] == "DGX-A100-920-23687-2530-000"
    assert labels["nvidia.com/cuda.driver-version.full"] == "550.54.15"
    assert len(labels["nvidia.com/gfd.timestamp"]) == 10
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    lines = out.read_text().splitlines()
    assert lines == sorted(lines)  # stable order: diffs and checksums mean something
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp file left


def test_unreadable_machine_file_gives_unknown(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    r = fd(
        "--sim-state", str(node), "--oneshot", "-o", str(out), "--machine-type-file", str(tmp_path / "none")
    )
    assert r.returncode == 0
    assert labels_of(out)["nvidia.com/gpu.machine"] == "unknown"


def test_stdout_output(node: Path) -> None:
    r = fd("--sim-state", str(node), "--oneshot", "--output-file", "", "--no-timestamp")
    assert r.returncode == 0
    assert "nvidia.com/gpu.count=8" in r.stdout.splitlines()
    assert "gfd.timestamp" not in r.stdout


def test_unwritable_output_directory_exits_1_naming_the_path(node: Path, tmp_path: Path) -> None:
    target = tmp_path / "missing-dir" / "gfd"
    r = fd("--sim-state", str(node), "--oneshot", "-o", str(target))
    assert r.returncode == 1
    assert str(target) in r.stderr


def test_malformed_config_exits_2(node: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(sliced("zero"))
    r = fd("--sim-state", str(node), "--oneshot", "-o", str(tmp_path / "gfd"), "--config-file", str(cfg))
    assert r.returncode == 2
    assert str(cfg) in r.stderr
    assert "sharing.timeSlicing.resources[0].replicas" in r.stderr


def test_time_slicing_labels_from_the_shared_config(node: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(sliced("4"))
    out = tmp_path / "gfd"
    assert (
        fd("--sim-state", str(node), "--oneshot", "-o", str(out), "--config-file", str(cfg)).returncode == 0
    )
    labels = labels_of(out)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


@pytest.fixture
def daemon(node: Path, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [FD, "--sim-state", str(node), "-o", str(tmp_path / "gfd"), "--http-port", "-1", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(p)
        wait_until(lambda: (tmp_path / "gfd").exists())
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_unchanged_labels_are_not_rewritten_and_stop_sets_an_expiry(
    daemon: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    out = tmp_path / "gfd"
    p = daemon("--sleep-interval", "0.3s")
    first = out.stat()
    assert p.stdout is not None
    EventLog(p.stdout).wait_for("labels_unchanged", count=3)  # several passes with nothing changed
    assert out.stat().st_ino == first.st_ino
    assert out.stat().st_mtime_ns == first.st_mtime_ns
    before = labels_of(out)
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    text = out.read_text()
    assert text.startswith("# +expiry-time=20")  # NFD drops them if the labeler does not come back
    assert labels_of(out) == before  # the labels stay meanwhile: no blinking on restart


def test_delete_on_exit_is_available(daemon: Callable[..., subprocess.Popen[str]], tmp_path: Path) -> None:
    p = daemon("--labels-on-exit", "delete")
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    assert not (tmp_path / "gfd").exists()


def test_mig_change_is_labeled_within_two_seconds(
    daemon: Callable[..., subprocess.Popen[str]], node: Path, tmp_path: Path
) -> None:
    out = tmp_path / "gfd"
    daemon("--mig-strategy", "mixed", "--sleep-interval", "60s")
    assert "nvidia.com/mig-1g.5gb.count" not in labels_of(out)
    with sim.SimNode.open(node).mutate() as st:
        st.set_mig_mode(0, 1)
        st.reset_gpu(0)
        for _ in range(3):
            _, gi = st.create_gi(0, mig.GI_1_SLICE, None)
            st.create_ci(0, gi, mig.CI_1_SLICE, None)
    changed = time.monotonic()
    wait_until(lambda: labels_of(out).get("nvidia.com/mig-1g.5gb.count") == "3", timeout=5)
    assert time.monotonic() - changed <= 2.0
    assert labels_of(out)["nvidia.com/gpu.count"] == "8"  # the MIG-enabled GPU still counts as a GPU


def test_a_lost_gpu_drops_out_of_the_count(
    daemon: Callable[..., subprocess.Popen[str]], node: Path, tmp_path: Path
) -> None:
    out = tmp_path / "gfd"
    daemon("--sleep-interval", "60s")
    with sim.SimNode.open(node).mutate() as st:
        st.lose(5)
    wait_until(lambda: labels_of(out).get("nvidia.com/gpu.count") == "7", timeout=5)


def test_sighup_takes_a_new_timestamp(daemon: Callable[..., subprocess.Popen[str]], tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    p = daemon("--sleep-interval", "60s")
    stamp = labels_of(out)["nvidia.com/gfd.timestamp"]
    time.sleep(1.1)
    p.send_signal(signal.SIGHUP)
    wait_until(lambda: labels_of(out)["nvidia.com/gfd.timestamp"] != stamp, timeout=5)


def test_nvml_unavailable_without_fail_on_init_error(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    out.write_text("nvidia.com/gpu.count=8\nnvidia.com/gpu.product=stale\n")  # from an earlier run
    with sim.SimNode.open(node).mutate() as st:
        st.init_fault = "driver-not-loaded"
    p = subprocess.Popen(
        [
            FD,
            "--sim-state",
            str(node),
            "-o",
            str(out),
            "--fail-on-init-error=false",
            "--http-port",
            "0",
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: "nvidia.com/gpu.count" not in labels_of(out))
        assert not any(k.startswith("nvidia.com/gpu.") for k in labels_of(out))  # stale GPU labels removed
        assert p.poll() is None  # alive
        port = None
        assert p.stdout is not None
        deadline = time.monotonic() + 5
        while port is None and time.monotonic() < deadline:
            line = p.stdout.readline()
            if '"http_listening"' in line:
                port = int(line.split('"port":')[1].split(",")[0].split("}")[0])
        assert port is not None
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert exc.value.code == 503
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)


def test_init_failure_exits_1_by_default(node: Path, tmp_path: Path) -> None:
    with sim.SimNode.open(node).mutate() as st:
        st.init_fault = "library-not-found"
    r = fd("--sim-state", str(node), "--oneshot", "-o", str(tmp_path / "gfd"))
    assert r.returncode == 1
    assert "NVML Shared Library Not Found" in r.stderr


def test_env_vars_named_like_nvidias(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    env = {
        **os.environ,
        "GFD_ONESHOT": "true",
        "GFD_OUTPUT_FILE": str(out),
        "GFD_NO_TIMESTAMP": "true",
        "MIG_STRATEGY": "single",
        "GPUNODE_SIM_STATE": str(node),
    }
    r = subprocess.run([FD], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    labels = labels_of(out)
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert "nvidia.com/gfd.timestamp" not in labels

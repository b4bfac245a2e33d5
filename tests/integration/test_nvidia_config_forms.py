"""NVIDIA's config values in the forms NVIDIA's files use, fed to the real processes.

``flags.gfd.sleepInterval: 5`` (a YAML integer) once crashed feature discovery with a traceback; a time-
slicing entry with ``rename`` and a ``devices`` list (indices and a UUID) once made both agents exit 2.
NVIDIA's agents serve with these files, and so must these.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpunode.sim import nvml as sim
from helpers.waiting import EventLog

BIN = Path(sys.executable).parent
FD = str(BIN / "gpunode-feature-discovery")
PLUGIN = str(BIN / "gpunode-device-plugin")

CONFIG = """
version: v1
flags:
  failOnInitError: "true"
  gfd:
    sleepInterval: {interval}
    noTimestamp: "True"
  plugin:
    passDeviceSpecs: "false"
    deviceListStrategy: "envvar,cdi-annotations"
sharing:
  timeSlicing:
    renameByDefault: false
    resources:
    - name: nvidia.com/gpu
      replicas: 3
      rename: gpu-shared
      devices: [0, "1", GPU-3b5e8a1c-0000-0000-0000-000000000000]
"""


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


def labels_of(path: Path) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in path.read_text().splitlines() if line and line[0] != "#")


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    return proc.returncode, err


@pytest.mark.parametrize("interval", ["5", "2.5", '"5"', "5s", '"1m"'])
def test_feature_discovery_serves_with_an_interval_in_every_form(
    node: Path, tmp_path: Path, interval: str
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG.format(interval=interval))
    out = tmp_path / "gfd"
    proc = subprocess.Popen(
        [FD, "--sim-state", str(node), "--config-file", str(cfg), "-o", str(out), "--http-port", "-1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(out)
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert "Traceback" not in err
    labels = labels_of(out)
    # rename ignored as NVIDIA ignores it: nvidia.com/gpu is shared, so the product says -SHARED
    assert labels["nvidia.com/gpu.replicas"] == "3"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert "nvidia.com/gfd.timestamp" not in labels  # noTimestamp: "True"
    assert "config_field_ignored" in err
    assert "'rename' field in sharing.timeSlicing.resources is not yet supported" in err


@pytest.mark.parametrize(
    ("interval", "reason"),
    [
        ("[5]", "flags.gfd.sleepInterval: must be a string or a number"),
        ("true", "flags.gfd.sleepInterval: must be a string or a number, not a boolean"),
        ("soon", "invalid duration"),
        ("-5", "negative"),
        ("0", "must be positive"),
    ],
)
def test_feature_discovery_refuses_a_bad_interval_with_exit_2(
    node: Path, tmp_path: Path, interval: str, reason: str
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG.format(interval=interval))
    r = subprocess.run(
        [FD, "--sim-state", str(node), "--config-file", str(cfg), "-o", str(tmp_path / "gfd"), "--oneshot"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert reason in r.stderr
    assert "Traceback" not in r.stderr


def test_device_plugin_serves_with_nvidias_file(node: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG.format(interval=5))
    root = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # a socket path has at most 107 characters
    sockets = root / "var/lib/kubelet/device-plugins"
    sockets.mkdir(parents=True)
    proc = subprocess.Popen(
        [
            PLUGIN,
            "--sim-state",
            str(node),
            "--config-file",
            str(cfg),
            "--kubelet-socket",
            "",
            "--host-root",
            str(root),
            "--http-port",
            "-1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "LOG_FORMAT": "json"},
    )
    assert proc.stdout is not None
    log = EventLog(proc.stdout)
    try:
        wait_for(sockets / "nvidia-gpu.sock")  # NVIDIA's resource name, not nvidia.com/gpu-shared
        log.wait_for("resources", timeout=20)  # logged once every server is up (after the sockets)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(20)
    err = log.text()
    assert code == 0, err
    assert log.events("resources")[-1]["advertised"] == {"nvidia.com/gpu": 24}, err
    assert not (sockets / "nvidia-gpu-shared.sock").exists()
    shutil.rmtree(root)
    assert "Customizing the 'devices' field in sharing.timeSlicing.resources is not yet supported" in err

"""IMEX channels through the real plugin: Allocate hands out the channel whose node exists; a required
channel that is missing stops the process with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from gpunode.common.hostpaths import HostPaths
from gpunode.sim.kubelet import FakeKubelet

GPU = "nvidia.com/gpu"
PLUGIN = str(Path(sys.executable).parent / "gpunode-device-plugin")
Starter = Any  # the start_plugin fixture (see conftest.py)
CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"


async def test_allocate_hands_out_the_channel_as_device_spec_and_cdi_name(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    node = host / CHANNEL.lstrip("/")
    node.parent.mkdir(parents=True)
    node.write_text("c 234:0\n")  # the stand-in node gpunode sim init writes without CAP_MKNOD
    await start_plugin(
        "t4x4",
        host=HostPaths(root=host),
        overrides={
            "imex_channel_ids": (0,),
            "imex_required": True,
            "pass_device_specs": True,
            "device_list_strategies": ("envvar", "cdi-cri"),
        },
    )
    gpu = sorted(kubelet.healthy(GPU))[0]
    resp = (await kubelet.allocate(GPU, [gpu])).container_responses[0]
    assert resp.envs["NVIDIA_IMEX_CHANNELS"] == "0"
    assert [(d.container_path, d.host_path) for d in resp.devices if "imex" in d.container_path] == [
        (CHANNEL, CHANNEL)
    ]
    assert "k8s.device-plugin.nvidia.com/imex-channel=0" in [d.name for d in resp.cdi_devices]


async def test_missing_channel_not_required_is_left_out(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    await start_plugin("t4x4", overrides={"imex_channel_ids": (0,), "pass_device_specs": True})
    gpu = sorted(kubelet.healthy(GPU))[0]
    resp = (await kubelet.allocate(GPU, [gpu])).container_responses[0]
    assert "NVIDIA_IMEX_CHANNELS" not in resp.envs
    assert not [d for d in resp.devices if "imex" in d.container_path]


def test_required_missing_channel_exits_2_naming_the_path(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            PLUGIN,
            "--simulate",
            "t4x4",
            "--sim-state",
            str(tmp_path / "node.json"),
            "--kubelet-socket",
            "",
            "--http-port",
            "-1",
            "--host-root",
            str(tmp_path),
            "--imex-channel-ids",
            "0",
            "--imex-required",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2, out.stderr
    assert "requested IMEX channel channel0 does not exist" in out.stderr
    assert str(tmp_path / CHANNEL.lstrip("/")) in out.stderr


def test_channel_ids_other_than_0_are_refused(tmp_path: Path) -> None:
    out = subprocess.run(
        [PLUGIN, "--simulate", "t4x4", "--kubelet-socket", "", "--imex-channel-ids", "3"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "IMEX channel IDs must be [] or [0]" in out.stderr

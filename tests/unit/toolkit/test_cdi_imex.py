"""The IMEX channel CDI spec (``--class imex-channel``): one device per channel node, plus ``all``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.common.hostpaths import HostPaths
from gpunode.toolkit.cdi import SpecOptions
from gpunode.toolkit.cdi_imex import build_imex_spec, discover_channels, is_imex_kind

KIND = "k8s.device-plugin.nvidia.com/imex-channel"


def make(root: Path, name: str, text: str) -> None:
    path = root / "dev/nvidia-caps-imex-channels" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_discovers_channel_nodes_in_numeric_order_and_nothing_else(tmp_path: Path) -> None:
    make(tmp_path, "channel10", "c 234:10\n")
    make(tmp_path, "channel2", "c 234:2\n")
    make(tmp_path, "channelx", "c 234:3\n")
    make(tmp_path, "channel4", "a note, not a node\n")
    assert discover_channels(HostPaths(root=tmp_path), "/") == [2, 10]
    assert discover_channels(HostPaths(root=tmp_path / "absent"), "/") == []


def test_spec_has_a_device_per_channel_and_all() -> None:
    spec = build_imex_spec([2, 0], SpecOptions(kind=KIND, dev_root="/run/nvidia/driver"))
    doc = spec.to_dict()
    assert spec.names == [f"{KIND}=0", f"{KIND}=2", f"{KIND}=all"]
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [
        {
            "path": "/dev/nvidia-caps-imex-channels/channel0",
            "hostPath": "/run/nvidia/driver/dev/nvidia-caps-imex-channels/channel0",
        }
    ]
    assert len(doc["devices"][2]["containerEdits"]["deviceNodes"]) == 2
    assert "containerEdits" not in doc  # no driver mounts, no hooks: the GPU spec has those
    assert doc["cdiVersion"] == "0.5.0"  # names that begin with a digit


def test_no_channels_no_devices_and_no_all_device_option() -> None:
    assert build_imex_spec([], SpecOptions(kind=KIND)).devices == ()
    spec = build_imex_spec([0], SpecOptions(kind=KIND, all_device=False))
    assert spec.names == [f"{KIND}=0"]


@pytest.mark.parametrize(
    ("kind", "imex"), [(KIND, True), ("nvidia.com/imex-channel", True), ("nvidia.com/gpu", False)]
)
def test_is_imex_kind(kind: str, imex: bool) -> None:
    assert is_imex_kind(kind) is imex

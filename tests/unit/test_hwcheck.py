"""hw-check's pure parts: masking, the preset for a product name, the comparisons, the read-only root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpunode.hwcheck import _real_host_root, _series, choose_preset, compare, mask


def test_mask_hides_uuids_bus_ids_and_serials() -> None:
    text = (
        "GPU-0d4c2a5e-6f1b-4c3d-9e8f-0a1b2c3d4e5f MIG-11111111-2222-3333-4444-555555555555 "
        "00000000:07:00.0 0000:3b:00.0 serial 1650921001234 cluster 6c2f4a9e-1d7b-4e8a-9f35-b2a1c0d4e7f8 "
        "gpu 7 driver 550.54.15"
    )
    assert mask(text) == (
        "GPU-<uuid> MIG-<uuid> <bus-id> <bus-id> serial <serial> cluster <uuid> gpu 7 driver 550.54.15"
    )


@pytest.mark.parametrize(
    ("product", "count", "preset"),
    [
        ("NVIDIA H200", 8, "hgx-h200"),
        ("NVIDIA H200", 1, "hgx-h200"),
        ("NVIDIA A100-SXM4-40GB", 8, "dgx-a100"),
        ("Tesla T4", 4, "t4x4"),
        ("NVIDIA B200", 8, "dgx-b200"),
        ("NVIDIA GB200", 4, "gb200-nvl4"),
        ("NVIDIA RTX 9999", 1, None),
    ],
)
def test_preset_from_the_product_name(product: str, count: int, preset: str | None) -> None:
    assert choose_preset(product, count) == preset


def test_compare_lists_only_real_only_preset_and_changed() -> None:
    assert compare("labels", {"a": "1", "b": "2"}, {"a": "1", "b": "2"}) == []
    assert compare("labels", {"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == [
        "  b: real 2 | preset 3",
        "  only preset: c=4",
    ]
    assert compare("device-plugin", {"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 8}) == [
        "  nvidia.com/gpu: real 1 | preset 8"
    ]
    assert compare("doctor", {"nvml": ("ok", "x")}, {"nvml": ("ok", "x")}) == []
    assert compare("mig", "a\nb\n", "a\nc\n")[-2:] == ["  -c", "  +b"]
    cdi = {"devices": {"nvidia.com/gpu=0": ["/dev/nvidia0"]}, "control nodes": ["/dev/nvidiactl"]}
    assert compare("cdi", cdi, cdi) == []
    other = {"devices": {}, "control nodes": []}
    assert compare("cdi", cdi, other) == [
        "  only real:   nvidia.com/gpu=0=/dev/nvidia0",
        "  control nodes: real ['/dev/nvidiactl'] | preset []",
    ]


def test_exporter_series_compare_label_keys_never_values() -> None:
    real = _series('# HELP x\nDCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 41\nup 1\n')
    preset = _series('DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="GPU-b"} 77\nup 0\n')
    assert real == {"DCGM_FI_DEV_GPU_TEMP": {"UUID,gpu"}, "up": {""}}
    assert compare("exporter", real, preset) == []
    assert compare("exporter", real, _series("up 1\n")) == ["  only real:   DCGM_FI_DEV_GPU_TEMP=UUID,gpu"]


def test_the_read_only_root_links_everything_but_the_plugin_directory(tmp_path: Path) -> None:
    root = _real_host_root(tmp_path / "root")
    assert os.readlink(root / "proc") == "/proc"
    assert os.readlink(root / "sys") == "/sys"
    own = root / "var/lib/kubelet/device-plugins"
    assert own.is_dir()
    assert not own.is_symlink()
    assert not (root / "var").is_symlink()
    assert not (root / "var/lib").is_symlink()
    if Path("/var/log").exists():
        assert os.readlink(root / "var/log") == "/var/log"  # the rest of /var stays the real one
    (own / "probe.sock").write_text("")
    assert not Path("/var/lib/kubelet/device-plugins/probe.sock").exists()

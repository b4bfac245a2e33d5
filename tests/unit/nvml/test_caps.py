"""gpunode.nvml.caps: the driver's MIG capability table, and GpuInfo.mig_enabled."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpunode.common.hostpaths import HostPaths
from gpunode.nvml.api import GpuInfo, MigMode, PciInfo
from gpunode.nvml.caps import mig_cap_keys, mig_minors_path, parse_mig_minors, read_mig_minors

GPU = GpuInfo(
    index=0,
    minor=0,
    uuid="GPU-0",
    name="NVIDIA A100-SXM4-40GB",
    serial=None,
    pci=PciInfo("00000000:07:00.0", 0, 7, 0, 0x20B010DE, 0x134F10DE),
    numa_node=None,
    memory_total_mib=40960,
    compute_capability=(8, 0),
    architecture="ampere",
    brand="nvidia",
    sm_count=108,
    mig=None,
)


def test_mig_cap_keys() -> None:
    assert mig_cap_keys(3, 1, 0) == ("gpu3/gi1/access", "gpu3/gi1/ci0/access")


def test_read_mig_minors(tmp_path: Path) -> None:
    host = HostPaths(root=tmp_path)
    assert read_mig_minors(host) is None  # no driver: unreadable, not empty
    path = mig_minors_path(host)
    assert path == tmp_path / "proc/driver/nvidia-caps/mig-minors"
    path.parent.mkdir(parents=True)
    path.write_text("config 1\nmonitor 2\ngpu0/gi1/access 12\nbroken line here\n")
    assert read_mig_minors(host) == parse_mig_minors(path.read_text())
    assert read_mig_minors(host) == {"config": 1, "monitor": 2, "gpu0/gi1/access": 12}


def test_mig_enabled_is_the_current_mode() -> None:
    assert not GPU.mig_enabled  # not MIG-capable
    assert not replace(GPU, mig=MigMode(current=False, pending=True)).mig_enabled
    assert replace(GPU, mig=MigMode(current=True, pending=True)).mig_enabled
    assert replace(GPU, mig=MigMode(current=True, pending=False)).mig_enabled

"""The NVML library against every simulator preset: identity, memory, topology as the real products report."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpunode.nvml.api import TopoLevel
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim

# preset -> (count, name, memory MiB, CC, SMs, PCI device id, arch, MIG capable, NVLinks between GPU 0 and 1)
PRESET_FACTS = {
    "dgx-a100": (8, "NVIDIA A100-SXM4-40GB", 40960, (8, 0), 108, 0x20B010DE, "ampere", True, 12),
    "dgx-a100-80gb": (8, "NVIDIA A100-SXM4-80GB", 81920, (8, 0), 108, 0x20B210DE, "ampere", True, 12),
    "dgx-h100": (8, "NVIDIA H100 80GB HBM3", 81559, (9, 0), 132, 0x233010DE, "hopper", True, 18),
    "hgx-h200": (8, "NVIDIA H200", 143771, (9, 0), 132, 0x233510DE, "hopper", True, 18),
    "a30x4": (4, "NVIDIA A30", 24576, (8, 0), 56, 0x20B710DE, "ampere", True, 0),
    "t4x4": (4, "Tesla T4", 15360, (7, 5), 40, 0x1EB810DE, "turing", False, 0),
    "dgx-b200": (8, "NVIDIA B200", 183359, (10, 0), 148, 0x290110DE, "blackwell", True, 18),
    "gb200-nvl4": (4, "NVIDIA GB200", 189471, (10, 0), 152, 0x294110DE, "blackwell", True, 18),
    "h100-nvl": (4, "NVIDIA H100 NVL", 95830, (9, 0), 132, 0x232110DE, "hopper", True, 12),
    "l4x8": (8, "NVIDIA L4", 23034, (8, 9), 58, 0x27B810DE, "ada", False, 0),
    "l40sx4": (4, "NVIDIA L40S", 46068, (8, 9), 142, 0x26B910DE, "ada", False, 0),
    "a10x4": (4, "NVIDIA A10", 23028, (8, 6), 72, 0x223610DE, "ampere", False, 0),
    "a2x2": (2, "NVIDIA A2", 15356, (8, 6), 10, 0x25B610DE, "ampere", False, 0),
}
BLACKWELL = {"dgx-b200", "gb200-nvl4"}


def test_every_preset_is_listed() -> None:
    assert set(PRESET_FACTS) | {"mixed", "mixed-ada-ampere"} == set(sim.preset_names())


@pytest.mark.parametrize("preset", sorted(PRESET_FACTS))
async def test_inventory_matches_the_product(preset: str) -> None:
    count, name, mib, cc, sms, pci_id, arch, mig_capable, links01 = PRESET_FACTS[preset]
    sim.install(preset)
    nvml = await RealNvml.open()
    try:
        gpus = await nvml.gpus()
        topo = await nvml.topology()
        system = await nvml.system()
    finally:
        await nvml.close()
    assert len(gpus) == count
    assert [g.index for g in gpus] == list(range(count))
    assert [g.minor for g in gpus] == list(range(count))
    assert len({g.uuid for g in gpus}) == count
    assert len({g.pci.bus_id for g in gpus}) == count
    for g in gpus:
        assert g.name == name
        assert g.memory_total_mib == mib
        assert g.compute_capability == cc
        assert g.sm_count == sms
        assert g.pci.device_id == pci_id
        assert g.architecture == arch
        assert g.mig_capable is mig_capable
        assert g.uuid.startswith("GPU-")
        assert g.pci.bus_id.startswith("000000" if preset == "gb200-nvl4" else "00000000:")
        assert g.numa_node is not None
    assert topo.link_count(0, 1) == links01
    assert topo.link_count(0, 0) == 0
    if preset in BLACKWELL:  # Blackwell needs R570 (CUDA 12.8)
        assert system.driver_version == "570.124.06"
        assert system.cuda_version == (12, 8)
    else:
        assert system.driver_version == "550.54.15"
        assert system.cuda_version == (12, 4)


async def test_mixed_node_has_one_nvlink_bridge_and_pcie_levels() -> None:
    sim.install("mixed")
    nvml = await RealNvml.open()
    try:
        gpus = await nvml.gpus()
        topo = await nvml.topology()
    finally:
        await nvml.close()
    assert [g.name for g in gpus] == ["NVIDIA A100 80GB PCIe"] * 2 + ["Tesla T4"] * 2
    assert [g.mig_capable for g in gpus] == [True, True, False, False]
    assert topo.link_count(0, 1) == 12
    assert topo.link_count(1, 0) == 12
    assert topo.link_count(0, 2) == 0
    assert topo.link_count(2, 3) == 0
    assert topo.level(0, 1) == TopoLevel.PXB  # same PCIe switch
    assert topo.level(2, 3) == TopoLevel.NODE  # same socket, different NUMA-local bridges
    assert topo.level(0, 3) == TopoLevel.SYS  # across sockets
    matrix = topo.matrix().splitlines()
    assert matrix[1].split()[:5] == ["GPU0", "X", "NV12", "SYS", "SYS"]


async def test_dgx_a100_pcie_levels_follow_the_board() -> None:
    sim.install("dgx-a100")
    nvml = await RealNvml.open()
    try:
        topo = await nvml.topology()
    finally:
        await nvml.close()
    assert topo.level(0, 1) == TopoLevel.PXB  # GPU pairs share a PCIe switch
    assert topo.level(0, 2) == TopoLevel.NODE  # same socket, other NUMA node
    assert topo.level(0, 4) == TopoLevel.SYS  # other socket
    assert topo.numa_nodes == (3, 3, 1, 1, 7, 7, 5, 5)


def test_plain_pynvml_in_a_fresh_process_sees_eight_a100s() -> None:
    """The issue's acceptance check, in a fresh interpreter with nothing but pynvml and install()."""
    code = textwrap.dedent(
        """
        import pynvml
        from gpunode.sim import nvml as sim
        sim.install("dgx-a100")
        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20
            cc = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            out.append(f"{pynvml.nvmlDeviceGetName(h)}|{mem}|{cc[0]}.{cc[1]}")
        print("\\n".join(out))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines() == ["NVIDIA A100-SXM4-40GB|40960|8.0"] * 8

"""NVLink fabric info (GB200) and the Ada, Ampere-PCIe, Hopper-PCIe and Blackwell product facts, through plain
pynvml and through gpunode.nvml.

Expected values are the published facts (data sheets, pci.ids, `nvidia-smi` output, nvml.h), written here
independently of the presets; the clique value has NVIDIA's format (reference/feature-discovery.md
§1: ``<clusterUUID>.<cliqueId>``, counted only when state = COMPLETED, status = SUCCESS, UUID non-zero).
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pynvml
import pytest

from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim
from gpunode.sim.nvml import presets

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.\d+$")


def _handle(preset: str, index: int = 0) -> tuple[sim.FakeNvmlLib, object]:
    lib = sim.install(preset)
    pynvml.nvmlInit()
    return lib, pynvml.nvmlDeviceGetHandleByIndex(index)


# -- fabric info through pynvml ------------------------------------------------------------------------


def test_gb200_fabric_info_v_v2_v3_and_v1_agree() -> None:
    _, h = _handle("gb200-nvl4", 2)
    v2 = pynvml.c_nvmlGpuFabricInfo_v2_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v2))
    v3 = pynvml.c_nvmlGpuFabricInfo_v3_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v3))
    v1 = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(v1))
    for info in (v1, v2, v3):
        assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        assert info.status == pynvml.NVML_SUCCESS
        assert any(bytes(info.clusterUuid))
        assert bytes(info.clusterUuid) == bytes(v1.clusterUuid)
        assert info.cliqueId == v1.cliqueId
    assert v2.healthMask & 0x3 == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
    assert v3.healthSummary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY


def test_fabric_info_wrong_version_is_a_version_mismatch() -> None:
    _, h = _handle("gb200-nvl4")
    info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    info.version = 0x01000024
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))


def test_fabric_info_before_hopper_is_not_supported_and_without_a_fabric_not_supported_state() -> None:
    _, h = _handle("dgx-a100")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(pynvml.c_nvmlGpuFabricInfo_v2_t()))
    _, h = _handle("dgx-b200")
    info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    assert not any(bytes(info.clusterUuid))


@pytest.mark.parametrize(
    ("fault", "state", "status", "attached", "degraded", "health"),
    [
        pytest.param(None, "completed", 0, True, False, "healthy", id="trained"),
        pytest.param("not-trained", "not-started", 0, False, None, "not-supported", id="not-trained"),
        pytest.param("training", "in-progress", 0, False, None, "not-supported", id="training"),
        pytest.param("failed", "completed", 999, False, None, "unhealthy", id="failed"),
        pytest.param("degraded", "completed", 0, True, True, "limited-capacity", id="degraded"),
    ],
)
async def test_fabric_faults_through_gpunode_nvml(
    fault: str | None, state: str, status: int, attached: bool, degraded: bool | None, health: str
) -> None:
    lib = sim.install("gb200-nvl4")
    with lib.node.mutate() as st:
        st.set_fabric_fault(1, fault)
    nvml = await RealNvml.open()
    try:
        info = await nvml.fabric_info(1)
        clique = await nvml.fabric_clique(1)
        healthy = await nvml.fabric_info(0)
    finally:
        await nvml.close()
    assert info is not None
    assert healthy is not None
    assert (info.state, info.status, info.attached, info.degraded_bandwidth, info.health) == (
        state,
        status,
        attached,
        degraded,
        health,
    )
    assert (clique is not None) is attached
    if attached:
        assert clique == healthy.clique
        assert clique is not None
        assert UUID_RE.match(clique)
    assert healthy.attached  # a fault stays on its GPU


async def test_every_gb200_gpu_reports_the_same_clique_and_no_other_preset_has_one() -> None:
    cliques: dict[str, set[str | None]] = {}
    for preset in ("gb200-nvl4", "dgx-b200", "dgx-h100", "l4x8"):
        sim.install(preset)
        nvml = await RealNvml.open()
        try:
            gpus = await nvml.gpus()
            cliques[preset] = {await nvml.fabric_clique(g.index) for g in gpus}
        finally:
            await nvml.close()
    (gb200,) = cliques.pop("gb200-nvl4")
    assert gb200 is not None
    cluster, clique = gb200.rsplit(".", 1)
    assert str(uuid.UUID(cluster)) == cluster
    assert int(clique) > 0
    assert all(v == {None} for v in cliques.values()), cliques


def test_fabric_fault_survives_the_state_file_and_restore_clears_it(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    gpunode = [sys.executable, "-m", "gpunode.cli"]
    run = subprocess.run

    def sim_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run(
            [*gpunode, "sim", *args, "--state", str(state)], capture_output=True, text=True, timeout=60
        )

    assert sim_cli("init", "gb200-nvl4").returncode == 0
    done = sim_cli("fabric", "--gpu", "3", "degraded")
    assert done.returncode == 0, done.stderr
    assert json.loads(state.read_text())["gpus"][3]["fabric_fault"] == "degraded"
    assert "fabric degraded" in sim_cli("show").stdout
    bad = sim_cli("fabric", "--gpu", "3", "melted")
    assert bad.returncode == 2
    assert "invalid choice" in bad.stderr
    assert sim_cli("restore", "--gpu", "3").returncode == 0
    assert json.loads(state.read_text())["gpus"][3]["fabric_fault"] is None
    other = tmp_path / "b200.json"
    assert run([*gpunode, "sim", "init", "dgx-b200", "--state", str(other)], timeout=60).returncode == 0
    refused = run(
        [*gpunode, "sim", "fabric", "--gpu", "0", "degraded", "--state", str(other)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "has no NVLink fabric" in refused.stderr


def test_unknown_preset_exits_2_listing_the_presets(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpunode.cli", "sim", "init", "dgx-b300", "--state", str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    for name in ("dgx-b200", "gb200-nvl4", "l4x8", "l40sx4", "a10x4", "a2x2", "h100-nvl", "mixed-ada-ampere"):
        assert name in done.stderr
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["gpunode", "demo", "--preset", "dgx-b300"], id="demo"),
        pytest.param(["gpunode-feature-discovery", "--simulate", "dgx-b300", "--oneshot"], id="agent"),
        pytest.param(["gpunode-mig", "export", "--simulate", "dgx-b300"], id="verb-agent"),
    ],
)
def test_every_cli_taking_a_preset_exits_2_on_an_unknown_one(argv: list[str]) -> None:
    command = [str(Path(sys.executable).parent / argv[0]), *argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "unknown simulator preset 'dgx-b300'" in done.stderr
    assert "dgx-b200, dgx-h100, gb200-nvl4" in done.stderr


# -- product facts beyond the inventory ------------------------------------------------------------------

# preset -> (power limit min W, max W, PCIe gen, width, NVLink version on link 0 or None, ECC)
EXTRA_FACTS = {
    "l4x8": (40, 72, 4, 16, None),
    "l40sx4": (100, 350, 4, 16, None),
    "a10x4": (100, 150, 4, 16, None),
    "a2x2": (40, 60, 4, 8, None),
    "h100-nvl": (200, 400, 5, 16, 4),
    "dgx-b200": (200, 1000, 5, 16, 5),
    "gb200-nvl4": (200, 1200, 5, 16, 5),
}


@pytest.mark.parametrize("preset", sorted(EXTRA_FACTS))
def test_power_pcie_nvlink_ecc(preset: str) -> None:
    lo, hi, gen, width, nvlink = EXTRA_FACTS[preset]
    _, h = _handle(preset)
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [lo * 1000, hi * 1000]
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == hi * 1000
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == gen
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == width
    assert pynvml.nvmlDeviceGetEccMode(h) == [1, 1]
    if nvlink is None:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(h, 0)
    else:
        assert pynvml.nvmlDeviceGetNvLinkVersion(h, 0) == nvlink


def test_gb200_gpus_sit_in_their_own_pci_domains_under_two_grace_cpus() -> None:
    sim.install("gb200-nvl4")
    pynvml.nvmlInit()
    bus_ids = [pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(4)]
    assert bus_ids == ["00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"]
    h = pynvml.nvmlDeviceGetHandleByPciBusId("0018:01:00.0")
    assert pynvml.nvmlDeviceGetIndex(h) == 2
    assert [pynvml.nvmlDeviceGetNumaNodeId(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)] == [
        0,
        0,
        1,
        1,
    ]
    remote = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(pynvml.nvmlDeviceGetHandleByIndex(0), 17)
    assert remote == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH


def test_mixed_ada_ampere_node() -> None:
    sim.install("mixed-ada-ampere")
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    assert [pynvml.nvmlDeviceGetName(h) for h in handles] == ["NVIDIA L40S"] * 2 + ["NVIDIA A10"] * 2
    assert [pynvml.nvmlDeviceGetArchitecture(h) for h in handles] == [8, 8, 7, 7]
    assert [pynvml.nvmlDeviceGetCudaComputeCapability(h) for h in handles] == [(8, 9)] * 2 + [(8, 6)] * 2


def test_inferred_fields_name_real_fields() -> None:
    """Every value a preset marks as inferred names a field of the product (or its MIG table)."""
    fields = set(presets.Product.__dataclass_fields__)
    for product in presets.PRODUCTS.values():
        for name in product.inferred:
            assert name.split("[")[0] in fields, (product.key, name)
    assert "gi_profiles[3g,4g,7g]" in presets.B200.inferred

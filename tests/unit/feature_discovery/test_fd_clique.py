"""``nvidia.com/gpu.clique`` on the simulated GB200 NVL72 tray, through the real path (pynvml over the
simulated library, RealNvml, gather_facts, compute_labels), with the simulator's fabric faults.

NVIDIA's rule (shared/reference/feature-discovery.md §1): the value is ``<clusterUUID>.<cliqueId>``; a GPU
counts only when its fabric state is COMPLETED, its status SUCCESS and its cluster UUID non-zero; the label
is written when every such GPU agrees.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpunode.common.hostpaths import HostPaths
from gpunode.feature_discovery.facts import gather_facts
from gpunode.feature_discovery.labels import compute_labels
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim

CLIQUE = "nvidia.com/gpu.clique"
FORMAT = re.compile(r"^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\.[0-9]+$")


async def _labels(preset: str, faults: dict[int, str], tmp_path: Path) -> dict[str, str]:
    lib = sim.install(preset)
    with lib.node.mutate() as state:
        for gpu, fault in faults.items():
            state.set_fabric_fault(gpu, fault)
    nvml = await RealNvml.open()
    try:
        facts = await gather_facts(nvml, HostPaths(root=tmp_path), tmp_path / "product_name")
    finally:
        await nvml.close()
    return compute_labels(facts, mig_strategy="none", sharing=None, timestamp=None).labels


@pytest.mark.parametrize(
    ("faults", "labelled"),
    [
        pytest.param({}, True, id="all-trained"),
        pytest.param({1: "degraded"}, True, id="degraded-still-attached"),
        pytest.param({3: "failed"}, True, id="one-failed-the-others-agree"),
        pytest.param({0: "training", 1: "training"}, True, id="two-training"),
        pytest.param({i: "not-trained" for i in range(4)}, False, id="none-trained"),
        pytest.param({0: "failed", 1: "failed", 2: "not-trained", 3: "training"}, False, id="none-attached"),
    ],
)
async def test_gb200_clique_label(faults: dict[int, str], labelled: bool, tmp_path: Path) -> None:
    labels = await _labels("gb200-nvl4", faults, tmp_path)
    if labelled:
        assert FORMAT.match(labels[CLIQUE]), labels[CLIQUE]
        fabric = sim.PRESETS["gb200-nvl4"].fabric
        assert fabric is not None
        assert labels[CLIQUE] == f"{fabric.cluster_uuid}.{fabric.clique_id}"
    else:
        assert CLIQUE not in labels


@pytest.mark.parametrize("preset", ["dgx-b200", "dgx-h100", "l40sx4", "dgx-a100"])
async def test_no_clique_without_an_nvlink_fabric(preset: str, tmp_path: Path) -> None:
    assert CLIQUE not in await _labels(preset, {}, tmp_path)

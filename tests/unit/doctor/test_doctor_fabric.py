"""`gpunode doctor`'s fabric check on simulated nodes: GB200 NVL trays with each fabric fault, and nodes
without an NVLink fabric (the check does not apply there)."""

from __future__ import annotations

import pytest

from gpunode import doctor
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim


async def _fabric(preset: str, faults: dict[int, str]) -> doctor.Check:
    lib = sim.install(preset)
    with lib.node.mutate() as state:
        for gpu, fault in faults.items():
            state.set_fabric_fault(gpu, fault)
    nvml = await RealNvml.open()
    try:
        facts = doctor._Facts(nvml=nvml, gpus=await nvml.gpus())
        return await doctor._fabric_check(facts)
    finally:
        await nvml.close()


@pytest.mark.parametrize(
    ("faults", "status", "words"),
    [
        pytest.param({}, "ok", ("4 GPUs on the NVLink fabric", "clique 6c2f4a9e-"), id="trained"),
        pytest.param(
            {2: "not-trained"}, "warn", ("not trained yet", "GPU 2 (not-started)"), id="not-trained"
        ),
        pytest.param({0: "training"}, "warn", ("GPU 0 (in-progress)",), id="training"),
        pytest.param({1: "degraded"}, "warn", ("fabric degraded", "GPU 1 (limited-capacity)"), id="degraded"),
        pytest.param(
            {3: "failed", 1: "degraded"}, "fail", ("registration failed", "GPU 3 (status 999)"), id="failed"
        ),
    ],
)
async def test_gb200_fabric_check(faults: dict[int, str], status: str, words: tuple[str, ...]) -> None:
    check = await _fabric("gb200-nvl4", faults)
    assert check.name == "fabric"
    assert check.status == status, check
    for word in words:
        assert word in check.detail, check
    if status != "ok":
        assert "nvidia-smi -q -d FABRIC" in check.fix


@pytest.mark.parametrize("preset", ["dgx-b200", "dgx-a100", "l4x8"])
async def test_no_fabric_is_skipped(preset: str) -> None:
    check = await _fabric(preset, {})
    assert check.status == "skip"
    assert "no GPU on an NVLink fabric" in check.detail


async def test_without_nvml_the_check_is_skipped() -> None:
    check = await doctor._fabric_check(doctor._Facts())
    assert (check.status, check.detail) == ("skip", "NVML unavailable")

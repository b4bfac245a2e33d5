"""RealNvml.gpm_utilization (GPM, Hopper and later) over the simulated library."""

from __future__ import annotations

import pytest

from gpunode.nvml import errors
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_gpm_utilization_is_none_without_gpm(nvml_sim: sim.FakeNvmlLib) -> None:
    nvml = await RealNvml.open()
    try:
        assert await nvml.gpm_utilization(0) is None
        assert await nvml.gpm_utilization(0) is None
        assert nvml_sim.symbols["nvmlGpmSampleAlloc"].calls == 0
    finally:
        await nvml.close()


async def test_gpm_utilization_measures_between_calls(clock: Clock) -> None:
    lib = sim.install("dgx-h100", clock=clock)
    nvml = await RealNvml.open()
    try:
        assert await nvml.gpm_utilization(0) is None  # the first call only takes a sample
        clock.now += 15
        first = await nvml.gpm_utilization(0)
        assert first is not None
        assert set(first) == {
            "graphics",
            "tensor",
            "dram",
            "sm_active",
            "sm_occupancy",
            "fp64",
            "fp32",
            "fp16",
        }
        assert all(0.0 <= v <= 100.0 for v in first.values())
        assert first["tensor"] == pytest.approx(first["graphics"] * 0.55)
        clock.now += 15
        second = await nvml.gpm_utilization(0)
        assert second is not None
        assert second != first  # a new interval, on a moving curve
        assert lib.symbols["nvmlGpmSampleAlloc"].calls == 2  # two buffers, allocated once
        assert lib.symbols["nvmlGpmQueryDeviceSupport"].calls == 1
    finally:
        await nvml.close()
    assert lib.symbols["nvmlGpmSampleFree"].calls == 2


async def test_gpm_utilization_on_a_lost_gpu_raises_then_starts_over(clock: Clock) -> None:
    lib = sim.install("dgx-h100", clock=clock)
    nvml = await RealNvml.open()
    try:
        assert await nvml.gpm_utilization(5) is None
        with lib.node.mutate() as state:
            state.lose(5)
        with pytest.raises(errors.GpuLost):
            await nvml.gpm_utilization(5)
        with lib.node.mutate() as state:
            state.restore(5)
        assert await nvml.gpm_utilization(5) is None  # no interval spans the loss
        clock.now += 5
        assert await nvml.gpm_utilization(5) is not None
    finally:
        await nvml.close()

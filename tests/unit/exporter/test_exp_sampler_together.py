"""The sampler samples the GPUs together (the one NVML thread answers their calls back to back) and comes to
what one GPU after the other gives: a lost GPU keeps its identity with health 0, the first other error in
GPU order fails the pass, and a failed MIG read asks for the layout again.

The real path (pynvml over the simulated library, RealNvml) with faults injected per call and GPU.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpunode.exporter.sampler import Sampler
from gpunode.nvml import errors, mig
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim

MIG_GPUS = (1, 4)
PER_GPU = ("telemetry", "mig_mode", "mig_devices", "mig_memory", "gpm_utilization")


class Faulty:
    """RealNvml with chosen calls failing for chosen GPUs; records the calls and how many were in flight."""

    def __init__(self, real: RealNvml) -> None:
        self.real = real
        self.faults: dict[tuple[str, int], errors.NvmlError] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in PER_GPU:
            return getattr(self.real, name)

        async def call(index: int) -> Any:
            self.calls.append((name, index))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                result = await getattr(self.real, name)(index)
            finally:
                self.in_flight -= 1
            fault = self.faults.get((name, index))
            if fault is not None:
                raise fault
            return result

        return call


@pytest.fixture
async def nvml() -> AsyncIterator[Faulty]:
    lib = sim.install("dgx-h100")
    with lib.node.mutate() as st:
        for gpu in MIG_GPUS:
            st.set_mig_mode(gpu, 1)
            st.reset_gpu(gpu)
            for _ in range(3):
                ret, gi = st.create_gi(gpu, mig.GI_1_SLICE, None)
                assert ret == 0
                assert st.create_ci(gpu, gi, mig.CI_1_SLICE, None)[0] == 0
    real = await RealNvml.open()
    yield Faulty(real)
    await real.close()
    sim.uninstall()


async def test_the_gpus_are_sampled_together(nvml: Faulty) -> None:
    sampler = Sampler(nvml, interval=60)
    await sampler.sample()
    nvml.calls.clear()
    snap = await sampler.sample()
    assert nvml.most_in_flight >= 8  # every GPU's first call issued before any answer was taken
    assert [g.info.index for g in snap.gpus] == list(range(8))
    assert {g.info.index: len(g.migs) for g in snap.gpus if g.migs} == dict.fromkeys(MIG_GPUS, 3)
    for index in range(8):  # each GPU's own calls in the order one GPU alone makes them
        memory = ["mig_memory"] if index in MIG_GPUS else []
        assert [name for name, i in nvml.calls if i == index] == [
            "telemetry",
            "mig_mode",
            *memory,
            "gpm_utilization",
        ]


async def test_a_lost_gpu_keeps_its_identity(nvml: Faulty) -> None:
    sampler = Sampler(nvml, interval=60)
    await sampler.sample()
    nvml.faults[("telemetry", 2)] = errors.GpuLost("GPU 2 is lost")
    nvml.faults[("mig_memory", 4)] = errors.GpuLost("GPU 4 is lost")
    snap = await sampler.sample()
    assert [g.info.index for g in snap.gpus] == list(range(8))
    assert [g.info.index for g in snap.gpus if not g.healthy] == [2, 4]
    assert snap.gpus[4].info.uuid == sampler.known[4].uuid


async def test_the_first_error_in_gpu_order_fails_the_pass(nvml: Faulty) -> None:
    sampler = Sampler(nvml, interval=60)
    first = await sampler.sample()
    nvml.faults[("gpm_utilization", 6)] = errors.NvmlError("GPM of GPU 6")
    nvml.faults[("mig_memory", 4)] = errors.NvmlError("MIG memory of GPU 4")
    nvml.faults[("telemetry", 0)] = errors.GpuLost("GPU 0 is lost")
    with pytest.raises(errors.NvmlError, match="MIG memory of GPU 4"):
        await sampler.sample()
    assert sampler.latest is first
    del nvml.faults[("mig_memory", 4)]
    with pytest.raises(errors.NvmlError, match="GPM of GPU 6"):
        await sampler.sample()


async def test_a_failed_mig_read_asks_for_the_layout_again(nvml: Faulty) -> None:
    sampler = Sampler(nvml, interval=60)
    await sampler.sample()
    sampler.layout_changed.add(1)
    nvml.faults[("mig_devices", 1)] = errors.NvmlError("MIG devices of GPU 1")
    with pytest.raises(errors.NvmlError, match="MIG devices of GPU 1"):
        await sampler.sample()
    assert 1 in sampler.layout_changed
    del nvml.faults[("mig_devices", 1)]
    nvml.calls.clear()
    snap = await sampler.sample()
    assert ("mig_devices", 1) in nvml.calls
    assert ("mig_devices", 4) not in nvml.calls
    assert len(snap.gpus[1].migs) == 3

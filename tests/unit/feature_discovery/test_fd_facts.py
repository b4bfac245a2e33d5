"""gather_facts issues its NVML calls together (the NVML thread answers them back to back) and comes to what
one call after the other gives: a GPU lost in its MIG or fabric query is left out, a GPU lost in its MIG
query is left out whatever its fabric query answered, and the first other error in that order propagates.

The real path (pynvml over the simulated library, RealNvml) with faults injected per call and GPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.common.hostpaths import HostPaths
from gpunode.feature_discovery.facts import gather_facts
from gpunode.nvml import errors, mig
from gpunode.nvml.api import MigDevice
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim

MIG_GPUS = (0, 2, 5)


class Faulty:
    """RealNvml with chosen calls failing for chosen GPUs; counts the calls in flight."""

    def __init__(self, real: RealNvml, faults: dict[tuple[str, int], errors.NvmlError]) -> None:
        self.real = real
        self.faults = faults
        self.in_flight = 0
        self.most_in_flight = 0
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def _call(self, name: str, index: int) -> Any:
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

    async def mig_devices(self, index: int) -> list[MigDevice]:
        result: list[MigDevice] = await self._call("mig_devices", index)
        return result

    async def fabric_clique(self, index: int) -> str | None:
        result: str | None = await self._call("fabric_clique", index)
        return result


@pytest.fixture
async def nvml() -> AsyncIterator[RealNvml]:
    lib = sim.install("dgx-a100")
    with lib.node.mutate() as st:
        for gpu in MIG_GPUS:
            st.set_mig_mode(gpu, 1)
            st.reset_gpu(gpu)
            for _ in range(2):
                ret, gi = st.create_gi(gpu, mig.GI_1_SLICE, None)
                assert ret == 0
                assert st.create_ci(gpu, gi, mig.CI_1_SLICE, None)[0] == 0
    real = await RealNvml.open()
    yield real
    await real.close()
    sim.uninstall()


async def _facts(nvml: RealNvml, faults: dict[tuple[str, int], errors.NvmlError], tmp_path: Path) -> Any:
    faulty = Faulty(nvml, faults)
    facts = await gather_facts(faulty, HostPaths(root=tmp_path), None)
    return faulty, facts


async def test_all_answers_issued_together_in_order(nvml: RealNvml, tmp_path: Path) -> None:
    faulty, facts = await _facts(nvml, {}, tmp_path)
    assert faulty.calls == [("mig_devices", i) for i in MIG_GPUS] + [("fabric_clique", i) for i in range(8)]
    assert faulty.most_in_flight == len(faulty.calls)  # none waited for another's answer
    assert [g.index for g in facts.gpus] == list(range(8))
    assert {i: len(d) for i, d in facts.mig_devices.items()} == dict.fromkeys(MIG_GPUS, 2)
    assert facts.cliques == dict.fromkeys(range(8))


async def test_lost_gpus_are_left_out(nvml: RealNvml, tmp_path: Path) -> None:
    faults: dict[tuple[str, int], errors.NvmlError] = {
        ("mig_devices", 2): errors.GpuLost("GPU 2 is lost"),
        ("fabric_clique", 2): errors.NvmlError("not looked at: GPU 2 is already left out"),
        ("fabric_clique", 5): errors.GpuLost("GPU 5 is lost"),
        ("fabric_clique", 6): errors.GpuLost("GPU 6 is lost"),
    }
    _, facts = await _facts(nvml, faults, tmp_path)
    assert [g.index for g in facts.gpus] == [0, 1, 3, 4, 7]
    assert sorted(facts.mig_devices) == [0]
    assert sorted(facts.cliques) == [0, 1, 3, 4, 7]


async def test_the_first_other_error_in_call_order_propagates(nvml: RealNvml, tmp_path: Path) -> None:
    faults: dict[tuple[str, int], errors.NvmlError] = {
        ("fabric_clique", 0): errors.NvmlError("fabric of GPU 0"),
        ("mig_devices", 5): errors.NvmlError("MIG of GPU 5"),
        ("mig_devices", 2): errors.GpuLost("GPU 2 is lost"),
    }
    with pytest.raises(errors.NvmlError, match="MIG of GPU 5"):
        await _facts(nvml, faults, tmp_path)
    del faults[("mig_devices", 5)]
    with pytest.raises(errors.NvmlError, match="fabric of GPU 0"):
        await _facts(nvml, faults, tmp_path)


async def test_no_call_is_left_running_when_the_pass_is_cancelled(nvml: RealNvml, tmp_path: Path) -> None:
    faulty = Faulty(nvml, {})
    task = asyncio.ensure_future(gather_facts(faulty, HostPaths(root=tmp_path), None))
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    assert faulty.in_flight == 0

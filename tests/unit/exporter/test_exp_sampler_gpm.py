"""The sampler names every GPU without NVML GPM in one event, once (issue 18: what NVML cannot provide is
listed once), and reads the GPM ratios on Hopper."""

from __future__ import annotations

from typing import Any

from gpunode.exporter.sampler import Sampler
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    warning = error = info


async def test_gpus_without_gpm_are_one_event() -> None:
    sim.install("dgx-a100")
    nvml = await RealNvml.open()
    try:
        sampler = Sampler(nvml, interval=60)
        log = Recorder()
        sampler.log = log  # type: ignore[assignment]
        for _ in range(4):
            await sampler.sample()
    finally:
        await nvml.close()
        sim.uninstall()
    events = [fields for event, fields in log.events if event == "profiling_metrics_unavailable"]
    assert len(events) == 1
    assert events[0]["gpus"] == list(range(8))
    assert "DCGM_FI_PROF_SM_ACTIVE" in events[0]["metrics"]
    assert "DCGM_FI_PROF_PIPE_FP16_ACTIVE" in events[0]["metrics"]


async def test_hopper_has_every_gpm_ratio() -> None:
    sim.install("dgx-h100")
    nvml = await RealNvml.open()
    try:
        sampler = Sampler(nvml, interval=60)
        log = Recorder()
        sampler.log = log  # type: ignore[assignment]
        await sampler.sample()
        snap = await sampler.sample()
    finally:
        await nvml.close()
        sim.uninstall()
    assert not [e for e, _ in log.events if e == "profiling_metrics_unavailable"]
    for gpu in snap.gpus:
        assert gpu.gpm is not None
        assert set(gpu.gpm) >= {"graphics", "sm_active", "sm_occupancy", "fp64", "fp32", "fp16"}

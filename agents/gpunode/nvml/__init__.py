"""The shared NVML library: typed, async, on real hardware or the simulator beneath pynvml."""

from __future__ import annotations

from pathlib import Path

from gpunode.nvml.api import Nvml


async def open_nvml(
    driver_root: Path | str | None = None,
    simulate: str | None = None,
    sim_state: Path | str | None = None,
) -> Nvml:
    """Start NVML for an agent: the simulator when `simulate` or `sim_state` is given, else the driver."""
    from gpunode.nvml.real import RealNvml

    if simulate is not None or sim_state is not None:
        from gpunode.nvml import sim

        sim.install(simulate, sim_state)
    return await RealNvml.open(driver_root)


__all__ = ["Nvml", "open_nvml"]

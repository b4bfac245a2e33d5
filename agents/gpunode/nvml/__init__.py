"""The shared NVML library: typed and async, over pynvml (the driver's libnvidia-ml, or whatever library
was installed beneath pynvml, such as the simulator of :mod:`gpunode.sim.nvml`)."""

from __future__ import annotations

from pathlib import Path

from gpunode.nvml.api import Nvml


async def open_nvml(driver_root: Path | str | None = None) -> Nvml:
    """Start NVML through pynvml: the driver's library under `driver_root` (or the one already installed)."""
    from gpunode.nvml.real import RealNvml

    return await RealNvml.open(driver_root)


__all__ = ["Nvml", "open_nvml"]

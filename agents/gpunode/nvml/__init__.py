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


def check_simulation(preset: str | None, state: str | None) -> None:
    """Bad simulator arguments are usage errors (exit 2), found before anything starts: an unknown preset
    raises UnknownPreset (a LookupError listing the presets), a bad state file StateError (a ValueError)."""
    if preset is None and state is None:
        return
    from gpunode.nvml import sim

    if preset is not None:
        sim.get_preset(preset)
    if state is not None and Path(state).exists():
        node = sim.read_state_file(Path(state))
        if preset is not None and node.preset != preset:
            raise ValueError(f"{state}: holds preset {node.preset!r}, not {preset!r}")


__all__ = ["Nvml", "check_simulation", "open_nvml"]

"""Opening NVML for an agent: the driver's library, or the simulator beneath pynvml when asked to simulate."""

from __future__ import annotations

from pathlib import Path

from gpunode.nvml import Nvml


async def open_nvml(
    driver_root: Path | str | None = None,
    simulate: str | None = None,
    sim_state: Path | str | None = None,
) -> Nvml:
    """Start NVML for an agent: the simulator when `simulate` or `sim_state` is given, else the driver."""
    from gpunode.nvml import open_nvml as open_real

    if simulate is not None or sim_state is not None:
        from gpunode.sim import nvml as sim

        sim.install(simulate, sim_state)
    return await open_real(driver_root)


def check_simulation(preset: str | None, state: str | None) -> None:
    """Bad simulator arguments are usage errors (exit 2), found before anything starts: an unknown preset
    raises UnknownPreset (a LookupError listing the presets), a bad state file StateError (a ValueError)."""
    if preset is None and state is None:
        return
    from gpunode.sim import nvml as sim

    if preset is not None:
        sim.get_preset(preset)
    if state is not None and Path(state).exists():
        node = sim.read_state_file(Path(state))
        if preset is not None and node.preset != preset:
            raise ValueError(f"{state}: holds preset {node.preset!r}, not {preset!r}")


__all__ = ["check_simulation", "open_nvml"]

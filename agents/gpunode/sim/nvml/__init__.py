"""A faithful simulated libnvidia-ml beneath the real pynvml bindings.

    from gpunode.sim import nvml as sim
    sim.install("dgx-a100")              # this process now sees 8 simulated A100s through pynvml
    sim.install("dgx-a100", state=path)  # ... shared with every process given the same state file

`gpunode sim ...` drives a shared node from outside (faults, MIG layout, inspection).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gpunode.sim.nvml.lib import FakeNvmlLib, StrictModeViolation
from gpunode.sim.nvml.node import SimNode, init_state_file, read_state_file
from gpunode.sim.nvml.presets import PRESETS, UnknownPreset, get_preset, preset_names
from gpunode.sim.nvml.state import SimNodeState, StateError

__all__ = [
    "PRESETS",
    "FakeNvmlLib",
    "SimNode",
    "SimNodeState",
    "StateError",
    "StrictModeViolation",
    "UnknownPreset",
    "get_preset",
    "init_state_file",
    "install",
    "open_node",
    "preset_names",
    "read_state_file",
    "uninstall",
]


def open_node(
    preset: str | None = None,
    state: Path | str | None = None,
    *,
    seed: int = 0,
    clock: Callable[[], float] = time.time,
) -> SimNode:
    """A simulated node: from a state file (created from `preset` if missing) or in memory."""
    if state is None:
        if preset is None:
            raise ValueError("open_node needs a preset or a state file")
        return SimNode(SimNodeState.new(preset, seed=seed, now=clock()), None, clock)
    path = Path(state)
    if not path.exists():
        if preset is None:
            raise StateError(
                f"{path}: simulator state file does not exist (create it with `gpunode sim init`)"
            )
        try:
            init_state_file(path, preset, seed=seed)
        except StateError:
            pass  # another process created it first
    node = SimNode.open(path, clock)
    if preset is not None and node.state.preset != preset:
        raise StateError(f"{path}: holds preset {node.state.preset!r}, not {preset!r}")
    return node


def install(
    preset: str | None = None,
    state: Path | str | None = None,
    *,
    seed: int = 0,
    strict: bool = True,
    clock: Callable[[], float] = time.time,
) -> FakeNvmlLib:
    """Put a simulated libnvidia-ml beneath pynvml in this process and return it."""
    from gpunode.nvml.real import install_library

    if preset is not None:
        get_preset(preset)  # UnknownPreset lists the choices
    lib = FakeNvmlLib(open_node(preset, state, seed=seed, clock=clock), strict=strict)
    install_library(lib)
    return lib


def uninstall() -> None:
    """Forget any installed library; pynvml will load the real one on the next init."""
    from gpunode.nvml.real import install_library

    install_library(None)

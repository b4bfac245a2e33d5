"""Wiring shared by ``gpunode-mig`` and the MIG manager: opening the node (NVML, real or simulated, and
the GPU resetter that goes with it) and the runner of mig-parted's hooks for one config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpunode.common.hostpaths import HostPaths
from gpunode.common.settings import CommonSettings

if TYPE_CHECKING:
    from gpunode.mig.apply import HookRunner
    from gpunode.mig.state import Resetter
    from gpunode.nvml.api import Nvml

__all__ = ["hook_runner", "open_node"]


async def open_node(common: CommonSettings, host_root: str) -> tuple[Nvml, Resetter]:
    """NVML (the simulator under --simulate / --sim-state) and the matching GPU resetter (the PCI
    device's sysfs ``reset`` file under ``host_root`` on a real node)."""
    from gpunode.mig.state import SysfsResetter
    from gpunode.nvml.real import RealNvml

    resetter: Resetter
    if common.simulate or common.sim_state:
        from gpunode.sim import nvml as sim
        from gpunode.sim.mig_reset import SimResetter

        lib = sim.install(common.simulate, common.sim_state)
        resetter = SimResetter(lib.node)
    else:
        resetter = SysfsResetter(HostPaths(root=host_root))
    nvml = await RealNvml.open(common.driver_root)
    return nvml, resetter


def hook_runner(
    hooks_file: str | None,
    *,
    config_file: str | None,
    selected_config: str | None,
    skip_reset: bool = False,
    mode_only: bool = False,
) -> HookRunner | None:
    """What runs the hooks of ``hooks_file`` (None without one), with mig-parted's MIG_PARTED_*
    variables describing the apply; a bad hooks file is a ConfigError."""
    if not hooks_file:
        return None
    from gpunode.api.mig_hooks import load_hooks
    from gpunode.common.logging import get_logger
    from gpunode.mig.hooks import run_hooks

    hooks = load_hooks(hooks_file)
    base = {
        "MIG_PARTED_CONFIG_FILE": config_file or "",
        "MIG_PARTED_SELECTED_CONFIG": selected_config or "",
        "MIG_PARTED_HOOKS_FILE": hooks_file,
        "MIG_PARTED_SKIP_RESET": str(skip_reset).lower(),
        "MIG_PARTED_MODE_CHANGE_ONLY": str(mode_only).lower(),
    }
    log = get_logger("gpunode.mig")

    async def runner(name: str) -> None:
        await run_hooks(hooks, name, base, log=log)

    return runner

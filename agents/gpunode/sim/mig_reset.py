"""The GPU resetter for the simulated node (what the MIG manager uses instead of the sysfs ``reset`` file)."""

from __future__ import annotations

from gpunode.nvml.api import GpuInfo
from gpunode.nvml.errors import ResetFailed
from gpunode.sim.nvml import codes
from gpunode.sim.nvml.node import SimNode

__all__ = ["SimResetter"]


class SimResetter:
    """Reset a GPU of the simulated node (the simulator applies a pending mode change at reset)."""

    def __init__(self, node: SimNode) -> None:
        self.node = node

    async def reset(self, gpu: GpuInfo) -> None:
        with self.node.mutate() as st:
            rc = st.reset_gpu(gpu.index)
        if rc != codes.SUCCESS:
            reason = {codes.IN_USE: "in use (instances or processes)", codes.GPU_IS_LOST: "lost"}.get(
                rc, str(rc)
            )
            raise ResetFailed(f"GPU {gpu.index}: reset refused: {reason}")

"""The live MIG state of the node, read through the NVML library, and GPU resets.

:func:`read_states` turns what NVML reports into the planner's inputs (:class:`gpunode.mig.plan.GpuMigState`).
Resetting a GPU is not an NVML call (``nvidia-smi -r`` and mig-parted write the PCI device's sysfs
``reset`` file), so it sits behind :class:`Resetter`: :class:`SysfsResetter` on a real node,
:class:`gpunode.sim.mig_reset.SimResetter` on the simulated one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Protocol

from gpunode.api.mig_config import GpuIdentity
from gpunode.common.hostpaths import HostPaths
from gpunode.mig.plan import CiState, GiState, GpuMigState
from gpunode.nvml import errors
from gpunode.nvml.api import GpuInfo, Nvml
from gpunode.nvml.errors import ResetFailed


def identity(gpu: GpuInfo) -> GpuIdentity:
    return GpuIdentity(
        index=gpu.index,
        pci_device_id=gpu.pci.device_id,
        pci_subsystem_id=gpu.pci.subsystem_id,
        name=gpu.name,
        mig_capable=gpu.mig_capable,
    )


def needs_reset_for_mode(gpu: GpuInfo) -> bool:
    """Ampere (compute capability 8.0, A100 / A30) applies a MIG mode change only at a GPU reset; Hopper
    and later apply it at once (and forget it at reboot)."""
    return gpu.compute_capability[0] < 9


async def read_state(nvml: Nvml, gpu: GpuInfo) -> GpuMigState:
    """One GPU's MIG mode, profiles, instances and the processes using it."""
    mode = await nvml.mig_mode(gpu.index)
    procs: tuple[int, ...] = ()
    try:
        telemetry = await nvml.telemetry(gpu.index)
        procs = tuple(sorted({pid for pid, _ in telemetry.processes}))
    except errors.NvmlError:
        pass
    if mode is None:
        return GpuMigState(
            index=gpu.index,
            name=gpu.name,
            mig_capable=False,
            mode_current=False,
            mode_pending=False,
            reset_for_mode=False,
            compute_slices=0,
            memory_slices=0,
            gi_profiles=(),
            ci_profiles={},
            instances=(),
            processes=procs,
        )
    profiles = tuple(await nvml.gi_profiles(gpu.index))
    ci_profiles = {p.enum: tuple(await nvml.ci_profiles(gpu.index, p.enum)) for p in profiles}
    instances = []
    if mode.current:
        for gi in await nvml.gpu_instances(gpu.index):
            cis = tuple(
                CiState(ci.id, ci.profile_enum, ci.placement.size, ci.placement.start)
                for ci in await nvml.compute_instances(gpu.index, gi.id)
            )
            instances.append(GiState(gi.id, gi.profile, gi.placement.start, gi.placement.size, cis))
    compute = max((p.slices for p in profiles), default=0)
    return GpuMigState(
        index=gpu.index,
        name=gpu.name,
        mig_capable=True,
        mode_current=mode.current,
        mode_pending=mode.pending,
        reset_for_mode=needs_reset_for_mode(gpu),
        compute_slices=compute,
        memory_slices=8 if compute > 4 else 4,
        gi_profiles=profiles,
        ci_profiles=ci_profiles,
        instances=tuple(sorted(instances, key=lambda g: g.start)),
        processes=procs,
    )


async def read_states(nvml: Nvml, gpus: Iterable[GpuInfo]) -> list[GpuMigState]:
    return [await read_state(nvml, gpu) for gpu in gpus]


class Resetter(Protocol):
    async def reset(self, gpu: GpuInfo) -> None: ...


class SysfsResetter:
    """Reset one GPU by writing its PCI function's sysfs ``reset`` file (what mig-parted does without
    the driver, and what ``nvidia-smi -r`` amounts to): only the GPU named, never all of them."""

    def __init__(self, host: HostPaths) -> None:
        self.host = host

    async def reset(self, gpu: GpuInfo) -> None:
        path = self.host.pci_device(gpu.pci.sysfs_bus_id) / "reset"
        try:
            await asyncio.to_thread(path.write_text, "1")
        except FileNotFoundError:
            raise ResetFailed(
                f"GPU {gpu.index} ({gpu.pci.sysfs_bus_id}): no {path}; this machine cannot reset the GPU "
                "(a VM without function-level reset?): reboot to apply the MIG mode change"
            ) from None
        except OSError as exc:
            raise ResetFailed(
                f"GPU {gpu.index} ({gpu.pci.sysfs_bus_id}): reset failed: {exc.strerror or exc}"
            ) from None


def select_gpus(gpus: Sequence[GpuInfo], indices: Iterable[int]) -> list[GpuInfo]:
    wanted = set(indices)
    return [g for g in gpus if g.index in wanted]

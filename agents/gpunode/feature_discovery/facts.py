"""Gather :class:`~gpunode.feature_discovery.labels.NodeFacts` from NVML and the host's sysfs.

* NVML: system information, the reachable GPUs (lost ones are left out) and the MIG devices of every
  GPU with MIG enabled. A GPU lost between the inventory and its MIG or fabric query is left out as well;
  any other NVML error propagates to the caller.
* sysfs, through :class:`~gpunode.common.hostpaths.HostPaths`: each GPU's PCI class from
  ``/sys/bus/pci/devices/<bdf>/class`` (``0x030200``; missing or unreadable -> ``None``, which makes
  ``gpu.mode`` ``unknown``), and vGPU presence from each GPU's PCI config space
  (``/sys/bus/pci/devices/<bdf>/config``): a vendor-specific capability (id ``0x09``) whose bytes 3 and 4
  are ``V`` and ``F`` marks a vGPU. Reading past the first 64 bytes of config space needs privileges; a
  short or missing file reads as "no vGPU".
* The machine type file (GFD's ``--machine-type-file``, normally ``/sys/class/dmi/id/product_name``),
  read as given -- the caller resolves it under the host root if needed -- and stripped; ``None`` when it
  is not set or cannot be read (the caller warns).

Fabric cliques come from NVML's fabric info (GB200-style NVLink domains); GPUs without one report None.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from gpunode.common.hostpaths import HostPaths
from gpunode.feature_discovery.labels import NodeFacts
from gpunode.nvml import errors
from gpunode.nvml.api import GpuInfo, MigDevice, Nvml

__all__ = ["gather_facts", "has_vgpu_capability", "read_machine_type", "read_pci_class"]

PCI_STATUS = 0x06
PCI_STATUS_CAP_LIST = 0x10
PCI_CAPABILITY_POINTER = 0x34
PCI_CAP_ID_VENDOR_SPECIFIC = 0x09
PCI_STANDARD_HEADER = 0x40
_MAX_CAPABILITIES = 48  # config space holds at most (256 - 64) / 4 capabilities; stops pointer loops


async def gather_facts(nvml: Nvml, host: HostPaths, machine_type_file: Path | None) -> NodeFacts:
    """One snapshot of the node for :func:`~gpunode.feature_discovery.labels.compute_labels`.

    The NVML calls are issued together and answered in order (NVML has one thread): they run back to
    back instead of each waiting for the event loop to take the answer before the next one. The outcome
    is what one call after the other gives: a GPU lost in its MIG query is left out without its fabric
    answer being looked at, and the first other error (in that order) propagates."""
    system, inventory = await asyncio.gather(nvml.system(), nvml.gpus())
    found = sorted(inventory, key=lambda g: g.index)
    with_mig = [g for g in found if g.mig_enabled]
    answers = await asyncio.gather(
        *(nvml.mig_devices(g.index) for g in with_mig),
        *(nvml.fabric_clique(g.index) for g in found),
        return_exceptions=True,
    )
    migs = cast(
        "dict[int, list[MigDevice] | BaseException]",
        dict(zip((g.index for g in with_mig), answers[: len(with_mig)], strict=True)),
    )
    fabric = cast(
        "dict[int, str | BaseException | None]",
        dict(zip((g.index for g in found), answers[len(with_mig) :], strict=True)),
    )
    gpus: list[GpuInfo] = []
    mig_devices: dict[int, tuple[MigDevice, ...]] = {}
    for gpu in found:
        if gpu.mig_enabled:
            devices = migs[gpu.index]
            if isinstance(devices, errors.GpuLost):
                continue
            if isinstance(devices, BaseException):
                raise devices
            mig_devices[gpu.index] = tuple(devices)
        gpus.append(gpu)
    cliques: dict[int, str | None] = {}
    for gpu in list(gpus):
        clique = fabric[gpu.index]
        if isinstance(clique, errors.GpuLost):  # lost since the inventory: left out like the others
            gpus.remove(gpu)
            mig_devices.pop(gpu.index, None)
        elif isinstance(clique, BaseException):
            raise clique
        else:
            cliques[gpu.index] = clique
    pci_classes = {g.index: read_pci_class(host, g.pci.bus_id) for g in gpus}
    return NodeFacts(
        system=system,
        gpus=tuple(gpus),
        mig_devices=mig_devices,
        pci_classes=pci_classes,
        machine=read_machine_type(machine_type_file),
        vgpu_present=any(has_vgpu_capability(host, g.pci.bus_id) for g in gpus),
        cliques=cliques,
    )


def read_pci_class(host: HostPaths, bus_id: str) -> int | None:
    """The PCI class of a device from sysfs (``0x030200``), or None when missing or unreadable."""
    try:
        text = (host.pci_device(bus_id) / "class").read_text(encoding="ascii").strip()
        return int(text, 16)
    except (OSError, ValueError):
        return None


def read_machine_type(path: Path | None) -> str | None:
    """The machine type file's text, stripped; None when no file is set or it cannot be read."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def has_vgpu_capability(host: HostPaths, bus_id: str) -> bool:
    """Whether the device's PCI config space holds the vGPU vendor-specific capability (``V``, ``F``)."""
    try:
        config = (host.pci_device(bus_id) / "config").read_bytes()
    except (OSError, ValueError):
        return False
    return _vgpu_capability_offset(config) is not None


def _vgpu_capability_offset(config: bytes) -> int | None:
    """Walk the standard capability list; the offset of the vGPU capability, or None."""
    if len(config) < PCI_STANDARD_HEADER or not config[PCI_STATUS] & PCI_STATUS_CAP_LIST:
        return None
    pointer = config[PCI_CAPABILITY_POINTER] & 0xFC
    seen: set[int] = set()
    while pointer >= PCI_STANDARD_HEADER and pointer not in seen and len(seen) < _MAX_CAPABILITIES:
        seen.add(pointer)
        if pointer + 2 > len(config):
            return None
        cap_id, next_pointer = config[pointer], config[pointer + 1]
        if (
            cap_id == PCI_CAP_ID_VENDOR_SPECIFIC
            and pointer + 5 <= len(config)
            and config[pointer + 3 : pointer + 5] == b"VF"
        ):
            return pointer
        pointer = next_pointer & 0xFC
    return None

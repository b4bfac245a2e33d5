"""The host tree of a simulated node: the /sys, /proc and /dev a real node with the preset's GPUs has.

``gpunode sim init PRESET --state F --host-root DIR`` lays down under ``DIR``, for every GPU of the
preset (bus id, NUMA node and device minor as the simulated NVML reports them):

* ``sys/bus/pci/devices/<bdf>/``: ``vendor``, ``device``, ``subsystem_vendor``, ``subsystem_device``,
  ``class`` (``0x030200``, a 3D controller: every preset GPU is a data-centre part, so feature discovery's
  ``nvidia.com/gpu.mode`` reads ``compute``), ``numa_node``, a 64-byte ``config`` header (no capability
  list: no vGPU) and the ``driver`` link to ``sys/bus/pci/drivers/nvidia`` (which links back);
* ``sys/module/{nvidia,nvidia_uvm,nvidia_modeset}`` (``version``, ``refcnt``, ``initstate``);
* ``proc/devices`` with the driver's character majors (``nvidia-frontend``, ``nvidia-caps``,
  ``nvidia-caps-imex-channels``, ``nvidia-uvm``), ``proc/driver/nvidia/{version,params}``,
  ``proc/driver/nvidia/gpus/<bdf>/information``, ``proc/driver/nvidia/capabilities/mig/{config,monitor}``
  and ``proc/driver/nvidia-caps/mig-minors``: the driver's capability table (``config 1``, ``monitor 2``,
  then per MIG-capable GPU 15 GPU instances of 1 + 8 minors each) for the preset's MIG-capable GPUs;
* ``dev/nvidia<minor>``, ``dev/nvidiactl``, ``dev/nvidia-modeset``, ``dev/nvidia-uvm``,
  ``dev/nvidia-uvm-tools``, ``dev/nvidia-caps/nvidia-cap{1,2}`` and the IMEX channels asked for:
  real character devices where this process may ``mknod`` (root), else stand-in files ``c MAJOR:MINOR``
  (:func:`gpunode.common.devnode.char_device` accepts both).

The MIG part follows the simulator: the GPU and compute instances that exist now have their
``capabilities/gpu<minor>/mig/gi<N>[/ci<M>]/access`` files and ``dev/nvidia-caps/nvidia-cap<minor>``
nodes, and nothing else. :func:`link` records the tree beside the state file (``<state>.host``); from then
on every change of the state file (``SimNode.mutate``: ``gpunode-mig apply``, ``gpunode sim reset``, NVML
calls of any agent on the simulator) calls :func:`follow`, which brings the MIG part in line when the
layout changed (one small file read otherwise).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.atomic import atomic_write
from gpunode.common.devnode import IMEX_CHANNELS_MAJOR_NAME, char_device, imex_channel_path
from gpunode.nvml.caps import MIG_MINORS

if TYPE_CHECKING:
    from gpunode.sim.nvml.state import SimNodeState

__all__ = [
    "MAJORS",
    "PCI_CLASS_3D",
    "build",
    "cap_minor",
    "follow",
    "link",
    "linked_root",
    "mig_minors_text",
    "sync_mig",
]

#: The character majors the simulated driver registers (nvidia-frontend is fixed; the rest are dynamic
#: on a real host, where /proc/devices says which).
MAJORS = {"nvidia-frontend": 195, "nvidia-caps": 235, IMEX_CHANNELS_MAJOR_NAME: 234, "nvidia-uvm": 508}
PCI_CLASS_3D = 0x030200
GIS_PER_GPU = 15  # the driver numbers gi0-gi14 per GPU ...
CIS_PER_GI = 8  # ... and ci0-ci7 per GPU instance
MODE_READ_ALL = 0o444  # DeviceFileMode 292: GI/CI access and monitor
MODE_CONFIG = 0o400  # DeviceFileMode 256: config
SIDECAR = ".host"
MARK = ".gpunode-sim-host.json"  # in the tree: the MIG layout it shows
BASE_DEVICES = "  1 mem\n  4 /dev/vc/0\n  4 tty\n  5 /dev/tty\n 10 misc\n 89 i2c\n128 ptm\n136 pts\n226 drm\n"
PARAMS = (
    "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n"
    "DeviceFileGID: 0\nDeviceFileMode: 438\nInitializeSystemMemoryAllocations: 1\nUsePageAttributeTable: "
    "4294967295\nEnableMSI: 1\nEnablePCIeGen3: 0\nMemoryPoolSize: 0\nKMallocHeapMaxSize: 0\n"
    "VMallocHeapMaxSize: 0\nIgnoreMMIOCheck: 0\nEnableStreamMemOPs: 0\nEnableUserNUMAManagement: 1\n"
    "NvLinkDisable: 0\nRmProfilingAdminOnly: 1\nPreserveVideoMemoryAllocations: 0\n"
    "EnableS0ixPowerManagement: 0\n"
    "DynamicPowerManagement: 3\nRegisterPCIDriver: 1\nEnablePCIERelaxedOrderingMode: 0\n"
    "EnableResizableBar: 0\nEnableGpuFirmware: 18\nEnableGpuFirmwareLogs: 2\nEnableDbgBreakpoint: 0\n"
    "OpenRmEnableUnsupportedGpus: 1\nCreateImexChannel0: 0\nGrdmaPciTopoCheckOverride: 0\n"
)


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The capability minor the driver gives ``gpu<gpu_minor>/gi<gi>[/ci<ci>]/access``: ``config`` is 1,
    ``monitor`` 2, then each GPU has 15 GIs of 9 minors (the GI's own, then ci0-ci7)."""
    base = 3 + gpu_minor * GIS_PER_GPU * (1 + CIS_PER_GI) + gi * (1 + CIS_PER_GI)
    return base if ci is None else base + 1 + ci


def mig_minors_text(gpu_minors: Iterable[int]) -> str:
    """``/proc/driver/nvidia-caps/mig-minors`` for MIG-capable GPUs with these device minors."""
    lines = ["config 1", "monitor 2"]
    for g in sorted(gpu_minors):
        for gi in range(GIS_PER_GPU):
            lines.append(f"gpu{g}/gi{gi}/access {cap_minor(g, gi)}")
            lines.extend(f"gpu{g}/gi{gi}/ci{ci}/access {cap_minor(g, gi, ci)}" for ci in range(CIS_PER_GI))
    return "\n".join(lines) + "\n"


def _bdf(bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` as sysfs spells it: ``0000:07:00.0``."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text, 0o644, only_if_changed=True)


def _symlink(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if path.is_symlink() and os.readlink(path) == target:
            return
        path.unlink()
    path.symlink_to(target)


def _node(path: Path, major: int, minor: int, mode: int, real: bool) -> None:
    """A character device (``real``) or its stand-in file; replaced when it is something else."""
    if char_device(path, major, minor):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if real:
        try:
            os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
            os.chmod(path, mode)
            return
        except OSError:
            pass  # a sandbox without CAP_MKNOD after all (or nodev): the stand-in below
    path.write_text(f"c {major}:{minor}\n")
    path.chmod(mode)


def can_mknod(directory: Path) -> bool:
    """Whether this process may create character devices in ``directory``."""
    probe = directory / ".mknod-probe"
    try:
        os.mknod(probe, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        return False
    probe.unlink()
    return True


def _config_header(device_id: int, subsystem: int) -> bytes:
    """The 64-byte standard PCI header: IDs, class, no capability list."""
    vendor, device = device_id & 0xFFFF, device_id >> 16
    sub_vendor, sub_device = subsystem & 0xFFFF, subsystem >> 16
    header = bytearray(64)
    struct.pack_into("<HHHH", header, 0, vendor, device, 0x0006, 0)  # memory + bus master; no caps
    header[9], header[10], header[11] = PCI_CLASS_3D & 0xFF, (PCI_CLASS_3D >> 8) & 0xFF, PCI_CLASS_3D >> 16
    struct.pack_into("<HH", header, 0x2C, sub_vendor, sub_device)
    return bytes(header)


def build(
    root: Path, state: SimNodeState, *, imex_channels: Sequence[int] = (), nodes: bool | None = None
) -> None:
    """Lay down the tree for ``state`` under ``root`` (created; files of an earlier tree are replaced).

    ``nodes``: real character devices (True), stand-in files (False), or real ones where permitted
    (None)."""
    root.mkdir(parents=True, exist_ok=True)
    real = can_mknod(root) if nodes is None else nodes
    spec = state.spec
    version = spec.driver_version
    arch = "aarch64" if "aarch64" in spec.cpu or "Grace" in spec.cpu else "x86_64"
    pci = root / "sys/bus/pci"
    driver_dir = pci / "drivers/nvidia"
    driver_dir.mkdir(parents=True, exist_ok=True)
    mig_capable: list[int] = []
    for index, slot in enumerate(spec.gpus):
        product = slot.product
        bdf = _bdf(slot.bus_id)
        dev = pci / "devices" / bdf
        _write(dev / "vendor", f"0x{product.pci_device_id & 0xFFFF:04x}\n")
        _write(dev / "device", f"0x{product.pci_device_id >> 16:04x}\n")
        _write(dev / "subsystem_vendor", f"0x{product.pci_subsystem_id & 0xFFFF:04x}\n")
        _write(dev / "subsystem_device", f"0x{product.pci_subsystem_id >> 16:04x}\n")
        _write(dev / "class", f"0x{PCI_CLASS_3D:06x}\n")
        _write(dev / "numa_node", f"{slot.numa_node}\n")
        _write(dev / "config", _config_header(product.pci_device_id, product.pci_subsystem_id))
        _symlink(dev / "driver", "../../drivers/nvidia")
        _symlink(driver_dir / bdf, f"../../devices/{bdf}")
        info = root / "proc/driver/nvidia/gpus" / bdf / "information"
        _write(
            info,
            f"Model: \t\t {product.name}\nIRQ:   \t\t {160 + index}\nGPU UUID: \t {state.gpu_uuid(index)}\n"
            f"Video BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t "
            f"0xfffffffffffff\nBus Location: \t {bdf}\nDevice Minor: \t {index}\nGPU Firmware: \t {version}\n"
            "GPU Excluded:\t No\n",
        )
        _node(root / f"dev/nvidia{index}", MAJORS["nvidia-frontend"], index, 0o666, real)
        if product.compute_slices:
            mig_capable.append(index)
    for module in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
        base = root / "sys/module" / module
        _write(base / "version", f"{version}\n")
        _write(base / "refcnt", "0\n" if module != "nvidia" else "2\n")
        _write(base / "initstate", "live\n")
        (base / "parameters").mkdir(exist_ok=True)
    majors = "".join(f"{major:>3} {name}\n" for name, major in sorted(MAJORS.items(), key=lambda kv: kv[1]))
    _write(
        root / "proc/devices",
        f"Character devices:\n{BASE_DEVICES}{majors}\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n",
    )
    driver = root / "proc/driver/nvidia"
    _write(
        driver / "version",
        f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {version}  Release Build  (simulated)\n"
        "GCC version:  gcc version 12.3.0 (simulated)\n",
    )
    _write(driver / "params", PARAMS)
    _write(
        driver / "capabilities/mig/config", "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    )
    _write(
        driver / "capabilities/mig/monitor", "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    )
    _write(root / "proc" / MIG_MINORS, mig_minors_text(mig_capable))
    front = MAJORS["nvidia-frontend"]
    _node(root / "dev/nvidiactl", front, 255, 0o666, real)
    _node(root / "dev/nvidia-modeset", front, 254, 0o666, real)
    _node(root / "dev/nvidia-uvm", MAJORS["nvidia-uvm"], 0, 0o666, real)
    _node(root / "dev/nvidia-uvm-tools", MAJORS["nvidia-uvm"], 1, 0o666, real)
    _node(root / "dev/nvidia-caps/nvidia-cap1", MAJORS["nvidia-caps"], 1, MODE_CONFIG, real)
    _node(root / "dev/nvidia-caps/nvidia-cap2", MAJORS["nvidia-caps"], 2, MODE_READ_ALL, real)
    for channel in imex_channels:
        _node(
            root / imex_channel_path(channel).lstrip("/"),
            MAJORS[IMEX_CHANNELS_MAJOR_NAME],
            channel,
            0o666,
            real,
        )
    with contextlib.suppress(FileNotFoundError):
        (root / MARK).unlink()  # the MIG part is written anew
    sync_mig(root, state, nodes=real)


def _layout(state: SimNodeState) -> dict[str, list[list[int]]]:
    """The MIG layout that decides the capability files: per GPU minor, [gi, ci...] lists."""
    return {
        str(index): [[gi.id, *(ci.id for ci in gi.cis)] for gi in gpu.gis]
        for index, gpu in enumerate(state.gpus)
        if gpu.gis
    }


def sync_mig(root: Path, state: SimNodeState, *, nodes: bool | None = None) -> bool:
    """Bring the MIG capability files and nodes in line with ``state``'s layout; True when it changed."""
    layout = _layout(state)
    mark = root / MARK
    try:
        recorded = json.loads(mark.read_text())
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, dict) and recorded.get("layout") == layout:
        return False
    real = bool(recorded.get("real")) if isinstance(recorded, dict) and nodes is None else bool(nodes)
    caps = root / "proc/driver/nvidia/capabilities"
    wanted: dict[Path, int] = {}  # access file -> minor
    for gpu_minor, gis in layout.items():
        g = int(gpu_minor)
        for gi, *cis in gis:
            gi_dir = caps / f"gpu{g}/mig/gi{gi}"
            wanted[gi_dir / "access"] = cap_minor(g, gi)
            for ci in cis:
                wanted[gi_dir / f"ci{ci}/access"] = cap_minor(g, gi, ci)
    for gpu_dir in caps.glob("gpu*"):  # GPU and compute instances that are gone
        for access in sorted(gpu_dir.rglob("access"), key=lambda p: len(p.parts), reverse=True):
            if access not in wanted:
                access.unlink()
        for directory in sorted((p for p in gpu_dir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            gpu_dir.rmdir()
    for access, minor in wanted.items():
        _write(access, f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    dev_caps = root / "dev/nvidia-caps"
    minors = set(wanted.values())
    with contextlib.suppress(FileNotFoundError):
        for entry in dev_caps.iterdir():
            number = entry.name.removeprefix("nvidia-cap")
            if number.isdigit() and int(number) > 2 and int(number) not in minors:
                entry.unlink()
    for minor in sorted(minors):
        _node(dev_caps / f"nvidia-cap{minor}", MAJORS["nvidia-caps"], minor, MODE_READ_ALL, real)
    _write(mark, json.dumps({"layout": layout, "real": real}, sort_keys=True) + "\n")
    return True


def _sidecar(state_file: Path) -> Path:
    return state_file.with_name(state_file.name + SIDECAR)


def link(state_file: Path, root: Path) -> None:
    """Record that ``root`` shows the simulated node of ``state_file`` (so MIG changes follow)."""
    _write(_sidecar(state_file), json.dumps({"host_root": str(root.resolve())}) + "\n")


def linked_root(state_file: Path) -> Path | None:
    """The host tree linked to ``state_file``; None when there is none (or its record is unreadable)."""
    try:
        data = json.loads(_sidecar(state_file).read_text())
        return Path(data["host_root"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def follow(state_file: Path, state: SimNodeState) -> None:
    """After a change of ``state_file``: the linked tree's MIG part follows (nothing without a tree).

    Never raises for the tree: a tree removed under the simulator is unlinked, not an NVML error."""
    root = linked_root(state_file)
    if root is None:
        return
    if not root.is_dir():
        with contextlib.suppress(OSError):
            _sidecar(state_file).unlink()
        return
    with contextlib.suppress(OSError):
        sync_mig(root, state)

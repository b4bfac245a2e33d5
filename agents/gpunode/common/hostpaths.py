"""Every host path the agents touch, built under an injectable root.

In a container the host filesystem is often mounted elsewhere (``/host``), the driver may live under
``/run/nvidia/driver``, and tests use a fake tree under ``tmp_path``; building each path through
:class:`HostPaths` covers all three. ``root`` is where the host's ``/`` is visible; ``driver_root`` and
``kubelet_dir`` are host paths, interpreted under ``root``. Nothing here touches the filesystem except
the explicit ``read_*``/``find_*`` helpers.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["DRIVER_LIB_SUBDIRS", "HostPaths", "normalize_bdf"]

StrPath = str | os.PathLike[str]

#: Library directories searched under the driver root, most specific first.
DRIVER_LIB_SUBDIRS: tuple[str, ...] = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
)

_BDF = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)


def normalize_bdf(bus_id: str) -> str:
    """A PCI address as sysfs spells it: ``"00000000:3B:00.0"`` (NVML) -> ``"0000:3b:00.0"``.

    Raises ``ValueError`` for anything that is not a PCI address, so a bad value can never walk out of
    ``/sys/bus/pci/devices``.
    """
    match = _BDF.match(bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain = int(match["domain"] or "0", 16)
    if domain > 0xFFFF:
        raise ValueError(f"PCI domain out of range in {bus_id!r}")
    return f"{domain:04x}:{match['bus'].lower()}:{match['dev'].lower()}.{match['fn']}"


def _under(base: Path, host_path: StrPath) -> Path:
    """``base`` joined with ``host_path`` taken as relative to ``/``: (/host, /sys) -> /host/sys."""
    parts = PurePosixPath(os.fspath(host_path)).parts
    if parts and parts[0] == "/":
        parts = parts[1:]
    if ".." in parts:
        raise ValueError(f"host path must not contain '..': {os.fspath(host_path)!r}")
    return base.joinpath(*parts)


@dataclass(frozen=True, init=False)
class HostPaths:
    """Host path builder; ``HostPaths(root=tmp_path)`` in tests, ``HostPaths()`` on a node."""

    root: Path
    driver_root: Path
    kubelet_dir: Path

    def __init__(
        self,
        root: StrPath = "/",
        driver_root: StrPath = "/",
        kubelet_dir: StrPath = "/var/lib/kubelet",
    ) -> None:
        object.__setattr__(self, "root", Path(root))
        object.__setattr__(self, "driver_root", Path(driver_root))
        object.__setattr__(self, "kubelet_dir", Path(kubelet_dir))

    # ------------------------------------------------------------------------------------ generic

    def host(self, host_path: StrPath) -> Path:
        """Any absolute host path, e.g. ``host("/etc/os-release")``, under ``root``."""
        return _under(self.root, host_path)

    def driver(self, driver_path: StrPath) -> Path:
        """A path inside the driver installation, e.g. ``driver("/usr/bin/nvidia-smi")``."""
        return _under(self.driver_dir, driver_path)

    @property
    def driver_dir(self) -> Path:
        """Where the driver root is visible from here (``root`` + ``driver_root``)."""
        return _under(self.root, self.driver_root)

    @property
    def sys(self) -> Path:
        return self.host("/sys")

    @property
    def proc(self) -> Path:
        return self.host("/proc")

    @property
    def dev(self) -> Path:
        return self.host("/dev")

    @property
    def run(self) -> Path:
        return self.host("/run")

    @property
    def etc(self) -> Path:
        return self.host("/etc")

    # -------------------------------------------------------------------------------------- sysfs

    @property
    def pci_devices_dir(self) -> Path:
        return self.sys / "bus" / "pci" / "devices"

    def pci_device(self, bdf: str) -> Path:
        """``/sys/bus/pci/devices/<bdf>``; accepts NVML's ``00000000:3B:00.0`` spelling."""
        return self.pci_devices_dir / normalize_bdf(bdf)

    def pci_numa_node(self, bdf: str) -> Path:
        return self.pci_device(bdf) / "numa_node"

    def sys_module(self, name: str = "nvidia") -> Path:
        """``/sys/module/<name>`` (exists while the kernel module is loaded)."""
        return self.sys / "module" / name

    # ---------------------------------------------------------------------------------------- dev

    def dev_nvidia(self, minor: int) -> Path:
        """``/dev/nvidia<minor>``."""
        if minor < 0:
            raise ValueError(f"negative device minor {minor}")
        return self.dev / f"nvidia{minor}"

    @property
    def nvidiactl(self) -> Path:
        return self.dev / "nvidiactl"

    @property
    def nvidia_uvm(self) -> Path:
        return self.dev / "nvidia-uvm"

    @property
    def nvidia_uvm_tools(self) -> Path:
        return self.dev / "nvidia-uvm-tools"

    @property
    def nvidia_modeset(self) -> Path:
        return self.dev / "nvidia-modeset"

    @property
    def nvidia_caps(self) -> Path:
        """``/dev/nvidia-caps`` (MIG capability device nodes live here)."""
        return self.dev / "nvidia-caps"

    # --------------------------------------------------------------------------------------- proc

    @property
    def proc_modules(self) -> Path:
        return self.proc / "modules"

    @property
    def proc_devices(self) -> Path:
        return self.proc / "devices"

    @property
    def proc_driver_nvidia(self) -> Path:
        """``/proc/driver/nvidia`` (version, gpus/<bdf>/information, capabilities)."""
        return self.proc / "driver" / "nvidia"

    # ------------------------------------------------------------------------------------ kubelet

    @property
    def kubelet_root(self) -> Path:
        """The kubelet directory as seen from here (``root`` + ``kubelet_dir``)."""
        return _under(self.root, self.kubelet_dir)

    @property
    def device_plugin_dir(self) -> Path:
        return self.kubelet_root / "device-plugins"

    @property
    def kubelet_socket(self) -> Path:
        """The kubelet's device-plugin registration socket."""
        return self.device_plugin_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    # ------------------------------------------------------------------------------ /run, /etc

    @property
    def run_nvidia(self) -> Path:
        return self.run / "nvidia"

    @property
    def validations_dir(self) -> Path:
        """``/run/nvidia/validations``: readiness marker files (``driver-ready``, ``toolkit-ready``)."""
        return self.run_nvidia / "validations"

    @property
    def cdi_dirs(self) -> tuple[Path, Path]:
        """CDI spec directories: ``/etc/cdi`` (static) and ``/var/run/cdi`` (generated)."""
        return self.etc / "cdi", self.host("/var/run/cdi")

    @property
    def nfd_features_dir(self) -> Path:
        """Node Feature Discovery's local feature-file directory."""
        return self.etc / "kubernetes" / "node-feature-discovery" / "features.d"

    # ------------------------------------------------------------------------------------- driver

    def driver_lib_dirs(self) -> tuple[Path, ...]:
        """Candidate driver library directories under the driver root (no filesystem access)."""
        return tuple(self.driver_dir / sub for sub in DRIVER_LIB_SUBDIRS)

    def find_driver_lib(self, soname: str) -> Path | None:
        """The first candidate directory holding ``soname`` (e.g. ``libnvidia-ml.so.1``), or None."""
        if "/" in soname:
            raise ValueError(f"library name must not contain '/': {soname!r}")
        for directory in self.driver_lib_dirs():
            candidate = directory / soname
            if candidate.exists():
                return candidate
        return None

    # -------------------------------------------------------------------------------------- reads

    def read_numa_node(self, bdf: str) -> int | None:
        """The NUMA node of a PCI device from sysfs; None when unknown (missing, unreadable or -1)."""
        try:
            text = self.pci_numa_node(bdf).read_text(encoding="ascii").strip()
            node = int(text)
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

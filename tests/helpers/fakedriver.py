"""A fake NVIDIA driver root on the real filesystem, for tests that start real containers.

What a container runtime needs from a driver installation, made for real so that podman can inject it:

* device nodes made with ``mknod`` carrying the driver's majors and minors: ``/dev/nvidia<N>`` (195, N),
  ``/dev/nvidiactl`` (195, 255), ``/dev/nvidia-modeset`` (195, 254), ``/dev/nvidia-uvm`` and
  ``/dev/nvidia-uvm-tools`` (the dynamic major ``nvidia-uvm`` gets in ``/proc/devices``, minors 0 and 1)
  and ``/dev/nvidia-caps/nvidia-cap<N>`` (the dynamic major of ``nvidia-caps``). Opening one in a
  container gives ENXIO: the devices cgroup let it through, no driver answers;
* the driver's user-space libraries as small ELF shared objects built with gcc, named
  ``<lib>.so.<driver version>`` with the driver's sonames, plus the links the driver's installer makes
  (``libcuda.so.1 -> libcuda.so.<version>``, ``libcuda.so -> libcuda.so.1``). ``libnvidia-ml`` exports
  ``nvmlInit_v2`` answering NVML_ERROR_DRIVER_NOT_LOADED (9), ``libcuda`` exports ``cuInit`` answering
  CUDA_ERROR_NO_DEVICE (100), so a container can call into them;
* the driver's binaries (shell scripts that say what they are) and GSP firmware files;
* a host root for the CDI generator: ``proc/driver/nvidia-caps/mig-minors`` (the driver's capability
  table) and ``proc/devices``, with the rest of the host reached through a link to the real ``/``
  directory that holds the driver root, so the generator reads the same files the spec names.

Nothing here is an NVIDIA program: the host running the tests has none.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BINARIES",
    "CAPS_MAJOR",
    "CONTROL_NODES",
    "LIBRARIES",
    "NVIDIA_MAJOR",
    "UVM_MAJOR",
    "VERSION",
    "FakeDriver",
    "build_fake_driver",
    "build_libraries",
    "mig_minors_table",
]

VERSION = "550.54.15"  # the simulator's driver version
NVIDIA_MAJOR = 195
UVM_MAJOR = 510  # dynamic on a real host: /proc/devices says which
CAPS_MAJOR = 237  # likewise
#: container path -> (major, minor)
CONTROL_NODES: dict[str, tuple[int, int]] = {
    "/dev/nvidiactl": (NVIDIA_MAJOR, 255),
    "/dev/nvidia-modeset": (NVIDIA_MAJOR, 254),
    "/dev/nvidia-uvm": (UVM_MAJOR, 0),
    "/dev/nvidia-uvm-tools": (UVM_MAJOR, 1),
}
#: (library, soname suffix; "" = the full driver version, as the driver ships it, subdirectory)
LIBRARIES: tuple[tuple[str, str, str], ...] = (
    ("libnvidia-ml", "1", ""),
    ("libnvidia-cfg", "1", ""),
    ("libcuda", "1", ""),
    ("libcudadebugger", "1", ""),
    ("libnvidia-opencl", "1", ""),
    ("libnvidia-ptxjitcompiler", "1", ""),
    ("libnvidia-nvvm", "4", ""),
    ("libnvidia-allocator", "1", ""),
    ("libnvidia-gpucomp", "", ""),
    ("libnvidia-pkcs11", "", ""),
    ("libnvidia-pkcs11-openssl3", "", ""),
    ("libvdpau_nvidia", "1", "vdpau"),
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")

# The exported functions: enough for a container to load the library and call into it.
_SOURCES = {
    "libnvidia-ml": (
        "int nvmlInit_v2(void) { return 9; }\n"  # NVML_ERROR_DRIVER_NOT_LOADED
        "int nvmlInit(void) { return 9; }\n"
        'const char *nvmlErrorString(int r) { return r == 9 ? "Driver Not Loaded" : "Unknown Error"; }\n'
        "int nvmlShutdown(void) { return 0; }\n"
    ),
    "libcuda": (
        "int cuInit(unsigned int flags) { return 100; }\n"  # CUDA_ERROR_NO_DEVICE
        "int cuDriverGetVersion(int *v) { *v = 12040; return 0; }\n"
    ),
}


def mig_minors_table(gpus: int) -> str:
    """``/proc/driver/nvidia-caps/mig-minors`` as the driver writes it: ``config``, ``monitor``, then per
    GPU minor 15 GPU instances, each followed by its 8 compute instances."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for g in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def soname(library: str, suffix: str, version: str = VERSION) -> str:
    return f"{library}.so.{suffix or version}"


def build_libraries(out: Path, version: str = VERSION) -> Path:
    """The driver's libraries as ELF shared objects in ``out`` (``<lib>.so.<version>``), built once:
    an existing complete set is reused. Needs gcc (no C library headers: nothing is included)."""
    out.mkdir(parents=True, exist_ok=True)
    if all((out / f"{lib}.so.{version}").is_file() for lib, _, _ in LIBRARIES):
        return out
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("a C compiler (gcc) is needed to build the fake driver's libraries")
    for lib, suffix, _ in LIBRARIES:
        ident = lib.replace("-", "_")
        source = out / f"{lib}.c"
        source.write_text(_SOURCES.get(lib, f"int gpunode_fake_{ident}(void) {{ return 0; }}\n"))
        target = out / f"{lib}.so.{version}"
        subprocess.run(
            [
                gcc,
                "-shared",
                "-fPIC",
                "-nostdlib",
                "-O1",
                f"-Wl,-soname,{soname(lib, suffix, version)}",
                "-o",
                f"{target}.tmp",
                str(source),
            ],
            check=True,
            capture_output=True,
        )
        os.replace(f"{target}.tmp", target)
        source.unlink()
    return out


@dataclass(frozen=True)
class FakeDriver:
    """A fake driver installation. ``root`` is the driver root (a real host path; ``/dev`` under it too),
    ``host_root`` what the CDI generator takes as ``--host-root`` (``/proc`` files of a driver, the rest
    of the host through a link)."""

    root: Path
    host_root: Path
    version: str
    gpus: int
    libdir: str

    def node(self, path: str) -> Path:
        """A device node's host path: ``/dev/nvidia0`` -> ``<root>/dev/nvidia0``."""
        return self.root / path.lstrip("/")

    def gpu_node(self, minor: int) -> tuple[str, tuple[int, int]]:
        return f"/dev/nvidia{minor}", (NVIDIA_MAJOR, minor)

    def cap_node(self, minor: int) -> tuple[str, tuple[int, int]]:
        return f"/dev/nvidia-caps/nvidia-cap{minor}", (CAPS_MAJOR, minor)

    def cap_minors(self) -> dict[str, int]:
        """The capability table (``gpu0/gi1/access`` -> minor)."""
        out: dict[str, int] = {}
        for line in mig_minors_table(self.gpus).splitlines():
            name, minor = line.split()
            out[name] = int(minor)
        return out

    @property
    def library_dir(self) -> str:
        """The container path of the library directory (``/usr/lib/x86_64-linux-gnu``)."""
        return "/" + self.libdir


def _mknod(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    os.chmod(path, 0o666)  # the umask took some bits away


def build_fake_driver(
    base: Path,
    *,
    gpus: int = 8,
    version: str = VERSION,
    libdir: str = "usr/lib/x86_64-linux-gnu",
    library_cache: Path | None = None,
    cap_nodes: bool = True,
    skip_libraries: Sequence[str] = (),
) -> FakeDriver:
    """A driver root under ``base/driver`` and a host root under ``base/host`` (``base`` must be an
    absolute real path; making device nodes needs root). ``library_cache``: where the built libraries
    are kept between calls (default: ``base/lib-build``)."""
    base = base.resolve()
    root = base / "driver"
    built = build_libraries(library_cache or base / "lib-build", version)
    lib_root = root / libdir
    for lib, suffix, sub in LIBRARIES:
        if lib in skip_libraries:
            continue
        directory = lib_root / sub if sub else lib_root
        directory.mkdir(parents=True, exist_ok=True)
        real = f"{lib}.so.{version}"
        shutil.copyfile(built / real, directory / real)
        os.chmod(directory / real, 0o755)
        if suffix:
            (directory / f"{lib}.so.{suffix}").symlink_to(real)
        if lib == "libcuda":
            (directory / "libcuda.so").symlink_to("libcuda.so.1")
    for name in BINARIES:
        path = root / "usr/bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f'#!/bin/sh\necho "{name}: gpunode fake driver {version}, no GPU behind it"\nexit 9\n'
        )
        os.chmod(path, 0o755)
    fw = root / "lib/firmware/nvidia" / version
    fw.mkdir(parents=True)
    for name in FIRMWARE:
        (fw / name).write_bytes(b"\x7fGSP fake firmware " + name.encode())

    for minor in range(gpus):
        _mknod(root / f"dev/nvidia{minor}", NVIDIA_MAJOR, minor)
    for path, (major, minor) in CONTROL_NODES.items():
        _mknod(root / path.lstrip("/"), major, minor)
    table = mig_minors_table(gpus)
    if cap_nodes:
        for line in table.splitlines():
            _mknod(root / f"dev/nvidia-caps/nvidia-cap{line.split()[1]}", CAPS_MAJOR, int(line.split()[1]))

    host = base / "host"
    caps = host / "proc/driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text(table)
    (host / "proc/devices").write_text(
        "Character devices:\n"
        f"{NVIDIA_MAJOR} nvidia-frontend\n{CAPS_MAJOR} nvidia-caps\n{UVM_MAJOR} nvidia-uvm\n"
    )
    top = root.parts[1]  # the host's directory holding the driver root (/tmp): visible through host_root
    (host / top).symlink_to(f"/{top}")
    return FakeDriver(root=root, host_root=host, version=version, gpus=gpus, libdir=libdir)

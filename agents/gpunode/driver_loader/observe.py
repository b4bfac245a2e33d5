"""What ``init`` sees on the host before it plans (read-only): a driver someone else loaded, nouveau,
the loaded modules and the recorded digest, module trees, kernel headers, the OS and the tools.

The plan itself is pure (:func:`gpunode.driver_loader.modules.plan_init` over :class:`Observed`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Literal

from gpunode.common.hostpaths import HostPaths
from gpunode.driver_loader import kmod
from gpunode.driver_loader.config import LoaderConfig
from gpunode.driver_loader.modules import Observed, parse_driver_version
from gpunode.driver_loader.readiness import Files

__all__ = ["find_host_driver", "headers", "modules_dir", "nouveau", "observe", "os_id"]

SMI_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin", "opt/bin", "usr/lib/wsl/lib")
MODULE_SUBDIRS = ("kernel/drivers/video", "updates/dkms", "extra", "updates")
KO_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


def find_host_driver(paths: HostPaths, files: Files) -> str | None:
    """A driver loaded by someone else, with ``nvidia-smi`` on the host: its version, or None."""
    if files.recorded_digest() is not None:
        return None  # we loaded it
    version_file = paths.proc_driver_nvidia / "version"
    if not (paths.sys_module("nvidia").exists() or version_file.exists()):
        return None
    if not any((paths.root / sub / "nvidia-smi").is_file() for sub in SMI_DIRS):
        return None
    for source in (version_file, paths.sys_module("nvidia") / "version"):
        with contextlib.suppress(OSError):
            text = source.read_text()
            version = parse_driver_version(text) if source == version_file else text.strip()
            if version:
                return version
    return "unknown"


def modules_dir(cfg: LoaderConfig) -> Path | None:
    """The directory of the module tree that holds ``nvidia.ko`` (any compression), or None."""
    for sub in MODULE_SUBDIRS:
        directory = cfg.modules_tree / sub
        if any((directory / f"nvidia{suffix}").exists() for suffix in KO_SUFFIXES):
            return directory
    return None


def headers(cfg: LoaderConfig) -> Path | None:
    """The kernel headers for ``cfg.kernel``, on the host or in the driver root, or None."""
    paths, kernel = cfg.paths, cfg.kernel
    for base in dict.fromkeys((paths.root, paths.driver_dir)):
        for rel in (
            f"lib/modules/{kernel}/build",
            f"usr/src/linux-headers-{kernel}",
            f"usr/src/kernels/{kernel}",
        ):
            path = base / rel
            if path.is_symlink():
                target = os.readlink(path)
                path = base / target.lstrip("/") if target.startswith("/") else path.parent / target
            if path.is_dir():
                return path
    return None


def os_id(paths: HostPaths) -> str | None:
    """``ID=`` of the host's ``/etc/os-release``."""
    with contextlib.suppress(OSError):
        for line in (paths.etc / "os-release").read_text().splitlines():
            if line.startswith("ID="):
                return line[3:].strip().strip('"')
    return None


def nouveau(paths: HostPaths) -> Literal["module", "builtin", "absent"]:
    module = paths.sys_module("nouveau")
    if (module / "refcnt").exists():
        return "module"
    return "builtin" if module.is_dir() else "absent"


def observe(cfg: LoaderConfig, files: Files, ops: kmod.HostOps) -> Observed:
    """Everything :func:`~gpunode.driver_loader.modules.plan_init` needs; on the fast path (the digest
    matches a loaded driver) the module source is not looked for."""
    paths = cfg.paths
    host = find_host_driver(paths, files)
    if host is not None:
        return Observed(kernel=cfg.kernel, host_driver=host)
    loaded = kmod.loaded_modules(paths)
    recorded = files.recorded_digest()
    fast = "nvidia" in loaded and recorded == cfg.digest and not cfg.force_reinstall
    found = None if fast else modules_dir(cfg)
    kernel_headers = None if fast or found is not None else headers(cfg)
    return Observed(
        kernel=cfg.kernel,
        nouveau=nouveau(paths),
        loaded=loaded,
        recorded_digest=recorded,
        modules_dir=str(found) if found else None,
        headers=str(kernel_headers) if kernel_headers else None,
        installer=None if fast else ops.which("nvidia-installer"),
        dkms=None if fast else ops.which("dkms"),
        persistenced=ops.which("nvidia-persistenced"),
        os_id=None if fast else os_id(paths),
    )

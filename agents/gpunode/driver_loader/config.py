"""The loader's configuration: what ``init`` and ``unload`` act on, from the typed settings and the host.

:func:`loader_config` turns the verb's settings groups into a :class:`LoaderConfig`, filling in what
the host tells (the kernel's release, the driver version in the driver root) and reading the module
parameter files; bad input is a :class:`UsageError` or :class:`ConfigError` (exit 2).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from gpunode.common.cmdargs import release_problem
from gpunode.common.devnode import IMEX_CHANNEL_COUNT
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.hostpaths import HostPaths
from gpunode.common.settings import CommonSettings
from gpunode.driver_loader.modules import (
    PARAM_MODULES,
    ModuleType,
    ParamFile,
    config_digest,
    parse_module_type,
    parse_params,
    sysfs_name,
)
from gpunode.driver_loader.settings import (
    DEFAULT_HEALTH_INTERVAL,
    DEFAULT_PARAMS_DIR,
    DEFAULT_UDEV_TIMEOUT,
    DEFAULT_VALIDATIONS_DIR,
    DriverSettings,
    HostSettings,
    InitSettings,
    LoadSettings,
)

__all__ = [
    "LoaderConfig",
    "detect_driver_version",
    "detect_kernel",
    "init_config",
    "loader_config",
    "read_params_dir",
]


@dataclass(frozen=True)
class LoaderConfig:
    paths: HostPaths
    kernel: str
    module_type: ModuleType = field(default_factory=lambda: parse_module_type("auto"))
    driver_version: str | None = None
    params_dir: Path = Path(DEFAULT_PARAMS_DIR)
    params: tuple[ParamFile, ...] = ()
    rdma: bool = False
    force_reinstall: bool = False
    digest_override: str | None = None
    write_nouveau_blacklist: bool = False
    validations_dir: str = DEFAULT_VALIDATIONS_DIR
    create_device_nodes: bool = True
    imex_channels: tuple[int, ...] = ()
    udev_timeout: float = DEFAULT_UDEV_TIMEOUT
    health_interval: float = DEFAULT_HEALTH_INTERVAL
    persistenced_stop_timeout: float = 5.0

    @property
    def driver_root(self) -> str:
        return str(self.paths.driver_root)

    @property
    def modules_tree(self) -> Path:
        """``<driver-root>/lib/modules/<kernel>`` as seen from here."""
        return self.paths.driver_dir / "lib" / "modules" / self.kernel

    @property
    def modules_target(self) -> Path:
        """Where precompiled modules live and where a build installs them."""
        return self.modules_tree / "kernel" / "drivers" / "video"

    @property
    def digest(self) -> str:
        if self.digest_override:
            return self.digest_override
        return config_digest(
            driver_version=self.driver_version,
            driver_root=self.driver_root,
            module_type=self.module_type.raw,
            kernel=self.kernel,
            params=self.params,
            rdma=self.rdma,
        )


def read_params_dir(directory: Path) -> tuple[ParamFile, ...]:
    """``<module>.conf`` for each NVIDIA module in ``directory`` (a missing directory: no parameters)."""
    if not directory.exists():
        return ()
    if not directory.is_dir():
        raise ConfigError(directory, ["not a directory; fix: point --module-params-dir at the directory"])
    found: list[ParamFile] = []
    for module in PARAM_MODULES:
        for name in (f"{module}.conf", f"{sysfs_name(module)}.conf"):
            path = directory / name
            if not path.exists() and not path.is_symlink():
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise ConfigError(
                    path,
                    [
                        f"cannot read the module parameter file ({reason}); fix: make it a readable "
                        f"UTF-8 text file of name=value parameters, or remove it"
                    ],
                ) from None
            try:
                params = parse_params(text)
            except ValueError as exc:
                raise ConfigError(
                    path, [f"{exc}; fix: write parameters as name=value, # for comments"]
                ) from None
            found.append(ParamFile(module, str(path), text, params))
            break
    return tuple(found)


def detect_kernel(paths: HostPaths) -> str:
    """The host's ``uname -r``: ``/proc/sys/kernel/osrelease`` under the host root (else our own)."""
    try:
        release = (paths.proc / "sys" / "kernel" / "osrelease").read_text().strip()
    except OSError:
        release = ""
    return release or os.uname().release


def detect_driver_version(paths: HostPaths) -> str | None:
    """From the driver root's ``usr/src/nvidia-<version>`` (one of them), else None."""
    with contextlib.suppress(OSError):
        versions = sorted(
            p.name.removeprefix("nvidia-")
            for p in (paths.driver_dir / "usr" / "src").iterdir()
            if p.name.startswith("nvidia-") and p.name[7:8].isdigit()
        )
        if len(versions) == 1:
            return versions[0]
    return None


def imex_channels(channels: tuple[int, ...]) -> tuple[int, ...]:
    """``--imex-channels``, sorted and without repeats; :class:`UsageError` for a number the driver has no
    channel for (it has 2048: 0-2047)."""
    bad = sorted({c for c in channels if not 0 <= c < IMEX_CHANNEL_COUNT})
    if bad:
        raise UsageError(
            f"--imex-channels/GPUNODE_IMEX_CHANNELS: no IMEX channel {', '.join(map(str, bad))}; "
            f"the driver has channels 0-{IMEX_CHANNEL_COUNT - 1}"
        )
    return tuple(sorted(set(channels)))


def loader_config(
    common: CommonSettings,
    host: HostSettings,
    driver: DriverSettings | None = None,
    load: LoadSettings | None = None,
    *,
    force_reinstall: bool = False,
    health_interval: float = DEFAULT_HEALTH_INTERVAL,
) -> LoaderConfig:
    """The loader's configuration for a verb's settings; :class:`UsageError`/:class:`ConfigError` (exit 2).

    Without ``driver`` (``unload``) the driver's defaults apply and no parameter file is read.
    """
    host_root = Path(host.host_root or "/")
    if not host_root.is_dir():
        raise UsageError(
            f"--host-root {host_root} does not exist or is not a directory; fix: mount the host's / "
            f"there (hostPath volume) or pass --host-root/GPUNODE_HOST_ROOT with the right path"
        )
    paths = HostPaths(root=host_root, driver_root=common.driver_root or "/")
    which = driver or DriverSettings()
    how = load or LoadSettings()
    params_dir = Path(which.module_params_dir or DEFAULT_PARAMS_DIR)
    kernel = which.kernel_version or detect_kernel(paths)
    driver_version = which.driver_version or detect_driver_version(paths)
    # both reach argv (modprobe -S, depmod, dkms) and paths (lib/modules/<kernel>): one plain token each
    problem = release_problem(kernel, "a kernel release")
    if problem is not None:
        raise UsageError(f"--kernel-version/KERNEL_VERSION (else the host's uname -r): {problem}")
    problem = release_problem(driver_version, "a driver version") if driver_version else None
    if problem is not None:
        raise UsageError(f"--driver-version/DRIVER_VERSION (else from the driver root): {problem}")
    return LoaderConfig(
        paths=paths,
        kernel=kernel,
        module_type=parse_module_type(which.kernel_module_type),  # one of MODULE_TYPES (the flag's choices)
        driver_version=driver_version,
        params_dir=params_dir,
        params=read_params_dir(params_dir) if driver is not None else (),
        rdma=which.gpu_direct_rdma,
        force_reinstall=force_reinstall,
        digest_override=how.driver_config_digest or None,
        write_nouveau_blacklist=how.write_nouveau_blacklist,
        validations_dir=host.validations_dir or DEFAULT_VALIDATIONS_DIR,
        create_device_nodes=how.create_device_nodes,
        imex_channels=imex_channels(how.imex_channels),
        udev_timeout=how.udev_timeout,
        health_interval=health_interval,
    )


def init_config(settings: InitSettings) -> LoaderConfig:
    """:func:`loader_config` for ``init``'s settings."""
    return loader_config(
        settings.common,
        settings.host,
        settings.driver,
        settings.load,
        force_reinstall=settings.force_reinstall,
        health_interval=settings.health_interval,
    )

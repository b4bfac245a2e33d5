"""Pure driver-loader logic: module names and order, module types, parameters, digest, and the init plan.

Nothing here touches the host: the loader gathers an :class:`Observed` snapshot (files under the host
root, tools found), and :func:`plan_init` turns it and the configuration into an :class:`InitPlan`, the
data that ``init`` applies step by step and ``init --dry-run`` prints.

Where the kernel modules come from (one layout, the one ``nvidia-installer --kernel-module-only`` and
``modprobe -d DRIVER_ROOT`` both use)::

    <driver-root>/lib/modules/<kernel>/kernel/drivers/video/nvidia.ko   (+ nvidia-uvm, -modeset, -peermem)
    <driver-root>/lib/modules/<kernel>/updates/dkms/nvidia.ko            (what ``dkms install`` writes)

A *precompiled* module set is that directory shipped ready in the driver root for the exact running
kernel; without one the modules are built with ``nvidia-installer`` (or DKMS) when kernel headers exist.

``--kernel-module-type`` (``KERNEL_MODULE_TYPE``) values:

=============== ===================================== ==================================================
value           module source                         flavour built (nvidia-installer ``-m``)
=============== ===================================== ==================================================
``auto``        precompiled if present, else build    the installer's own recommendation
``precompiled`` precompiled only (error when absent)  -
``runcompiled`` always build for the running kernel   the installer's own recommendation
``open``        like ``auto``                         ``kernel-open`` (NVIDIA's open GPU kernel modules)
``proprietary`` like ``auto``                         ``kernel`` (the proprietary modules)
=============== ===================================== ==================================================
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "COHERENT_PARAM",
    "LOAD_ORDER",
    "MODULE_TYPES",
    "PARAM_MODULES",
    "UNLOAD_ORDER",
    "Capability",
    "InitPlan",
    "ModuleType",
    "Observed",
    "ParamFile",
    "Source",
    "config_digest",
    "expected_refs",
    "headers_hint",
    "modules_to_load",
    "parse_capability",
    "parse_driver_version",
    "parse_gpu_minor",
    "parse_module_type",
    "parse_params",
    "parse_proc_devices",
    "plan_init",
    "render_modprobe_conf",
    "sysfs_name",
    "wants_coherent_param",
]

#: modprobe names, in load order; nvidia-peermem only with GPUDirect RDMA.
LOAD_ORDER: tuple[str, ...] = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-peermem")
#: sysfs names, in removal order (dependents first); only those present are removed.
UNLOAD_ORDER: tuple[str, ...] = ("nvidia_drm", "nvidia_peermem", "nvidia_modeset", "nvidia_uvm", "nvidia")
#: which of our modules holds a reference on which (a loaded dependent adds 1 to the refcount).
DEPENDS_ON: Mapping[str, str] = {
    "nvidia_uvm": "nvidia",
    "nvidia_modeset": "nvidia",
    "nvidia_peermem": "nvidia",
    "nvidia_drm": "nvidia_modeset",
}
#: modules whose ``<module>.conf`` parameter file is read from ``--module-params-dir``.
PARAM_MODULES: tuple[str, ...] = LOAD_ORDER
COHERENT_PARAM = "NVreg_CoherentGPUMemoryMode"
MODULE_TYPES: tuple[str, ...] = ("auto", "precompiled", "runcompiled", "open", "proprietary")


def sysfs_name(module: str) -> str:
    """``nvidia-uvm`` -> ``nvidia_uvm`` (the kernel's spelling under /sys/module)."""
    return module.replace("-", "_")


def modules_to_load(rdma: bool) -> tuple[str, ...]:
    return LOAD_ORDER if rdma else LOAD_ORDER[:-1]


# ------------------------------------------------------------------------------- module type


@dataclass(frozen=True)
class ModuleType:
    """``--kernel-module-type`` split into where modules come from and which flavour to build."""

    raw: str
    source: Literal["auto", "precompiled", "runcompiled"]
    flavour: Literal["open", "proprietary"] | None = None

    @property
    def installer_type(self) -> str | None:
        """nvidia-installer's ``-m`` value, or None to let the installer recommend one."""
        return {"open": "kernel-open", "proprietary": "kernel", None: None}[self.flavour]


def parse_module_type(text: str) -> ModuleType:
    word = text.strip().lower()
    if word in ("auto", "precompiled", "runcompiled"):
        return ModuleType(word, word)  # type: ignore[arg-type]
    if word in ("open", "proprietary"):
        return ModuleType(word, "auto", word)  # type: ignore[arg-type]
    raise ValueError(f"unknown kernel module type {text!r}: must be one of {', '.join(MODULE_TYPES)}")


# -------------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class ParamFile:
    """One ``<module>.conf`` from the parameters directory: where it came from and its parameters."""

    module: str  # modprobe spelling: nvidia, nvidia-uvm, ...
    path: str
    text: str
    params: tuple[str, ...]


_PARAM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def parse_params(text: str) -> tuple[str, ...]:
    """Module parameters from a ``<module>.conf``: space or newline separated, ``#`` comments.

    ``name=value`` tokens (values may be double-quoted and contain spaces, as modprobe.d allows);
    ``ValueError`` names the line of anything else.
    """
    out: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        token, quoted = "", False
        for char in line:
            if char == '"':
                quoted = not quoted
            elif char == "#" and not quoted:
                break
            if char.isspace() and not quoted:
                if token:
                    out.append(_check_param(token, number))
                token = ""
                continue
            token += char
        if quoted:
            raise ValueError(f"line {number}: unterminated double quote")
        if token:
            out.append(_check_param(token, number))
    return tuple(out)


def _check_param(token: str, line: int) -> str:
    name = token.split("=", 1)[0]
    if not _PARAM_NAME.match(name):
        raise ValueError(f"line {line}: {token!r} is not a module parameter (expected name=value)")
    return token


def wants_coherent_param(driver_version: str | None) -> bool:
    """NVIDIA adds ``NVreg_CoherentGPUMemoryMode=driver`` from branch 580 on; unknown versions get it."""
    if not driver_version:
        return True
    match = re.match(r"(\d+)", driver_version)
    return match is None or int(match.group(1)) >= 580


def render_modprobe_conf(params: Sequence[ParamFile], *, coherent: bool) -> str:
    """``/etc/modprobe.d/nvidia-gpunode.conf``: one ``options <module> ...`` line per module."""
    by_module = {p.module: list(p.params) for p in params}
    if coherent:
        nvidia = by_module.setdefault("nvidia", [])
        if not any(p.split("=", 1)[0] == COHERENT_PARAM for p in nvidia):
            nvidia.append(f"{COHERENT_PARAM}=driver")
    lines = ["# Written by gpunode-driver-loader from the module parameter files; rewritten on every init."]
    for module in PARAM_MODULES:
        if by_module.get(module):
            lines.append(f"options {module} {' '.join(by_module[module])}")
    return "\n".join(lines) + "\n"


def firmware_disabled(params: Sequence[ParamFile]) -> bool:
    """``NVreg_EnableGpuFirmware=0`` among the nvidia parameters (then the firmware path is left alone)."""
    return any(p.module == "nvidia" and "NVreg_EnableGpuFirmware=0" in p.params for p in params)


def config_digest(
    *,
    driver_version: str | None,
    driver_root: str,
    module_type: str,
    kernel: str,
    params: Sequence[ParamFile],
    rdma: bool,
) -> str:
    """sha256 of everything that decides which modules are loaded how (the fast path compares it)."""
    doc = {
        "driverVersion": driver_version or "",
        "driverRoot": driver_root,
        "kernelModuleType": module_type,
        "kernel": kernel,
        "params": {p.module: p.text for p in params},
        "gpuDirectRdma": rdma,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ------------------------------------------------------------------------------------- /proc


def parse_proc_devices(text: str) -> dict[str, int]:
    """The character-device majors of ``/proc/devices`` by name."""
    majors: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            section = stripped
            continue
        parts = stripped.split(None, 1)
        if section.startswith("Character") and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def parse_gpu_minor(information: str) -> int | None:
    """``Device Minor: 3`` from ``/proc/driver/nvidia/gpus/<bdf>/information``."""
    match = re.search(r"^Device Minor:\s*(\d+)\s*$", information, re.MULTILINE)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Capability:
    minor: int
    mode: int


def parse_capability(text: str) -> Capability | None:
    """``DeviceFileMinor``/``DeviceFileMode`` of a ``/proc/driver/nvidia/capabilities/...`` file."""
    minor = re.search(r"^DeviceFileMinor:\s*(\d+)\s*$", text, re.MULTILINE)
    if minor is None:
        return None
    mode = re.search(r"^DeviceFileMode:\s*(\d+)\s*$", text, re.MULTILINE)
    return Capability(int(minor.group(1)), int(mode.group(1)) & 0o777 if mode else 0o444)


_VERSION = re.compile(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s")


def parse_driver_version(proc_version: str) -> str | None:
    """The version in ``/proc/driver/nvidia/version`` ("NVRM version: ... Kernel Module  550.54.15 ...")."""
    match = _VERSION.search(proc_version + " ")
    return match.group(1) if match else None


def expected_refs(module: str, present: Sequence[str], holders: Sequence[str] | None) -> int:
    """References on ``module`` that our own loaded modules account for (the rest are users).

    With the kernel's ``holders/`` list, the holders among our modules; without it, the static
    dependency table (reference 1.7: every loaded uvm/modeset/peermem counts once against nvidia).
    """
    ours = set(UNLOAD_ORDER)
    if holders is not None:
        return sum(1 for h in holders if h in ours)
    return sum(1 for dep, base in DEPENDS_ON.items() if base == module and dep in present)


def headers_hint(kernel: str, os_id: str | None) -> str:
    """Which package provides the kernel headers for ``kernel`` on this distribution."""
    family = (os_id or "").lower()
    if family in ("ubuntu", "debian"):
        return f"install the package linux-headers-{kernel}"
    if family in ("rhel", "centos", "rocky", "almalinux", "fedora", "ol", "amzn"):
        return f"install the package kernel-devel-{kernel}"
    if family.startswith(("sles", "opensuse")):
        return "install the package kernel-default-devel matching the running kernel"
    return f"install the kernel headers for {kernel} (linux-headers-{kernel} or kernel-devel-{kernel})"


# -------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Observed:
    """What the loader saw on the host before planning ``init``."""

    kernel: str
    host_driver: str | None = None  # version ("unknown" when unreadable) of a driver we did not load
    nouveau: Literal["absent", "module", "builtin"] = "absent"
    loaded: tuple[str, ...] = ()  # sysfs names of our modules that are loaded
    recorded_digest: str | None = None
    modules_dir: str | None = None  # directory holding nvidia.ko for this kernel in the driver root
    headers: str | None = None
    installer: str | None = None
    dkms: str | None = None
    persistenced: str | None = None
    os_id: str | None = None


@dataclass(frozen=True)
class Source:
    """Where this init gets its kernel modules: already there, or built, and the build command."""

    kind: Literal["present", "installer", "dkms"]
    detail: str
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class InitPlan:
    digest: str
    host_driver: str | None = None
    nouveau: Literal["none", "unload", "builtin"] = "none"
    fast_path: bool = False
    unload: tuple[str, ...] = ()  # loaded modules to remove before loading (configuration changed)
    source: Source | None = None
    source_error: str | None = None
    params: str = ""
    load: tuple[str, ...] = ()
    persistenced: str | None = None
    notes: tuple[str, ...] = field(default=())

    def describe(self) -> list[str]:
        if self.host_driver is not None:
            return [f"host driver {self.host_driver} is installed: only write the readiness files"]
        lines = []
        if self.nouveau == "unload":
            lines.append("unload nouveau")
        elif self.nouveau == "builtin":
            lines.append("nouveau is built into the kernel: stop (blacklist it and reboot)")
        if self.fast_path:
            lines.append(f"config digest {self.digest[:12]} matches the loaded driver: keep the modules")
        if self.unload:
            lines.append("unload the previous driver: " + ", ".join(self.unload))
        if self.source is not None:
            lines.append(f"module source: {self.source.detail}")
        if self.source_error:
            lines.append(f"module source: ERROR {self.source_error}")
        if not self.fast_path and self.source is not None:
            lines.append("write /etc/modprobe.d/nvidia-gpunode.conf")
        lines.append("load " + ", ".join(self.load) if self.load else "all modules are loaded")
        lines.append("create missing device nodes (majors from /proc/devices once loaded)")
        lines.append(
            "start nvidia-persistenced --persistence-mode"
            if self.persistenced
            else "no nvidia-persistenced found"
        )
        lines.append("write .driver-ctr-ready, driver-ready and nvidia-driver.state")
        lines.extend(self.notes)
        return lines


@dataclass(frozen=True)
class PlanInputs:
    """The configuration parts :func:`plan_init` needs."""

    digest: str
    module_type: ModuleType
    rdma: bool
    force_reinstall: bool
    driver_version: str | None
    modules_target: str  # where a build installs the modules (shown in the plan, passed to the build)


def plan_init(obs: Observed, cfg: PlanInputs) -> InitPlan:
    """Decide every step of ``init`` from the observed host and the configuration."""
    if obs.host_driver is not None:
        return InitPlan(digest=cfg.digest, host_driver=obs.host_driver)
    nouveau: Literal["none", "unload", "builtin"] = {
        "absent": "none",
        "module": "unload",
        "builtin": "builtin",
    }[obs.nouveau]  # type: ignore[assignment]
    wanted = modules_to_load(cfg.rdma)
    loaded = "nvidia" in obs.loaded
    fast = loaded and obs.recorded_digest == cfg.digest and not cfg.force_reinstall
    notes: list[str] = []
    if fast:
        missing = tuple(m for m in wanted if sysfs_name(m) not in obs.loaded)
        return InitPlan(
            digest=cfg.digest,
            nouveau=nouveau,
            fast_path=True,
            load=missing,
            persistenced=obs.persistenced,
        )
    unload = tuple(m for m in UNLOAD_ORDER if m in obs.loaded)
    if unload:
        why = "FORCE_REINSTALL" if cfg.force_reinstall and obs.recorded_digest == cfg.digest else "changed"
        notes.append(f"the loaded driver's configuration {why}: it is reloaded")
    source, error = choose_source(obs, cfg)
    return InitPlan(
        digest=cfg.digest,
        nouveau=nouveau,
        unload=unload,
        source=source,
        source_error=error,
        load=wanted,
        persistenced=obs.persistenced,
        notes=tuple(notes),
    )


def choose_source(obs: Observed, cfg: PlanInputs) -> tuple[Source | None, str | None]:
    """Precompiled modules for this kernel, else a build when headers exist, else why not."""
    kind = cfg.module_type.source
    if obs.modules_dir is not None and kind != "runcompiled":
        return Source("present", f"precompiled modules for {obs.kernel} in {obs.modules_dir}"), None
    if kind == "precompiled":
        return None, (
            f"no precompiled NVIDIA modules for kernel {obs.kernel} in {cfg.modules_target} "
            f"(KERNEL_MODULE_TYPE=precompiled never builds); use a driver root with modules for "
            f"this kernel, or --kernel-module-type auto to build them"
        )
    if obs.headers is None:
        return None, (
            f"no precompiled NVIDIA modules for kernel {obs.kernel} in {cfg.modules_target} and no "
            f"kernel headers to build them (looked for /lib/modules/{obs.kernel}/build and "
            f"/usr/src/linux-headers-{obs.kernel}); {headers_hint(obs.kernel, obs.os_id)}"
        )
    if obs.installer is not None:
        argv = [
            obs.installer,
            "--kernel-module-only",
            "--silent",
            "--ui=none",
            "--no-drm",
            "--no-nouveau-check",
            f"--kernel-name={obs.kernel}",
            f"--kernel-source-path={obs.headers}",
            f"--kernel-install-path={cfg.modules_target}",
        ]
        if cfg.module_type.installer_type is not None:
            argv.append(f"-m={cfg.module_type.installer_type}")
        match = re.match(r"(\d+)", cfg.driver_version or "")
        if match is None or int(match.group(1)) >= 550:
            argv.append("--skip-module-load")  # we load them ourselves, with the parameters
        return Source("installer", f"build for {obs.kernel} with nvidia-installer", tuple(argv)), None
    if obs.dkms is not None:
        if not cfg.driver_version:
            return None, (
                f"building with DKMS needs the driver version: set --driver-version/DRIVER_VERSION "
                f"(kernel {obs.kernel})"
            )
        dkms = (obs.dkms, "install", f"nvidia/{cfg.driver_version}", "-k", obs.kernel)
        return Source("dkms", f"build for {obs.kernel} with dkms", dkms), None
    return None, (
        f"kernel headers for {obs.kernel} are at {obs.headers} but neither nvidia-installer nor dkms "
        f"was found to build the modules; put one in the driver root or pass --nvidia-installer/--dkms"
    )

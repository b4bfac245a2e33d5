"""gpunode-toolkit's settings: the flags of each verb (`cdi generate|list`, `runtime configure|status`).

`runtime`'s defaults and NVIDIA env var aliases depend on ``--runtime``: :class:`RuntimeSettings` holds
containerd's, :class:`CrioSettings` overrides them with CRI-O's (field order, and so ``--help``, stays
the same); :func:`status_settings_for` and :func:`configure_settings_for` pick the class from the
command line before parsing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from gpunode.common.errors import UsageError
from gpunode.common.settings import CommonSettings, group, setting
from gpunode.toolkit.cdi import DEFAULT_HOOK_PATH, DEFAULT_OUTPUT, HOOK_COMMANDS, MODES, parse_disabled_hooks

__all__ = [
    "CdiGenerateSettings",
    "CdiListSettings",
    "CdiSpecSettings",
    "ConfigureActions",
    "ConfigureSettings",
    "CrioConfigureSettings",
    "CrioSettings",
    "HookSettings",
    "RuntimeSettings",
    "configure_settings_for",
    "runtime_of",
    "spec_dirs",
    "status_settings_for",
]

# ------------------------------------------------------------------------------------------------ cdi


def _disabled_hooks(text: str) -> str:
    """``--disable-hook``: checked, normalized (``all`` spelled out)."""
    return ",".join(sorted(parse_disabled_hooks(text)))


@dataclass(frozen=True)
class CdiSpecSettings:
    """What the CDI spec is built from (both `cdi` verbs)."""

    vendor: str = setting(
        "--vendor",
        env=("GPUNODE_CDI_VENDOR", "NVIDIA_CTK_CDI_VENDOR"),
        default="nvidia.com",
        help="vendor part of the CDI kind",
    )
    device_class: str = setting(
        "--class",
        env=("GPUNODE_CDI_CLASS", "NVIDIA_CTK_CDI_CLASS"),
        default="gpu",
        help="class part of the CDI kind",
    )
    kind: str | None = setting(
        "--kind",
        env=("GPUNODE_CDI_KIND", "NVIDIA_CTK_CDI_KIND"),
        metavar="VENDOR/CLASS",
        help="the CDI kind; overrides --vendor and --class",
    )
    device_name_strategy: str = setting(
        "--device-name-strategy",
        env=("GPUNODE_CDI_DEVICE_NAME_STRATEGY", "NVIDIA_CTK_CDI_DEVICE_NAME_STRATEGY"),
        default="index,uuid",
        metavar="LIST",
        help="device names to emit, comma-separated: index (0, 0:1), uuid (GPU-..., MIG-...), "
        "type-index (gpu0, mig0:1)",
    )
    all_device: bool = setting(
        "--all-device",
        env="GPUNODE_CDI_ALL_DEVICE",
        type=bool,
        default=True,
        help="emit the device 'all' (every device's nodes)",
    )
    hook_path: str = setting(
        "--hook-path",
        env="NVIDIA_CDI_HOOK_PATH",
        default=DEFAULT_HOOK_PATH,
        metavar="PATH",
        help="host path of the program the spec's hooks run: gpunode's gpunode-cdi-hook (installed by "
        "generate), or NVIDIA's nvidia-cdi-hook / nvidia-ctk where installed",
    )
    disable_hook: str = setting(
        "--disable-hook",
        env=("GPUNODE_CDI_DISABLE_HOOK", "NVIDIA_CTK_CDI_DISABLE_HOOK"),
        default="",
        type=_disabled_hooks,
        metavar="NAMES",
        help=f"hooks to leave out of the spec, comma-separated: all, {', '.join(HOOK_COMMANDS)}",
    )
    mode: str = setting(
        "--mode",
        env=("GPUNODE_CDI_MODE", "NVIDIA_CTK_CDI_MODE"),
        choices=MODES,
        default="auto",
        help="nvml/auto: every GPU and MIG device NVML reports; management: one device 'all' with every "
        "GPU node found (kind management.nvidia.com/gpu unless --kind/--vendor/--class say otherwise)",
    )
    also_kind: str = setting(
        "--also-kind",
        env="GPUNODE_CDI_ALSO_KIND",
        default="",
        metavar="KINDS",
        help="write the same devices under these kinds too, comma-separated, each to <vendor>-<class>.<ext> "
        "next to --output (k8s.device-plugin.nvidia.com/gpu: the names the device plugin hands out); a kind "
        "of class imex-channel gets the IMEX channel nodes instead (none found: no file)",
    )
    allow_missing_libraries: bool = setting(
        "--allow-missing-libraries",
        env="GPUNODE_CDI_ALLOW_MISSING_LIBRARIES",
        type=bool,
        default=False,
        help="write the spec even when the driver root holds no driver library (default: exit 1)",
    )
    dev_root: str | None = setting(
        "--dev-root",
        env="NVIDIA_DEV_ROOT",
        metavar="DIR",
        help="host directory under which /dev/nvidia* live (default: the driver root)",
    )
    host_root: str = setting(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's / is visible to this process (files are looked up there; the spec "
        "keeps host paths)",
    )


_HOOK_ALIAS = {"--nvidia-cdi-hook-path": "hook_path"}  # listed after the spec flags, as always


@dataclass(frozen=True)
class CdiGenerateSettings:
    """`gpunode-toolkit cdi generate`."""

    common: CommonSettings = group(CommonSettings)
    cdi: CdiSpecSettings = group(CdiSpecSettings, aliases=_HOOK_ALIAS)
    output: str = setting(
        "--output",
        short="-o",
        env=("GPUNODE_CDI_OUTPUT", "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH"),
        default=DEFAULT_OUTPUT,
        metavar="FILE",
        help="where to write the spec; '-' prints it",
    )
    format: Literal["yaml", "json"] | None = setting(
        "--format",
        env=("GPUNODE_CDI_FORMAT", "NVIDIA_CTK_CDI_FORMAT"),
        choices=("yaml", "json"),
        help="output format (default: json for a .json file name, else yaml)",
    )
    watch: bool = setting(
        "--watch",
        env="GPUNODE_CDI_WATCH",
        type=bool,
        default=False,
        help="stay up and rewrite the spec after every MIG configuration change",
    )
    install_hook: bool = setting(
        "--install-hook",
        env="GPUNODE_CDI_INSTALL_HOOK",
        type=bool,
        default=True,
        help="install gpunode-cdi-hook at --hook-path (under --host-root) before writing a spec that runs it",
    )


@dataclass(frozen=True)
class CdiListSettings:
    """`gpunode-toolkit cdi list`."""

    common: CommonSettings = group(CommonSettings)
    cdi: CdiSpecSettings = group(CdiSpecSettings, aliases=_HOOK_ALIAS)
    spec: str | None = setting(
        "--spec", metavar="FILE", help="list the devices of this spec file instead (no NVML)"
    )


@dataclass(frozen=True)
class HookSettings:
    """`gpunode-toolkit hook install|uninstall`."""

    common: CommonSettings = group(CommonSettings)
    hook_path: str = setting(
        "--hook-path",
        env="NVIDIA_CDI_HOOK_PATH",
        default=DEFAULT_HOOK_PATH,
        metavar="PATH",
        help="host path of gpunode-cdi-hook",
    )
    host_root: str = setting(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's / is visible to this process",
    )


# -------------------------------------------------------------------------------------------- runtime

TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
RUNTIMES = ("containerd", "crio")
RestartMode = Literal["signal", "systemd", "none"]


@dataclass(frozen=True)
class _RuntimeDefaults:
    """What differs between the runtimes: defaults and NVIDIA's env var aliases."""

    runtime: str
    config: str
    drop_in: str
    socket: str
    restart_mode: RestartMode
    config_envs: tuple[str, ...]
    socket_envs: tuple[str, ...]
    default_envs: tuple[str, ...]


CONTAINERD = _RuntimeDefaults(
    runtime="containerd",
    config="/etc/containerd/config.toml",
    drop_in="/etc/containerd/conf.d/99-nvidia.toml",
    socket="/run/containerd/containerd.sock",
    restart_mode="signal",
    config_envs=("RUNTIME_CONFIG", "CONTAINERD_CONFIG"),
    socket_envs=("RUNTIME_SOCKET", "CONTAINERD_SOCKET"),
    default_envs=("NVIDIA_RUNTIME_SET_AS_DEFAULT", "CONTAINERD_SET_AS_DEFAULT"),
)
CRIO = _RuntimeDefaults(
    runtime="crio",
    config="/etc/crio/crio.conf",
    drop_in="/etc/crio/crio.conf.d/99-nvidia.toml",
    socket="/var/run/crio/crio.sock",
    restart_mode="systemd",
    config_envs=("RUNTIME_CONFIG", "CRIO_CONFIG"),
    socket_envs=("RUNTIME_SOCKET", "CRIO_SOCKET"),
    default_envs=("NVIDIA_RUNTIME_SET_AS_DEFAULT",),
)


# The flags whose defaults or env vars differ by runtime, declared once each (cast: setting() returns
# the dataclass field that stands for the value).


def _runtime(d: _RuntimeDefaults) -> str:
    # Always given (runtime_of insists before parsing); the default only types the field.
    return cast(
        str,
        setting(
            "--runtime",
            env="RUNTIME",
            choices=RUNTIMES,
            default=d.runtime,
            default_help="",
            help="the container runtime",
        ),
    )


def _config(d: _RuntimeDefaults) -> str:
    return cast(
        str, setting("--config", env=d.config_envs, default=d.config, metavar="FILE", help="its main config")
    )


def _drop_in(d: _RuntimeDefaults) -> str:
    return cast(
        str,
        setting(
            "--drop-in-config",
            env="RUNTIME_DROP_IN_CONFIG",
            default=d.drop_in,
            metavar="FILE",
            help="where our settings go ('' or none: edit --config in place; containerd v1 always is)",
        ),
    )


def _socket(d: _RuntimeDefaults) -> str:
    return cast(
        str, setting("--socket", env=d.socket_envs, default=d.socket, metavar="SOCK", help="to find its pid")
    )


def _set_as_default(d: _RuntimeDefaults) -> bool:
    return cast(
        bool,
        setting(
            "--set-as-default",
            env=d.default_envs,
            type=bool,
            default=False,
            help="make the nvidia handler the default runtime",
        ),
    )


def _restart_mode(d: _RuntimeDefaults) -> str:
    return cast(
        str,
        setting(
            "--restart-mode",
            env="RUNTIME_RESTART_MODE",
            choices=("signal", "systemd", "none"),
            default=d.restart_mode,
            metavar="MODE",
            help="signal | systemd | none; only when something changed",
        ),
    )


def _systemd_unit(d: _RuntimeDefaults) -> str:
    return cast(
        str,
        setting("--systemd-unit", env="RUNTIME_SYSTEMD_UNIT", default=d.runtime, metavar="UNIT", help="unit"),
    )


def _runtime_path(option: str, env: str, suffix: str) -> str:
    return cast(
        str,
        setting(option, env=env, default=f"{TOOLKIT_DIR}/nvidia-container-runtime{suffix}", metavar="PATH"),
    )


def spec_dirs(raw: str) -> tuple[str, ...]:
    """``--cdi-spec-dirs``: a comma-separated list of at least one directory."""
    dirs = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not dirs:
        raise ValueError("at least one directory")
    return dirs


@dataclass(frozen=True)
class RuntimeSettings:
    """`gpunode-toolkit runtime status --runtime containerd` (the other runtime: :class:`CrioSettings`)."""

    common: CommonSettings = group(CommonSettings)
    runtime: str = _runtime(CONTAINERD)
    config: str = _config(CONTAINERD)
    drop_in_config: str = _drop_in(CONTAINERD)
    socket: str = _socket(CONTAINERD)
    nvidia_runtime_name: str = setting(
        "--nvidia-runtime-name",
        env=("NVIDIA_RUNTIME_NAME", "CONTAINERD_RUNTIME_CLASS"),
        default="nvidia",
        metavar="NAME",
        help="name of the main handler (the RuntimeClass handler)",
    )
    nvidia_runtime_path: str = _runtime_path("--nvidia-runtime-path", "NVIDIA_RUNTIME_PATH", "")
    nvidia_cdi_runtime_path: str = _runtime_path(
        "--nvidia-cdi-runtime-path", "NVIDIA_CDI_RUNTIME_PATH", ".cdi"
    )
    nvidia_legacy_runtime_path: str = _runtime_path(
        "--nvidia-legacy-runtime-path", "NVIDIA_LEGACY_RUNTIME_PATH", ".legacy"
    )
    set_as_default: bool = _set_as_default(CONTAINERD)
    enable_cdi: bool = setting(
        "--enable-cdi",
        env=("RUNTIME_ENABLE_CDI", "CDI_ENABLED"),
        type=bool,
        default=True,
        help="containerd (1.7 and later): enable_cdi + cdi_spec_dirs in the CRI plugin, so pods get the "
        "devices the plugin names from the CDI spec with no RuntimeClass (CRI-O always reads CDI specs); "
        "--no-enable-cdi: the legacy path, NVIDIA's runtime handlers",
    )
    nvidia_runtime_handlers: bool = setting(
        "--nvidia-runtime-handlers",
        env="NVIDIA_RUNTIME_HANDLERS",
        type=bool,
        default=False,
        help="also register the nvidia, nvidia-cdi and nvidia-legacy handlers (always with "
        "--no-enable-cdi); they run NVIDIA's nvidia-container-runtime, which must be on the host",
    )
    cdi_spec_dirs: tuple[str, ...] = setting(
        "--cdi-spec-dirs",
        env="CDI_SPEC_DIRS",
        type=spec_dirs,
        default=("/etc/cdi", "/var/run/cdi"),
        default_help="/etc/cdi,/var/run/cdi",
        metavar="DIRS",
        help="comma-separated",
    )
    containerd_config_version: int | None = setting(
        "--containerd-config-version",
        env="CONTAINERD_CONFIG_VERSION",
        type=int,
        choices=(1, 2, 3),
        metavar="N",
        help="config version for a new or empty containerd config (default 2); else the file's own",
    )
    runtime_type: str = setting(
        "--runtime-type",
        env="CONTAINERD_RUNTIME_TYPE",
        default="io.containerd.runc.v2",
        metavar="TYPE",
        help="containerd runtime_type when the copied runc table has none",
    )
    restart_mode: str = _restart_mode(CONTAINERD)
    systemctl: str | None = setting(
        "--systemctl", env="GPUNODE_SYSTEMCTL", metavar="PATH", help="default: systemctl (chrooted)"
    )
    systemd_unit: str = _systemd_unit(CONTAINERD)
    pid_file: str | None = setting(
        "--pid-file", env="RUNTIME_PID_FILE", metavar="FILE", help="runtime's pid file (signal mode)"
    )
    host_root: str = setting(
        "--host-root", env="GPUNODE_HOST_ROOT", default="/", metavar="DIR", help="host's / is here"
    )
    state_file: str | None = setting(
        "--state-file", env="RUNTIME_STATE_FILE", metavar="FILE", help="default: <config>.gpunode-state.json"
    )


@dataclass(frozen=True)
class CrioSettings(RuntimeSettings):
    """`gpunode-toolkit runtime status --runtime crio`: CRI-O's defaults and env var aliases."""

    runtime: str = _runtime(CRIO)
    config: str = _config(CRIO)
    drop_in_config: str = _drop_in(CRIO)
    socket: str = _socket(CRIO)
    set_as_default: bool = _set_as_default(CRIO)
    restart_mode: str = _restart_mode(CRIO)
    systemd_unit: str = _systemd_unit(CRIO)


@dataclass(frozen=True)
class ConfigureActions:
    """What `runtime configure` does besides configuring."""

    dry_run: bool = setting("--dry-run", type=bool, default=False, help="print the diff, change nothing")
    revert: bool = setting(
        "--revert", type=bool, default=False, help="restore the files as they were before us"
    )
    force: bool = setting("--force", type=bool, default=False, help="revert files edited since we wrote them")
    check: bool = setting("--check", type=bool, default=False, help="same as the status command")


@dataclass(frozen=True)
class ConfigureSettings(RuntimeSettings):
    """`gpunode-toolkit runtime configure --runtime containerd`."""

    actions: ConfigureActions = group(ConfigureActions)


@dataclass(frozen=True)
class CrioConfigureSettings(CrioSettings, ConfigureSettings):
    """`gpunode-toolkit runtime configure --runtime crio` (CRI-O's defaults, then the actions)."""


def runtime_of(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """--runtime (or RUNTIME) before the full parse: the other flags' defaults depend on it."""
    value: str | None = None
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--runtime" and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("--runtime="):
            value = arg.partition("=")[2]
    if value is None:
        value = environ.get("RUNTIME") or None
    if value is None:
        raise UsageError("--runtime is required; the choices are: containerd, crio")
    if value not in RUNTIMES:
        raise UsageError(f"unknown runtime {value!r}; the choices are: containerd, crio")
    return value


def status_settings_for(argv: Sequence[str], environ: Mapping[str, str]) -> type[RuntimeSettings]:
    """The `runtime status` settings class of the runtime named on the command line (or RUNTIME)."""
    return CrioSettings if runtime_of(argv, environ) == "crio" else RuntimeSettings


def configure_settings_for(argv: Sequence[str], environ: Mapping[str, str]) -> type[ConfigureSettings]:
    """The `runtime configure` settings class of the runtime named on the command line (or RUNTIME)."""
    return CrioConfigureSettings if runtime_of(argv, environ) == "crio" else ConfigureSettings

"""The device plugin's effective settings: flag > environment variable > config file > default.

Plain dataclasses and pure parsing, no pydantic: the ``version: v1`` file's models live in
:mod:`gpunode.api.plugin_config`, imported only when a file is given, so a plugin started from flags
alone never loads pydantic (several MB of resident memory). The file's plain types (choices, resource
names, time slicing) are in :mod:`gpunode.api.plugin_types`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, cast

from gpunode.api.plugin_types import (
    ALLOCATION_POLICIES,
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEVICE_ID_STRATEGIES,
    DISCOVERY_STRATEGIES,
    MIG_STRATEGIES,
    MPS_MIXED_REFUSAL,
    AllocationPolicy,
    DeviceIdStrategy,
    DiscoveryStrategy,
    MigStrategy,
    ResourcePattern,
    TimeSlicing,
    parse_device_list_strategy,
)
from gpunode.common.errors import UsageError

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.device_plugin.flags import DevicePluginFlags

__all__ = ["PluginSettings", "plugin_settings", "settings_from_config"]


@dataclass(frozen=True)
class PluginSettings:
    """The device plugin's effective settings after flag > env > config file > default.

    ``dev_root`` defaults to ``driver_root``. ``imex_channel_ids`` holds the configured IMEX channels;
    the server clears it when the channel device is missing and ``imex_required`` is false.
    ``gpu_resources`` / ``mig_resources`` come from the file's ``resources`` block.
    """

    mig_strategy: MigStrategy = "none"
    fail_on_init_error: bool = True
    pass_device_specs: bool = False
    device_list_strategies: tuple[str, ...] = ("envvar",)
    device_id_strategy: DeviceIdStrategy = "uuid"
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    shared_allocation_policy: AllocationPolicy = "distributed"
    driver_root: str = "/"
    dev_root: str = "/"
    sharing: TimeSlicing | None = None
    gds_enabled: bool = False
    mofed_enabled: bool = False
    gdrcopy_enabled: bool = False
    mps_root: str | None = None
    device_discovery_strategy: DiscoveryStrategy = "auto"
    nvidia_ctk_path: str = "/usr/bin/nvidia-ctk"
    container_driver_root: str = "/driver-root"
    imex_channel_ids: tuple[int, ...] = ()
    imex_required: bool = False
    gpu_resources: tuple[ResourcePattern, ...] = ()
    mig_resources: tuple[ResourcePattern, ...] = ()


_SETTING_NAMES = frozenset(f.name for f in fields(PluginSettings))

_CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {
    "mig_strategy": ("MIG strategy", MIG_STRATEGIES),
    "device_id_strategy": ("device ID strategy", DEVICE_ID_STRATEGIES),
    "shared_allocation_policy": ("shared devices allocation policy", ALLOCATION_POLICIES),
    "device_discovery_strategy": ("device discovery strategy", DISCOVERY_STRATEGIES),
}
_BOOLS = frozenset(
    {
        "fail_on_init_error",
        "pass_device_specs",
        "gds_enabled",
        "mofed_enabled",
        "gdrcopy_enabled",
        "imex_required",
    }
)
_STRINGS = frozenset({"cdi_annotation_prefix", "driver_root", "nvidia_ctk_path", "container_driver_root"})


def _file_values(cfg: PluginConfig) -> dict[str, object]:
    """The settings written in the file (None = not written), keyed by PluginSettings field."""
    flags = cfg.flags
    plugin = flags.plugin
    gpu_patterns, mig_patterns = cfg.resource_patterns()  # empty unless gpunode's extension is on

    def pv(name: str) -> object:
        return getattr(plugin, name) if plugin is not None else None

    values: dict[str, object] = {
        "mig_strategy": flags.mig_strategy,
        "fail_on_init_error": flags.fail_on_init_error,
        "driver_root": flags.nvidia_driver_root,
        "dev_root": flags.nvidia_dev_root,
        "mps_root": flags.mps_root,
        "gds_enabled": flags.gds_enabled,
        "mofed_enabled": flags.mofed_enabled,
        "gdrcopy_enabled": flags.gdrcopy_enabled,
        "device_discovery_strategy": flags.device_discovery_strategy,
        "pass_device_specs": pv("pass_device_specs"),
        "device_list_strategies": pv("device_list_strategy"),
        "device_id_strategy": pv("device_id_strategy"),
        "cdi_annotation_prefix": pv("cdi_annotation_prefix"),
        "nvidia_ctk_path": pv("nvidia_ctk_path"),
        "container_driver_root": pv("container_driver_root"),
        "shared_allocation_policy": pv("shared_devices_allocation_policy"),
        "imex_channel_ids": cfg.imex.channel_ids or None,
        "imex_required": cfg.imex.required if "required" in cfg.imex.model_fields_set else None,
        "gpu_resources": gpu_patterns or None,
        "mig_resources": mig_patterns or None,
        "sharing": cfg.time_slicing(),
    }
    return {key: value for key, value in values.items() if value is not None}


def _check_override(key: str, value: object) -> object:
    """Validate one already-parsed flag/env value; :class:`UsageError` names the bad value."""
    if key == "device_list_strategies":
        try:
            return parse_device_list_strategy(cast("str | Sequence[str]", value))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if key in _CHOICES:
        what, allowed = _CHOICES[key]
        if value not in allowed:
            raise UsageError(f"invalid {what} {value!r}: must be one of {', '.join(allowed)}")
        return value
    if key in _BOOLS and not isinstance(value, bool):
        raise UsageError(f"{key} must be true or false, not {value!r}")
    if key in _STRINGS and not isinstance(value, str):
        raise UsageError(f"{key} must be a string, not {value!r}")
    if key == "imex_channel_ids":
        channels = tuple(cast("Iterable[int]", value))
        if channels not in ((), (0,)):
            raise UsageError(f"IMEX channel IDs must be [] or [0] (got {list(channels)})")
        return channels
    if key == "sharing" and value is not None and not isinstance(value, TimeSlicing):
        raise UsageError(f"sharing must be a TimeSlicing or None, not {type(value).__name__}")
    return value


def settings_from_config(cfg: PluginConfig | None, overrides: Mapping[str, object]) -> PluginSettings:
    """The effective settings: ``overrides`` (resolved flag/env values) > file > defaults.

    ``overrides`` is keyed by :class:`PluginSettings` field names; a key that is present wins over the
    file even when its value equals the default. ``device_list_strategies`` may be given as the
    comma-separated env/flag text. Raises :class:`UsageError` for an invalid override value and
    ``KeyError`` for a key that names no setting (a programming error).
    """
    unknown = sorted(set(overrides) - _SETTING_NAMES)
    if unknown:
        raise KeyError(f"unknown device plugin setting(s): {', '.join(unknown)}")
    # each value is the model's (typed) or checked by _check_override: PluginSettings takes them as they are
    merged: dict[str, Any] = _file_values(cfg) if cfg is not None else {}
    for key, value in overrides.items():
        merged[key] = _check_override(key, value)
    if "dev_root" not in merged or merged["dev_root"] is None:
        merged["dev_root"] = merged.get("driver_root", "/")
    sharing = merged.get("sharing")
    if isinstance(sharing, TimeSlicing) and sharing.mps and merged.get("mig_strategy") == "mixed":
        raise UsageError(MPS_MIXED_REFUSAL)
    return PluginSettings(**merged)


def plugin_settings(flags: DevicePluginFlags, config: PluginConfig | None) -> PluginSettings:
    """The effective settings for ``config`` (None: no file): the resolved command line (flag > env >
    the file's ``flags`` > default, already applied) over the rest of the file."""
    overrides: dict[str, object] = {
        "mig_strategy": flags.mig_strategy,
        "fail_on_init_error": flags.fail_on_init_error,
        "pass_device_specs": flags.pass_device_specs,
        "device_list_strategies": flags.device_list_strategy,
        "device_id_strategy": flags.device_id_strategy,
        "cdi_annotation_prefix": flags.cdi_annotation_prefix,
        "shared_allocation_policy": flags.shared_devices_allocation_policy,
        "driver_root": flags.common.driver_root,
        "dev_root": flags.dev_root,
        "mps_root": flags.mps_root,
        "imex_channel_ids": flags.imex_channel_ids,
        "imex_required": flags.imex_required,
    }
    return settings_from_config(config, {key: value for key, value in overrides.items() if value is not None})

"""The device plugin's effective settings: plain dataclasses and pure parsing, no pydantic.

The config file's pydantic models live in :mod:`gpunode.device_plugin.config`, imported only when a file
is given, so a plugin started from flags alone never loads pydantic (several MB of resident memory).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from gpunode.common.errors import UsageError

if TYPE_CHECKING:
    from gpunode.device_plugin.config import PluginConfig

RESOURCE_PREFIX = "nvidia.com/"
MAX_RESOURCE_NAME = 63
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"

MIG_STRATEGIES = ("none", "single", "mixed")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
ALLOCATION_POLICIES = ("distributed", "packed")
DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")

MigStrategy = Literal["none", "single", "mixed"]
DeviceIdStrategy = Literal["uuid", "index"]
AllocationPolicy = Literal["distributed", "packed"]
DiscoveryStrategy = Literal["auto", "nvml", "tegra"]

#: ``"all"``, a count of devices, or a tuple of device references (``"0"``, ``"1:0"``, ``"GPU-..."``).
DeviceSelection = Literal["all"] | int | tuple[str, ...]

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_GPU_INDEX = re.compile(r"^[0-9]+$")
_MIG_INDEX = re.compile(r"^[0-9]+:[0-9]+$")
_UUID_REF = re.compile(r"^(GPU|MIG)-\S+$")


# ------------------------------------------------------------------------------------------- helpers


def normalize_resource_name(name: str) -> str:
    """``"gpu"`` -> ``"nvidia.com/gpu"``; ``ValueError`` unless the result is a valid extended resource.

    The ``nvidia.com/`` prefix is added when absent; the full name must have at most 63 characters and
    the part after the prefix must be a DNS-1123 subdomain (lower-case letters, digits, ``-`` and ``.``).
    """
    full = name if name.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + name
    suffix = full.removeprefix(RESOURCE_PREFIX)
    if not suffix:
        raise ValueError(f"resource name {name!r} is empty after the {RESOURCE_PREFIX} prefix")
    if len(full) > MAX_RESOURCE_NAME:
        raise ValueError(
            f"resource name {full!r} is {len(full)} characters long; at most {MAX_RESOURCE_NAME} are allowed"
        )
    if "/" in suffix:
        raise ValueError(
            f"resource name {name!r}: only resources in the {RESOURCE_PREFIX} domain are allowed"
        )
    if not _DNS1123_SUBDOMAIN.match(suffix):
        raise ValueError(
            f"resource name {full!r}: {suffix!r} must be a DNS-1123 subdomain "
            "(lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )
    return full


def parse_device_list_strategy(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"envvar,cdi-cri"`` (the flag/env form) or a list -> ``("envvar", "cdi-cri")``, deduplicated.

    ``ValueError`` names the bad value and lists the allowed ones; an empty list is an error too.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in items:
        if not isinstance(raw, str):
            raise ValueError(f"device list strategy must be a string, not {raw!r}")
        item = raw.strip()
        if not item and isinstance(text, str):
            continue
        if item not in DEVICE_LIST_STRATEGIES:
            raise ValueError(
                f"invalid device list strategy {item!r}: must be one of {', '.join(DEVICE_LIST_STRATEGIES)}"
            )
        if item not in out:
            out.append(item)
    if not out:
        raise ValueError(
            f"no device list strategy given: use one or more of {', '.join(DEVICE_LIST_STRATEGIES)}"
        )
    return tuple(out)


def _parse_devices(value: object) -> DeviceSelection:
    if isinstance(value, bool):
        raise ValueError('must be "all", a number of devices or a list of device references')
    if isinstance(value, str):
        if value == "all":
            return "all"
        raise ValueError(f'must be "all", a number of devices or a list of device references (got {value!r})')
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"a device count must be at least 1 (got {value})")
        return value
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError('the device list is empty; use "all" or name at least one device')
        refs: list[str] = []
        for position, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int | str):
                raise ValueError(f"[{position}]: a device reference must be an index or a UUID string")
            if isinstance(item, int):
                if item < 0:
                    raise ValueError(f"[{position}]: a GPU index cannot be negative (got {item})")
                ref = str(item)
            else:
                ref = item.strip()
                if not (_GPU_INDEX.match(ref) or _MIG_INDEX.match(ref) or _UUID_REF.match(ref)):
                    raise ValueError(
                        f"[{position}]: {item!r} is not a device reference "
                        '(a GPU index like 0, a MIG index like "1:0", or a GPU-/MIG- UUID)'
                    )
            if ref in refs:
                raise ValueError(f"[{position}]: {ref!r} is listed twice")
            refs.append(ref)
        return tuple(refs)
    raise ValueError('must be "all", a number of devices or a list of device references')


# ------------------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class ResourcePattern:
    """A resource-naming rule: devices whose name/profile matches ``pattern`` are advertised as ``name``."""

    pattern: str
    name: str

    def matches(self, text: str) -> bool:
        """Anchored, case-insensitive glob match where ``*`` is the only wildcard."""
        regex = ".*".join(re.escape(part) for part in self.pattern.split("*"))
        return re.fullmatch(regex, text, flags=re.IGNORECASE) is not None


@dataclass(frozen=True)
class SharedResource:
    """One time-sliced resource: ``name`` (normalised) replicated ``replicas`` times.

    ``devices`` selects which devices of ``name`` are replicated (see the module docstring); ``rename``
    is the resource name the replicas are advertised under (wins over ``renameByDefault``).
    """

    name: str
    replicas: int
    devices: DeviceSelection = "all"
    rename: str | None = None


@dataclass(frozen=True)
class TimeSlicing:
    """The effective time-slicing settings."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[SharedResource, ...] = ()


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


def _file_values(cfg: PluginConfig) -> dict[str, Any]:
    """The settings written in the file (None = not written), keyed by PluginSettings field."""
    flags = cfg.flags
    plugin = flags.plugin

    def pv(name: str) -> Any:
        return getattr(plugin, name) if plugin is not None else None

    values: dict[str, Any] = {
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
        "gpu_resources": tuple(ResourcePattern(r.pattern, r.name) for r in cfg.resources.gpus) or None,
        "mig_resources": tuple(ResourcePattern(r.pattern, r.name) for r in cfg.resources.mig) or None,
    }
    ts = cfg.sharing.time_slicing
    if ts is not None:
        values["sharing"] = TimeSlicing(
            rename_by_default=ts.rename_by_default,
            fail_requests_greater_than_one=bool(ts.fail_requests_greater_than_one),
            resources=tuple(
                SharedResource(name=r.name, replicas=r.replicas, devices=r.devices, rename=r.rename)
                for r in ts.resources
            ),
        )
    return {key: value for key, value in values.items() if value is not None}


def _check_override(key: str, value: Any) -> Any:
    """Validate one already-parsed flag/env value; :class:`UsageError` names the bad value."""
    if key == "device_list_strategies":
        try:
            return parse_device_list_strategy(value)
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
        channels = tuple(value)
        if channels not in ((), (0,)):
            raise UsageError(f"IMEX channel IDs must be [] or [0] (got {list(channels)})")
        return channels
    if key == "sharing" and value is not None and not isinstance(value, TimeSlicing):
        raise UsageError(f"sharing must be a TimeSlicing or None, not {type(value).__name__}")
    return value


def settings_from_config(cfg: PluginConfig | None, overrides: Mapping[str, Any]) -> PluginSettings:
    """The effective settings: ``overrides`` (resolved flag/env values) > file > defaults.

    ``overrides`` is keyed by :class:`PluginSettings` field names; a key that is present wins over the
    file even when its value equals the default. ``device_list_strategies`` may be given as the
    comma-separated env/flag text. Raises :class:`UsageError` for an invalid override value and
    ``KeyError`` for a key that names no setting (a programming error).
    """
    unknown = sorted(set(overrides) - _SETTING_NAMES)
    if unknown:
        raise KeyError(f"unknown device plugin setting(s): {', '.join(unknown)}")
    merged: dict[str, Any] = _file_values(cfg) if cfg is not None else {}
    for key, value in overrides.items():
        merged[key] = _check_override(key, value)
    if "dev_root" not in merged or merged["dev_root"] is None:
        merged["dev_root"] = merged.get("driver_root", "/")
    return PluginSettings(**merged)

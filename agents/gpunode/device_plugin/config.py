"""The device plugin's config file (NVIDIA's ``version: v1`` format) and its effective settings.

The file format is NVIDIA's k8s-device-plugin config, key for key, so GPU Operator ConfigMaps work
unchanged. Load it with ``load_config(path, PluginConfig)`` (or ``parse_config_text``): every problem is
reported at once with its YAML path, e.g. ``sharing.timeSlicing.resources[0].replicas: must be at least 2``.

Every flag in the file is optional (``None`` = not written), so that :func:`settings_from_config` can
apply the precedence flag > environment variable > config file > default: the caller passes the values
it resolved from flags and environment variables as ``overrides``.

Where NVIDIA's plugin parses something and then silently ignores it, this one implements it:

* ``sharing.timeSlicing.resources[].rename`` advertises that entry's replicas under its own resource
  name (``rename: gpu-shared-a`` -> ``nvidia.com/gpu-shared-a``); it wins over ``renameByDefault``.
* ``sharing.timeSlicing.resources[].devices`` selects which devices are replicated: ``all``, a count
  ``N`` (the first N devices of the resource, by GPU index then MIG index), or a list of references:
  a GPU index (``0``), a MIG index (``"1:0"`` = MIG device 0 of GPU 1), a GPU UUID (``GPU-...``) or a
  MIG UUID (``MIG-...``). A GPU index or GPU UUID also selects the MIG devices of that GPU. Several
  entries may name the same resource with disjoint selections (per-GPU replica counts); devices that no
  entry selects stay unshared, so a partial selection needs a rename (checked when devices are built).
* ``resources.gpus`` / ``resources.mig`` (``{pattern, name}`` lists) name resources by GPU model or MIG
  profile: the first pattern matching the GPU's NVML name (``*A100*``) or the MIG profile (``1g.5gb``)
  wins; ``*`` is the only wildcard, the match is anchored and case-insensitive. Devices matching no
  pattern get the default names (``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``).

Not implemented, and said so rather than ignored: MPS sharing (``sharing.mps`` is parsed and then
rejected with ``sharing.mps: MPS sharing is not supported yet; use timeSlicing``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from pydantic import Field, field_validator

from gpunode.common.config import ConfigModel
from gpunode.common.errors import UsageError

__all__ = [
    "ALLOCATION_POLICIES",
    "DEFAULT_CDI_ANNOTATION_PREFIX",
    "DEVICE_ID_STRATEGIES",
    "DEVICE_LIST_STRATEGIES",
    "DISCOVERY_STRATEGIES",
    "MIG_STRATEGIES",
    "RESOURCE_PREFIX",
    "DeviceSelection",
    "Flags",
    "ImexConfig",
    "PluginConfig",
    "PluginFlags",
    "PluginSettings",
    "ReplicatedResourceConfig",
    "ReplicatedResourcesConfig",
    "ResourcePattern",
    "ResourcePatternConfig",
    "ResourcesConfig",
    "SharedResource",
    "SharingConfig",
    "TimeSlicing",
    "normalize_resource_name",
    "parse_device_list_strategy",
    "settings_from_config",
]

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


# ----------------------------------------------------------------------------------------- file model


class PluginFlags(ConfigModel):
    """``flags.plugin``: the device plugin's own flags."""

    pass_device_specs: bool | None = None
    device_list_strategy: tuple[str, ...] | None = None
    device_id_strategy: DeviceIdStrategy | None = Field(default=None, alias="deviceIDStrategy")
    cdi_annotation_prefix: str | None = None
    nvidia_ctk_path: str | None = Field(default=None, alias="nvidiaCTKPath")
    container_driver_root: str | None = None
    shared_devices_allocation_policy: AllocationPolicy | None = None

    @field_validator("device_list_strategy", mode="plain")
    @classmethod
    def _strategies(cls, value: object) -> tuple[str, ...] | None:
        """A single string (``envvar``, also ``envvar,cdi-cri``) or a list of strategies."""
        if value is None:
            return None
        if not isinstance(value, str | list | tuple):
            raise ValueError("must be a strategy name or a list of strategy names")
        return parse_device_list_strategy(value)


class Flags(ConfigModel):
    """``flags``: the flags shared by the device plugin and GFD (GFD-only keys are accepted, unused)."""

    mig_strategy: MigStrategy | None = None
    fail_on_init_error: bool | None = None
    nvidia_driver_root: str | None = None
    nvidia_dev_root: str | None = None
    mps_root: str | None = None
    gds_enabled: bool | None = None
    mofed_enabled: bool | None = None
    gdrcopy_enabled: bool | None = None
    device_discovery_strategy: DiscoveryStrategy | None = None
    use_node_feature_api: bool | None = Field(default=None, alias="useNodeFeatureAPI")
    gfd: dict[str, Any] | None = None  # feature discovery's block; ignored by the device plugin
    plugin: PluginFlags | None = None


class ResourcePatternConfig(ConfigModel):
    """One ``resources.gpus`` / ``resources.mig`` entry: devices matching ``pattern`` get ``name``."""

    pattern: str
    name: str

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty (use * to match everything)")
        return value.strip()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return normalize_resource_name(value)


class ResourcesConfig(ConfigModel):
    """``resources``: name resources by GPU model (``gpus``) or MIG profile (``mig``)."""

    gpus: tuple[ResourcePatternConfig, ...] = ()
    mig: tuple[ResourcePatternConfig, ...] = ()


class ReplicatedResourceConfig(ConfigModel):
    """One ``sharing.<strategy>.resources`` entry."""

    name: str
    replicas: int
    devices: DeviceSelection = "all"
    rename: str | None = None

    @field_validator("name", "rename")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else normalize_resource_name(value)

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: int) -> int:
        if value < 2:
            raise ValueError(f"must be at least 2 (got {value})")
        return value

    @field_validator("devices", mode="plain")
    @classmethod
    def _devices(cls, value: object) -> DeviceSelection:
        return _parse_devices(value)


class ReplicatedResourcesConfig(ConfigModel):
    """``sharing.timeSlicing`` or ``sharing.mps``."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool | None = None
    resources: tuple[ReplicatedResourceConfig, ...]

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: tuple[ReplicatedResourceConfig, ...]) -> tuple[ReplicatedResourceConfig, ...]:
        if not value:
            raise ValueError("must list at least one resource to share")
        seen: dict[tuple[str, DeviceSelection], int] = {}
        for position, entry in enumerate(value):
            key = (entry.name, entry.devices)
            if key in seen:
                raise ValueError(
                    f"[{position}] repeats [{seen[key]}] ({entry.name} with the same devices); "
                    "merge the two entries"
                )
            seen[key] = position
        return value


class SharingConfig(ConfigModel):
    """``sharing``: time-slicing (supported) or MPS (parsed, then rejected)."""

    time_slicing: ReplicatedResourcesConfig | None = None
    mps: ReplicatedResourcesConfig | None = None

    @field_validator("mps")
    @classmethod
    def _mps(cls, value: ReplicatedResourcesConfig | None) -> ReplicatedResourcesConfig | None:
        if value is not None:
            raise ValueError("MPS sharing is not supported yet; use timeSlicing")
        return value


class ImexConfig(ConfigModel):
    """``imex``: the IMEX channel handed to every container (``[]`` or ``[0]``)."""

    channel_ids: tuple[int, ...] = Field(default=(), alias="channelIDs")
    required: bool = False

    @field_validator("channel_ids")
    @classmethod
    def _channels(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if value not in ((), (0,)):
            raise ValueError(f"must be [] or [0] (got {list(value)})")
        return value


class PluginConfig(ConfigModel):
    """The whole file. ``version`` must be ``v1``; a missing or empty version is read as ``v1``."""

    version: Literal["v1"] = "v1"
    flags: Flags = Flags()
    resources: ResourcesConfig = ResourcesConfig()
    sharing: SharingConfig = SharingConfig()
    imex: ImexConfig = ImexConfig()

    @field_validator("version", mode="before")
    @classmethod
    def _empty_version(cls, value: Any) -> Any:
        return "v1" if value in ("", None) else value


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
    plugin = flags.plugin or PluginFlags()
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
        "pass_device_specs": plugin.pass_device_specs,
        "device_list_strategies": plugin.device_list_strategy,
        "device_id_strategy": plugin.device_id_strategy,
        "cdi_annotation_prefix": plugin.cdi_annotation_prefix,
        "nvidia_ctk_path": plugin.nvidia_ctk_path,
        "container_driver_root": plugin.container_driver_root,
        "shared_allocation_policy": plugin.shared_devices_allocation_policy,
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

"""The device plugin / feature discovery config file: NVIDIA's ``version: v1`` format, as pydantic models.

The file format is NVIDIA's k8s-device-plugin config, key for key, so GPU Operator ConfigMaps work
unchanged. Load it with ``load_config(path, PluginConfig)`` (or ``parse_config_text``): every problem is
reported at once with its YAML path, e.g. ``sharing.timeSlicing.resources[0].replicas: must be at least 2``.

Every flag in the file is optional (``None`` = not written), so that an agent can apply the precedence
flag > environment variable > config file > default (the device plugin's
``gpunode.device_plugin.settings.settings_from_config``). The plain types the models produce (time
slicing, resource patterns, choices) are in :mod:`gpunode.api.plugin_types`, which needs no pydantic.

NVIDIA's semantics by default: NVIDIA's plugin parses three things and then ignores them, logging why
(``Customizing the 'resources' field is not yet supported in the config. Ignoring...``; the same for
``rename`` and ``devices`` of ``sharing.timeSlicing.resources``). This one does the same unless the
file switches on gpunode's extension with ``flags.gpunode.timeSlicingExtensions: true``
(:meth:`PluginConfig.time_slicing`, :meth:`PluginConfig.resource_patterns` and
:meth:`PluginConfig.ignored_fields`, whose messages the agents log as warnings). So a file written for
NVIDIA advertises what NVIDIA advertises: ``rename: gpu-shared`` with ``renameByDefault: false`` gives
``nvidia.com/gpu``; with ``renameByDefault: true`` every shared resource is ``<name>.shared``. The
values are still validated, as NVIDIA validates them. With the extension on:

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

Values in every form NVIDIA's files use: booleans also as strings (``"true"``), the device list
strategy as a list or one (comma-separated) string, ``flags.gfd`` values as numbers or strings (read by
the feature discovery's settings).

MPS sharing (``sharing.mps``, the same shape as ``timeSlicing``) as NVIDIA's plugin reads it: when set it
wins over ``timeSlicing`` (ignored, with a warning), ``failRequestsGreaterThanOne`` is always true, and
``rename`` / ``devices`` follow the same rule as under time-slicing (ignored unless
``flags.gpunode.timeSlicingExtensions``). NVIDIA's refusal is kept: MPS with ``flags.migStrategy:
mixed`` (and, found when the devices are built, MPS on MIG devices) is an error naming the path. The
per-client limits and the control daemon's paths are in :mod:`gpunode.api.mps`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from gpunode.api.plugin_types import (
    MPS_MIXED_REFUSAL,
    AllocationPolicy,
    DeviceIdStrategy,
    DeviceSelection,
    DiscoveryStrategy,
    MigStrategy,
    ResourcePattern,
    SharedResource,
    TimeSlicing,
    normalize_resource_name,
    parse_device_list_strategy,
    parse_devices,
)
from gpunode.common.config import Bool, ConfigModel

__all__ = [
    "EXTENSIONS_HINT",
    "Flags",
    "GpunodeFlags",
    "ImexConfig",
    "PluginConfig",
    "PluginFlags",
    "ReplicatedResourceConfig",
    "ReplicatedResourcesConfig",
    "ResourcePatternConfig",
    "ResourcesConfig",
    "SharingConfig",
]


#: Said with each ignored field: how to get gpunode's behaviour instead.
EXTENSIONS_HINT = "set flags.gpunode.timeSlicingExtensions: true to honour it"

# ----------------------------------------------------------------------------------------- file model


class PluginFlags(ConfigModel):
    """``flags.plugin``: the device plugin's own flags."""

    pass_device_specs: Bool | None = None
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


class GpunodeFlags(ConfigModel):
    """``flags.gpunode``: gpunode's own switches (NVIDIA's plugin ignores this block)."""

    #: honour ``resources`` and time slicing's ``rename`` / ``devices``, which NVIDIA's plugin ignores
    time_slicing_extensions: Bool | None = None


class Flags(ConfigModel):
    """``flags``: the flags shared by the device plugin and GFD (GFD-only keys are accepted, unused)."""

    mig_strategy: MigStrategy | None = None
    fail_on_init_error: Bool | None = None
    nvidia_driver_root: str | None = None
    nvidia_dev_root: str | None = None
    mps_root: str | None = None
    gds_enabled: Bool | None = None
    mofed_enabled: Bool | None = None
    gdrcopy_enabled: Bool | None = None
    device_discovery_strategy: DiscoveryStrategy | None = None
    use_node_feature_api: Bool | None = Field(default=None, alias="useNodeFeatureAPI")
    gfd: dict[str, Any] | None = None  # feature discovery's block; ignored by the device plugin
    plugin: PluginFlags | None = None
    gpunode: GpunodeFlags | None = None


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
        return parse_devices(value)


class ReplicatedResourcesConfig(ConfigModel):
    """``sharing.timeSlicing`` or ``sharing.mps``."""

    rename_by_default: Bool = False
    fail_requests_greater_than_one: Bool | None = None
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
    """``sharing``: time-slicing or MPS (MPS wins when both are set, as in NVIDIA's plugin)."""

    time_slicing: ReplicatedResourcesConfig | None = None
    mps: ReplicatedResourcesConfig | None = None


class ImexConfig(ConfigModel):
    """``imex``: the IMEX channel handed to every container (``[]`` or ``[0]``)."""

    channel_ids: tuple[int, ...] = Field(default=(), alias="channelIDs")
    required: Bool = False

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

    @field_validator("sharing")
    @classmethod
    def _mps_strategy(cls, value: SharingConfig, info: ValidationInfo) -> SharingConfig:
        """NVIDIA's refusal: MPS sharing with the ``mixed`` MIG strategy."""
        flags = info.data.get("flags")
        if value.mps is not None and isinstance(flags, Flags) and flags.mig_strategy == "mixed":
            raise ValueError(MPS_MIXED_REFUSAL)
        return value

    @property
    def extensions(self) -> bool:
        """``flags.gpunode.timeSlicingExtensions``: gpunode's ``resources`` / ``rename`` / ``devices``."""
        own = self.flags.gpunode
        return bool(own is not None and own.time_slicing_extensions)

    def time_slicing(self) -> TimeSlicing | None:
        """The effective sharing settings: ``sharing.mps`` when set (``strategy="mps"``, as NVIDIA's
        plugin, which then ignores ``timeSlicing``), else ``sharing.timeSlicing``; ``None`` for neither.

        Without the extension, as NVIDIA's plugin: every entry shares all devices of its resource under
        the default name (``renameByDefault`` still gives ``<name>.shared``); entries that then name
        the same resource count once, with the most replicas (NVIDIA's replicas of one device overlap).
        Under MPS ``failRequestsGreaterThanOne`` is always true (NVIDIA forces it).
        """
        mps = self.sharing.mps
        ts = mps if mps is not None else self.sharing.time_slicing
        if ts is None:
            return None
        if self.extensions:
            shared = tuple(
                SharedResource(name=r.name, replicas=r.replicas, devices=r.devices, rename=r.rename)
                for r in ts.resources
            )
        else:
            most: dict[str, int] = {}
            for r in ts.resources:
                most[r.name] = max(most.get(r.name, 0), r.replicas)
            shared = tuple(SharedResource(name=name, replicas=replicas) for name, replicas in most.items())
        return TimeSlicing(
            rename_by_default=ts.rename_by_default,
            fail_requests_greater_than_one=mps is not None or bool(ts.fail_requests_greater_than_one),
            resources=shared,
            strategy="mps" if mps is not None else "time-slicing",
        )

    def resource_patterns(self) -> tuple[tuple[ResourcePattern, ...], tuple[ResourcePattern, ...]]:
        """``resources.gpus`` and ``resources.mig`` as patterns; both empty without the extension."""
        if not self.extensions:
            return (), ()
        return (
            tuple(ResourcePattern(r.pattern, r.name) for r in self.resources.gpus),
            tuple(ResourcePattern(r.pattern, r.name) for r in self.resources.mig),
        )

    def ignored_fields(self) -> tuple[str, ...]:
        """What the file sets that is ignored, in NVIDIA's words (the agents log each as a warning, with
        :data:`EXTENSIONS_HINT`)."""
        if self.extensions:
            return ()
        out: list[str] = []
        if self.resources.gpus or self.resources.mig:
            out.append("Customizing the 'resources' field is not yet supported in the config. Ignoring...")
        for section, ts in (("timeSlicing", self.sharing.time_slicing), ("mps", self.sharing.mps)):
            if ts is None:
                continue
            if any(r.rename is not None and r.rename != _default_shared(r.name, ts) for r in ts.resources):
                out.append(
                    f"Setting the 'rename' field in sharing.{section}.resources is not yet supported "
                    "in the config. Ignoring..."
                )
            if any(r.devices != "all" for r in ts.resources):
                out.append(
                    f"Customizing the 'devices' field in sharing.{section}.resources is not yet "
                    "supported in the config. Ignoring..."
                )
        return tuple(out)

    def overridden_fields(self) -> tuple[str, ...]:
        """What the file sets that another part of it overrides (logged as warnings, whatever the
        extension): ``sharing.timeSlicing`` next to ``sharing.mps``, which wins as in NVIDIA's plugin."""
        if self.sharing.mps is not None and self.sharing.time_slicing is not None:
            return ("sharing.timeSlicing is ignored: sharing.mps is set and MPS sharing wins",)
        return ()


def _default_shared(name: str, ts: ReplicatedResourcesConfig) -> str | None:
    """The name NVIDIA gives an entry's replicas: ``<name>.shared`` with ``renameByDefault``, else none."""
    return name + ".shared" if ts.rename_by_default else None

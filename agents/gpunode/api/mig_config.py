"""The mig-parted ``version: v1`` MIG config file, read strictly.

The format is NVIDIA mig-parted's, key for key, so GPU Operator ConfigMaps work unchanged
(shared/reference/mig.md §1.1-1.2)::

    version: v1
    mig-configs:
      all-balanced:
        - device-filter: ["0x20B010DE", "0x20B110DE"]   # optional: string or list, 0xDDDDVVVV[:0xSSSSWWWW]
          devices: all                                  # or a list of GPU indices
          mig-enabled: true
          mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}

YAML or JSON. Stricter than mig-parted where mig-parted fails silently: a malformed ``device-filter`` is
an error (mig-parted matches nothing with it), duplicate GPU indices and two keys naming the same
profile (``2g.10gb`` and ``2c.2g.10gb``) are errors, and every problem is reported at once with its YAML
path, e.g. ``mig-configs.custom[1].device-filter[0]: 0x20B0 is not a PCI ID (expected
0xDDDDVVVV[:0xSSSSWWWW])``. Profile keys are checked for their format only; whether a GPU offers the
profile is the planner's business, per GPU. Zero counts are accepted and then dropped, so they never
make two layouts differ (mig-parted compares key counts and rebuilds forever, §2.3).

What a named config asks of each GPU of a node (mig-parted's selection walk) is the MIG agent's
business: ``gpunode.mig.selection.desired_per_gpu``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpunode.api.mig_profiles import ProfileSyntaxError, parse_profile
from gpunode.common.config import load_config, parse_config_text
from gpunode.common.errors import ConfigError

MIG_SLICES = 7  # the most MIG devices of one profile on any GPU: 7 slices (A100, H100, H200, B200; A30: 4)

__all__ = [
    "ConfigError",
    "DeviceFilter",
    "GpuIdentity",
    "MigEntry",
    "MigSpec",
    "UnknownConfig",
    "load_spec",
    "parse_device_filter",
    "parse_spec",
]

# ------------------------------------------------------------------------------------------ PCI filters

_PCI_ID = r"0[xX][0-9a-fA-F]{8}"
_FILTER_RE = re.compile(rf"^(?P<primary>{_PCI_ID})(?::(?P<subsystem>{_PCI_ID}))?$")


@dataclass(frozen=True)
class DeviceFilter:
    """One ``device-filter`` item: a PCI device + vendor id, optionally narrowed to one board (subsystem)."""

    device: int
    vendor: int
    subsys_device: int | None = None
    subsys_vendor: int | None = None

    @property
    def pci_device_id(self) -> int:
        """The primary id in NVML's form: ``device << 16 | vendor``."""
        return self.device << 16 | self.vendor

    @property
    def pci_subsystem_id(self) -> int | None:
        if self.subsys_device is None or self.subsys_vendor is None:
            return None
        return self.subsys_device << 16 | self.subsys_vendor

    def matches(self, pci_device_id: int, pci_subsystem_id: int) -> bool:
        """Whether a GPU with these ids (as NVML reports them: ``device << 16 | vendor``) matches."""
        if pci_device_id != self.pci_device_id:
            return False
        subsystem = self.pci_subsystem_id
        return subsystem is None or subsystem == pci_subsystem_id

    @classmethod
    def from_ids(cls, pci_device_id: int, pci_subsystem_id: int | None = None) -> DeviceFilter:
        """The filter for NVML-style ids (``device << 16 | vendor``)."""
        if pci_subsystem_id is None:
            return cls(pci_device_id >> 16, pci_device_id & 0xFFFF)
        return cls(
            pci_device_id >> 16, pci_device_id & 0xFFFF, pci_subsystem_id >> 16, pci_subsystem_id & 0xFFFF
        )

    def __str__(self) -> str:
        text = f"0x{self.pci_device_id:08X}"
        subsystem = self.pci_subsystem_id
        return text if subsystem is None else f"{text}:0x{subsystem:08X}"


def parse_device_filter(text: str) -> DeviceFilter:
    """``"0x20B010DE"`` or ``"0x20B510DE:0x153310DE"`` (any case) -> :class:`DeviceFilter` (or ValueError)."""
    match = _FILTER_RE.match(text.strip())
    if match is None:
        raise ValueError(f"{text} is not a PCI ID (expected 0xDDDDVVVV[:0xSSSSWWWW])")
    primary = int(match["primary"], 16)
    subsystem = int(match["subsystem"], 16) if match["subsystem"] else None
    return DeviceFilter.from_ids(primary, subsystem)


# ------------------------------------------------------------------------------------------ file model


class _V1Model(BaseModel):
    # Keys are spelled exactly as in the file (aliases); the Python names are not accepted as keys.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return str(value)


_ABSENT = object()  # stands for a key the file leaves out


def _filter_item(value: object) -> DeviceFilter:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFFFFFF:
        raise ValueError(
            f'must be a quoted string such as "0x{value:08X}" (unquoted, YAML reads a hex PCI ID as a number)'
        )
    if not isinstance(value, str):
        raise ValueError(f"must be a PCI ID string, not {_describe(value)}")
    return parse_device_filter(value)


_FilterItem = Annotated[DeviceFilter, PlainValidator(_filter_item)]


class _EntryModel(_V1Model):
    devices: Any = Field(alias="devices")
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: Any = Field(alias="mig-devices")
    device_filter: tuple[_FilterItem, ...] = Field(default=(), alias="device-filter")

    @field_validator("devices", mode="plain")
    @classmethod
    def _devices(cls, value: object) -> Literal["all"] | tuple[int, ...]:
        if value == "all":
            return "all"
        expected = 'must be "all" or a list of GPU indices (non-negative integers)'
        if not isinstance(value, list | tuple):
            raise ValueError(f"{expected}, not {_describe(value)}")
        bad = [
            f"[{i}] is {_describe(v)}"
            for i, v in enumerate(value)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0
        ]
        if bad:
            raise ValueError(f"{expected}: {', '.join(bad)}")
        indices = tuple(int(v) for v in value)
        repeated = sorted(i for i, n in Counter(indices).items() if n > 1)  # linear: lists can be long
        if repeated:
            raise ValueError(f"lists GPU {', '.join(map(str, repeated))} more than once")
        return indices

    @field_validator("mig_devices", mode="plain")
    @classmethod
    def _mig_devices(cls, value: object, info: ValidationInfo) -> dict[str, int]:
        enabled = info.data.get("mig_enabled")  # absent when mig-enabled itself is missing or wrong
        if value is None or value is _ABSENT:
            if enabled is True:
                raise ValueError("required when mig-enabled is true ({} means MIG on without devices)")
            return {}
        if not isinstance(value, dict):
            raise ValueError(f"must be a mapping of MIG profile to count, not {_describe(value)}")
        problems: list[str] = []
        counts: dict[str, int] = {}
        spelled: dict[str, str] = {}
        for key, count in value.items():
            try:
                profile = parse_profile(key)
            except ProfileSyntaxError as exc:
                problems.append(str(exc))
                continue
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                problems.append(f'"{key}": the count must be a non-negative integer, not {_describe(count)}')
                continue
            if count > MIG_SLICES:  # the planner checks the GPU at hand; this bounds what it is given
                problems.append(f'"{key}": {count} is more than any GPU holds (at most {MIG_SLICES})')
                continue
            canonical = str(profile)
            if canonical in spelled:
                problems.append(f'"{spelled[canonical]}" and "{key}" name the same profile; merge them')
                continue
            spelled[canonical] = key
            counts[canonical] = count
        if enabled is False and value:  # {} is fine
            problems.append("must be absent or empty when mig-enabled is false")
        elif counts and not any(counts.values()):
            problems.append("every count is 0; use {} for MIG enabled without MIG devices")
        if problems:
            raise ValueError("; ".join(problems))
        return {name: count for name, count in counts.items() if count > 0}

    @field_validator("device_filter", mode="before")
    @classmethod
    def _filter_list(cls, value: object) -> tuple[object, ...]:
        """A single string stands for a one-item list (so its problems read ``device-filter[0]``)."""
        if value is None:
            return ()
        if isinstance(value, list | tuple):
            return tuple(value)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return (value,)
        raise ValueError(f"must be a PCI ID string or a list of them, not {_describe(value)}")

    @field_validator("device_filter")
    @classmethod
    def _filter_unique(cls, value: tuple[DeviceFilter, ...]) -> tuple[DeviceFilter, ...]:
        return tuple(dict.fromkeys(value))

    @model_validator(mode="before")
    @classmethod
    def _mark_absent_devices(cls, data: Any) -> Any:
        # A missing mig-devices is validated (and reported) under its own key, not the Python name.
        if isinstance(data, dict) and "mig-devices" not in data:
            return {**data, "mig-devices": _ABSENT}
        return data


def _non_empty_entries(value: tuple[_EntryModel, ...]) -> tuple[_EntryModel, ...]:
    if not value:
        raise ValueError("must list at least one entry")
    return value


class _SpecFile(_V1Model):
    version: Literal["v1"] = Field(alias="version")
    mig_configs: dict[str, Annotated[tuple[_EntryModel, ...], AfterValidator(_non_empty_entries)]] = Field(
        alias="mig-configs"
    )

    @field_validator("mig_configs")
    @classmethod
    def _some_configs(cls, value: dict[str, tuple[_EntryModel, ...]]) -> dict[str, tuple[_EntryModel, ...]]:
        if not value:
            raise ValueError("must define at least one named MIG config")
        return value


# --------------------------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class MigEntry:
    """One entry of a named config, validated and canonical (profile names as ``parse_profile`` prints)."""

    path: str  # "mig-configs.<name>[i]", for messages
    devices: Literal["all"] | tuple[int, ...]
    filters: tuple[DeviceFilter, ...]
    mig_enabled: bool
    mig_devices: Mapping[str, int] = field(default_factory=dict, hash=False)  # no zero counts

    def matches(self, gpu: GpuIdentity) -> bool:
        """Filter (any of them; none = any GPU) and then ``devices`` (``all`` or index membership)."""
        if self.filters and not any(f.matches(gpu.pci_device_id, gpu.pci_subsystem_id) for f in self.filters):
            return False
        return self.devices == "all" or gpu.index in self.devices


class UnknownConfig(Exception):
    """The selected config name is not in the file (or none was named and the file has several)."""

    def __init__(self, name: str | None, available: Sequence[str], source: str) -> None:
        self.name = name
        self.available = tuple(available)
        self.source = source
        super().__init__(name, self.available, source)

    def __str__(self) -> str:
        choices = ", ".join(self.available)
        if self.name is None:
            count = len(self.available)
            return f"no MIG config selected and {self.source} has {count}; choose one of: {choices}"
        return f'unknown MIG config "{self.name}" in {self.source}; the configs are: {choices}'


@dataclass(frozen=True)
class MigSpec:
    """A whole file: named configs in file order."""

    source: str
    configs: Mapping[str, tuple[MigEntry, ...]] = field(hash=False)

    def select(self, name: str | None) -> tuple[MigEntry, ...]:
        """The entries of config ``name``; ``None`` only when the file has exactly one config."""
        if name is None:
            if len(self.configs) == 1:
                return next(iter(self.configs.values()))
            raise UnknownConfig(None, tuple(self.configs), self.source)
        try:
            return self.configs[name]
        except KeyError:
            raise UnknownConfig(name, tuple(self.configs), self.source) from None


def _to_spec(model: _SpecFile, source: str) -> MigSpec:
    configs: dict[str, tuple[MigEntry, ...]] = {}
    for name, entries in model.mig_configs.items():
        configs[name] = tuple(
            MigEntry(
                path=f"mig-configs.{name}[{i}]",
                devices=e.devices,
                filters=e.device_filter,
                mig_enabled=e.mig_enabled,
                mig_devices=e.mig_devices,
            )
            for i, e in enumerate(entries)
        )
    return MigSpec(source=source, configs=configs)


def parse_spec(text: str, source: str) -> MigSpec:
    """Validate YAML or JSON ``text`` (``source`` names it); :class:`ConfigError` lists every problem."""
    return _to_spec(parse_config_text(text, source, _SpecFile), source)


def load_spec(path: str | os.PathLike[str] | Path) -> MigSpec:
    """Read and validate the file at ``path``; an unreadable file is a :class:`ConfigError` too."""
    name = os.fspath(path)
    return _to_spec(load_config(name, _SpecFile), name)


# --------------------------------------------------------------------------------- the GPUs entries match


@dataclass(frozen=True)
class GpuIdentity:
    """What config selection needs to know about a GPU."""

    index: int
    pci_device_id: int  # device << 16 | vendor
    pci_subsystem_id: int  # subsystem device << 16 | subsystem vendor
    name: str
    mig_capable: bool

    def describe(self) -> str:
        ids = f"0x{self.pci_device_id:08X}:0x{self.pci_subsystem_id:08X}"
        mig = "" if self.mig_capable else ", no MIG"
        return f"{self.index}: {self.name} ({ids}{mig})"

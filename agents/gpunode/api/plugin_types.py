"""The plain types of the device plugin / feature discovery ``version: v1`` config: no pydantic.

Choices, resource names, device selections and the time-slicing settings, as frozen dataclasses and
pure parsers. The file's pydantic models live in :mod:`gpunode.api.plugin_config`, imported only when a
file is given, so an agent started from flags alone never loads pydantic (several MB of resident memory).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ALLOCATION_POLICIES",
    "DEFAULT_CDI_ANNOTATION_PREFIX",
    "DEVICE_ID_STRATEGIES",
    "DEVICE_LIST_STRATEGIES",
    "DISCOVERY_STRATEGIES",
    "MAX_RESOURCE_NAME",
    "MIG_STRATEGIES",
    "MPS_MIXED_REFUSAL",
    "RESOURCE_PREFIX",
    "AllocationPolicy",
    "DeviceIdStrategy",
    "DeviceSelection",
    "DiscoveryStrategy",
    "MigStrategy",
    "ResourcePattern",
    "SharedResource",
    "SharingStrategy",
    "TimeSlicing",
    "normalize_resource_name",
    "parse_device_list_strategy",
    "parse_devices",
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


def parse_devices(value: object) -> DeviceSelection:
    """A ``devices`` value (``all``, a count or a list of references); ``ValueError`` says what is wrong."""
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


# ----------------------------------------------------------------------- naming and sharing settings


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

    ``devices`` selects which devices of ``name`` are replicated (see :mod:`gpunode.api.plugin_config`);
    ``rename`` is the resource name the replicas are advertised under (wins over ``renameByDefault``).
    """

    name: str
    replicas: int
    devices: DeviceSelection = "all"
    rename: str | None = None


#: NVIDIA refuses MPS sharing with the mixed MIG strategy (the file's or the command line's).
MPS_MIXED_REFUSAL = (
    "MPS sharing (sharing.mps) is not supported with mig-strategy mixed; use mig-strategy none or "
    "single on GPUs without MIG, or share with sharing.timeSlicing"
)

#: NVIDIA's sharing strategies (``nvidia.com/gpu.sharing-strategy`` values for shared resources).
SharingStrategy = Literal["time-slicing", "mps"]


@dataclass(frozen=True)
class TimeSlicing:
    """The effective sharing settings: time-slicing, or MPS (``strategy="mps"``, from ``sharing.mps``:
    the same replicas, each client capped by the MPS control daemon, see :mod:`gpunode.api.mps`)."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[SharedResource, ...] = ()
    strategy: SharingStrategy = "time-slicing"

    @property
    def mps(self) -> bool:
        return self.strategy == "mps"

    @property
    def section(self) -> str:
        """The file's YAML path of these settings, for messages: ``sharing.timeSlicing`` / ``sharing.mps``."""
        return "sharing.mps" if self.mps else "sharing.timeSlicing"

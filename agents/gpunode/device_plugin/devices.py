"""From the NVML inventory to the resources the plugin advertises (pure: no NVML, no I/O).

:func:`build_inventory` applies the MIG strategy, the resource-naming patterns and time-slicing to a
list of :class:`~gpunode.nvml.api.GpuInfo` and their :class:`~gpunode.nvml.api.MigDevice` lists, and
returns one :class:`Resource` per resource name plus human-readable warnings for things that are
skipped but not fatal. :func:`build_resources` is the same without the warnings. Anything that makes
the node's layout unusable for the chosen strategy raises :class:`DeviceConfigError` with a message
naming the GPU, the profile or the config entry at fault.

MIG strategies (NVIDIA's semantics):

* ``none``: every GPU, MIG-enabled or not, is one whole ``nvidia.com/gpu`` device.
* ``single``: MIG devices are advertised as ``nvidia.com/gpu``. Every MIG-enabled GPU must hold at least
  one MIG device, all MIG devices must have the same profile, and MIG-enabled and non-MIG GPUs may not
  be mixed on the node. With no MIG-enabled GPU it behaves like ``none``.
* ``mixed``: non-MIG GPUs are ``nvidia.com/gpu``; each MIG profile gets ``nvidia.com/mig-<profile>``
  (``+`` becomes ``.``); a MIG-enabled GPU without MIG devices contributes nothing (a warning).

Under ``single`` and ``mixed``, MIG devices whose compute instance is smaller than its GPU instance
(profiles like ``1c.3g.20gb``) are rejected: like NVIDIA's plugin, they are unsupported.

MIG capability device nodes are looked up in ``/proc/driver/nvidia-caps/mig-minors`` (parsed by
:func:`gpunode.nvml.caps.parse_mig_minors`); its ``gpu<N>`` is the parent GPU's device *minor* number,
which equals the index on most machines.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpunode.api.plugin_types import RESOURCE_PREFIX, ResourcePattern, SharedResource
from gpunode.device_plugin.settings import PluginSettings
from gpunode.nvml.api import GpuInfo, MigDevice
from gpunode.nvml.caps import mig_cap_keys

__all__ = [
    "DEFAULT_RESOURCE",
    "MAX_MESSAGE_BYTES",
    "DeviceConfigError",
    "Inventory",
    "PluginDevice",
    "Resource",
    "build_inventory",
    "build_resources",
    "listandwatch_size_bytes",
    "mig_resource_name",
]

DEFAULT_RESOURCE = "nvidia.com/gpu"
#: The kubelet's gRPC client accepts messages up to 4 MiB (grpc-go's default receive limit).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_MIB = 1024 * 1024


class DeviceConfigError(Exception):
    """The node's devices cannot be advertised with the chosen settings (message says why)."""


@dataclass(frozen=True)
class PluginDevice:
    """One advertised device: a whole GPU, a MIG device, or a replica of either."""

    id: str  # advertised ID: GPU/MIG UUID, plus "::<n>" for replicas
    device_uuid: str  # GPU or MIG UUID (no replica suffix)
    physical_uuid: str  # the physical GPU's UUID (the parent for MIG)
    gpu_index: int  # physical GPU index
    index: str  # "0", or "0:1" for MIG device 1 of GPU 0 (NVIDIA's Index)
    mig: tuple[int, int] | None  # (gi_id, ci_id)
    numa_node: int | None
    replica: int | None
    replicas: int  # 1 when not shared
    device_nodes: tuple[str, ...]  # container paths of the device nodes this device needs
    memory_mib: int
    profile: str | None  # MIG profile, e.g. "1g.5gb"
    mig_index: int | None = None  # position of the MIG device under its parent

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """GPU index, then MIG index, then replica."""
        return (
            self.gpu_index,
            -1 if self.mig_index is None else self.mig_index,
            -1 if self.replica is None else self.replica,
        )


@dataclass(frozen=True)
class Resource:
    """One extended resource, served on its own socket.

    ``replicas`` is the largest replica count of its devices (1 when not shared; entries for the same
    resource may use different counts). ``shared`` is true when every device is a replica: a resource
    never mixes replicas and unshared devices.
    """

    name: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared"
    devices: tuple[PluginDevice, ...]
    shared: bool
    replicas: int
    fail_requests_greater_than_one: bool

    @property
    def socket_name(self) -> str:
        """``nvidia-gpu.sock``, ``nvidia-mig-1g.5gb.sock``, ``nvidia-gpu.shared.sock``."""
        return "nvidia-" + self.name.removeprefix(RESOURCE_PREFIX) + ".sock"

    @functools.cached_property
    def by_id(self) -> dict[str, PluginDevice]:
        """Advertised ID -> device (computed once per resource)."""
        return {device.id: device for device in self.devices}

    @functools.cached_property
    def devices_per_gpu(self) -> dict[str, int]:
        """Physical GPU UUID -> how many of this resource's devices live on it."""
        counts: dict[str, int] = defaultdict(int)
        for device in self.devices:
            counts[device.physical_uuid] += 1
        return dict(counts)

    @functools.cached_property
    def whole_gpus(self) -> bool:
        """True when every device is a whole, unshared GPU (the topology-aware case)."""
        return all(d.mig is None and d.replica is None for d in self.devices)


@dataclass(frozen=True)
class Inventory:
    """What :func:`build_inventory` found: the resources (sorted by name) and non-fatal warnings."""

    resources: tuple[Resource, ...]
    warnings: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------ mig-minors


def _mig_device_nodes(gpu: GpuInfo, mig: MigDevice, mig_minors: Mapping[str, int] | None) -> tuple[str, ...]:
    nodes = [f"/dev/nvidia{gpu.minor}"]
    if mig_minors is not None:
        for cap in mig_cap_keys(gpu.minor, mig.gi_id, mig.ci_id):
            minor = mig_minors.get(cap)
            if minor is not None:
                nodes.append(f"/dev/nvidia-caps/nvidia-cap{minor}")
    return tuple(nodes)


# -------------------------------------------------------------------------------------------- naming


def mig_resource_name(profile: str) -> str:
    """``"1g.10gb+me"`` -> ``"nvidia.com/mig-1g.10gb.me"`` (the ``mixed`` strategy's name)."""
    return f"{RESOURCE_PREFIX}mig-{profile.replace('+', '.')}"


def _pattern_name(patterns: Sequence[ResourcePattern], text: str, default: str) -> str:
    for pattern in patterns:
        if pattern.matches(text):
            return pattern.name
    return default


# ------------------------------------------------------------------------------------------ building


def _gpu_device(gpu: GpuInfo, numa: int | None) -> PluginDevice:
    return PluginDevice(
        id=gpu.uuid,
        device_uuid=gpu.uuid,
        physical_uuid=gpu.uuid,
        gpu_index=gpu.index,
        index=str(gpu.index),
        mig=None,
        numa_node=numa,
        replica=None,
        replicas=1,
        device_nodes=(f"/dev/nvidia{gpu.minor}",),
        memory_mib=gpu.memory_total_mib,
        profile=None,
    )


def _mig_device(
    gpu: GpuInfo, mig: MigDevice, numa: int | None, mig_minors: Mapping[str, int] | None
) -> PluginDevice:
    return PluginDevice(
        id=mig.uuid,
        device_uuid=mig.uuid,
        physical_uuid=gpu.uuid,
        gpu_index=gpu.index,
        index=f"{gpu.index}:{mig.index}",
        mig=(mig.gi_id, mig.ci_id),
        numa_node=numa,
        replica=None,
        replicas=1,
        device_nodes=_mig_device_nodes(gpu, mig, mig_minors),
        memory_mib=mig.memory_mib,
        profile=mig.profile,
        mig_index=mig.index,
    )


def _check_sub_profiles(strategy: str, migs: Sequence[MigDevice]) -> None:
    for mig in migs:
        if mig.ci_slices != mig.gi_slices:
            raise DeviceConfigError(
                f"mig-strategy {strategy}: MIG device {mig.uuid} (GPU {mig.parent_index}, profile "
                f"{mig.profile}) has a compute instance smaller than its GPU instance "
                f"({mig.ci_slices} of {mig.gi_slices} slices); such profiles are unsupported: "
                "give each GPU instance one full-size compute instance"
            )


def _base_devices(
    gpus: Sequence[GpuInfo],
    mig_devices: Mapping[int, Sequence[MigDevice]],
    settings: PluginSettings,
    numa: Callable[[GpuInfo], int | None],
    mig_minors: Mapping[str, int] | None,
    warnings: list[str],
) -> list[tuple[str, PluginDevice]]:
    """(resource name, device) for every device before sharing."""
    strategy = settings.mig_strategy
    out: list[tuple[str, PluginDevice]] = []
    ordered = sorted(gpus, key=lambda g: g.index)

    def whole(gpu: GpuInfo) -> tuple[str, PluginDevice]:
        return _pattern_name(settings.gpu_resources, gpu.name, DEFAULT_RESOURCE), _gpu_device(gpu, numa(gpu))

    if strategy == "none":
        return [whole(gpu) for gpu in ordered]

    migs_of = {gpu.index: sorted(mig_devices.get(gpu.index, ()), key=lambda m: m.index) for gpu in ordered}
    enabled = [gpu for gpu in ordered if gpu.mig_enabled]
    for gpu in enabled:
        _check_sub_profiles(strategy, migs_of[gpu.index])

    if strategy == "single":
        if enabled:
            plain = [gpu for gpu in ordered if not gpu.mig_enabled]
            if plain:
                raise DeviceConfigError(
                    "mig-strategy single: MIG-enabled and non-MIG GPUs are mixed on the node "
                    f"(MIG enabled: {_indices(enabled)}; MIG disabled: {_indices(plain)}); "
                    "enable MIG on all GPUs or use mig-strategy mixed"
                )
            empty = [gpu for gpu in enabled if not migs_of[gpu.index]]
            if empty:
                raise DeviceConfigError(
                    f"mig-strategy single: MIG-enabled GPU(s) {_indices(empty)} have no MIG devices; "
                    "create MIG devices or use mig-strategy mixed"
                )
            profiles = sorted({m.profile for gpu in enabled for m in migs_of[gpu.index]})
            if len(profiles) > 1:
                raise DeviceConfigError(
                    f"mig-strategy single: more than one MIG profile on the node ({', '.join(profiles)}); "
                    "use one profile everywhere or use mig-strategy mixed"
                )
        for gpu in ordered:
            if not gpu.mig_enabled:
                out.append(whole(gpu))
                continue
            node = numa(gpu)
            for mig in migs_of[gpu.index]:
                name = _pattern_name(settings.mig_resources, mig.profile, DEFAULT_RESOURCE)
                out.append((name, _mig_device(gpu, mig, node, mig_minors)))
        return out

    # mixed
    for gpu in ordered:
        if not gpu.mig_enabled:
            out.append(whole(gpu))
            continue
        if not migs_of[gpu.index]:
            warnings.append(
                f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled but no MIG devices; it is not advertised"
            )
            continue
        node = numa(gpu)
        for mig in migs_of[gpu.index]:
            name = _pattern_name(settings.mig_resources, mig.profile, mig_resource_name(mig.profile))
            out.append((name, _mig_device(gpu, mig, node, mig_minors)))
    return out


def _indices(gpus: Sequence[GpuInfo]) -> str:
    return ", ".join(str(g.index) for g in gpus)


def _selects(ref: str, device: PluginDevice) -> bool:
    if ref.isdigit():
        return device.gpu_index == int(ref)
    if ":" in ref and not ref.startswith(("GPU-", "MIG-")):
        return device.index == ref
    return ref in (device.device_uuid, device.physical_uuid)


def _select(entry: SharedResource, devices: list[PluginDevice]) -> tuple[list[PluginDevice], list[str]]:
    """The devices an entry selects (in order) and the references that matched nothing."""
    if entry.devices == "all":
        return devices, []
    if isinstance(entry.devices, int):
        return devices[: entry.devices], []
    unmatched = [ref for ref in entry.devices if not any(_selects(ref, d) for d in devices)]
    chosen = [d for d in devices if any(_selects(ref, d) for ref in entry.devices)]
    return chosen, unmatched


def _replicate(device: PluginDevice, replicas: int) -> list[PluginDevice]:
    return [
        replace(device, id=f"{device.device_uuid}::{n}", replica=n, replicas=replicas)
        for n in range(replicas)
    ]


def _apply_sharing(
    base: list[tuple[str, PluginDevice]], settings: PluginSettings, warnings: list[str]
) -> dict[str, list[tuple[PluginDevice, int | None]]]:
    """Group devices by their final resource name, each with its replica count (None: unshared).

    Replicas are not built here, so that an absurd replica count fails the size check quickly.
    """
    sharing = settings.sharing
    by_name: dict[str, list[PluginDevice]] = defaultdict(list)
    for name, device in base:
        by_name[name].append(device)
    if sharing is None or not sharing.resources:
        return {name: [(d, None) for d in devices] for name, devices in by_name.items()}

    claimed: dict[str, int] = {}  # device_uuid -> sharing entry position
    targets: dict[str, str] = {}  # device_uuid -> final resource name
    replicas_of: dict[str, int] = {}
    for position, entry in enumerate(sharing.resources):
        where = f"{sharing.section}.resources[{position}]"
        candidates = by_name.get(entry.name, [])
        if not candidates:
            warnings.append(f"{where}: no {entry.name} devices on this node; the entry has no effect")
            continue
        chosen, unmatched = _select(entry, candidates)
        if unmatched:
            warnings.append(f"{where}: devices {', '.join(unmatched)} match no {entry.name} device")
        if entry.rename is not None:
            target = entry.rename
        elif sharing.rename_by_default:
            target = entry.name + ".shared"
        else:
            target = entry.name
        for device in chosen:
            if device.device_uuid in claimed:
                raise DeviceConfigError(
                    f"{where}: device {device.device_uuid} (index {device.index}) is already shared by "
                    f"{sharing.section}.resources[{claimed[device.device_uuid]}]; "
                    "each device may be selected by one entry only"
                )
            claimed[device.device_uuid] = position
            targets[device.device_uuid] = target
            replicas_of[device.device_uuid] = entry.replicas

    grouped: dict[str, list[tuple[PluginDevice, int | None]]] = defaultdict(list)
    for name, devices in by_name.items():
        for device in devices:
            if device.device_uuid in targets:
                grouped[targets[device.device_uuid]].append((device, replicas_of[device.device_uuid]))
            else:
                grouped[name].append((device, None))
    for name, planned in grouped.items():
        shared = [d for d, replicas in planned if replicas is not None]
        if shared and len(shared) != len(planned):
            entries = sorted({claimed[d.device_uuid] for d in shared})
            unshared = sorted({d.index for d, replicas in planned if replicas is None}, key=_index_key)
            raise DeviceConfigError(
                f"{name}: time-sliced and unshared devices would share one resource name "
                f"(unshared: {', '.join(unshared)}); set rename (or renameByDefault) for "
                + ", ".join(f"{sharing.section}.resources[{p}]" for p in entries)
                + ", or select all of its devices"
            )
    return dict(grouped)


def _check_mps(gpus: Sequence[GpuInfo], base: list[tuple[str, PluginDevice]]) -> None:
    """NVIDIA's refusal: MPS sharing is not supported for MIG devices (nor on GPUs with MIG enabled)."""
    mig = {d.gpu_index for _, d in base if d.mig is not None} | {g.index for g in gpus if g.mig_enabled}
    if mig:
        raise DeviceConfigError(
            "sharing.mps: MPS sharing is not supported for MIG devices (MIG is enabled on GPU "
            f"{', '.join(map(str, sorted(mig)))}); disable MIG on the node or share with sharing.timeSlicing"
        )


def _index_key(index: str) -> tuple[int, ...]:
    return tuple(int(part) for part in index.split(":"))


def build_inventory(
    gpus: Sequence[GpuInfo],
    mig_devices: Mapping[int, Sequence[MigDevice]],
    settings: PluginSettings,
    *,
    numa: Callable[[GpuInfo], int | None],
    mig_minors: Mapping[str, int] | None,
) -> Inventory:
    """The resources to advertise (sorted by name, devices sorted) and non-fatal warnings.

    ``mig_devices`` maps a GPU index to its MIG devices; ``numa`` gives a GPU's NUMA node (None when
    unknown); ``mig_minors`` comes from :func:`gpunode.nvml.caps.read_mig_minors` (None: MIG capability
    device nodes are left out). Raises :class:`DeviceConfigError` when the layout does not fit the MIG
    strategy, when time-slicing entries overlap or would mix shared and unshared devices under one name,
    or when a resource's ListAndWatch message would exceed :data:`MAX_MESSAGE_BYTES`.
    """
    warnings: list[str] = []
    base = _base_devices(gpus, mig_devices, settings, numa, mig_minors, warnings)
    if settings.sharing is not None and settings.sharing.mps:
        _check_mps(gpus, base)
    grouped = _apply_sharing(base, settings, warnings)
    fail_gt_one = settings.sharing.fail_requests_greater_than_one if settings.sharing else False
    resources: list[Resource] = []
    for name in sorted(grouped):
        planned = grouped[name]
        if not planned:
            continue
        size = sum(_planned_size(device, replicas) for device, replicas in planned)
        if size > MAX_MESSAGE_BYTES:
            count = sum(replicas or 1 for _, replicas in planned)
            raise DeviceConfigError(
                f"{name}: {count} devices need {_mib(size)} MiB per ListAndWatch message, "
                "over the kubelet's 4 MiB limit; lower the replicas"
            )
        devices: list[PluginDevice] = []
        for device, replicas in planned:
            devices.extend([device] if replicas is None else _replicate(device, replicas))
        devices.sort(key=lambda d: d.sort_key)
        shared = devices[0].replica is not None
        resources.append(
            Resource(
                name=name,
                devices=tuple(devices),
                shared=shared,
                replicas=max(d.replicas for d in devices),
                fail_requests_greater_than_one=shared and fail_gt_one,
            )
        )
    return Inventory(resources=tuple(resources), warnings=tuple(warnings))


def build_resources(
    gpus: Sequence[GpuInfo],
    mig_devices: Mapping[int, Sequence[MigDevice]],
    settings: PluginSettings,
    *,
    numa: Callable[[GpuInfo], int | None],
    mig_minors: Mapping[str, int] | None,
) -> list[Resource]:
    """:func:`build_inventory` without the warnings."""
    return list(build_inventory(gpus, mig_devices, settings, numa=numa, mig_minors=mig_minors).resources)


# ------------------------------------------------------------------------------------- message size


def _varint_len(value: int) -> int:
    if value < 0:  # int64 negatives take ten bytes
        return 10
    length = 1
    while value >= 0x80:
        value >>= 7
        length += 1
    return length


def _field_len(payload: int) -> int:
    """A length-delimited field with a one-byte tag: tag + length varint + payload."""
    return 1 + _varint_len(payload) + payload


_UNHEALTHY = len("Unhealthy")  # the longer health string: a device going unhealthy must still fit


def _entry_len(id_len: int, numa_node: int | None) -> int:
    """One ``devices`` entry of ListAndWatchResponse: Device{ID, health, topology} with its tag."""
    size = _field_len(id_len) + _field_len(_UNHEALTHY)
    if numa_node is not None:
        numa = 0 if numa_node == 0 else 1 + _varint_len(numa_node)  # NUMANode{ID}; ID 0 is omitted
        size += _field_len(_field_len(numa))  # topology: TopologyInfo{nodes: [NUMANode]}
    return _field_len(size)


def _planned_size(device: PluginDevice, replicas: int | None) -> int:
    """The encoded size of a device, or of its replicas ``<uuid>::0`` ... ``<uuid>::<replicas-1>``."""
    if replicas is None:
        return _entry_len(len(device.id.encode()), device.numa_node)
    base = len(device.device_uuid.encode()) + 2
    size, digits, start = 0, 1, 0
    while start < replicas:  # replica numbers with the same number of digits encode alike
        end = min(replicas, 10**digits)
        size += (end - start) * _entry_len(base + digits, device.numa_node)
        start, digits = end, digits + 1
    return size


def listandwatch_size_bytes(resource: Resource) -> int:
    """The encoded size of the resource's ListAndWatchResponse, every device counted as Unhealthy."""
    return sum(_entry_len(len(device.id.encode()), device.numa_node) for device in resource.devices)


def _mib(size: int) -> str:
    for digits in (1, 2, 3):
        text = f"{size / _MIB:.{digits}f}"
        if float(text) > MAX_MESSAGE_BYTES / _MIB:
            return text
    return f"{size / _MIB:.6f}"

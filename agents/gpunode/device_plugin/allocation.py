"""Allocate and GetPreferredAllocation logic (pure: the gRPC server converts the results to protobuf).

* :func:`validate_request` checks an Allocate request's IDs against a resource.
* :func:`allocate_response` builds what one container gets, per device-list strategy, exactly as
  NVIDIA's plugin does: environment variables, ``/dev/null`` volume mounts, CDI annotations or CDI
  devices, and (with ``pass_device_specs``) device specs.
* :func:`preferred_allocation` picks devices: topology-aware for whole GPUs, a distributed or packed
  greedy policy for replicas and MIG devices. It never raises for devices it does not know.
"""

from __future__ import annotations

import functools
import itertools
import math
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpunode.api.mps import CONTAINER_ROOT, SHM_CONTAINER_PATH, MpsRoot, ReadyResource, client_env
from gpunode.common.bounds import clip_list
from gpunode.device_plugin.devices import PluginDevice, Resource
from gpunode.device_plugin.settings import PluginSettings
from gpunode.nvml.api import TopoLevel, Topology

__all__ = [
    "CDI_KIND",
    "CONTROL_DEVICE_NODES",
    "VOLUME_MOUNTS_HOST_PATH",
    "VOLUME_MOUNTS_ROOT",
    "AllocationError",
    "ContainerAllocation",
    "DeviceSpec",
    "Mount",
    "allocate_response",
    "cdi_annotation_key",
    "mps_allocation",
    "pair_score",
    "preferred_allocation",
    "validate_request",
]

CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
IMEX_CHANNEL_NODE = "/dev/nvidia-caps-imex-channels/channel{}"
_SHOWN_UNKNOWN = 10


class AllocationError(Exception):
    """An Allocate request the plugin refuses (the server answers INVALID_ARGUMENT with this text)."""


# ---------------------------------------------------------------------------------------- Allocate


def validate_request(resource: Resource, ids: Sequence[str]) -> list[PluginDevice]:
    """The devices named by an Allocate request, in request order (a repeated ID counts once).

    Raises :class:`AllocationError` for IDs the resource does not advertise (sorted; the first ten are
    named, each cut at 256 characters with a count of the rest, then how many more), and, when the
    resource sets ``failRequestsGreaterThanOne``, for a request of more than one replica.
    """
    known = resource.by_id
    unknown = sorted({i for i in ids if i not in known})
    if unknown:
        shown = clip_list(unknown, _SHOWN_UNKNOWN)  # each cut at 256 characters: an ID can be 4 MiB
        noun = "ID" if len(unknown) == 1 else "IDs"
        raise AllocationError(
            f"invalid allocation request for {resource.name}: unknown device {noun} {shown}"
        )
    devices = [known[i] for i in dict.fromkeys(ids)]
    if (
        resource.fail_requests_greater_than_one
        and len(ids) > 1
        and any(d.replica is not None for d in devices)
    ):
        raise AllocationError(
            f"invalid request: maximum request size for shared resources is 1; found {len(ids)}"
        )
    return devices


class Mount(NamedTuple):
    container_path: str
    host_path: str
    read_only: bool


class DeviceSpec(NamedTuple):
    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True)
class ContainerAllocation:
    """One ContainerAllocateResponse, as plain data."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[DeviceSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)


def cdi_annotation_key(prefix: str, response_id: str) -> str:
    """``cdi.k8s.io/nvidia-device-plugin_<response_id>`` (pass a fresh ``uuid4()`` string)."""
    return f"{prefix}nvidia-device-plugin_{response_id}"


def _visible_ids(devices: Sequence[PluginDevice], strategy: str) -> list[str]:
    values = (d.index for d in devices) if strategy == "index" else (d.device_uuid for d in devices)
    return list(dict.fromkeys(values))


def _host_path(dev_root: str, container_path: str) -> str:
    return posixpath.normpath(posixpath.join(dev_root, container_path.lstrip("/")))


def allocate_response(
    devices: Sequence[PluginDevice],
    settings: PluginSettings,
    *,
    dev_root_exists: Callable[[str], bool],
    cdi_kind: str = CDI_KIND,
    annotation_key: str,
    mps: ContainerAllocation | None = None,
) -> ContainerAllocation:
    """What a container gets for ``devices`` (from :func:`validate_request`).

    IDs are GPU/MIG UUIDs (replica suffixes dropped) or indices (``device_id_strategy``), deduplicated
    in request order. CDI strategies add ``<cdi_kind>=<id>`` names (plus IMEX/GDS/MOFED/GDRCOPY
    devices when configured) as the ``annotation_key`` annotation and/or CDI devices; when only CDI
    strategies are selected nothing else is added. Otherwise ``envvar`` sets NVIDIA_VISIBLE_DEVICES
    (and NVIDIA_IMEX_CHANNELS), ``volume-mounts`` sets it to the mount root and mounts ``/dev/null`` per
    ID (read-write, as NVIDIA does), ``pass_device_specs`` adds ``rw`` device specs for the control
    nodes that ``dev_root_exists(container_path)`` confirms, then every device's nodes and the IMEX
    channel (host path = ``dev_root`` + container path), and GDS/MOFED/GDRCOPY env vars are set.
    ``mps`` (MPS sharing, :func:`mps_allocation`) adds its env vars and mounts with every strategy.
    """
    strategies = settings.device_list_strategies
    ids = _visible_ids(devices, settings.device_id_strategy)
    channels = [str(c) for c in settings.imex_channel_ids]
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    specs: list[DeviceSpec] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []

    if any(s.startswith("cdi-") for s in strategies):
        vendor = cdi_kind.split("/", 1)[0]
        names = [f"{cdi_kind}={i}" for i in ids]
        names += [f"{vendor}/imex-channel={c}" for c in channels]
        for enabled, kind in (
            (settings.gds_enabled, "gds"),
            (settings.mofed_enabled, "mofed"),
            (settings.gdrcopy_enabled, "gdrcopy"),
        ):
            if enabled:
                names.append(f"{vendor}/{kind}=all")
        if names:
            if "cdi-annotations" in strategies:
                annotations[annotation_key] = ",".join(names)
            if "cdi-cri" in strategies:
                cdi_devices.extend(names)
    if mps is not None:  # MPS sharing: what the container needs of the control daemon, whatever the strategy
        envs.update(mps.envs)
        mounts.extend(mps.mounts)
    if all(s.startswith("cdi-") for s in strategies):
        return ContainerAllocation(envs=envs, mounts=mounts, annotations=annotations, cdi_devices=cdi_devices)

    if "envvar" in strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
        if channels:
            envs["NVIDIA_IMEX_CHANNELS"] = ",".join(channels)
    if "volume-mounts" in strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = VOLUME_MOUNTS_ROOT
        mounts.extend(
            Mount(posixpath.join(VOLUME_MOUNTS_ROOT, i), VOLUME_MOUNTS_HOST_PATH, False) for i in ids
        )
        mounts.extend(
            Mount(posixpath.join(VOLUME_MOUNTS_ROOT, "imex", c), VOLUME_MOUNTS_HOST_PATH, False)
            for c in channels
        )
    if settings.pass_device_specs:
        paths = [p for p in CONTROL_DEVICE_NODES if dev_root_exists(p)]
        paths.extend(node for d in devices for node in d.device_nodes)
        paths.extend(IMEX_CHANNEL_NODE.format(c) for c in channels)
        specs.extend(DeviceSpec(p, _host_path(settings.dev_root, p), "rw") for p in dict.fromkeys(paths))
    if settings.gds_enabled:
        envs["NVIDIA_GDS"] = "enabled"
    if settings.mofed_enabled:
        envs["NVIDIA_MOFED"] = "enabled"
    if settings.gdrcopy_enabled:
        envs["NVIDIA_GDRCOPY"] = "enabled"
    return ContainerAllocation(
        envs=envs, mounts=mounts, devices=specs, annotations=annotations, cdi_devices=cdi_devices
    )


def mps_allocation(
    resource: str, devices: Sequence[PluginDevice], root: str, ready: ReadyResource
) -> ContainerAllocation:
    """What NVIDIA's plugin adds for MPS: ``CUDA_MPS_PIPE_DIRECTORY`` and two mounts, the resource's
    pipe directory (host ``<root>/<resource>/pipe`` at ``/mps/<resource>/pipe``) and the shared memory
    (host ``<root>/shm`` at ``/dev/shm``); plus the daemon's per-client limits as env vars
    (:func:`gpunode.api.mps.client_env`)."""
    uuids = list(dict.fromkeys(d.device_uuid for d in devices))
    host, container = MpsRoot(root), MpsRoot(CONTAINER_ROOT)
    return ContainerAllocation(
        envs=client_env(resource, ready, uuids),
        mounts=[
            Mount(container.pipe_dir(resource), host.pipe_dir(resource), False),
            Mount(SHM_CONTAINER_PATH, host.shm_dir, False),
        ],
    )


# -------------------------------------------------------------------------- GetPreferredAllocation

_LEVEL_SCORE = {
    TopoLevel.INTERNAL: 60,  # same board
    TopoLevel.PIX: 50,  # single PCIe switch
    TopoLevel.PXB: 40,  # multiple PCIe switches
    TopoLevel.PHB: 30,  # host bridge
    TopoLevel.NODE: 20,  # same CPU / NUMA node
    TopoLevel.SYS: 10,  # across CPUs
}
_NVLINK_SCORE = 100
#: Exact search while (combinations x pairs scored per combination) stays under this; greedy beyond.
EXACT_SEARCH_BUDGET = 4_000


def pair_score(topology: Topology, a: int, b: int) -> int:
    """go-gpuallocator's pair score: 100 per NVLink plus the PCIe path's score (10 cross-CPU ... 60)."""
    if a not in topology.indices or b not in topology.indices:
        return 0
    return topology.link_count(a, b) * _NVLINK_SCORE + _LEVEL_SCORE.get(topology.level(a, b), 0)


@functools.lru_cache(maxsize=16)
def _score_table(topology: Topology) -> dict[tuple[int, int], int]:
    return {(a, b): pair_score(topology, a, b) for a in topology.indices for b in topology.indices if a != b}


def preferred_allocation(
    resource: Resource,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    topology: Topology | None,
    policy: str,
    allocated_counts: Mapping[str, int] | None = None,
) -> list[str]:
    """The IDs to prefer for one container: ``must_include`` first, ``size`` IDs in all when possible.

    IDs the resource does not know are ignored; with fewer candidates than ``size`` the valid ones are
    returned (the kubelet fills any shortfall): this never raises for bad input, so the RPC never fails.

    Whole, unshared GPUs with a ``topology`` get the set with the best summed :func:`pair_score`
    (exact search while cheap, greedy otherwise; ties go to the lowest GPU indices). Replicas and MIG
    devices use the greedy ``policy`` (anything but ``packed`` is ``distributed``), always one ID at a
    time and grouped by physical GPU: ``distributed`` takes from the physical GPU with the fewest
    allocated devices, counting those taken in this call; ``packed`` from the GPU with the most devices
    allocated before this call. Ties go to the GPU least used by this call, then the lowest index, so
    a request for two prefers two physical GPUs. "Allocated" on a GPU is its devices in the resource
    minus those in ``available``, unless ``allocated_counts`` (physical GPU UUID -> count) says otherwise.
    """
    if size <= 0:
        return []
    known = resource.by_id
    must = [i for i in dict.fromkeys(must_include) if i in known]
    if len(must) >= size:
        return must[:size]
    chosen = set(must)
    candidates = [known[i] for i in dict.fromkeys(available) if i in known and i not in chosen]
    needed = size - len(must)
    if len(candidates) <= needed:
        return must + [d.id for d in sorted(candidates, key=lambda d: d.sort_key)]
    must_devices = [known[i] for i in must]
    if topology is not None and resource.whole_gpus:
        picked = _topology_pick(must_devices, candidates, needed, topology)
    else:
        offered = set(available)
        free = [known[i] for i in must if i in offered] + candidates
        picked = _greedy_pick(resource, must_devices, free, candidates, needed, policy, allocated_counts)
    return must + picked


def _topology_pick(
    must: list[PluginDevice], candidates: list[PluginDevice], needed: int, topology: Topology
) -> list[str]:
    scores = _score_table(topology)
    candidates = sorted(candidates, key=lambda d: d.gpu_index)
    must_idx = [d.gpu_index for d in must]
    cand_idx = [d.gpu_index for d in candidates]
    # Each candidate's score against the must-include set is fixed: precompute it.
    base = [sum(scores.get((c, m), 0) for m in must_idx) for c in cand_idx]
    pairs_per_combo = needed * (needed - 1) // 2 + needed
    if math.comb(len(candidates), needed) * max(pairs_per_combo, 1) <= EXACT_SEARCH_BUDGET:
        best: tuple[int, ...] = tuple(range(needed))
        best_score = -1
        for combo in itertools.combinations(range(len(candidates)), needed):
            score = sum(base[k] for k in combo)
            for x, y in itertools.combinations(combo, 2):
                score += scores.get((cand_idx[x], cand_idx[y]), 0)
            if score > best_score:  # strict: the first (lowest indices) best set wins ties
                best, best_score = combo, score
        return [candidates[k].id for k in best]
    return [candidates[k].id for k in _greedy_topology(cand_idx, base, needed, scores)]


def _greedy_topology(
    cand_idx: list[int], base: list[int], needed: int, scores: Mapping[tuple[int, int], int]
) -> list[int]:
    """Multi-start greedy: seed with each candidate in turn, grow by best marginal score, keep the best.

    O(n^2 * k) for n candidates and k picks; ties go to the set with the lowest GPU indices.
    """
    n = len(cand_idx)
    best: list[int] = []
    best_key: tuple[int, tuple[int, ...]] | None = None
    for seed in range(n):
        gain = list(base)  # marginal score of adding each candidate to the current set
        picked = [seed]
        total = base[seed]
        remaining = set(range(n)) - {seed}
        for r in remaining:
            gain[r] += scores.get((cand_idx[r], cand_idx[seed]), 0)
        while len(picked) < needed:
            k = max(remaining, key=lambda r: (gain[r], -r))
            picked.append(k)
            total += gain[k]
            remaining.discard(k)
            for r in remaining:
                gain[r] += scores.get((cand_idx[r], cand_idx[k]), 0)
        order = tuple(sorted(picked))
        key = (total, tuple(-k for k in order))
        if best_key is None or key > best_key:
            best, best_key = sorted(picked), key
    return best


def _greedy_pick(
    resource: Resource,
    must: Iterable[PluginDevice],
    free: Iterable[PluginDevice],
    candidates: list[PluginDevice],
    needed: int,
    policy: str,
    allocated_counts: Mapping[str, int] | None,
) -> list[str]:
    """``free``: every known available device (must-include ones too), for the allocated counts."""
    queues: dict[str, list[PluginDevice]] = {}
    gpu_index: dict[str, int] = {}
    for device in sorted(candidates, key=lambda d: d.sort_key, reverse=True):  # pop() takes the lowest
        queues.setdefault(device.physical_uuid, []).append(device)
        gpu_index[device.physical_uuid] = device.gpu_index
    free_per_gpu: dict[str, int] = dict.fromkeys(queues, 0)
    for device in free:
        if device.physical_uuid in free_per_gpu:
            free_per_gpu[device.physical_uuid] += 1
    totals = resource.devices_per_gpu
    allocated: dict[str, int] = {}
    for gpu in queues:
        if allocated_counts is not None and gpu in allocated_counts:
            allocated[gpu] = allocated_counts[gpu]
        else:
            allocated[gpu] = max(totals.get(gpu, 0) - free_per_gpu[gpu], 0)
    taken: dict[str, int] = dict.fromkeys(queues, 0)
    for device in must:
        if device.physical_uuid in taken:
            taken[device.physical_uuid] += 1

    packed = policy == "packed"

    def key(gpu: str) -> tuple[int, int, int]:
        if packed:
            return (-allocated[gpu], taken[gpu], gpu_index[gpu])
        return (allocated[gpu] + taken[gpu], taken[gpu], gpu_index[gpu])

    picked: list[str] = []
    while len(picked) < needed:
        gpu = min((g for g, q in queues.items() if q), key=key)
        picked.append(queues[gpu].pop().id)
        taken[gpu] += 1
    return picked

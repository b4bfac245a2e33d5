"""MPS sharing's contract between the MPS control daemon agent and the device plugin (pure, no I/O).

NVIDIA's layout (k8s-device-plugin's ``mps-control-daemon``), kept so that its DaemonSets, mounts and
pods work unchanged. Under the MPS root (``flags.mpsRoot`` / ``--mps-root``, default
``/run/nvidia/mps``), per shared resource (its full name is a path: ``nvidia.com/gpu``):

* ``<root>/<resource>/pipe``: ``CUDA_MPS_PIPE_DIRECTORY`` of that resource's control daemon (its
  ``control`` socket and ``nvidia-cuda-mps-control.pid``); mounted into a client container at
  ``/mps/<resource>/pipe``;
* ``<root>/<resource>/log``: ``CUDA_MPS_LOG_DIRECTORY`` (``control.log``, ``server.log``);
* ``<root>/<resource>/.started``: written once the daemon runs with its limits set;
* ``<root>/shm``: the shared memory the clients and the server share, mounted at ``/dev/shm``;
* ``<root>/.ready``: written (atomically) once every daemon has started; removed before a daemon is
  stopped or when one dies. It holds :func:`ready_document`: the sharing settings it was started for
  (the device plugin advertises an MPS resource only while they equal its own, as NVIDIA's plugin
  compares its config with the file) and the per-resource limits.

Per-client limits, derived from the replica count as NVIDIA's daemon derives them: the default active
thread percentage is ``100 // replicas`` (``set_default_active_thread_percentage``), the default pinned
device memory limit of each GPU is its total memory divided by its replicas, in MiB
(``set_default_device_pinned_mem_limit <index> <N>M``). An MPS server takes at most 48 clients on
compute capability 7.5 and later, 16 before: more replicas are refused.

:func:`plan_daemons` turns the effective sharing settings and the node's GPUs into one
:class:`DaemonPlan` per resource (the names the device plugin advertises), refusing what NVIDIA refuses
(MIG, too many replicas) with the config path at fault.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpunode.api.plugin_types import RESOURCE_PREFIX, SharedResource, TimeSlicing

__all__ = [
    "CONTAINER_ROOT",
    "CONTROL_BINARY",
    "DEFAULT_ROOT",
    "PLUGIN_CONFIG_FILE",
    "SHM_CONTAINER_PATH",
    "DaemonPlan",
    "MpsConfigError",
    "MpsGpu",
    "MpsRoot",
    "ReadyResource",
    "active_thread_percentage",
    "client_env",
    "max_clients",
    "pinned_mem_limit_mib",
    "plan_daemons",
    "ready_document",
    "ready_resources",
    "sharing_document",
]

DEFAULT_ROOT = "/run/nvidia/mps"
CONTAINER_ROOT = "/mps"  # where a client container sees the root (NVIDIA's ContainerRoot)
SHM_CONTAINER_PATH = "/dev/shm"
CONTROL_BINARY = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET = "control"
READY_FILE = ".ready"
STARTED_FILE = ".started"
# The config the node's device plugin serves, as it published it for the MPS agent (--follow-device-plugin)
PLUGIN_CONFIG_FILE = ".device-plugin-config.yaml"
FULL_GPU = RESOURCE_PREFIX + "gpu"


class MpsConfigError(ValueError):
    """MPS sharing that cannot be set up: ``path`` is the config path at fault, ``str()`` says why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class MpsRoot:
    """The MPS root and the paths under it (host paths, or :data:`CONTAINER_ROOT` in a container)."""

    path: str = DEFAULT_ROOT

    def resource_dir(self, resource: str) -> str:
        return posixpath.join(self.path, resource)

    def pipe_dir(self, resource: str) -> str:
        return posixpath.join(self.path, resource, "pipe")

    def log_dir(self, resource: str) -> str:
        return posixpath.join(self.path, resource, "log")

    def started_file(self, resource: str) -> str:
        return posixpath.join(self.path, resource, STARTED_FILE)

    def control_socket(self, resource: str) -> str:
        return posixpath.join(self.pipe_dir(resource), CONTROL_SOCKET)

    def pid_file(self, resource: str) -> str:
        return posixpath.join(self.pipe_dir(resource), PID_FILE)

    @property
    def shm_dir(self) -> str:
        return posixpath.join(self.path, "shm")

    @property
    def ready_file(self) -> str:
        return posixpath.join(self.path, READY_FILE)

    @property
    def plugin_config_file(self) -> str:
        return posixpath.join(self.path, PLUGIN_CONFIG_FILE)


# ------------------------------------------------------------------------------------------ limits


def active_thread_percentage(replicas: int) -> int:
    """The share of a GPU's SMs one client may use: ``100 // replicas`` (NVIDIA's daemon)."""
    return 100 // max(replicas, 1)


def pinned_mem_limit_mib(memory_total_mib: int, replicas: int) -> int:
    """One client's pinned device memory on a GPU: its total memory split evenly, in MiB."""
    return memory_total_mib // max(replicas, 1)


def max_clients(compute_capability: tuple[int, int]) -> int:
    """How many clients one MPS server takes: 48 from compute capability 7.5 on, else 16."""
    return 48 if compute_capability >= (7, 5) else 16


# ------------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class MpsGpu:
    """What the plan needs of a GPU."""

    index: int
    uuid: str
    memory_total_mib: int
    compute_capability: tuple[int, int]
    mig_enabled: bool = False


@dataclass(frozen=True)
class DaemonPlan:
    """One control daemon: the resource it serves, its GPUs and their replica counts."""

    resource: str
    gpus: tuple[MpsGpu, ...]
    replicas: Mapping[int, int] = field(default_factory=dict)  # GPU index -> replicas

    @property
    def most_replicas(self) -> int:
        return max(self.replicas.values(), default=1)

    @property
    def thread_percentage(self) -> int:
        """The daemon's default active thread percentage (the GPU with the most replicas decides)."""
        return active_thread_percentage(self.most_replicas)

    def pinned_limits(self) -> dict[int, int]:
        """GPU index -> default pinned device memory limit in MiB (GPUs reporting no memory: none)."""
        return {
            g.index: pinned_mem_limit_mib(g.memory_total_mib, self.replicas[g.index])
            for g in self.gpus
            if g.memory_total_mib > 0
        }

    def commands(self) -> list[str]:
        """The control commands that set the limits, in NVIDIA's order (memory, then threads)."""
        out = [f"set_default_device_pinned_mem_limit {i} {mib}M" for i, mib in self.pinned_limits().items()]
        out.append(f"set_default_active_thread_percentage {self.thread_percentage}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "memoryTotalMiB": g.memory_total_mib,
                    "computeCapability": list(g.compute_capability),
                }
                for g in self.gpus
            ],
            "replicas": {str(i): n for i, n in self.replicas.items()},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DaemonPlan:
        """The inverse of :meth:`to_json` (``KeyError``/``TypeError``/``ValueError`` for anything else)."""
        gpus = tuple(
            MpsGpu(
                int(g["index"]),
                str(g["uuid"]),
                int(g["memoryTotalMiB"]),
                (int(g["computeCapability"][0]), int(g["computeCapability"][1])),
            )
            for g in doc["gpus"]
        )
        return cls(str(doc["resource"]), gpus, {int(i): int(n) for i, n in doc["replicas"].items()})

    def env(self, root: MpsRoot) -> dict[str, str]:
        """The control daemon's environment (besides the inherited one)."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": root.pipe_dir(self.resource),
            "CUDA_MPS_LOG_DIRECTORY": root.log_dir(self.resource),
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in self.gpus),
        }


def _target(entry: SharedResource, sharing: TimeSlicing) -> str:
    if entry.rename is not None:
        return entry.rename
    return entry.name + ".shared" if sharing.rename_by_default else entry.name


def _selects(ref: str, gpu: MpsGpu) -> bool:
    return ref == str(gpu.index) or ref == gpu.uuid


def plan_daemons(
    sharing: TimeSlicing | None, gpus: Sequence[MpsGpu], *, warnings: list[str] | None = None
) -> list[DaemonPlan]:
    """One daemon per MPS-shared resource (sorted by name); ``[]`` unless ``sharing`` is MPS.

    MPS shares full GPUs (``nvidia.com/gpu``); an entry naming another resource has no devices here
    (a warning). Raises :class:`MpsConfigError` when a GPU has MIG enabled (NVIDIA: not supported for
    MIG devices), when replicas exceed what the GPU's MPS server takes, or when two entries select one
    GPU.
    """
    if sharing is None or not sharing.mps:
        return []
    notes = warnings if warnings is not None else []
    mig = [g.index for g in gpus if g.mig_enabled]
    if mig:
        raise MpsConfigError(
            "sharing.mps",
            "MPS sharing is not supported for MIG devices (MIG is enabled on GPU "
            f"{', '.join(map(str, mig))}); disable MIG on the node or share with sharing.timeSlicing",
        )
    ordered = sorted(gpus, key=lambda g: g.index)
    claimed: dict[int, int] = {}
    by_target: dict[str, dict[int, tuple[MpsGpu, int]]] = {}
    for position, entry in enumerate(sharing.resources):
        where = f"sharing.mps.resources[{position}]"
        if entry.name != FULL_GPU:
            notes.append(f"{where}: MPS shares full GPUs ({FULL_GPU}); {entry.name} has no devices here")
            continue
        if entry.devices == "all":
            chosen = ordered
        elif isinstance(entry.devices, int):
            chosen = ordered[: entry.devices]
        else:
            chosen = [g for g in ordered if any(_selects(ref, g) for ref in entry.devices)]
        for gpu in chosen:
            limit = max_clients(gpu.compute_capability)
            if entry.replicas > limit:
                raise MpsConfigError(
                    f"{where}.replicas",
                    f"{entry.replicas} replicas exceed the {limit} clients an MPS server takes on GPU "
                    f"{gpu.index} (compute capability {'.'.join(map(str, gpu.compute_capability))})",
                )
            if gpu.index in claimed:
                raise MpsConfigError(
                    f"{where}.devices",
                    f"GPU {gpu.index} is already shared by sharing.mps.resources[{claimed[gpu.index]}]",
                )
            claimed[gpu.index] = position
            by_target.setdefault(_target(entry, sharing), {})[gpu.index] = (gpu, entry.replicas)
    plans = []
    for name in sorted(by_target):
        members = by_target[name]
        plans.append(
            DaemonPlan(
                resource=name,
                gpus=tuple(members[i][0] for i in sorted(members)),
                replicas={i: members[i][1] for i in sorted(members)},
            )
        )
    return plans


# -------------------------------------------------------------------------------------- readiness


def sharing_document(sharing: TimeSlicing) -> dict[str, Any]:
    """The sharing settings as the readiness file records them (compared by the device plugin)."""
    return {
        "renameByDefault": sharing.rename_by_default,
        "failRequestsGreaterThanOne": sharing.fail_requests_greater_than_one,
        "resources": [
            {
                "name": r.name,
                "replicas": r.replicas,
                "devices": r.devices if isinstance(r.devices, str | int) else list(r.devices),
                **({"rename": r.rename} if r.rename is not None else {}),
            }
            for r in sharing.resources
        ],
    }


def ready_document(sharing: Mapping[str, Any], plans: Sequence[DaemonPlan]) -> dict[str, Any]:
    """What ``<root>/.ready`` holds: the sharing settings (:func:`sharing_document`) and, per resource,
    its GPUs and limits."""
    return {
        "sharing": dict(sharing),
        "resources": {
            p.resource: {
                "gpus": [g.uuid for g in p.gpus],
                "replicas": {g.uuid: p.replicas[g.index] for g in p.gpus},
                "activeThreadPercentage": p.thread_percentage,
                "pinnedDeviceMemLimitMiB": {g.uuid: lim for g, lim in _limits_by_uuid(p)},
            }
            for p in plans
        },
    }


def _limits_by_uuid(plan: DaemonPlan) -> list[tuple[MpsGpu, int]]:
    limits = plan.pinned_limits()
    return [(g, limits[g.index]) for g in plan.gpus if g.index in limits]


@dataclass(frozen=True)
class ReadyResource:
    """One resource of a readiness file, as the device plugin reads it."""

    thread_percentage: int
    pinned_mib: Mapping[str, int]  # GPU UUID -> MiB


def ready_resources(document: object, sharing: TimeSlicing) -> dict[str, ReadyResource] | None:
    """The resources a readiness file declares ready for ``sharing``; None when it was written for other
    settings or is not a readiness document (the plugin then advertises no MPS resource)."""
    if not isinstance(document, dict) or document.get("sharing") != sharing_document(sharing):
        return None
    resources = document.get("resources")
    if not isinstance(resources, dict):
        return None
    out: dict[str, ReadyResource] = {}
    for name, value in resources.items():
        if not isinstance(name, str) or not isinstance(value, dict):
            return None
        percentage = value.get("activeThreadPercentage")
        pinned = value.get("pinnedDeviceMemLimitMiB", {})
        if not isinstance(percentage, int) or not isinstance(pinned, dict):
            return None
        out[name] = ReadyResource(
            percentage,
            {str(k): v for k, v in pinned.items() if isinstance(v, int) and not isinstance(v, bool)},
        )
    return out


def client_env(
    resource: str, ready: ReadyResource, device_uuids: Sequence[str], *, container_root: str = CONTAINER_ROOT
) -> dict[str, str]:
    """A client container's MPS environment: the pipe directory (as NVIDIA's plugin), and the limits the
    daemon set as defaults, spelled out per client (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` counts the
    container's devices from 0, in the order they are handed over)."""
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": MpsRoot(container_root).pipe_dir(resource),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(ready.thread_percentage),
    }
    limits = [
        f"{ordinal}={ready.pinned_mib[uuid]}M"
        for ordinal, uuid in enumerate(device_uuids)
        if uuid in ready.pinned_mib
    ]
    if limits:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    return env

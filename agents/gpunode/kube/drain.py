"""kubectl drain's rules for the pods on a node (with ``--ignore-daemonsets``), as pure functions.

:func:`decide_pod` says what a drain does with one pod: DaemonSet and static pods are left alone (their
controller, or the kubelet, would put them back), pods already terminating are waited for, finished pods
are evicted, pods no controller manages (nothing recreates them) and pods with emptyDir volumes (their
data goes with them) block the drain unless allowed. :func:`plan_drain` sorts a node's pods by those
rules, so a caller can refuse the whole drain up front, before anything is evicted, naming each pod in
the way. :func:`is_gpu_pod` picks the pods that use NVIDIA GPUs, as NVIDIA's driver manager does.

The reasons name the driver manager's settings that would allow a blocked pod (``DRAIN_USE_FORCE``,
``DRAIN_DELETE_EMPTYDIR_DATA``), as NVIDIA's environment variables; the eviction itself (the Eviction
API, disruption budgets) is :meth:`gpunode.kube.client.Kube.evict_pod`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from gpunode.kube.api import PodInfo

__all__ = [
    "GPU_RESOURCE_PREFIXES",
    "DrainPlan",
    "PodAction",
    "PodDecision",
    "decide_pod",
    "is_gpu_pod",
    "plan_drain",
]

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


def is_gpu_pod(pod: PodInfo) -> bool:
    """Whether a pod requests (or limits) ``nvidia.com/gpu*`` or ``nvidia.com/mig-*``, as NVIDIA's filter."""
    return any(name.startswith(GPU_RESOURCE_PREFIXES) for name in pod.requests)


PodAction = Literal["evict", "wait", "ignore", "block"]


@dataclass(frozen=True)
class PodDecision:
    """What a drain does with one pod: evict it, wait for it (already terminating), leave it (ignore:
    DaemonSet or static pod) or refuse to go on (block), and why."""

    pod: PodInfo
    action: PodAction
    why: str

    def __str__(self) -> str:
        return f"{self.pod.key} ({self.why})"


def decide_pod(pod: PodInfo, *, force: bool, delete_emptydir_data: bool) -> PodDecision:
    """kubectl drain's rules for one pod (with ``--ignore-daemonsets``)."""
    controller = next((o for o in pod.owners if o.controller), None)
    if controller is not None and controller.kind == "DaemonSet":
        return PodDecision(pod, "ignore", f"DaemonSet {controller.name}: its controller would put it back")
    if controller is not None and controller.kind == "Node":
        return PodDecision(pod, "ignore", "static pod: the kubelet runs it from a file, it cannot be evicted")
    if pod.deleting:
        return PodDecision(pod, "wait", "already terminating")
    if pod.phase in ("Succeeded", "Failed"):
        return PodDecision(pod, "evict", f"finished ({pod.phase})")
    if controller is None and not force:
        return PodDecision(
            pod,
            "block",
            "not managed by a controller, so nothing recreates it: DRAIN_USE_FORCE=true evicts it",
        )
    volumes = pod.empty_dirs
    if volumes and not delete_emptydir_data:
        return PodDecision(
            pod,
            "block",
            f"emptyDir volume(s) {', '.join(volumes)} would lose their data: "
            "DRAIN_DELETE_EMPTYDIR_DATA=true evicts it",
        )
    if controller is None:
        return PodDecision(pod, "evict", "not managed by a controller (DRAIN_USE_FORCE)")
    return PodDecision(pod, "evict", f"{controller.kind} {controller.name}")


@dataclass(frozen=True)
class DrainPlan:
    evict: tuple[PodInfo, ...] = ()
    wait: tuple[PodInfo, ...] = ()
    blocked: tuple[PodDecision, ...] = ()
    ignored: tuple[PodDecision, ...] = ()

    @property
    def targets(self) -> tuple[PodInfo, ...]:
        """The pods that must be gone for the drain to be done."""
        return self.evict + self.wait


def plan_drain(
    pods: Iterable[PodInfo],
    *,
    select: Callable[[PodInfo], bool],
    force: bool,
    delete_emptydir_data: bool,
) -> DrainPlan:
    """Sort the selected pods by :func:`decide_pod`; pods not selected are not part of the plan."""
    by: dict[PodAction, list[PodDecision]] = {"evict": [], "wait": [], "ignore": [], "block": []}
    for pod in sorted(pods, key=lambda p: p.key):
        if select(pod):
            decision = decide_pod(pod, force=force, delete_emptydir_data=delete_emptydir_data)
            by[decision.action].append(decision)
    return DrainPlan(
        evict=tuple(d.pod for d in by["evict"]),
        wait=tuple(d.pod for d in by["wait"]),
        blocked=tuple(by["block"]),
        ignored=tuple(by["ignore"]),
    )

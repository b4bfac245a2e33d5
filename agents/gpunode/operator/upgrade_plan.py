"""The cluster-wide driver upgrade, as pure decisions (issue 17): which nodes need an upgrade, which may
start now within ``driver.upgradePolicy``'s limits, and where each node goes next.

NVIDIA's upgrade controller keeps each GPU node's progress in the label
``nvidia.com/gpu-driver-upgrade-state`` and walks it through the states of :data:`STATES`. These functions
take snapshots (:class:`NodeView`, the policy's limits) and return decisions with their reasons; the
controller that reads the cluster and writes labels, cordons and evictions applies them. Keeping them
pure lets a table test check every rule, and lets a checker re-verify the limits on any snapshot.

Where gpunode differs from NVIDIA on purpose (the users' complaints in the operator reference):

* ``upgrade-failed`` is left only on a new driver revision or the retry annotation, never by itself;
* a node an administrator had cordoned stays cordoned (recorded when we cordon it, in an annotation);
* a driver DaemonSet with an unscheduled pod holds back only its own nodes, not the whole pass;
* a change that does not reinstall the driver (its ``DRIVER_CONFIG_DIGEST`` unchanged) restarts the driver
  pod with the node cordoned, without evicting GPU workloads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

__all__ = [
    "ACTIVE_STATES",
    "IN_FLIGHT_STATES",
    "RETRY_ANNOTATION",
    "SKIP_LABEL",
    "STATES",
    "STATE_LABEL",
    "Admission",
    "LimitError",
    "Limits",
    "Need",
    "NodeView",
    "Observed",
    "Step",
    "Steps",
    "admit",
    "max_unavailable",
    "need",
    "step",
    "unavailable_now",
]

STATE_LABEL: Final = "nvidia.com/gpu-driver-upgrade-state"
SKIP_LABEL: Final = "nvidia.com/gpu-driver-upgrade.skip"
DRAIN_SKIP_POD_LABEL: Final = "nvidia.com/gpu-driver-upgrade-drain.skip"
REQUESTED_ANNOTATION: Final = "nvidia.com/gpu-driver-upgrade-requested"
# gpunode's own: an explicit retry of a failed node, the reason of the last transition, and whether the
# node was cordoned by us (so an administrator's cordon is never undone).
RETRY_ANNOTATION: Final = "gpunode.io/driver-upgrade-retry"
REASON_ANNOTATION: Final = "gpunode.io/driver-upgrade-reason"
CORDONED_BY_US_ANNOTATION: Final = "gpunode.io/driver-upgrade-cordoned"

State = Literal[
    "",
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "drain-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
    "upgrade-failed",
]
STATES: Final[tuple[State, ...]] = get_args(State)
# A node in one of these holds an upgrade slot (it counts against maxParallelUpgrades), in their order.
IN_FLIGHT_STATES: Final[tuple[State, ...]] = STATES[2:9]
ACTIVE_STATES: Final = frozenset(IN_FLIGHT_STATES)

Need = Literal["none", "restart", "upgrade", "held"]


class LimitError(ValueError):
    """A limit of ``driver.upgradePolicy`` that cannot be applied; ``path`` is its YAML path."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


_PERCENT = re.compile(r"^([0-9]+)%$")


def max_unavailable(
    value: int | str, total: int, *, path: str = "spec.driver.upgradePolicy.maxUnavailable"
) -> int:
    """``maxUnavailable`` (a count, or a percentage of ``total`` GPU nodes rounded up as NVIDIA does) as
    a count. A negative count, a percentage over 100 % or anything else: :class:`LimitError`."""
    if isinstance(value, bool):
        raise LimitError(path, f'{value!r} is not a count or a percentage (write 1 or "25%")')
    if isinstance(value, int):
        if value < 0:
            raise LimitError(path, f"{value} is negative (write a count >= 0 or a percentage)")
        return value
    text = value.strip()
    if text.isdigit():
        return int(text)
    match = _PERCENT.match(text)
    if match is None:
        raise LimitError(path, f'{value!r} is not a count or a percentage (write 1 or "25%")')
    percent = int(match.group(1))
    if percent > 100:
        raise LimitError(path, f"{value!r} is over 100%")
    return math.ceil(total * percent / 100)


@dataclass(frozen=True)
class Limits:
    """The policy's two limits: ``max_parallel`` in-progress upgrades (0 = unlimited) and
    ``max_unavailable`` nodes cordoned or NotReady (already a count)."""

    max_parallel: int
    max_unavailable: int


@dataclass(frozen=True)
class NodeView:
    """What the upgrade decisions need of one GPU node and its driver pod."""

    name: str
    state: State = ""
    skip: bool = False  # nvidia.com/gpu-driver-upgrade.skip=true
    unschedulable: bool = False
    ready: bool = True
    cordoned_by_us: bool = False
    # The driver pod: its controller-revision-hash and install digest, against its DaemonSet's newest.
    pod_revision: str | None = None
    newest_revision: str | None = None
    pod_digest: str | None = None
    newest_digest: str | None = None
    # The DaemonSet that should run here has every pod it wants scheduled (else this node is held).
    daemonset_complete: bool = True
    requested: bool = False  # nvidia.com/gpu-driver-upgrade-requested=true
    retry: bool = False  # gpunode.io/driver-upgrade-retry present
    failed_revision: str | None = None  # the newest revision when the node failed
    extra: Mapping[str, str] = field(default_factory=dict)


def need(node: NodeView) -> tuple[Need, str]:
    """Whether ``node`` needs anything, and why: ``upgrade`` (the install-relevant digest changed, or an
    upgrade was requested), ``restart`` (the pod is stale but installs the same driver), ``held`` (its
    DaemonSet has unscheduled pods, or the node opts out), or ``none``."""
    if node.skip:
        return "held", f"{SKIP_LABEL}=true"
    if node.pod_revision is None or node.newest_revision is None:
        return "none", "no driver pod on the node yet"
    if node.requested:
        return "upgrade", f"{REQUESTED_ANNOTATION} is set"
    if node.pod_revision == node.newest_revision:
        return "none", f"driver pod at the newest revision {node.newest_revision}"
    if not node.daemonset_complete:
        return "held", "the driver DaemonSet has unscheduled pods; this node waits until it is complete"
    if node.pod_digest is not None and node.pod_digest == node.newest_digest:
        return "restart", (
            f"driver pod revision {node.pod_revision} -> {node.newest_revision}, same DRIVER_CONFIG_DIGEST: "
            "restart only, no eviction"
        )
    return "upgrade", f"driver pod revision {node.pod_revision} -> {node.newest_revision}, driver changes"


def admin_cordoned(node: NodeView) -> bool:
    """Cordoned, and not by us: an administrator's, which the upgrade neither counts nor lifts."""
    return node.unschedulable and not node.cordoned_by_us


def unavailable(node: NodeView) -> bool:
    """Whether a node counts against ``maxUnavailable``: NotReady, cordoned by us, or upgrading (a node
    admitted a moment ago is not cordoned yet, but will be: its slot is taken from the start). A node an
    administrator cordoned is not the upgrade's doing and costs nothing (it is not cordoned again)."""
    return not node.ready or (
        not admin_cordoned(node) and (node.unschedulable or node.state in ACTIVE_STATES)
    )


def unavailable_now(nodes: Iterable[NodeView]) -> int:
    """Nodes that count against ``maxUnavailable`` (:func:`unavailable`)."""
    return sum(1 for n in nodes if unavailable(n))


@dataclass(frozen=True)
class Admission:
    """:func:`admit`'s answer: the nodes that may start now, and for each waiting node why not."""

    start: tuple[str, ...]
    waiting: Mapping[str, str]
    holding: tuple[str, ...]  # nodes holding the slots (in progress)


def admit(nodes: Iterable[NodeView], limits: Limits) -> Admission:
    """Which ``upgrade-required`` nodes may move on now without breaking either limit, in name order.

    A node cordoned by an administrator, or NotReady, costs no unavailability slot when it starts: we
    do not cordon it (it is unavailable either way, or not by our doing). Every other start costs one of
    each."""
    listed = sorted(nodes, key=lambda n: n.name)
    active = [n.name for n in listed if n.state in ACTIVE_STATES]
    in_flight = len(active)
    unavailable = unavailable_now(listed)
    start: list[str] = []
    waiting: dict[str, str] = {}
    for node in listed:
        if node.state != "upgrade-required":
            continue
        if limits.max_parallel and in_flight >= limits.max_parallel:
            waiting[node.name] = (
                f"waiting for a slot: {in_flight} upgrades in progress, "
                f"maxParallelUpgrades {limits.max_parallel}"
            )
            continue
        already_down = admin_cordoned(node) or not node.ready
        if not already_down and unavailable >= limits.max_unavailable:
            waiting[node.name] = (
                f"waiting for a slot: {unavailable} nodes unavailable, "
                f"maxUnavailable {limits.max_unavailable}"
            )
            continue
        start.append(node.name)
        in_flight += 1
        if not already_down:
            unavailable += 1
    return Admission(tuple(start), waiting, tuple(active))


# -- one node's next step ------------------------------------------------------------------------------------
Action = Literal["cordon", "evict-gpu-pods", "drain", "delete-driver-pod", "uncordon"]

# NVIDIA's limits on the two steps that have no setting: driver pod restarts before the node fails, and
# how long the validator may take.
MAX_DRIVER_RESTARTS: Final = 10
VALIDATION_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True)
class Steps:
    """The per-node settings of ``driver.upgradePolicy`` (timeouts in seconds, 0 = wait forever)."""

    wait_for_jobs_selector: str = ""
    wait_for_jobs_timeout: int = 0
    pod_deletion_timeout: int = 300
    drain_enable: bool = False
    drain_timeout: int = 300


@dataclass(frozen=True)
class Observed:
    """What the controller saw on the node for the step it is in.

    ``in_state_s``: seconds since the node entered its state (from the reason annotation's time);
    ``jobs_left``: pods matching ``waitForCompletion.podSelector`` still running; ``gpu_pods_left`` and
    ``drain_left``: pods still to leave (with the ones that refuse, and why, in ``blocked``);
    ``driver_ready`` / ``driver_restarts``: the driver pod on the newest revision; ``validator_ready``;
    ``refused``: pods the drain rules refuse to evict at all (no controller without ``force``, emptyDir
    data without ``deleteEmptyDir``), each with why: waiting for them would only run out the clock."""

    in_state_s: float = 0.0
    jobs_left: int = 0
    gpu_pods_left: int = 0
    drain_left: int = 0
    blocked: tuple[str, ...] = ()
    driver_ready: bool = False
    driver_restarts: int = 0
    validator_ready: bool = False
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """Where the node goes (``to``; the same state to stay), why, and what to do first (``action``)."""

    to: State
    reason: str
    action: Action | None = None


def _failed(step: str, cause: str) -> Step:
    return Step("upgrade-failed", f"{step}: {cause}")


def step(node: NodeView, seen: Observed, steps: Steps) -> Step:
    """The next step of one node (``upgrade-required`` is left by :func:`admit`, not here)."""
    what, why = need(node)
    state = node.state
    if state in ("", "upgrade-done"):
        if what in ("upgrade", "restart"):
            return Step("upgrade-required", why)
        return Step(state, why)
    if state == "upgrade-failed":
        if node.retry:
            return Step("upgrade-required", f"retry requested ({RETRY_ANNOTATION})")
        if node.failed_revision is not None and node.newest_revision not in (None, node.failed_revision):
            return Step("upgrade-required", f"new driver revision {node.newest_revision} after the failure")
        return Step(state, "failed; set the retry annotation or roll out a new driver revision")
    if state == "upgrade-required":
        return Step(state, "waiting for a slot")
    if state == "cordon-required":
        action: Action | None = None if node.unschedulable else "cordon"
        if what == "restart":
            return Step(
                "pod-restart-required", "cordoned; same driver install: restart without eviction", action
            )
        return Step("wait-for-jobs-required", "cordoned", action)
    if state == "wait-for-jobs-required":
        if not steps.wait_for_jobs_selector or seen.jobs_left == 0:
            return Step("pod-deletion-required", "no jobs to wait for")
        if steps.wait_for_jobs_timeout and seen.in_state_s >= steps.wait_for_jobs_timeout:
            return Step(
                "pod-deletion-required",
                f"{seen.jobs_left} jobs still running after waitForCompletion.timeoutSeconds "
                f"{steps.wait_for_jobs_timeout}; going on",
            )
        return Step(state, f"waiting for {seen.jobs_left} jobs ({steps.wait_for_jobs_selector})")
    if state == "pod-deletion-required":
        if seen.refused:
            pods = "; ".join(seen.refused)
            if steps.drain_enable:
                return Step("drain-required", f"GPU pods may not be evicted ({pods}); draining instead")
            return _failed("pod-deletion-required", f"GPU pods may not be evicted: {pods}")
        if seen.gpu_pods_left == 0:
            if steps.drain_enable:
                return Step("drain-required", "GPU pods gone; draining")
            return Step("pod-restart-required", "GPU pods gone")
        if steps.pod_deletion_timeout and seen.in_state_s >= steps.pod_deletion_timeout:
            pods = ", ".join(seen.blocked) or f"{seen.gpu_pods_left} pods"
            if steps.drain_enable:
                return Step("drain-required", f"GPU pods would not leave ({pods}); draining instead")
            return _failed("pod-deletion-required", f"GPU pods would not leave: {pods}")
        return Step(state, f"{seen.gpu_pods_left} GPU pods to evict", "evict-gpu-pods")
    if state == "drain-required":
        if seen.refused:
            return _failed("drain-required", f"pods may not be evicted: {'; '.join(seen.refused)}")
        if seen.drain_left == 0:
            return Step("pod-restart-required", "drained")
        if steps.drain_timeout and seen.in_state_s >= steps.drain_timeout:
            pods = ", ".join(seen.blocked) or f"{seen.drain_left} pods"
            return _failed(
                "drain-required",
                f"pods would not leave within drain.timeoutSeconds {steps.drain_timeout}: {pods}",
            )
        return Step(state, f"{seen.drain_left} pods to drain", "drain")
    if state == "pod-restart-required":
        if node.pod_revision is not None and node.pod_revision == node.newest_revision:
            if seen.driver_restarts > MAX_DRIVER_RESTARTS:
                return _failed(
                    "pod-restart-required", f"driver pod crash-looping ({seen.driver_restarts} restarts)"
                )
            if seen.driver_ready:
                return Step("validation-required", "driver pod at the newest revision and Ready")
            return Step(state, "waiting for the new driver pod to be Ready")
        return Step(state, "restarting the driver pod", "delete-driver-pod")
    if state == "validation-required":
        if seen.validator_ready:
            return Step("uncordon-required", "validated")
        if seen.in_state_s >= VALIDATION_TIMEOUT_S:
            return _failed("validation-required", f"validator not Ready after {VALIDATION_TIMEOUT_S:.0f} s")
        return Step(state, "waiting for the validator")
    # uncordon-required
    if node.cordoned_by_us and node.unschedulable:
        return Step("upgrade-done", "uncordoned", "uncordon")
    kept = " (cordoned by an administrator before the upgrade: left cordoned)" if node.unschedulable else ""
    return Step("upgrade-done", "done" + kept)

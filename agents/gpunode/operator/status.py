"""The ClusterPolicy's ``status``, computed from the states' verdicts.

NVIDIA's fields: ``state`` (``ready``, ``notReady``, ``ignored``), ``namespace`` and the conditions
``Ready`` and ``Error`` with reasons ``Reconciled``, ``ReconcileFailed``, ``OperandNotReady``,
``NFDLabelsMissing``, ``NoGPUNodes``. Beyond NVIDIA: ``states[]`` with, per state, the pod counts and up
to five node names holding it back, so ``notReady`` always says where and why. A condition keeps its
``lastTransitionTime`` while its status does not change, so an unchanged cluster yields an equal status
(and the controller writes nothing). Pure: the clock is a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpunode.operator.readiness import Readiness

__all__ = [
    "IGNORED",
    "MAX_NODES",
    "NOT_READY",
    "READY",
    "Reason",
    "StateStatus",
    "cluster_status",
    "ignored_status",
    "state_status",
]

READY = "ready"
NOT_READY = "notReady"
IGNORED = "ignored"
DISABLED = "disabled"
MAX_NODES = 5


class Reason:
    RECONCILED = "Reconciled"
    RECONCILE_FAILED = "ReconcileFailed"
    OPERAND_NOT_READY = "OperandNotReady"
    NFD_LABELS_MISSING = "NFDLabelsMissing"
    NO_GPU_NODES = "NoGPUNodes"
    IGNORED = "Ignored"


@dataclass(frozen=True)
class StateStatus:
    """One entry of ``status.states``."""

    name: str
    state: str  # ready, notReady or disabled
    desired: int = 0
    ready: int = 0
    unavailable: int = 0
    nodes: tuple[str, ...] = field(default=())
    message: str = ""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "state": self.state,
            "desired": self.desired,
            "ready": self.ready,
            "unavailable": self.unavailable,
        }
        if self.nodes:
            out["nodes"] = list(self.nodes)
        if self.message:
            out["message"] = self.message
        return out


def state_status(name: str, verdicts: Mapping[str, Readiness], *, enabled: bool = True) -> StateStatus:
    """A state's entry from its DaemonSets' verdicts (by DaemonSet name): counts summed, the holding-back
    nodes merged (first five, sorted, and how many more), each not-ready DaemonSet's message."""
    if not enabled:
        return StateStatus(name, DISABLED)
    nodes = sorted({n for v in verdicts.values() for n in v.nodes})
    messages = [f"{ds}: {v.message}" for ds, v in sorted(verdicts.items()) if not v.ready]
    if len(nodes) > MAX_NODES:
        messages.append(f"{len(nodes) - MAX_NODES} more nodes")
    return StateStatus(
        name,
        READY if all(v.ready for v in verdicts.values()) else NOT_READY,
        desired=sum(v.desired for v in verdicts.values()),
        ready=sum(v.ready_pods for v in verdicts.values()),
        unavailable=sum(v.unavailable for v in verdicts.values()),
        nodes=tuple(nodes[:MAX_NODES]),
        message="; ".join(messages),
    )


def _condition(
    type_: str, status: bool, reason: str, message: str, now: str, previous: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    text = "True" if status else "False"
    since = now
    for c in previous:
        if c.get("type") == type_ and c.get("status") == text and c.get("lastTransitionTime"):
            since = str(c["lastTransitionTime"])
    return {"type": type_, "status": text, "reason": reason, "message": message, "lastTransitionTime": since}


def _conditions(
    ready: tuple[bool, str, str], error: tuple[bool, str, str], now: str, previous: Any
) -> list[dict[str, Any]]:
    prev = [c for c in previous if isinstance(c, Mapping)] if isinstance(previous, list) else []
    return [_condition("Ready", *ready, now, prev), _condition("Error", *error, now, prev)]


def cluster_status(
    namespace: str,
    states: Sequence[StateStatus],
    *,
    now: str,
    nfd_nodes: int,
    gpu_nodes: int,
    error: str | None = None,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The status of the active policy. ``error`` (a failed reconcile: invalid spec, refused write) makes
    it ``notReady`` with ``Error`` true; no node labelled by NFD: ``notReady``, ``NFDLabelsMissing``; NFD
    but no GPU node: ``ready``, ``NoGPUNodes``; otherwise ready exactly when every state is."""
    prev_conditions = (previous or {}).get("conditions") or []
    blocked = [s for s in states if s.state == NOT_READY]
    if error is not None:
        state = NOT_READY
        ready = (False, Reason.RECONCILE_FAILED, error)
        err = (True, Reason.RECONCILE_FAILED, error)
    elif nfd_nodes == 0:
        msg = "no node carries Node Feature Discovery labels; is NFD deployed?"
        state = NOT_READY
        ready = (False, Reason.NFD_LABELS_MISSING, msg)
        err = (True, Reason.NFD_LABELS_MISSING, msg)
    elif blocked:
        state = NOT_READY
        msg = "; ".join(
            f"{s.name} not ready" + (f" on {', '.join(s.nodes)}" if s.nodes else "") for s in blocked
        )
        ready = (False, Reason.OPERAND_NOT_READY, msg)
        err = (False, Reason.RECONCILED, "")
    elif gpu_nodes == 0:
        state = READY
        ready = (True, Reason.NO_GPU_NODES, "no GPU node found; watching for nodes to join")
        err = (False, Reason.RECONCILED, "")
    else:
        state = READY
        ready = (True, Reason.RECONCILED, "every state is ready")
        err = (False, Reason.RECONCILED, "")
    return {
        "state": state,
        "namespace": namespace,
        "conditions": _conditions(ready, err, now, prev_conditions),
        "states": [s.as_json() for s in states],
    }


def ignored_status(active: str, *, now: str, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The status of every policy but the active one: ``ignored``, with a condition naming the active one."""
    msg = f"only one ClusterPolicy is honoured; the active one is {active!r} (the oldest)"
    prev_conditions = (previous or {}).get("conditions") or []
    return {
        "state": IGNORED,
        "conditions": _conditions(
            (False, Reason.IGNORED, msg), (False, Reason.IGNORED, ""), now, prev_conditions
        ),
    }

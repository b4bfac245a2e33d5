"""Pause GPU operands on this node, wait for their pods to go, and always put the labels back.

The GPU Operator deploys each operand (device plugin, feature discovery, DCGM, exporter, ...) as a
DaemonSet selecting ``nvidia.com/gpu.deploy.<operand>=true``. To get the GPUs to themselves (MIG
re-partitioning, a driver upgrade), the MIG manager and driver manager set those labels to
``paused-for-<reason>``, wait until the operands' pods on the node are gone, do their work and restore
the labels. NVIDIA's MIG manager can leave a node wedged with its operands paused for good: a pod wait
that times out returns without restoring, and a process that dies halfway forgets what it paused.

Here the record of what was paused travels with the change itself: one merge patch of the node sets the
labels *and* the annotation ``nvidia.com/gpunode.operands-paused`` holding their previous values, so no
label is ever changed without the means to undo it. The restore is also one patch (labels back,
annotation gone). It runs when the work ends, fails, times out or is cancelled; after a crash, the next
start of any agent using this module (:meth:`OperandPauser.recover`) finishes it. The holder renews a
lease in the record while paused, so another agent can tell a live pause from an abandoned one; two
agents never pause at once (the record is written with optimistic locking, and a second pauser waits).

Rules for the labels, as NVIDIA's: ``false`` stays ``false``; an absent label is not created. And one
of our own: a label someone changed while it was paused (an administrator setting ``false``) is left as
they set it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from gpunode.common.logging import get_logger
from gpunode.kube.api import KubeConflict, NodeInfo, PodInfo

__all__ = [
    "DEFAULT_OPERANDS",
    "DEPLOY_PREFIX",
    "RECORD_ANNOTATION",
    "LabelOperand",
    "Operand",
    "OperandPauser",
    "OperandsBusy",
    "OperandsNotStopped",
    "PauseRecord",
    "paused_value",
    "plan_pause",
    "plan_restore",
]

DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
RECORD_ANNOTATION = "nvidia.com/gpunode.operands-paused"


# Our record is a few hundred characters; anything far larger was not written by an agent.
MAX_RECORD_CHARS = 16384


@dataclass(frozen=True)
class Operand:
    """One operand: the suffix of its ``gpu.deploy`` label and the labels of its pods (any of
    ``pod_labels`` sets, all keys of a set equal). Pods whose nodeSelector names the deploy label are
    waited for as well, whatever their labels."""

    name: str
    pod_labels: tuple[Mapping[str, str], ...] = ()

    @property
    def label(self) -> str:
        return DEPLOY_PREFIX + self.name


@dataclass(frozen=True)
class LabelOperand(Operand):
    """An operand whose node label is any key, not ``nvidia.com/gpu.deploy.<name>``."""

    key: str = ""

    @property
    def label(self) -> str:
        return self.key


# The operands the GPU Operator's MIG manager pauses, with the pod labels of NVIDIA's DaemonSets and of
# ours (app.kubernetes.io/name=gpunode-<agent>).
DEFAULT_OPERANDS: tuple[Operand, ...] = (
    Operand(
        "device-plugin",
        ({"app": "nvidia-device-plugin-daemonset"}, {"app.kubernetes.io/name": "gpunode-device-plugin"}),
    ),
    Operand(
        "gpu-feature-discovery",
        ({"app": "gpu-feature-discovery"}, {"app.kubernetes.io/name": "gpunode-feature-discovery"}),
    ),
    Operand(
        "dcgm-exporter", ({"app": "nvidia-dcgm-exporter"}, {"app.kubernetes.io/name": "gpunode-exporter"})
    ),
    Operand("dcgm", ({"app": "nvidia-dcgm"},)),
    Operand("nvsm"),
)


class OperandsNotStopped(Exception):
    """Operand pods were still on the node at the deadline; the labels have been restored."""

    def __init__(self, pods: Sequence[str], timeout: float) -> None:
        self.pods = tuple(pods)
        self.timeout = timeout
        super().__init__(
            f"{len(self.pods)} operand pod(s) still running after {timeout:g} s: {', '.join(self.pods)}; "
            "operand labels restored"
        )


class OperandsBusy(Exception):
    """Another agent holds a live pause on this node."""


# -- the record ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PauseRecord:
    owner: str
    reason: str
    previous: Mapping[str, str]  # label -> value before the pause
    since: str = ""
    lease_until: float = 0.0  # epoch seconds; past it, the holder is taken to be gone

    def to_json(self) -> str:
        return json.dumps(
            {
                "owner": self.owner,
                "reason": self.reason,
                "previous": dict(sorted(self.previous.items())),
                "since": self.since,
                "leaseUntil": round(self.lease_until, 3),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> PauseRecord | None:
        """The record, or None when the annotation is unreadable (it is then ignored and replaced).

        Anyone allowed to patch the node can write the annotation: a huge or deeply nested value (a
        RecursionError in the parser) is unreadable too, never a crash."""
        if len(text) > MAX_RECORD_CHARS:
            return None
        try:
            data = json.loads(text)
            previous = data["previous"]
            if not isinstance(previous, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in previous.items()
            ):
                return None
            return cls(
                owner=str(data["owner"]),
                reason=str(data["reason"]),
                previous=previous,
                since=str(data.get("since", "")),
                lease_until=float(data.get("leaseUntil", 0.0)),
            )
        except (ValueError, KeyError, TypeError, RecursionError):
            return None


def paused_value(reason: str) -> str:
    """The label value while paused: ``paused-for-<reason>``, kept a valid label value (<= 63 chars)."""
    clean = "".join(c if c.isalnum() or c in "-_." else "-" for c in reason).strip("-_.") or "change"
    return f"paused-for-{clean}"[:63].rstrip("-_.")


# -- pure planning ---------------------------------------------------------------------------------------
def plan_pause(
    labels: Mapping[str, str], operands: Sequence[Operand], reason: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(label changes, previous values) to pause ``operands``: absent labels are not created, ``false``
    stays ``false``, a label already at the paused value is left alone."""
    target = paused_value(reason)
    changes: dict[str, str] = {}
    previous: dict[str, str] = {}
    for operand in operands:
        value = labels.get(operand.label)
        if value is None or value == "false" or value == target:
            continue
        changes[operand.label] = target
        previous[operand.label] = value
    return changes, previous


def plan_restore(labels: Mapping[str, str], record: PauseRecord) -> tuple[dict[str, str], dict[str, str]]:
    """(label changes, left alone): each paused label goes back to its previous value, unless someone
    changed or removed it meanwhile (then it is theirs, and reported as left alone)."""
    target = paused_value(record.reason)
    changes: dict[str, str] = {}
    left: dict[str, str] = {}
    for key, before in record.previous.items():
        now = labels.get(key)
        if now == target:
            changes[key] = before
        elif now != before:
            left[key] = "<absent>" if now is None else now
    return changes, left


def pods_in_the_way(pods: Sequence[PodInfo], operands: Sequence[Operand]) -> list[str]:
    """``namespace/name`` of the pods still there for ``operands``: by pod labels, or by a nodeSelector
    naming an operand's deploy label."""
    keys = {o.label for o in operands}
    out: list[str] = []
    for pod in pods:
        by_label = any(
            all(pod.labels.get(k) == v for k, v in selector.items())
            for o in operands
            for selector in o.pod_labels
        )
        by_selector = bool(keys & set(pod.node_selector))
        if by_label or by_selector:
            out.append(pod.key)
    return sorted(out)


# -- the API calls this module needs (satisfied by gpunode.kube.client.Kube) ----------------------------
class KubeLike(Protocol):
    async def get_node(self) -> NodeInfo: ...

    async def patch_node(
        self,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> NodeInfo: ...

    async def list_pods(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        namespace: str | None = None,
        requesting: str | None = None,
    ) -> list[PodInfo]: ...


@dataclass
class PauseState:
    """What a pause did, for the caller's logs and status."""

    reason: str
    paused: dict[str, str] = field(default_factory=dict)  # label -> previous value
    waited_s: float = 0.0


class OperandPauser:
    """Pauses operands for one agent (``owner``), crash-safe; see the module docstring."""

    def __init__(
        self,
        kube: KubeLike,
        owner: str,
        *,
        operands: Sequence[Operand] = DEFAULT_OPERANDS,
        lease: float = 60.0,
        poll: float = 1.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.kube = kube
        self.owner = owner
        self.operands = tuple(operands)
        self.lease = lease
        self.poll = poll
        self.clock = clock
        self.sleep = sleep
        self.log = get_logger("gpunode.operands")

    # -- recovery --------------------------------------------------------------------------------------
    async def recover(self) -> dict[str, str]:
        """Finish a pause left behind by a process that died: ours (same owner) at once, another
        agent's once its lease has run out. Returns the labels restored."""
        node = await self.kube.get_node()
        record = _record_of(node)
        if record is None:
            if RECORD_ANNOTATION in node.annotations:  # unreadable: nothing we can restore from it
                self.log.warning(
                    "operands_record_unreadable", value=node.annotations[RECORD_ANNOTATION][:200]
                )
                await self.kube.patch_node(annotations={RECORD_ANNOTATION: None})
            return {}
        if record.owner != self.owner and record.lease_until > self.clock():
            return {}  # a live pause by someone else
        self.log.warning(
            "operands_restore_interrupted",
            owner=record.owner,
            reason=record.reason,
            since=record.since,
            labels=dict(record.previous),
        )
        return await self._restore(record)

    # -- the pause -------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def paused(
        self, reason: str, *, timeout: float = 300.0, only: Sequence[str] | None = None
    ) -> AsyncIterator[PauseState]:
        """Pause the operands (``only`` names a subset), wait up to ``timeout`` seconds for their pods
        to leave this node, run the body, then restore. :class:`OperandsNotStopped` (labels already
        restored) when pods outlive the deadline; :class:`OperandsBusy` when another agent's pause
        does not end within it."""
        operands = [o for o in self.operands if only is None or o.name in only]
        state = PauseState(reason=reason)
        deadline = time.monotonic() + timeout
        record = await self._take(reason, operands, deadline)
        state.paused = dict(record.previous)
        # Not a TaskGroup: the body's own exceptions must reach the caller as they are, not grouped.
        renew = asyncio.create_task(self._renew(record), name="operands-lease")
        try:
            state.waited_s = await self._wait_gone(operands, deadline, timeout)
            yield state
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew
            # Restore even when cancelled: shielded, and retried while the API server is away.
            await asyncio.shield(self._restore_with_retries(record))

    async def _take(self, reason: str, operands: Sequence[Operand], deadline: float) -> PauseRecord:
        while True:
            node = await self.kube.get_node()
            held = _record_of(node)
            if held is not None:
                if held.owner == self.owner or held.lease_until <= self.clock():
                    await self.recover()
                    continue
                if time.monotonic() >= deadline:
                    raise OperandsBusy(
                        f"operands on this node are paused by {held.owner} for {held.reason} "
                        f"since {held.since}; gave up waiting"
                    )
                await self.sleep(self.poll)
                continue
            changes, previous = plan_pause(node.labels, operands, reason)
            record = PauseRecord(
                owner=self.owner,
                reason=reason,
                previous=previous,
                since=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                lease_until=self.clock() + self.lease,
            )
            try:
                await self.kube.patch_node(
                    labels=dict(changes),
                    annotations={RECORD_ANNOTATION: record.to_json()},
                    resource_version=node.resource_version,
                )
            except KubeConflict:
                continue
            self.log.info("operands_paused", reason=reason, labels=changes, previous=previous)
            return record

    async def _renew(self, record: PauseRecord) -> None:
        while True:
            await self.sleep(self.lease / 3)
            renewed = PauseRecord(
                record.owner, record.reason, record.previous, record.since, self.clock() + self.lease
            )
            try:
                await self.kube.patch_node(annotations={RECORD_ANNOTATION: renewed.to_json()})
            except Exception as exc:  # a missed renewal only risks an early takeover; keep trying
                self.log.warning("operands_lease_renew_failed", error=str(exc))

    async def _wait_gone(self, operands: Sequence[Operand], deadline: float, timeout: float) -> float:
        started = time.monotonic()
        last: list[str] = []
        while True:
            pods = await self.kube.list_pods()
            left = pods_in_the_way(pods, operands)
            if not left:
                waited = time.monotonic() - started
                self.log.info("operands_stopped", waited_s=round(waited, 2))
                return waited
            if left != last:
                self.log.info(
                    "operands_waiting", pods=left, remaining_s=round(deadline - time.monotonic(), 1)
                )
                last = left
            if time.monotonic() >= deadline:
                raise OperandsNotStopped(left, timeout)
            await self.sleep(min(self.poll, max(0.0, deadline - time.monotonic())))

    async def _restore_with_retries(self, record: PauseRecord, attempts: int = 12) -> None:
        for attempt in range(1, attempts + 1):
            try:
                await self._restore(record)
                return
            except Exception as exc:
                if attempt == attempts:
                    self.log.error(
                        "operands_restore_failed",
                        error=str(exc),
                        action="the record stays on the node; the next start of an agent restores it",
                    )
                    return
                await self.sleep(min(5.0, 0.5 * attempt))

    async def _restore(self, record: PauseRecord) -> dict[str, str]:
        node = await self.kube.get_node()
        current = _record_of(node)
        if current is None or (current.owner, current.since) != (record.owner, record.since):
            if current is None and RECORD_ANNOTATION not in node.annotations:
                return {}  # already restored (by us before a retry, or by a recovering agent)
            record = current or record
        changes, left = plan_restore(node.labels, record)
        await self.kube.patch_node(labels=dict(changes), annotations={RECORD_ANNOTATION: None})
        if left:
            self.log.warning("operands_left_as_changed", labels=left)
        self.log.info("operands_restored", reason=record.reason, labels=changes)
        return changes


def _record_of(node: NodeInfo) -> PauseRecord | None:
    text = node.annotations.get(RECORD_ANNOTATION)
    return PauseRecord.from_json(text) if text else None

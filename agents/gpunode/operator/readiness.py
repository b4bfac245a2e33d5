"""Whether a DaemonSet is ready, by NVIDIA's rules, and which nodes hold it back.

- zero desired pods is ready (no GPU node yet);
- any unavailable pod is not ready;
- ``RollingUpdate``: the controller has seen the newest generation and updated = available = desired;
- ``OnDelete`` (the driver loader, replaced node by node): every pod carries the newest
  ControllerRevision's hash and is Ready, and there is a pod for every desired node.

Pure: the inputs are the JSON the API server returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "REVISION_HASH_LABEL",
    "DaemonSetView",
    "PodView",
    "Readiness",
    "daemonset_readiness",
    "daemonset_view",
    "newest_revision_hash",
    "pod_view",
]

REVISION_HASH_LABEL = "controller-revision-hash"


@dataclass(frozen=True)
class DaemonSetView:
    name: str
    namespace: str = ""
    generation: int = 0
    observed_generation: int = 0
    strategy: str = "RollingUpdate"
    desired: int = 0
    updated: int = 0
    available: int = 0
    ready: int = 0
    unavailable: int = 0


@dataclass(frozen=True)
class PodView:
    name: str
    node: str
    revision_hash: str
    ready: bool


@dataclass(frozen=True)
class Readiness:
    """One DaemonSet's verdict: the counts for the status, the nodes whose pods hold it back (sorted),
    and why in a few words (``""`` when ready)."""

    ready: bool
    desired: int
    ready_pods: int
    unavailable: int
    nodes: tuple[str, ...] = ()
    message: str = ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def daemonset_view(obj: Mapping[str, Any]) -> DaemonSetView:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    strategy = (spec.get("updateStrategy") or {}).get("type") or "RollingUpdate"
    return DaemonSetView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or ""),
        generation=_int(meta.get("generation")),
        observed_generation=_int(status.get("observedGeneration")),
        strategy=str(strategy),
        desired=_int(status.get("desiredNumberScheduled")),
        updated=_int(status.get("updatedNumberScheduled")),
        available=_int(status.get("numberAvailable")),
        ready=_int(status.get("numberReady")),
        unavailable=_int(status.get("numberUnavailable")),
    )


def _pod_ready(status: Mapping[str, Any]) -> bool:
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    statuses = status.get("containerStatuses") or ()
    if statuses:
        return all(isinstance(s, Mapping) and s.get("ready") is True for s in statuses)
    return status.get("phase") == "Running"  # no conditions reported (a test API server): the phase says


def pod_view(obj: Mapping[str, Any]) -> PodView:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return PodView(
        name=str(meta.get("name", "")),
        node=str((obj.get("spec") or {}).get("nodeName") or ""),
        revision_hash=str(labels.get(REVISION_HASH_LABEL) or ""),
        ready=_pod_ready(obj.get("status") or {}),
    )


def newest_revision_hash(revisions: Iterable[Mapping[str, Any]]) -> str | None:
    """The hash of the ControllerRevision with the highest ``revision`` (its ``controller-revision-hash``
    label, else the suffix of its name after the last ``-``); ``None`` without revisions."""
    best: tuple[int, str] | None = None
    for rev in revisions:
        meta = rev.get("metadata") or {}
        number = _int(rev.get("revision"))
        h = (meta.get("labels") or {}).get(REVISION_HASH_LABEL) or str(meta.get("name", "")).rsplit("-", 1)[
            -1
        ]
        if best is None or number > best[0]:
            best = (number, str(h))
    return None if best is None else best[1]


def _held_back(pods: Sequence[PodView], newest: str | None) -> tuple[str, ...]:
    nodes = {
        p.node or p.name for p in pods if not p.ready or (newest is not None and p.revision_hash != newest)
    }
    return tuple(sorted(nodes))


def daemonset_readiness(
    ds: DaemonSetView, pods: Sequence[PodView] = (), newest_hash: str | None = None
) -> Readiness:
    """The verdict for one DaemonSet given its pods and the newest ControllerRevision's hash (``None``:
    not known, so revisions are not compared)."""

    def verdict(ok: bool, message: str, nodes: tuple[str, ...] = ()) -> Readiness:
        return Readiness(ok, ds.desired, ds.ready, ds.unavailable, () if ok else nodes, "" if ok else message)

    if ds.desired == 0:
        return verdict(True, "")
    held = _held_back(pods, newest_hash)
    if ds.unavailable > 0:
        return verdict(False, f"{ds.unavailable} of {ds.desired} pods unavailable", held)
    if ds.strategy == "OnDelete":
        if newest_hash is None:
            return verdict(False, "no ControllerRevision yet", held)
        stale = [p for p in pods if p.revision_hash != newest_hash]
        unready = [p for p in pods if p.ready is False]
        if stale:
            return verdict(False, f"{len(stale)} of {ds.desired} pods not on the newest revision", held)
        if unready:
            return verdict(False, f"{len(unready)} of {ds.desired} pods not ready", held)
        if len(pods) < ds.desired:
            return verdict(False, f"{len(pods)} of {ds.desired} pods scheduled", held)
        return verdict(True, "")
    if ds.observed_generation != ds.generation:
        return verdict(False, f"generation {ds.generation} not yet observed", held)
    if not ds.updated == ds.available == ds.desired:
        return verdict(
            False, f"{ds.updated} updated and {ds.available} available of {ds.desired} desired pods", held
        )
    return verdict(True, "")

"""Which ClusterPolicy is honoured, and whether an object needs writing.

One policy is active: the oldest ``creationTimestamp``, the name breaking ties (NVIDIA's rule). Every
other one is ``ignored`` (the controller persists that, NVIDIA does not).

Objects carry a content hash annotation of what the operator applied. The hash alone would hide a hand
edit (``kubectl edit`` keeps annotations), so an object is left alone only when the live object also
still holds what the operator manages: its :func:`managed_view` (the live values at exactly the paths
the operator sets: a changed image or env value, a removed label, a list with an entry more or less)
equals the view recorded right after the operator's own write (the ``baseline``: whatever the API
server normalised then is the norm), or, with no such record (a restarted operator), equals the
desired object itself. Fields someone else adds beside the operator's (an env var of their own in an
associative list, an annotation) are theirs, as with any server-side apply. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "HASH_ANNOTATION",
    "MISSING",
    "PolicyRef",
    "active_policy",
    "content_hash",
    "managed_view",
    "needs_write",
    "policy_ref",
    "view_hash",
    "with_hash",
]

HASH_ANNOTATION = "nvidia.com/gpunode.applied-hash"
_EPOCH = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class PolicyRef:
    name: str
    uid: str
    created: datetime


def _parse_time(text: Any) -> datetime:
    if not isinstance(text, str) or not text:
        return _EPOCH  # a policy without a timestamp (not yet persisted) sorts first, by name
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return _EPOCH
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def policy_ref(obj: Mapping[str, Any]) -> PolicyRef:
    meta = obj.get("metadata") or {}
    return PolicyRef(
        str(meta.get("name", "")), str(meta.get("uid") or ""), _parse_time(meta.get("creationTimestamp"))
    )


def active_policy(policies: Iterable[PolicyRef]) -> PolicyRef | None:
    """The honoured policy: the oldest, then the smallest name; ``None`` when there is none."""
    return min(policies, key=lambda p: (p.created, p.name), default=None)


def content_hash(obj: Mapping[str, Any]) -> str:
    """A stable hash of what the operator would apply: canonical JSON of the object without its own hash
    annotation (key order and the annotation itself do not change it)."""
    meta = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != HASH_ANNOTATION}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    body = {**obj, "metadata": meta}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def with_hash(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` carrying its content hash annotation."""
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), HASH_ANNOTATION: content_hash(obj)}
    return {**obj, "metadata": meta}


MISSING = "\x00missing"  # a managed path the live object lacks (no JSON value spells it)


def managed_view(desired: Any, live: Any) -> Any:
    """``live`` restricted to the paths ``desired`` sets: mappings key by key; lists whose entries all
    carry a ``name`` matched by name (containers, env, volumes: server-side apply's associative lists),
    other lists by position with their length when it differs; :data:`MISSING` where ``live`` has
    nothing. Equal to ``desired`` exactly when the live object holds everything ``desired`` says."""
    if live is MISSING:
        return MISSING
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return MISSING
        return {k: managed_view(v, live.get(k, MISSING)) for k, v in desired.items()}
    if isinstance(desired, list):
        if not isinstance(live, list):
            return MISSING
        if desired and all(isinstance(d, Mapping) and "name" in d for d in desired):
            by_name = {e.get("name"): e for e in live if isinstance(e, Mapping)}
            return [managed_view(d, by_name.get(d["name"], MISSING)) for d in desired]
        out = [managed_view(d, live[i] if i < len(live) else MISSING) for i, d in enumerate(desired)]
        return out if len(live) == len(desired) else [*out, {MISSING: len(live)}]
    return live


def view_hash(desired: Mapping[str, Any], live: Mapping[str, Any]) -> str:
    """A hash of :func:`managed_view`: what the controller records as the baseline after its write."""
    text = json.dumps(managed_view(desired, live), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def needs_write(
    desired: Mapping[str, Any], live: Mapping[str, Any] | None, baseline: str | None = None
) -> bool:
    """Whether ``desired`` (as rendered, without its hash) must be applied over ``live``: it is absent,
    carries another hash, or what the operator manages in it changed: its :func:`view_hash` differs from
    ``baseline`` (the view recorded after the operator's last write of this same desired object), or,
    without a baseline, its :func:`managed_view` differs from the object as applied."""
    if live is None:
        return True
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    if annotations.get(HASH_ANNOTATION) != content_hash(desired):
        return True
    applied = with_hash(desired)
    if baseline is not None:
        return view_hash(applied, live) != baseline
    return bool(managed_view(applied, live) != applied)

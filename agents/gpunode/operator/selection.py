"""Which ClusterPolicy is honoured, and whether an object needs writing.

One policy is active: the oldest ``creationTimestamp``, the name breaking ties (NVIDIA's rule). Every
other one is ``ignored`` (the controller persists that, NVIDIA does not). Objects carry a content hash
annotation of what the operator applied; an object whose rendered hash equals the one on the live
object is not written again. Pure.
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
    "PolicyRef",
    "active_policy",
    "content_hash",
    "needs_write",
    "policy_ref",
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


def needs_write(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """True unless the live object carries the hash of ``desired`` (absent: always write)."""
    if live is None:
        return True
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    return annotations.get(HASH_ANNOTATION) != content_hash(desired)

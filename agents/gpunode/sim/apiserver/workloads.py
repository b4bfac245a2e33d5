"""Pure helpers of the miniature DaemonSet controller: scheduling predicates and template hashes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

JsonObj = dict[str, Any]

_HASH_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet the real controller encodes hashes in

# What the real DaemonSet controller adds to every daemon pod's tolerations.
DAEMON_TOLERATIONS: tuple[JsonObj, ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one toleration tolerates one taint (the core/v1 rules)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(pod_spec: Mapping[str, Any], node: Mapping[str, Any], effects: tuple[str, ...]) -> bool:
    """Whether the node has a taint with one of `effects` that the pod spec (plus what the DaemonSet
    controller adds) does not tolerate."""
    tolerations = [t for t in pod_spec.get("tolerations") or [] if isinstance(t, dict)]
    tolerations.extend(DAEMON_TOLERATIONS)
    for taint in (node.get("spec") or {}).get("taints") or []:
        if not isinstance(taint, dict) or taint.get("effect") not in effects:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return True
    return False


def selector_matches(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def should_run(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> tuple[bool, bool]:
    """(should a new daemon pod be placed here, may an existing one keep running here)."""
    if not selector_matches(pod_spec, node):
        return False, False
    place = not untolerated(pod_spec, node, ("NoSchedule", "NoExecute"))
    keep = not untolerated(pod_spec, node, ("NoExecute",))
    return place, keep


def template_hash(template: Any) -> str:
    """A stable short hash of a pod template, in the real controller's alphabet."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    number = int.from_bytes(digest[:8], "big")
    chars = []
    for _ in range(10):
        number, rest = divmod(number, len(_HASH_ALPHABET))
        chars.append(_HASH_ALPHABET[rest])
    return "".join(chars)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, not terminating, and Ready where the pod has a Ready condition."""
    if "deletionTimestamp" in (pod.get("metadata") or {}):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    for condition in status.get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return True

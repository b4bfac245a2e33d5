"""The install's ClusterPolicy, handed to the operator in a ConfigMap, so that one ``kubectl apply`` works.

``gpunode render --operator | kubectl apply -f -`` creates the ClusterPolicy CRD and, in the same apply,
would create the ClusterPolicy itself; but kubectl maps every object to its resource before it creates
any, and the CRD is not established yet, so the policy fails with ``no matches for kind "ClusterPolicy"``.
The install therefore carries the policy in the ConfigMap ``gpunode-operator-clusterpolicy`` (key
``clusterpolicy.json``), and the operator applies it (server-side apply, field manager ``gpunode-render``)
once the CRD serves, recording the content's digest in the annotation ``gpunode.io/install-digest``:

* the policy missing, or its digest not the ConfigMap's (a new render applied): applied, forced, so the
  fields the install sets are the install's again, as ``kubectl apply`` of the policy would make them;
* the same digest: left alone, so ``kubectl edit clusterpolicy`` changes last until the next render with
  a different policy is applied.

A ConfigMap that is not a ClusterPolicy is logged (``clusterpolicy_seed_invalid``) and ignored, and so
is a policy the API server refuses (``clusterpolicy_seed_refused``: invalid for the CRD's schema, or
forbidden); the operator then works with the policies the cluster has. Until the CRD serves, the pass fails
and is retried.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "SEED_ANNOTATION",
    "SEED_FIELD_MANAGER",
    "SEED_KEY",
    "SEED_NAME",
    "SeedError",
    "parse_seed",
    "seed_configmap",
]

SEED_NAME = "gpunode-operator-clusterpolicy"
SEED_KEY = "clusterpolicy.json"
SEED_ANNOTATION = "gpunode.io/install-digest"
SEED_FIELD_MANAGER = "gpunode-render"

Obj = dict[str, Any]


class SeedError(ValueError):
    """The ConfigMap holds no usable ClusterPolicy."""


def seed_configmap(policy: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> Obj:
    """The ConfigMap carrying ``policy`` (the ClusterPolicy object as written) to the operator."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": SEED_NAME, "namespace": namespace, "labels": dict(labels)},
        "data": {SEED_KEY: json.dumps(policy, sort_keys=True, separators=(",", ":"))},
    }


def parse_seed(configmap: Mapping[str, Any]) -> tuple[Obj, str] | None:
    """(the ClusterPolicy to apply, its digest), or None when the ConfigMap carries none; SeedError when
    what it carries is not a ClusterPolicy."""
    text = (configmap.get("data") or {}).get(SEED_KEY)
    if not text:
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than Python's stack
        raise SeedError(f"{SEED_KEY}: not JSON ({type(exc).__name__}: {exc})") from None
    if (
        not isinstance(obj, dict)
        or obj.get("apiVersion") != "nvidia.com/v1"
        or obj.get("kind") != "ClusterPolicy"
    ):
        raise SeedError(f"{SEED_KEY}: not a nvidia.com/v1 ClusterPolicy")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise SeedError(f"{SEED_KEY}: metadata.name is missing")
    digest = hashlib.sha256(str(text).encode()).hexdigest()[:20]
    annotations = meta.get("annotations")
    meta["annotations"] = {**(annotations if isinstance(annotations, dict) else {}), SEED_ANNOTATION: digest}
    return obj, digest

"""The install's ClusterPolicy in a ConfigMap (:mod:`gpunode.operator.seed`): what is a usable one, its
digest, and hostile contents refused with a reason, in bounded time."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gpunode.operator.seed import SEED_ANNOTATION, SEED_KEY, SeedError, parse_seed, seed_configmap

POLICY = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": {}}


def cm(text: str | None) -> dict[str, Any]:
    return {"data": {SEED_KEY: text}} if text is not None else {}


def test_round_trip_with_the_digest_as_annotation_and_user_annotations_kept() -> None:
    policy = {**POLICY, "metadata": {"name": "p", "annotations": {"team": "ml"}}}
    got = parse_seed(seed_configmap(policy, "gpunode", {"app.kubernetes.io/part-of": "gpunode"}))
    assert got is not None
    obj, digest = got
    assert obj["metadata"]["annotations"] == {"team": "ml", SEED_ANNOTATION: digest}
    assert obj["spec"] == {}
    # the digest follows the content
    other = parse_seed(seed_configmap({**POLICY, "spec": {"nfd": {"enabled": False}}}, "gpunode", {}))
    assert other is not None
    assert other[1] != digest


def test_no_data_is_no_policy() -> None:
    assert parse_seed({}) is None
    assert parse_seed(cm("")) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "not JSON"),
        ("[" * 200_000 + "]" * 200_000, "not JSON"),  # nested past Python's recursion limit
        ("[]", "not a nvidia.com/v1 ClusterPolicy"),
        (json.dumps({**POLICY, "kind": "Pod"}), "not a nvidia.com/v1 ClusterPolicy"),
        (json.dumps({**POLICY, "apiVersion": "nvidia.com/v2"}), "not a nvidia.com/v1 ClusterPolicy"),
        (json.dumps({**POLICY, "metadata": {}}), "metadata.name is missing"),
        (json.dumps({**POLICY, "metadata": {"name": 7}}), "metadata.name is missing"),
        (json.dumps({**POLICY, "metadata": []}), "metadata.name is missing"),
    ],
)
def test_what_is_not_a_policy_is_refused_with_the_reason_quickly(text: str, why: str) -> None:
    started = time.monotonic()
    with pytest.raises(SeedError, match=why):
        parse_seed(cm(text))
    assert time.monotonic() - started < 5

"""gpunode.operator.selection: the one honoured policy; content hashes."""

from __future__ import annotations

import pytest

from gpunode.operator.selection import (
    HASH_ANNOTATION,
    active_policy,
    content_hash,
    needs_write,
    policy_ref,
    with_hash,
)


def cp(name: str, created: str | None) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "uid": f"uid-{name}"}
    if created is not None:
        meta["creationTimestamp"] = created
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("policies", "winner"),
    [
        ([], None),
        ([cp("a", "2026-01-02T00:00:00Z")], "a"),
        ([cp("b", "2026-01-02T00:00:00Z"), cp("a", "2026-01-03T00:00:00Z")], "b"),  # oldest wins
        ([cp("b", "2026-01-02T00:00:00Z"), cp("a", "2026-01-02T00:00:00Z")], "a"),  # name breaks ties
        ([cp("z", "2026-01-02T00:00:00+00:00"), cp("y", "2026-01-02T01:00:00+01:00")], "y"),  # same instant
        ([cp("a", "2026-01-02T00:00:00Z"), cp("b", None)], "b"),
    ],
)
def test_active_policy(policies: list[dict[str, object]], winner: str | None) -> None:
    got = active_policy(policy_ref(p) for p in policies)
    assert (got.name if got else None) == winner


OBJ = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "c", "namespace": "n"},
    "data": {"a": "1", "b": "2"},
}


def test_hash_is_stable_and_ignores_key_order_and_itself() -> None:
    reordered = {
        "data": {"b": "2", "a": "1"},
        "metadata": {"namespace": "n", "name": "c"},
        "kind": "ConfigMap",
        "apiVersion": "v1",
    }
    assert content_hash(OBJ) == content_hash(reordered) == content_hash(with_hash(OBJ))
    assert content_hash({**OBJ, "data": {"a": "1"}}) != content_hash(OBJ)
    assert with_hash(OBJ)["metadata"]["annotations"] == {HASH_ANNOTATION: content_hash(OBJ)}
    assert "annotations" not in OBJ["metadata"]


def test_needs_write() -> None:
    live = with_hash(OBJ)
    assert not needs_write(OBJ, live)
    assert needs_write(OBJ, None)
    assert needs_write({**OBJ, "data": {}}, live)
    assert needs_write(OBJ, OBJ)  # live object without our hash

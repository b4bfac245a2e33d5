"""gpunode.operator.selection: the one honoured policy; content hashes."""

from __future__ import annotations

import pytest

from gpunode.operator.selection import (
    HASH_ANNOTATION,
    MISSING,
    active_policy,
    content_hash,
    managed_view,
    needs_write,
    policy_ref,
    view_hash,
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


DS = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "d", "namespace": "n", "labels": {"app": "d"}},
    "spec": {
        "template": {
            "spec": {
                "containers": [
                    {"name": "c", "image": "img:1", "env": [{"name": "A", "value": "1"}]},
                ],
                "tolerations": [{"operator": "Exists"}],
            }
        }
    },
}


def live_of(obj: dict[str, object], **server: object) -> dict[str, object]:
    """``obj`` as an API server stores it after our apply: with the hash and what the server adds."""
    import copy

    stored = copy.deepcopy(with_hash(obj))
    stored["metadata"] = {**stored["metadata"], "uid": "u", "resourceVersion": "7", "generation": 1}
    stored["status"] = {"numberReady": 1}
    stored.update(server)
    return stored


def edited(obj: dict[str, object], edit: str) -> dict[str, object]:
    import copy

    out = copy.deepcopy(obj)
    meta = out["metadata"]
    pod = out["spec"]["template"]["spec"]
    container = pod["containers"][0]
    if edit == "image":
        container["image"] = "img:evil"
    elif edit == "env value":
        container["env"][0]["value"] = "2"
    elif edit == "env removed":
        container["env"] = []
    elif edit == "label removed":
        meta["labels"] = {}
    elif edit == "toleration added":
        pod["tolerations"].append({"key": "x", "operator": "Exists"})
    elif edit == "container removed":
        pod["containers"] = []
    elif edit == "own env added":  # someone else's entry beside ours: theirs
        container["env"].append({"name": "B", "value": "2"})
    elif edit == "defaulted":  # what an API server fills in
        container["imagePullPolicy"] = "IfNotPresent"
        container["terminationMessagePath"] = "/dev/termination-log"
        pod["restartPolicy"] = "Always"
        meta["annotations"]["deprecated.daemonset.template.generation"] = "1"
    else:
        raise AssertionError(edit)
    return out


@pytest.mark.parametrize(
    ("edit", "drift"),
    [
        ("image", True),
        ("env value", True),
        ("env removed", True),
        ("label removed", True),
        ("toleration added", True),
        ("container removed", True),
        ("own env added", False),
        ("defaulted", False),
    ],
)
def test_a_hand_edit_of_what_the_operator_manages_needs_a_write(edit: str, drift: bool) -> None:
    live = live_of(DS)
    assert not needs_write(DS, live)  # as applied
    baseline = view_hash(with_hash(DS), live)
    after = edited(live, edit)
    assert needs_write(DS, after) is drift  # a restarted operator (no baseline)
    assert needs_write(DS, after, baseline) is drift
    assert (managed_view(with_hash(DS), after) == with_hash(DS)) is not drift


def test_a_value_the_server_normalised_is_written_once_not_forever() -> None:
    desired = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"cpu": "1000m"}}
    stored = live_of(desired)
    stored["data"] = {"cpu": "1"}  # the server's canonical form
    assert needs_write(desired, stored)  # without a record: differs from what we applied
    baseline = view_hash(with_hash(desired), stored)  # recorded after our write
    assert not needs_write(desired, stored, baseline)
    stored["data"] = {"cpu": "2"}
    assert needs_write(desired, stored, baseline)


def test_managed_view_marks_what_is_missing() -> None:
    desired = {"a": {"b": 1}, "l": [1, 2], "n": [{"name": "x", "v": 1}]}
    assert (
        managed_view(desired, {"a": {"b": 1, "c": 2}, "l": [1, 2], "n": [{"name": "x", "v": 1}]}) == desired
    )
    view = managed_view(desired, {"a": "flat", "l": [1], "n": []})
    assert view["a"] == MISSING
    assert view["l"] == [1, MISSING, {MISSING: 1}]
    assert view["n"] == [MISSING]

"""gpunode.sim.apiserver: the miniature DaemonSet controller keeps per-node counts, so a node write
examines that node only (counted, not timed), and the counts it keeps always equal a recount from scratch
through every kind of write: labels, taints, pod readiness, deletions, a rollout, nodes going away."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

import gpunode.sim.apiserver.server as server_module
from gpunode.sim.apiserver import FakeApiServer
from gpunode.sim.apiserver.workloads import pod_ready, should_run

NAMESPACE = "gpu"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def daemonset(name: str, selector: dict[str, str], max_unavailable: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"nodeSelector": selector, "containers": [{"name": "c", "image": "a:1"}]},
            },
        },
    }


def recount(api: FakeApiServer, name: str) -> dict[str, int]:
    """The DaemonSet's status computed from scratch, the way the real controller defines it."""
    ds = api.get("daemonsets", name, NAMESPACE)
    assert ds is not None
    uid = ds["metadata"]["uid"]
    revision = ds["metadata"].get("generation")
    pod_spec = ds["spec"]["template"]["spec"]
    current = {
        r["metadata"]["labels"]["controller-revision-hash"]
        for r in api.objects("controllerrevisions", NAMESPACE)
        if r["metadata"]["ownerReferences"][0]["uid"] == uid and r["revision"] == max_revision(api, uid)
    }
    desired = scheduled = ready = updated = misscheduled = 0
    for node in api.objects("nodes"):
        live = [
            p
            for p in api.pods(node["metadata"]["name"])
            if any(r["uid"] == uid for r in p["metadata"].get("ownerReferences") or [])
            and "deletionTimestamp" not in p["metadata"]
        ]
        place, keep = should_run(pod_spec, node)
        if place or (keep and live):
            desired += 1
            scheduled += bool(live)
            ready += any(pod_ready(p) for p in live)
            updated += any(p["metadata"]["labels"]["controller-revision-hash"] in current for p in live)
        elif live:
            misscheduled += 1
    status = {
        "currentNumberScheduled": scheduled,
        "desiredNumberScheduled": desired,
        "numberAvailable": ready,
        "numberMisscheduled": misscheduled,
        "numberReady": ready,
        "observedGeneration": revision,
        "updatedNumberScheduled": updated,
    }
    if desired > ready:
        status["numberUnavailable"] = desired - ready
    return status


def max_revision(api: FakeApiServer, uid: str) -> int:
    return max(
        r["revision"]
        for r in api.objects("controllerrevisions", NAMESPACE)
        if r["metadata"]["ownerReferences"][0]["uid"] == uid
    )


def test_a_node_write_examines_that_node_only(api: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def counting(pod_spec: Any, node: Any) -> tuple[bool, bool]:
        nonlocal calls
        calls += 1
        return should_run(pod_spec, node)

    monkeypatch.setattr(server_module, "should_run", counting)
    for k in range(3):
        api.create("daemonsets", daemonset(f"ds{k}", {"gpu": "true"}))
    per_write = []
    for size in (20, 80):
        for i in range(len(api.objects("nodes")), size):
            api.add_node(f"n{i:03d}", labels={"gpu": "true"})
        calls = 0
        api.patch_node(f"n{size - 1:03d}", {"metadata": {"labels": {"extra": "x"}}})
        per_write.append(calls)
        assert len(api.pods()) == 3 * size
    assert per_write[0] == per_write[1]  # independent of the cluster's size
    assert 0 < per_write[0] <= 3 * 4  # a few looks per DaemonSet at the one node
    # a template change still reaches every node
    api.patch(
        "daemonsets",
        "ds0",
        {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "a:2"}]}}}},
        NAMESPACE,
    )
    assert {
        p["spec"]["containers"][0]["image"] for p in api.pods() if p["metadata"]["name"].startswith("ds0")
    } == {"a:2"}


def test_kept_counts_equal_a_recount_through_every_kind_of_write(api: FakeApiServer) -> None:
    rng = random.Random(15)
    api.daemon_pod_phase = "Pending"  # pods wait for readiness: rollouts take several steps
    for i in range(12):
        api.add_node(f"n{i:02d}", labels={"gpu": "true"} if i % 3 else {})
    api.create("daemonsets", daemonset("a", {"gpu": "true"}, max_unavailable=2))
    api.create("daemonsets", daemonset("b", {}))

    def check() -> None:
        for name in ("a", "b"):
            ds = api.get("daemonsets", name, NAMESPACE)
            assert ds is not None
            assert ds["status"] == recount(api, name), name

    def ready_some() -> None:
        for listed in api.pods():
            pod = api.get("pods", listed["metadata"]["name"], NAMESPACE)  # a rollout may have replaced it
            if pod is not None and "deletionTimestamp" not in pod["metadata"] and rng.random() < 0.5:
                api.patch("pods", pod["metadata"]["name"], {"status": {"phase": "Running"}}, NAMESPACE)

    check()
    for step in range(40):
        node = f"n{rng.randrange(12):02d}"
        action = rng.choice(["label", "unlabel", "taint", "untaint", "ready", "delete-pod", "rollout"])
        if api.get("nodes", node) is None:
            api.add_node(node, labels={"gpu": "true"})
        elif action == "label":
            api.patch_node(node, {"metadata": {"labels": {"gpu": "true"}}})
        elif action == "unlabel":
            api.patch_node(node, {"metadata": {"labels": {"gpu": None}}})
        elif action == "taint":
            api.patch_node(node, {"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}})
        elif action == "untaint":
            api.patch_node(node, {"spec": {"taints": None}})
        elif action == "ready":
            ready_some()
        elif action == "delete-pod" and api.pods(node):
            api.delete("pods", api.pods(node)[0]["metadata"]["name"], NAMESPACE)
        elif action == "rollout":
            image = f"a:{step}"
            api.patch(
                "daemonsets",
                rng.choice(["a", "b"]),
                {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}},
                NAMESPACE,
            )
        if step == 30:
            api.delete("nodes", node)
        check()
    # once every pod is ready, the rollouts finish: every wanted node runs the current template
    for _ in range(30):
        ready_some()
        check()
    for name in ("a", "b"):
        status = recount(api, name)
        assert status["updatedNumberScheduled"] == status["desiredNumberScheduled"] == status["numberReady"]

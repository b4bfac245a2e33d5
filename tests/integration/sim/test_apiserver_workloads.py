"""gpunode.sim.apiserver: DaemonSets through the API (placement by node selector and taints, status,
ControllerRevisions, rolling updates) and garbage collection through ownerReferences."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpunode.sim.apiserver import FakeApiServer

DS = "/apis/apps/v1/namespaces/gpu/daemonsets"
MERGE = "application/merge-patch+json"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def call(
    api: FakeApiServer, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        headers = {"User-Agent": "operator/0.1"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def daemonset(image: str = "a:1", tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {"gpu": "true"},
        "containers": [{"name": "c", "image": image}],
    }
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "dp"},
        "spec": {
            "selector": {"matchLabels": {"app": "dp"}},
            "template": {"metadata": {"labels": {"app": "dp"}}, "spec": spec},
        },
    }


def status_of(api: FakeApiServer) -> dict[str, Any]:
    ds = api.get("daemonsets", "dp", "gpu")
    assert ds is not None
    return dict(ds["status"])


def test_daemonset_placement_taints_and_status(api: FakeApiServer) -> None:
    api.add_node("n1", {"gpu": "true"})
    api.add_node("n2", {"gpu": "true"})
    api.add_node("n3", {})
    api.patch_node("n2", {"spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}})
    status, created = call(api, "POST", DS, daemonset())
    assert (status, created["metadata"]["generation"]) == (201, 1)
    assert [p["spec"]["nodeName"] for p in api.pods()] == ["n1"]
    pod = api.pods()[0]
    assert pod["spec"]["containers"] == [{"name": "c", "image": "a:1"}]
    labels = pod["metadata"]["labels"]
    assert (labels["app"], labels["pod-template-generation"]) == ("dp", "1")
    assert status_of(api) == {
        "currentNumberScheduled": 1,
        "desiredNumberScheduled": 1,
        "numberAvailable": 1,
        "numberMisscheduled": 0,
        "numberReady": 1,
        "observedGeneration": 1,
        "updatedNumberScheduled": 1,
    }
    (revision,) = api.objects("controllerrevisions", "gpu")
    assert revision["metadata"]["name"] == f"dp-{labels['controller-revision-hash']}"
    assert (revision["revision"], revision["metadata"]["ownerReferences"][0]["kind"]) == (1, "DaemonSet")

    # a toleration for the taint places the second pod; the template change rolls the first one
    status, _ = call(
        api,
        "PATCH",
        f"{DS}/dp",
        {"spec": {"template": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}}},
        content_type=MERGE,
    )
    assert status == 200
    assert sorted(p["spec"]["nodeName"] for p in api.pods()) == ["n1", "n2"]
    assert len({p["metadata"]["labels"]["controller-revision-hash"] for p in api.pods()}) == 1
    assert api.pods("n1")[0]["metadata"]["name"] != pod["metadata"]["name"]  # replaced
    st = status_of(api)
    assert (st["desiredNumberScheduled"], st["updatedNumberScheduled"], st["observedGeneration"]) == (2, 2, 2)
    assert sorted(r["revision"] for r in api.objects("controllerrevisions", "gpu")) == [1, 2]

    # an untolerated NoExecute taint evicts; a NoSchedule one does not
    api.patch_node("n1", {"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}})
    assert [p["spec"]["nodeName"] for p in api.pods()] == ["n2"]
    assert status_of(api)["desiredNumberScheduled"] == 1
    # a pod not ready shows in the counts
    name = api.pods("n2")[0]["metadata"]["name"]
    api.patch("pods", name, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, "gpu")
    st = status_of(api)
    assert (st["numberReady"], st["numberAvailable"], st["numberUnavailable"]) == (0, 0, 1)


def test_daemonset_status_is_the_controllers(api: FakeApiServer) -> None:
    api.add_node("n1", {"gpu": "true"})
    created = call(api, "POST", DS, {**daemonset(), "status": {"numberReady": 5}})[1]
    assert "numberReady" not in created.get("status", {})
    assert status_of(api)["numberReady"] == 1
    status, got = call(api, "GET", f"{DS}/dp/status")
    assert (status, got["status"]["numberReady"]) == (200, 1)
    status, listed = call(api, "GET", "/apis/apps/v1/daemonsets")
    assert (status, [d["metadata"]["name"] for d in listed["items"]]) == (200, ["dp"])


def test_on_delete_strategy_keeps_old_pods(api: FakeApiServer) -> None:
    api.add_node("n1", {"gpu": "true"})
    ds = daemonset()
    ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
    call(api, "POST", DS, ds)
    old = api.pods()[0]["metadata"]["name"]
    call(
        api,
        "PATCH",
        f"{DS}/dp",
        {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "a:2"}]}}}},
        content_type=MERGE,
    )
    assert [p["metadata"]["name"] for p in api.pods()] == [old]
    assert status_of(api)["updatedNumberScheduled"] == 0
    api.delete("pods", old, "gpu")
    assert api.pods()[0]["spec"]["containers"][0]["image"] == "a:2"
    assert status_of(api)["updatedNumberScheduled"] == 1


def test_garbage_collection(api: FakeApiServer) -> None:
    api.pod_deletion_delay = 0.1
    api.add_node("n1", {"gpu": "true"})
    call(api, "POST", DS, daemonset())
    assert len(api.pods()) == 1
    assert len(api.objects("controllerrevisions")) == 1
    status, _ = call(api, "DELETE", f"{DS}/dp")
    assert status == 200
    assert api.objects("controllerrevisions") == []  # collected at once
    assert "deletionTimestamp" in api.pods()[0]["metadata"]  # a pod honours its deletion delay
    assert api.wait_for(lambda: api.pods() == [], timeout=3)
    assert api.gc_deletions == 2

    # a dependent with another live owner only loses the dangling reference; Orphan strips it
    owner_a = api.create("configmaps", {"metadata": {"name": "a", "namespace": "gpu"}})
    owner_b = api.create("configmaps", {"metadata": {"name": "b", "namespace": "gpu"}})

    def ref(owner: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
        }

    api.create(
        "configmaps",
        {"metadata": {"name": "dep", "namespace": "gpu", "ownerReferences": [ref(owner_a), ref(owner_b)]}},
    )
    api.create(
        "configmaps", {"metadata": {"name": "only-a", "namespace": "gpu", "ownerReferences": [ref(owner_a)]}}
    )
    api.delete("configmaps", "a", "gpu")
    assert api.get("configmaps", "only-a", "gpu") is None
    dep = api.get("configmaps", "dep", "gpu")
    assert dep is not None
    assert [r["name"] for r in dep["metadata"]["ownerReferences"]] == ["b"]
    status, _ = call(api, "DELETE", "/api/v1/namespaces/gpu/configmaps/b", {"propagationPolicy": "Orphan"})
    assert status == 200
    dep = api.get("configmaps", "dep", "gpu")
    assert dep is not None
    assert "ownerReferences" not in dep["metadata"]

    # deleting a namespace deletes what is in it
    api.create("namespaces", {"metadata": {"name": "gpu"}})
    api.delete("namespaces", "gpu")
    assert api.objects("configmaps") == []


def test_pending_daemon_pods_and_deployment_status(api: FakeApiServer) -> None:
    api.daemon_pod_phase = "Pending"
    api.add_node("n1", {"gpu": "true"})
    call(api, "POST", DS, daemonset())
    (pod,) = api.pods()
    assert pod["status"]["phase"] == "Pending"
    assert (status_of(api)["numberReady"], status_of(api)["numberUnavailable"]) == (0, 1)
    api.patch("pods", pod["metadata"]["name"], {"status": {"phase": "Running"}}, "gpu")
    assert status_of(api)["numberReady"] == 1
    assert "numberUnavailable" not in status_of(api)

    deployment = {"metadata": {"name": "nfd-master"}, "spec": {"replicas": 2}}
    status, _ = call(api, "POST", "/apis/apps/v1/namespaces/gpu/deployments", deployment)
    assert status == 201
    got = api.get("deployments", "nfd-master", "gpu")
    assert got is not None
    assert (got["status"]["availableReplicas"], got["status"]["observedGeneration"]) == (2, 1)
    assert got["status"]["conditions"][0]["type"] == "Available"

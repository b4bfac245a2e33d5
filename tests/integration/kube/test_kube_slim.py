"""gpunode.kube.client keeps what a cluster-wide cache holds small: node summaries share their label
strings across nodes, lists are read a page at a time, and a DaemonSet's pods come back slim (what
readiness reads, not the pod spec) - against the test API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpunode.kube.client import NODE_PAGE, POD_PAGE, Kube
from gpunode.sim.apiserver import FakeApiServer

NFD = "feature.node.kubernetes.io/pci-10de.present"


def cluster(kubeconfig: Path) -> Kube:
    return Kube.connect_cluster(str(kubeconfig), namespace="gpunode", backoff=(0.01, 0.05))


async def test_node_summaries_share_label_strings_and_lists_are_paged(
    api: FakeApiServer, tmp_path: Path
) -> None:
    for i in range(NODE_PAGE + 5):
        api.add_node(f"gpu-{i:03d}", labels={NFD: "true", "zone": f"z{i % 2}"}, annotations={"a": "b"})
    kube = cluster(tmp_path / "kubeconfig")
    before = len(api.requests)
    try:
        nodes, _ = await kube.list_nodes()
        watch = kube.watch_nodes()
        first = await anext(watch)
        await watch.aclose()
    finally:
        await kube.aclose()
    gpu = [n for n in nodes if n.name.startswith("gpu-")]
    assert len(gpu) == NODE_PAGE + 5
    keys = [next(k for k in n.labels if k == NFD) for n in gpu]
    values = [n.labels[NFD] for n in gpu]
    assert all(k is keys[0] for k in keys)
    assert all(v is values[0] for v in values)
    assert all(next(iter(n.annotations)) is next(iter(gpu[0].annotations)) for n in gpu)
    assert first.type == "SYNC"
    assert len(first.nodes) == len(nodes)
    lists = [r for r in api.requests[before:] if r.method == "GET" and r.path == "/api/v1/nodes"]
    lists = [r for r in lists if r.query.get("watch") not in ("true", "1")]
    assert len(lists) == 4  # two lists (list_nodes, the watch's), two pages each
    assert {r.query.get("limit") for r in lists} == {str(NODE_PAGE)}


async def test_daemonset_pods_come_back_slim(api: FakeApiServer, tmp_path: Path) -> None:
    for i in range(3):
        api.add_node(f"gpu-{i}", labels={"gpu": "true"})
    api.create("namespaces", {"metadata": {"name": "gpunode"}})
    labels = {"app": "plugin"}
    container = {
        "name": "c",
        "image": "i",
        "env": [{"name": f"E{k}", "value": "x" * 100} for k in range(20)],
        "volumeMounts": [{"name": "v", "mountPath": "/v"}],
    }
    ds: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "plugin", "namespace": "gpunode"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": {"gpu": "true"}, "containers": [container]},
            },
        },
    }
    api.create("daemonsets", ds)
    # a pod with the same labels that the DaemonSet does not control is left out
    api.add_pod("gpunode", "stray", node="gpu-0", labels=labels)
    (pod,) = api.pods("gpu-1")[:1]
    api.patch(
        "pods",
        pod["metadata"]["name"],
        {
            "status": {
                "conditions": [{"type": "Ready", "status": "False", "reason": "x", "message": "long"}],
                "containerStatuses": [{"name": "c", "ready": False, "image": "i", "restartCount": 3}],
            }
        },
        "gpunode",
    )
    kube = cluster(tmp_path / "kubeconfig")
    before = len(api.requests)
    try:
        found = await kube.daemonset_rollout("plugin")
    finally:
        await kube.aclose()
    assert found is not None
    _, pods, revisions = found
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["gpu-0", "gpu-1", "gpu-2"]
    assert all(set(p) == {"metadata", "spec", "status"} and set(p["spec"]) == {"nodeName"} for p in pods)
    by_node = {p["spec"]["nodeName"]: p for p in pods}
    meta = by_node["gpu-1"]["metadata"]
    assert set(meta) == {"name", "namespace", "uid", "labels", "ownerReferences"}
    assert (
        meta["labels"]["controller-revision-hash"]
        == revisions[0]["metadata"]["labels"]["controller-revision-hash"]
    )
    assert meta["ownerReferences"][0]["kind"] == "DaemonSet"
    assert meta["ownerReferences"][0]["controller"]
    assert by_node["gpu-1"]["status"] == {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "c", "ready": False}],
    }
    assert by_node["gpu-0"]["status"] == {"phase": "Running"}
    pod_lists = [r for r in api.requests[before:] if r.path == "/api/v1/namespaces/gpunode/pods"]
    assert [(r.query.get("limit"), r.query.get("labelSelector")) for r in pod_lists] == [
        (str(POD_PAGE), "app=plugin")
    ]

"""gpunode.kube.client's cluster-wide node calls over real HTTP: list, read, watch and merge-patch any
node as a slim NodeSummary (what the operator's node labelling caches)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gpunode.kube.api import KubeConflict, KubeForbidden, KubeNotFound
from gpunode.kube.client import Kube, load_kubeconfig
from gpunode.kube.cluster import NodeEvent, NodeSummary
from gpunode.sim.apiserver import FakeApiServer

NODE = "node-1"  # the test API server's node (conftest.py)
TEST_KEY = "test.gpunode.io/cluster-nodes"
Target = Any  # conftest.Target: kubeconfig, node, namespace, api (None on a real cluster)


def client(kubeconfig: Path, **kw: object) -> Kube:
    kw.setdefault("backoff", (0.01, 0.05))
    return Kube("gpunode-operator", load_kubeconfig(str(kubeconfig)), **kw)  # type: ignore[arg-type]


async def next_event(
    watch: AsyncIterator[NodeEvent], pred: Callable[[NodeEvent], bool], timeout: float = 5.0
) -> NodeEvent:
    async with asyncio.timeout(timeout):
        async for event in watch:
            if pred(event):
                return event
    raise AssertionError("watch ended")


def patches(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH")


# -- against the test API server and, when configured, a real cluster -------------------------------------
@pytest.mark.cluster
async def test_list_then_patch_any_node_by_name(target: Target) -> None:
    kube = client(target.kubeconfig)
    try:
        nodes, version = await kube.list_nodes()
        assert version
        mine = next(n for n in nodes if n.name == target.node)
        assert isinstance(mine, NodeSummary)
        changed = await kube.patch_node_labels(
            target.node,
            labels={TEST_KEY: "a"},
            annotations={TEST_KEY: "note"},
            resource_version=mine.resource_version,
        )
        assert changed.labels[TEST_KEY] == "a"
        assert changed.annotations[TEST_KEY] == "note"
        read = await kube.read_node(target.node)
        assert read.labels[TEST_KEY] == "a"
        assert read.resource_version == changed.resource_version
    finally:
        await kube.patch_node_labels(target.node, labels={TEST_KEY: None}, annotations={TEST_KEY: None})
        await kube.aclose()


# -- the test API server only ------------------------------------------------------------------------------
async def test_summaries_carry_labels_annotations_cordon_and_readiness(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.add_node(
        "gpu-1", labels={"feature.node.kubernetes.io/pci-10de.present": "true"}, annotations={"a": "b"}
    )
    api.add_node("gpu-2")
    api.patch_node("gpu-2", {"spec": {"unschedulable": True}})
    api.patch_node("gpu-2", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    kube = client(tmp_path / "kubeconfig")
    try:
        nodes, version = await kube.list_nodes(chunk_size=2)
        by_name = {n.name: n for n in nodes}
        assert sorted(by_name) == ["gpu-1", "gpu-2", NODE]
        assert by_name["gpu-1"].labels == {"feature.node.kubernetes.io/pci-10de.present": "true"}
        assert by_name["gpu-1"].annotations == {"a": "b"}
        assert by_name["gpu-1"].ready is True
        assert by_name["gpu-1"].unschedulable is False
        assert by_name["gpu-2"].ready is False
        assert by_name["gpu-2"].unschedulable is True
        assert int(version) >= max(int(n.resource_version) for n in nodes)
        selected, _ = await kube.list_nodes(labels={"feature.node.kubernetes.io/pci-10de.present": "true"})
        assert [n.name for n in selected] == ["gpu-1"]
    finally:
        await kube.aclose()


async def test_patch_with_a_stale_version_conflicts_and_changes_nothing(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.add_node("gpu-1")
    kube = client(tmp_path / "kubeconfig")
    try:
        seen = await kube.read_node("gpu-1")
        api.patch_node("gpu-1", {"metadata": {"labels": {"someone": "else"}}})
        with pytest.raises(KubeConflict):
            await kube.patch_node_labels(
                "gpu-1", labels={"mine": "1"}, resource_version=seen.resource_version
            )
        assert "mine" not in api.node("gpu-1")["metadata"]["labels"]
        fresh = await kube.read_node("gpu-1")
        done = await kube.patch_node_labels(
            "gpu-1", labels={"mine": "1"}, resource_version=fresh.resource_version
        )
        assert done.labels == {"someone": "else", "mine": "1"}
        removed = await kube.patch_node_labels("gpu-1", labels={"mine": None})
        assert "mine" not in removed.labels
    finally:
        await kube.aclose()


async def test_nothing_to_patch_reads_instead_of_writing(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    try:
        before = patches(api)
        node = await kube.patch_node_labels(NODE, labels={}, annotations=None)
        assert node.name == NODE
        assert patches(api) == before
    finally:
        await kube.aclose()


async def test_missing_node_is_not_found(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    try:
        with pytest.raises(KubeNotFound):
            await kube.read_node("no-such-node")
        with pytest.raises(KubeNotFound):
            await kube.patch_node_labels("no-such-node", labels={"a": "b"})
    finally:
        await kube.aclose()


async def test_forbidden_list_and_patch_name_what_to_grant(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    try:
        api.forbid("patch", "nodes")
        with pytest.raises(KubeForbidden) as info:
            await kube.patch_node_labels(NODE, labels={"a": "b"})
        assert '"patch" on resource "nodes"' in str(info.value)
        api.forbid("list", "nodes")
        watch = kube.watch_nodes()
        with pytest.raises(KubeForbidden) as info:
            await anext(watch)
        assert '"list" on resource "nodes"' in str(info.value)
        assert kube.available is True  # it answered: not an outage
    finally:
        await kube.aclose()


async def test_watch_syncs_then_gives_every_change(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    watch = kube.watch_nodes()
    try:
        sync = await next_event(watch, lambda e: True)
        assert sync.type == "SYNC"
        assert [n.name for n in sync.nodes] == [NODE]
        api.add_node("gpu-1")
        added = await next_event(watch, lambda e: True)
        assert (added.type, added.node and added.node.name) == ("ADDED", "gpu-1")
        api.patch_node("gpu-1", {"metadata": {"labels": {"step": "1"}}})
        changed = await next_event(watch, lambda e: True)
        assert changed.type == "MODIFIED"
        assert changed.node is not None
        assert changed.node.labels == {"step": "1"}
        api.delete("Node", "gpu-1")
        gone = await next_event(watch, lambda e: True)
        assert (gone.type, gone.node and gone.node.name) == ("DELETED", "gpu-1")
    finally:
        await watch.aclose()  # type: ignore[attr-defined]
        await kube.aclose()


async def test_watch_resumes_after_a_drop_and_relists_on_410(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    watch = kube.watch_nodes()
    try:
        await next_event(watch, lambda e: e.type == "SYNC")
        api.drop_watches()
        api.patch_node(NODE, {"metadata": {"labels": {"step": "1"}}})  # while no watch is open
        resumed = await next_event(watch, lambda e: True)
        assert resumed.type == "MODIFIED"  # resumed from the version seen, not listed again
        api.stall_watches(True)
        api.add_node("gpu-1")
        api.compact()  # the version the watch holds is now too old
        api.drop_watches()
        api.stall_watches(False)
        relisted = await next_event(watch, lambda e: e.type == "SYNC")
        assert sorted(n.name for n in relisted.nodes) == ["gpu-1", NODE]
    finally:
        api.stall_watches(False)
        await watch.aclose()  # type: ignore[attr-defined]
        await kube.aclose()

"""gpunode.kube.client over real HTTP: the own node, its watch, pods, NodeFeatures, retries and errors."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.kube.api import KubeConflict, KubeForbidden, KubeNotFound, KubeUnavailable, NodeInfo
from gpunode.kube.client import Kube, load_kubeconfig
from gpunode.sim.apiserver import FakeApiServer
from helpers.waiting import wait_until

NODE = "node-1"  # the test API server's node (conftest.py)
TEST_KEY = "test.gpunode.io/kube-client"
Target = Any  # conftest.Target: kubeconfig, node, namespace, api (None on a real cluster)


def client(kubeconfig: Path, node: str = NODE, **kw: object) -> Kube:
    kw.setdefault("backoff", (0.01, 0.05))
    return Kube(node, load_kubeconfig(str(kubeconfig)), **kw)  # type: ignore[arg-type]


async def next_matching(watch: AsyncIterator[NodeInfo], pred: object, timeout: float = 5.0) -> NodeInfo:
    async with asyncio.timeout(timeout):
        async for node in watch:
            if pred(node):  # type: ignore[operator]
                return node
    raise AssertionError("watch ended")


# -- against the test API server and, when configured, a real cluster -------------------------------------
@pytest.mark.cluster
async def test_get_and_merge_patch_labels_and_annotations(target: Target) -> None:
    kube = client(target.kubeconfig, target.node)
    try:
        node = await kube.patch_node(labels={TEST_KEY: "a"}, annotations={TEST_KEY: "note"})
        assert node.labels[TEST_KEY] == "a"
        assert node.annotations[TEST_KEY] == "note"
        assert (await kube.get_node()).labels[TEST_KEY] == "a"
        node = await kube.patch_node(labels={TEST_KEY: None}, annotations={TEST_KEY: None})
        assert TEST_KEY not in node.labels
        assert TEST_KEY not in node.annotations
        assert kube.available is True
    finally:
        await kube.patch_node(labels={TEST_KEY: None}, annotations={TEST_KEY: None})
        await kube.aclose()


@pytest.mark.cluster
async def test_watch_gives_the_node_then_every_change(target: Target) -> None:
    watcher, writer = client(target.kubeconfig, target.node), client(target.kubeconfig, target.node)
    watch = watcher.watch_node()
    try:
        first = await next_matching(watch, lambda n: True)
        assert first.name == target.node
        await writer.patch_node(labels={TEST_KEY: "1"})
        changed = await next_matching(watch, lambda n: n.labels.get(TEST_KEY) == "1")
        assert int(changed.resource_version) > int(first.resource_version)
    finally:
        await watch.aclose()  # type: ignore[attr-defined]
        await writer.patch_node(labels={TEST_KEY: None})
        await watcher.aclose()
        await writer.aclose()


@pytest.mark.cluster
async def test_node_feature_created_then_updated_only_on_change(target: Target) -> None:
    kube = client(target.kubeconfig, target.node, namespace=target.namespace)
    name = "gpunode-test-features"
    meta = {"nfd.node.kubernetes.io/node-name": target.node}
    try:
        assert (
            await kube.put_node_feature(target.namespace, name, labels={"a": "1"}, object_labels=meta)
            == "created"
        )
        before = await kube.get_node_feature(target.namespace, name)
        assert before is not None
        again = await kube.put_node_feature(target.namespace, name, labels={"a": "1"}, object_labels=meta)
        assert again == "unchanged"
        after = await kube.get_node_feature(target.namespace, name)
        assert after is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # no churn
        changed = await kube.put_node_feature(target.namespace, name, labels={"a": "2"}, object_labels=meta)
        assert changed == "updated"
        now = await kube.get_node_feature(target.namespace, name)
        assert now is not None
        assert now["spec"]["labels"] == {"a": "2"}
        assert now["metadata"]["labels"]["nfd.node.kubernetes.io/node-name"] == target.node
    finally:
        if target.api is not None:
            target.api.delete("nodefeatures", name, target.namespace)
        await kube.aclose()


# -- the test API server only: faults and things not to do to a real node ---------------------------------
async def test_watch_resumes_from_the_last_version_after_a_drop(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    watch = kube.watch_node()
    try:
        await next_matching(watch, lambda n: True)
        api.patch_node(NODE, {"metadata": {"labels": {"step": "1"}}})
        one = await next_matching(watch, lambda n: n.labels.get("step") == "1")
        gets_before = sum(1 for r in api.requests if r.method == "GET" and r.query.get("watch") is None)
        api.drop_watches()
        api.patch_node(NODE, {"metadata": {"labels": {"step": "2"}}})  # made while no watch is open
        await next_matching(watch, lambda n: n.labels.get("step") == "2")
        rewatch = [r for r in api.requests if r.query.get("watch") in ("true", "1")][-1]
        assert int(rewatch.query["resourceVersion"]) >= int(one.resource_version)
        gets_after = sum(1 for r in api.requests if r.method == "GET" and r.query.get("watch") is None)
        assert gets_after == gets_before  # resumed, not relisted
    finally:
        await watch.aclose()  # type: ignore[attr-defined]
        await kube.aclose()


async def test_watch_relists_on_410_gone(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    watch = kube.watch_node()
    try:
        await next_matching(watch, lambda n: True)
        api.stall_watches(True)
        api.patch_node(NODE, {"metadata": {"labels": {"while": "away"}}})
        api.compact()  # the version the watch holds is now too old
        api.drop_watches()
        api.stall_watches(False)
        node = await next_matching(watch, lambda n: n.labels.get("while") == "away")
        assert node.labels["while"] == "away"
    finally:
        await watch.aclose()  # type: ignore[attr-defined]
        await kube.aclose()


async def test_a_stalled_watch_is_abandoned_and_resumed(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    watch = kube.watch_node(idle_timeout=0.5)
    change: asyncio.Task[NodeInfo] | None = None
    try:
        await next_matching(watch, lambda n: True)  # the node as read; the watch opens on the next read
        before = api.watches_opened
        change = asyncio.create_task(next_matching(watch, lambda n: n.labels.get("stalled") == "yes"))
        await asyncio.to_thread(wait_until, lambda: api.watches_opened > before, 4.0, 0.02)
        api.stall_watches(True)
        api.patch_node(NODE, {"metadata": {"labels": {"stalled": "yes"}}})
        opened = api.watches_opened
        # The stream stays silent: past the idle timeout the client must give it up and open a new watch.
        # Unstalling only after that new request reached the server shows the change did not come over
        # the old stream.
        await asyncio.to_thread(wait_until, lambda: api.watches_opened > opened, 4.0, 0.02)
        assert api.watches_opened > opened  # a second watch request reached the server
        api.stall_watches(False)
        await change
    finally:
        api.stall_watches(False)
        if change is not None and not change.done():
            change.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await change
        await watch.aclose()  # type: ignore[attr-defined]
        await kube.aclose()


async def test_server_errors_are_retried(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig", attempts=4)
    try:
        api.fail_next(2, status=500)
        assert (await kube.get_node()).name == NODE
        api.fail_next(1, status=429)
        assert (await kube.get_node()).name == NODE
        api.fail_next(10, status=503)
        with pytest.raises(KubeUnavailable) as info:
            await kube.get_node()
        assert info.value.status == 503
        assert kube.available is False
        api.fail_next(0)
        api.allow_all()
    finally:
        await kube.aclose()


async def test_unreachable_server_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "kubeconfig"
    with FakeApiServer() as api:
        api.write_kubeconfig(cfg)
    cfg.write_text(cfg.read_text().replace(api.url, f"http://127.0.0.1:{port}"))
    kube = client(cfg, attempts=3)
    try:
        started = time.monotonic()
        with pytest.raises(KubeUnavailable):
            await kube.get_node()
        assert time.monotonic() - started < 5
        assert kube.available is False
        assert kube.last_error
    finally:
        await kube.aclose()


async def test_every_call_has_a_timeout(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig", timeout=0.3, attempts=2)
    try:
        api.stall(2.0, path_contains="/nodes/", count=1)
        started = time.monotonic()
        assert (await kube.get_node()).name == NODE  # the first attempt times out, the second answers
        assert time.monotonic() - started < 1.5
    finally:
        await kube.aclose()


async def test_forbidden_names_what_to_grant(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    try:
        api.forbid("patch", "nodes")
        with pytest.raises(KubeForbidden) as info:
            await kube.patch_node(labels={"x": "y"})
        text = str(info.value)
        assert '"patch"' in text
        assert '"nodes"' in text
        assert "cannot patch resource" in text
        assert kube.available is True  # it answered: not an outage
    finally:
        await kube.aclose()


async def test_missing_node_is_not_found(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig", node="no-such-node")
    try:
        with pytest.raises(KubeNotFound):
            await kube.get_node()
    finally:
        await kube.aclose()


async def test_patch_with_a_stale_version_conflicts_and_changes_nothing(
    api: FakeApiServer, tmp_path: Path
) -> None:
    kube = client(tmp_path / "kubeconfig")
    try:
        seen = await kube.get_node()
        api.patch_node(NODE, {"metadata": {"labels": {"someone": "else"}}})
        with pytest.raises(KubeConflict):
            await kube.patch_node(labels={"mine": "1"}, resource_version=seen.resource_version)
        assert "mine" not in api.node(NODE)["metadata"].get("labels", {})
        fresh = await kube.get_node()
        await kube.patch_node(labels={"mine": "1"}, resource_version=fresh.resource_version)
        assert api.node(NODE)["metadata"]["labels"]["mine"] == "1"
    finally:
        await kube.aclose()


async def test_cordon_and_uncordon(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    try:
        assert (await kube.set_unschedulable(True)).unschedulable
        assert api.node(NODE)["spec"]["unschedulable"] is True
        assert not (await kube.set_unschedulable(False)).unschedulable
        assert not api.node(NODE).get("spec", {}).get("unschedulable")
    finally:
        await kube.aclose()


async def test_pods_on_this_node_by_label_and_request_then_delete_and_evict(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.add_node("node-2")
    api.add_pod("gpu-operator", "dp-1", node=NODE, labels={"app": "nvidia-device-plugin-daemonset"})
    api.add_pod("team", "train", node=NODE, labels={"app": "train"}, requests={"nvidia.com/gpu": "1"})
    api.add_pod("team", "cpu-only", node=NODE, labels={"app": "web"})
    api.add_pod("team", "elsewhere", node="node-2", labels={"app": "train"}, requests={"nvidia.com/gpu": "1"})
    kube = client(tmp_path / "kubeconfig")
    try:
        every = {p.key for p in await kube.list_pods()}
        assert every == {"gpu-operator/dp-1", "team/train", "team/cpu-only"}
        by_label = await kube.list_pods(labels={"app": "nvidia-device-plugin-daemonset"})
        assert [p.key for p in by_label] == ["gpu-operator/dp-1"]
        in_ns = await kube.list_pods(namespace="team")
        assert {p.key for p in in_ns} == {"team/train", "team/cpu-only"}
        gpu = await kube.list_pods(requesting="nvidia.com/")
        assert [p.key for p in gpu] == ["team/train"]
        assert gpu[0].requests == frozenset({"nvidia.com/gpu"})
        assert await kube.evict_pod("team", "train") is True
        assert await kube.delete_pod("gpu-operator", "dp-1") is True
        assert await kube.delete_pod("gpu-operator", "dp-1") is False  # already gone
        assert await kube.evict_pod("team", "nope") is False
        assert {p.key for p in await kube.list_pods()} == {"team/cpu-only"}
        evictions = [r for r in api.requests if r.path.endswith("/eviction")]
        assert len(evictions) == 2
    finally:
        await kube.aclose()


async def test_node_feature_update_conflict_is_retried(api: FakeApiServer, tmp_path: Path) -> None:
    kube = client(tmp_path / "kubeconfig")
    meta = {"nfd.node.kubernetes.io/node-name": NODE}
    try:
        await kube.put_node_feature("default", "nf", labels={"a": "1"}, object_labels=meta)
        api.fail_next(1, status=409, method="PUT", reason="Conflict")
        assert (
            await kube.put_node_feature("default", "nf", labels={"a": "2"}, object_labels=meta) == "updated"
        )
        stored = api.get("nodefeatures", "nf", "default")
        assert stored is not None
        assert stored["spec"]["labels"] == {"a": "2"}
    finally:
        await kube.aclose()

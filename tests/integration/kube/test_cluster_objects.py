"""gpunode.kube.client's calls on any kind, for the operator, against the test API server: server-side
apply with a field manager, get / list / delete, ClusterPolicies (a custom resource) listed, watched and
their status subresource patched, a DaemonSet with its pods and ControllerRevisions, and Leases."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpunode.api.clusterpolicy_crd import crd
from gpunode.common.errors import UsageError
from gpunode.kube.api import KubeConflict, KubeForbidden
from gpunode.kube.client import Kube, load_kubeconfig
from gpunode.kube.cluster import (
    CLUSTER_POLICY,
    OPERATOR_FIELD_MANAGER,
    LeaseRecord,
    ObjectEvent,
    resource_kind,
)
from gpunode.sim.apiserver import FakeApiServer

CONFIG_MAP = resource_kind("v1", "ConfigMap")


def cluster(kubeconfig: Path, **kw: Any) -> Kube:
    return Kube.connect_cluster(str(kubeconfig), namespace="gpunode", backoff=(0.01, 0.05), **kw)


def cm(data: dict[str, str], name: str = "c") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def policy(name: str) -> dict[str, Any]:
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": name}, "spec": {}}


@pytest.fixture
def api(tmp_path: Path) -> Any:
    with FakeApiServer() as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


async def _namespace(kube: Kube) -> None:
    await kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpunode"}})


def test_cluster_wide_client_needs_no_node_name(tmp_path: Path, api: FakeApiServer) -> None:
    config = load_kubeconfig(str(tmp_path / "kubeconfig"))
    assert Kube(None, config, cluster_wide=True).node_name == ""
    assert cluster(tmp_path / "kubeconfig").field_manager == OPERATOR_FIELD_MANAGER
    with pytest.raises(UsageError, match="no node name"):
        Kube(None, config)


async def test_apply_get_list_delete(api: FakeApiServer, tmp_path: Path) -> None:
    kube = cluster(tmp_path / "kubeconfig")
    try:
        await _namespace(kube)
        stored = await kube.apply(cm({"a": "1"}))
        assert stored["metadata"]["namespace"] == "gpunode"  # the client's namespace by default
        managers = {m["manager"] for m in stored["metadata"]["managedFields"]}
        assert managers == {OPERATOR_FIELD_MANAGER}
        assert (await kube.apply(cm({"a": "2"})))["data"] == {"a": "2"}
        got = await kube.get_object(CONFIG_MAP, "c")
        assert got is not None
        assert got["data"] == {"a": "2"}
        items, version = await kube.list_objects(CONFIG_MAP)
        assert [o["metadata"]["name"] for o in items] == ["c"]
        assert version
        assert await kube.delete_object(CONFIG_MAP, "c")
        assert not await kube.delete_object(CONFIG_MAP, "c")
        assert await kube.get_object(CONFIG_MAP, "c") is None
    finally:
        await kube.aclose()


async def test_apply_conflict_with_another_manager_unless_forced(api: FakeApiServer, tmp_path: Path) -> None:
    kube = cluster(tmp_path / "kubeconfig")
    try:
        await _namespace(kube)
        await kube.apply(cm({"a": "1"}), field_manager="someone-else")
        with pytest.raises(KubeConflict):
            await kube.apply(cm({"a": "2"}))
        assert (await kube.apply(cm({"a": "2"}), force=True))["data"] == {"a": "2"}
    finally:
        await kube.aclose()


async def test_unknown_kind_is_refused_before_any_request(api: FakeApiServer, tmp_path: Path) -> None:
    kube = cluster(tmp_path / "kubeconfig")
    try:
        before = len(api.requests)
        with pytest.raises(KeyError, match="unknown kind Widget"):
            await kube.apply({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
        assert len(api.requests) == before
    finally:
        await kube.aclose()


async def test_forbidden_apply_names_verb_resource_and_group(api: FakeApiServer, tmp_path: Path) -> None:
    kube = cluster(tmp_path / "kubeconfig")
    try:
        api.forbid("patch", "clusterroles")
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "r"},
        }
        with pytest.raises(KubeForbidden) as info:
            await kube.apply(role)
        assert (info.value.verb, info.value.resource, info.value.group) == (
            "patch",
            "clusterroles",
            "rbac.authorization.k8s.io",
        )
    finally:
        await kube.aclose()


async def test_cluster_policies_listed_watched_and_status_patched(api: FakeApiServer, tmp_path: Path) -> None:
    kube = cluster(tmp_path / "kubeconfig")
    try:
        await kube.apply(crd())
        await kube.apply(policy("first"))
        watch = kube.watch_objects(CLUSTER_POLICY)
        sync = await asyncio.wait_for(anext(watch), 5)
        assert sync.type == "SYNC"
        assert [o["metadata"]["name"] for o in sync.objects] == ["first"]
        await kube.apply(policy("second"))
        added: ObjectEvent = await asyncio.wait_for(anext(watch), 5)
        assert added.type == "ADDED"
        assert added.obj is not None
        assert added.obj["metadata"]["name"] == "second"
        await watch.aclose()

        stored = await kube.patch_status(CLUSTER_POLICY, "first", {"state": "ready", "namespace": "gpunode"})
        assert stored["status"] == {"state": "ready", "namespace": "gpunode"}
        stored = await kube.patch_status(CLUSTER_POLICY, "first", {"state": "ignored", "namespace": None})
        assert stored["status"] == {"state": "ignored"}
        assert stored["spec"] == {}
        with pytest.raises(KubeConflict):
            await kube.patch_status(CLUSTER_POLICY, "first", {"state": "ready"}, resource_version="1")
        items, _ = await kube.list_objects(CLUSTER_POLICY)
        assert {o["metadata"]["name"]: o.get("status") for o in items} == {
            "first": {"state": "ignored"},
            "second": None,
        }
    finally:
        await kube.aclose()


async def test_daemonset_with_its_pods_and_revisions(api: FakeApiServer, tmp_path: Path) -> None:
    for i in range(3):
        api.add_node(f"gpu-{i}", labels={"gpu": "true"})
    api.add_node("cpu-0")
    kube = cluster(tmp_path / "kubeconfig")
    try:
        await _namespace(kube)
        labels = {"app": "plugin"}
        await kube.apply(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": "plugin"},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "updateStrategy": {"type": "OnDelete"},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "nodeSelector": {"gpu": "true"},
                            "containers": [{"name": "c", "image": "i"}],
                        },
                    },
                },
            }
        )
        assert await kube.daemonset_rollout("missing") is None
        for _ in range(100):
            found = await kube.daemonset_rollout("plugin")
            assert found is not None
            ds, pods, revisions = found
            if len(pods) == 3 and (ds.get("status") or {}).get("desiredNumberScheduled") == 3:
                break
            await asyncio.sleep(0.02)
        assert sorted(p["spec"]["nodeName"] for p in pods) == ["gpu-0", "gpu-1", "gpu-2"]
        assert len(revisions) == 1
        assert {p["metadata"]["labels"]["controller-revision-hash"] for p in pods} == {
            revisions[0]["metadata"]["labels"]["controller-revision-hash"]
        }
    finally:
        await kube.aclose()


async def test_leases_created_once_and_updated_only_as_of_the_version_read(
    api: FakeApiServer, tmp_path: Path
) -> None:
    kube = cluster(tmp_path / "kubeconfig")
    try:
        await _namespace(kube)
        assert await kube.get_lease("gpunode-operator") is None
        t0 = "2026-12-01T10:00:00.000000Z"
        record = LeaseRecord("gpunode-operator", "gpunode", "a", 15, t0, t0, 0)
        created = await kube.create_lease(record)
        assert (created.holder, created.duration_s, created.renew_time) == ("a", 15, t0)
        assert created.resource_version
        with pytest.raises(KubeConflict):
            await kube.create_lease(LeaseRecord("gpunode-operator", "gpunode", "b", 15))
        renewed = await kube.update_lease(
            LeaseRecord(
                "gpunode-operator",
                "gpunode",
                "a",
                15,
                t0,
                "2026-12-01T10:00:05.000000Z",
                0,
                created.resource_version,
            )
        )
        assert renewed.renew_time == "2026-12-01T10:00:05.000000Z"
        with pytest.raises(KubeConflict):  # b read the old version
            await kube.update_lease(
                LeaseRecord("gpunode-operator", "gpunode", "b", 15, t0, t0, 1, created.resource_version)
            )
        got = await kube.get_lease("gpunode-operator")
        assert got == renewed
    finally:
        await kube.aclose()

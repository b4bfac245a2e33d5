"""The ClusterPolicy controller against the test API server: a clean simulated cluster (GPU nodes with
only NFD's labels, and other nodes) reaches ``ready`` with the DaemonSets on GPU nodes only; a second
reconcile writes nothing; a second ClusterPolicy is ``ignored``, persisted; disabling a component
deletes its objects; an invalid policy is ``notReady`` naming the path and applies nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpunode.api.clusterpolicy_crd import crd
from gpunode.deploy.render import render_by_agent
from gpunode.kube.api import KubeConflict, KubeForbidden, KubeUnavailable
from gpunode.kube.client import Kube
from gpunode.kube.cluster import CLUSTER_POLICY, DAEMON_SET, resource_kind
from gpunode.operator.cache import ObjectCache
from gpunode.operator.controller import ClusterPolicyController, ReconcileResult, run_controller
from gpunode.operator.labeller import NodeLabeller
from gpunode.operator.queue import WorkQueue
from gpunode.operator.selection import HASH_ANNOTATION
from gpunode.operator.states import key_of
from gpunode.sim.apiserver import FakeApiServer
from helpers.waiting import until

NS = "gpunode"
NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
CPU_NFD = {"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"}
GPU_NODES = ["gpu-0", "gpu-1", "gpu-2"]
CPU_NODES = ["cpu-0", "cpu-1"]
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def render(policy: Any, namespace: str) -> Mapping[str, Sequence[dict[str, Any]]]:
    return render_by_agent(policy, namespace=namespace)


def policy(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": name},
        "spec": spec or {},
    }


@dataclass
class Cluster:
    api: FakeApiServer
    kube: Kube
    controller: ClusterPolicyController
    labeller: NodeLabeller

    def writes(self) -> int:
        return sum(
            1 for r in self.api.requests if r.method in WRITES and not r.path.startswith("/api/v1/nodes")
        )

    async def until_ready(self, limit: int = 200) -> ReconcileResult:
        for _ in range(limit):
            result = await self.controller.reconcile()
            if result.state == "ready":
                return result
            await asyncio.sleep(0.02)
        raise AssertionError(f"not ready: {self.status('cluster-policy')}")

    def status(self, name: str) -> dict[str, Any]:
        obj = self.api.get("ClusterPolicy", name)
        assert obj is not None
        return dict(obj.get("status") or {})


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    with FakeApiServer() as api:
        for n in GPU_NODES:
            api.add_node(n, labels={"kubernetes.io/hostname": n, **NFD})
        for n in CPU_NODES:
            api.add_node(n, labels={"kubernetes.io/hostname": n, **CPU_NFD})
        api.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Kube.connect_cluster(str(tmp_path / "kubeconfig"), namespace=NS, backoff=(0.01, 0.05))
        labeller = NodeLabeller(kube)
        task = asyncio.create_task(labeller.run())
        try:
            await kube.apply(crd())
            await kube.apply(policy("cluster-policy"), field_manager="user")
            await asyncio.wait_for(labeller.wait_idle(), 10)
            controller = ClusterPolicyController(
                kube, render, namespace=NS, nodes=lambda: [n.labels for n in labeller.nodes.values()]
            )
            yield Cluster(api, kube, controller, labeller)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await kube.aclose()


def gpunode_daemonsets(api: FakeApiServer) -> list[dict[str, Any]]:
    return [d for d in api.objects("DaemonSet", NS) if "nfd" not in d["metadata"]["name"]]


async def test_clean_cluster_reaches_ready_with_daemonsets_on_gpu_nodes_only(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        first = await c.controller.reconcile()
        assert first.active == "cluster-policy"
        assert first.applied  # every rendered object, once
        await c.until_ready()
        status = c.status("cluster-policy")
        assert status["state"] == "ready"
        assert status["namespace"] == NS
        ready = next(x for x in status["conditions"] if x["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "Reconciled")
        names = [s["name"] for s in status["states"]]
        assert names[:3] == ["pre-requisites", "state-driver", "state-container-toolkit"]
        daemonsets = gpunode_daemonsets(c.api)
        assert len(daemonsets) == 7  # driver, toolkit, device plugin, MPS daemon, GFD, exporter, MIG manager
        for ds in daemonsets:
            owner = ds["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["controller"]) == (
                "ClusterPolicy",
                "cluster-policy",
                True,
            )
            assert HASH_ANNOTATION in ds["metadata"]["annotations"]
            pods = [
                p
                for p in c.api.objects("Pod", NS)
                if any(r["uid"] == ds["metadata"]["uid"] for r in p["metadata"].get("ownerReferences", []))
            ]
            nodes = sorted(p["spec"]["nodeName"] for p in pods)
            # NFD's labels alone do not make a node MIG-capable: no MIG manager label, no pod; nor MPS-capable
            # (GFD's nvidia.com/mps.capable): no MPS control daemon
            quiet = ds["metadata"]["name"].endswith(("mig-manager", "mps-control-daemon"))
            expected = [] if quiet else GPU_NODES
            assert nodes == expected, ds["metadata"]["name"]
        assert c.api.get("Namespace", NS) is not None


async def test_a_second_reconcile_with_nothing_changed_writes_nothing(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.until_ready()
        before = c.writes()
        result = await c.controller.reconcile()
        assert result.writes == 0
        assert result.requeue_after is None  # ready: events only
        assert c.writes() == before
        # a restarted operator (no memory of what it applied) writes nothing either
        fresh = ClusterPolicyController(c.kube, render, namespace=NS)
        result = await fresh.reconcile()
        assert (result.writes, result.state) == (0, "ready")
        assert c.writes() == before


async def test_a_second_policy_is_ignored_and_that_is_persisted(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.until_ready()
        await c.kube.apply(policy("zz-second"), field_manager="user")
        result = await c.controller.reconcile()
        assert result.active == "cluster-policy"
        status = c.status("zz-second")
        assert status["state"] == "ignored"
        cond = next(x for x in status["conditions"] if x["type"] == "Ready")
        assert "'cluster-policy'" in cond["message"]
        assert c.status("cluster-policy")["state"] == "ready"
        before = c.writes()
        assert (await c.controller.reconcile()).writes == 0  # the ignored status is not rewritten
        assert c.writes() == before


async def test_disabling_a_component_deletes_its_objects(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.until_ready()
        plugin = [
            d["metadata"]["name"]
            for d in gpunode_daemonsets(c.api)
            if "device-plugin" in d["metadata"]["name"]
        ]
        assert plugin
        await c.kube.apply(
            policy("cluster-policy", {"devicePlugin": {"enabled": False}}), field_manager="user"
        )
        result = await c.controller.reconcile()
        assert any(f"DaemonSet {NS}/{plugin[0]}" == d for d in result.deleted)
        assert await c.kube.get_object(DAEMON_SET, plugin[0]) is None
        states = {s["name"]: s["state"] for s in c.status("cluster-policy")["states"]}
        assert states["state-device-plugin"] == "disabled"
        assert (await c.controller.reconcile()).deleted == []  # deleted once


async def test_an_invalid_policy_is_not_ready_names_the_path_and_applies_nothing(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.until_ready()
        running = {d["metadata"]["name"]: d["metadata"]["resourceVersion"] for d in gpunode_daemonsets(c.api)}
        assert len(running) == 7
        before = [r for r in c.api.requests if r.method == "PATCH" and "/status" not in r.path]
        # the CRD schema lets a string through where the model wants a known enum value
        await c.kube.apply(policy("cluster-policy", {"mig": {"strategy": "bogus"}}), field_manager="user")
        after_user = len([r for r in c.api.requests if r.method == "PATCH" and "/status" not in r.path])
        result = await c.controller.reconcile()
        assert result.state == "notReady"
        assert result.applied == []
        assert (
            len([r for r in c.api.requests if r.method == "PATCH" and "/status" not in r.path]) == after_user
        )
        assert after_user == len(before) + 1
        status = c.status("cluster-policy")
        error = next(x for x in status["conditions"] if x["type"] == "Error")
        assert error["status"] == "True"
        assert "spec.mig.strategy" in error["message"]
        obj = await c.kube.get_object(CLUSTER_POLICY, "cluster-policy")
        assert obj is not None
        # the last good policy's objects are left running, untouched, and its states still reported
        assert {
            d["metadata"]["name"]: d["metadata"]["resourceVersion"] for d in gpunode_daemonsets(c.api)
        } == (running)
        assert [s["state"] for s in status["states"]].count("ready") >= 6
        assert result.deleted == []
        # fixed: ready again, nothing rewritten
        await c.kube.apply(policy("cluster-policy"), field_manager="user")
        result = await c.controller.reconcile()
        assert (result.state, result.applied, result.deleted) == ("ready", [], [])


async def test_requeue_5_s_while_not_ready_45_s_without_nfd_labels_else_events_only(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.api.daemon_pod_phase = "Pending"  # pods stay unready
        result = await c.controller.reconcile()
        assert (result.state, result.requeue_after) == ("notReady", 5.0)
        not_ready = next(x for x in c.status("cluster-policy")["conditions"] if x["type"] == "Ready")
        assert not_ready["reason"] == "OperandNotReady"
        no_nfd = ClusterPolicyController(
            c.kube, render, namespace=NS, nodes=lambda: [{"kubernetes.io/os": "linux"}]
        )
        result = await no_nfd.reconcile()
        assert (result.state, result.requeue_after) == ("notReady", 45.0)
        missing = next(x for x in c.status("cluster-policy")["conditions"] if x["type"] == "Ready")
        assert missing["reason"] == "NFDLabelsMissing"


async def test_a_refused_write_names_what_to_grant_in_the_status(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.api.forbid("patch", "daemonsets")
        with pytest.raises(KubeForbidden):
            await c.controller.reconcile()
        status = c.status("cluster-policy")
        assert status["state"] == "notReady"
        error = next(x for x in status["conditions"] if x["type"] == "Error")
        assert (error["status"], error["reason"]) == ("True", "ReconcileFailed")
        assert 'verb "patch" on resource "daemonsets" (apiGroups: ["apps"])' in error["message"]


async def test_interrupted_mid_reconcile_then_restarted_converges(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.api.forbid("patch", "daemonsets")  # the pass stops after the first states' other objects
        with pytest.raises(KubeForbidden):
            await c.controller.reconcile()
        assert gpunode_daemonsets(c.api) == []
        c.api.allow_all()
        restarted = ClusterPolicyController(c.kube, render, namespace=NS)  # nothing remembered
        for _ in range(200):
            result = await restarted.reconcile()
            if result.state == "ready":
                break
            await asyncio.sleep(0.02)
        assert result.state == "ready"
        assert len(gpunode_daemonsets(c.api)) == 7
        error = next(x for x in c.status("cluster-policy")["conditions"] if x["type"] == "Error")
        assert error["status"] == "False"


async def test_an_api_outage_fails_the_pass_and_the_next_one_recovers(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.until_ready()
        c.api.fail_next(5, status=503, path_contains="clusterpolicies")  # every attempt of one call
        with pytest.raises(KubeUnavailable):
            await c.controller.reconcile()
        result = await c.controller.reconcile()
        assert (result.state, result.writes) == ("ready", 0)


async def test_deleting_the_policy_takes_its_objects_but_not_the_namespace(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.until_ready()
        assert gpunode_daemonsets(c.api)
        assert await c.kube.delete_object(CLUSTER_POLICY, "cluster-policy")
        for _ in range(200):
            if not c.api.objects("DaemonSet", NS):
                break
            await asyncio.sleep(0.02)
        assert c.api.objects("DaemonSet", NS) == []  # garbage-collected through the ownerReferences
        assert c.api.get("Namespace", NS) is not None  # it holds the operator itself
        result = await c.controller.reconcile()
        assert (result.active, result.writes) == (None, 0)


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["template"]["spec"])


async def test_hand_edits_and_deletions_are_put_right_and_only_they_are_written(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.until_ready()
        assert (await c.controller.reconcile()).writes == 0
        plugin = c.api.get("DaemonSet", "gpunode-device-plugin", NS)
        assert plugin is not None
        wanted = _pod_spec(plugin)["containers"]
        containers = json.loads(json.dumps(wanted))
        containers[0]["image"] = "example.com/evil:1"
        containers[0]["env"] = [*containers[0].get("env", []), {"name": "EXTRA", "value": "1"}]
        containers[0]["env"][0] = {**containers[0]["env"][0], "value": "hand-edited"}
        # as `kubectl edit` does: an update by another field manager, the hash annotation left alone
        c.api.patch(
            "DaemonSet",
            "gpunode-device-plugin",
            {"spec": {"template": {"spec": {"containers": containers}}}},
            NS,
            manager="kubectl-edit",
        )
        c.api.patch(
            "ServiceAccount",
            "gpunode-toolkit",
            {"metadata": {"labels": {"app.kubernetes.io/name": None}}},
            NS,
            manager="kubectl-label",
        )
        c.api.delete("ConfigMap", "gpunode-nfd-worker-conf", NS)
        result = await c.controller.reconcile()
        assert sorted(result.applied) == [
            f"ConfigMap {NS}/gpunode-nfd-worker-conf",
            f"DaemonSet {NS}/gpunode-device-plugin",
            f"ServiceAccount {NS}/gpunode-toolkit",
        ]
        assert result.deleted == []
        fixed = c.api.get("DaemonSet", "gpunode-device-plugin", NS)
        assert fixed is not None
        got = _pod_spec(fixed)["containers"][0]
        assert got["image"] == wanted[0]["image"]
        assert got["env"][0] == wanted[0]["env"][0]
        # (an entry added beside the operator's is left to server-side apply: a real API server keeps it
        # as the other manager's, the test API server's atomic lists drop it; no further write either way)
        sa = c.api.get("ServiceAccount", "gpunode-toolkit", NS)
        assert sa is not None
        assert sa["metadata"]["labels"]["app.kubernetes.io/name"] == "gpunode-toolkit"
        assert c.api.get("ConfigMap", "gpunode-nfd-worker-conf", NS) is not None
        assert (await c.controller.reconcile()).writes == 0  # put right once, then nothing

        # an edit made while no operator ran: a restarted one finds it without any memory
        c.api.patch(
            "DaemonSet",
            "gpunode-toolkit",
            {"metadata": {"labels": {"app.kubernetes.io/part-of": "mine"}}},
            NS,
            manager="kubectl-label",
        )
        fresh = ClusterPolicyController(c.kube, render, namespace=NS)
        assert (await fresh.reconcile()).applied == [f"DaemonSet {NS}/gpunode-toolkit"]
        toolkit = c.api.get("DaemonSet", "gpunode-toolkit", NS)
        assert toolkit is not None
        assert toolkit["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpunode"
        assert (await fresh.reconcile()).writes == 0


async def test_the_running_loop_puts_drift_right_on_the_watch_event(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        cache = ObjectCache(c.kube, namespace=NS)
        controller = ClusterPolicyController(
            c.kube,
            render,
            namespace=NS,
            nodes=lambda: [n.labels for n in c.labeller.nodes.values()],
            cache=cache,
        )
        results: list[ReconcileResult] = []
        work: WorkQueue[str] = WorkQueue()
        task = asyncio.create_task(run_controller(controller, queue=work, on_result=results.append))

        def quiet() -> bool:  # ready, nothing queued (events only), the last pass wrote nothing
            return (
                bool(results) and results[-1].state == "ready" and results[-1].writes == 0 and not len(work)
            )

        try:
            await until(quiet, 30)
            await until(
                lambda: all(cache.synced(resource_kind(k.api_version, k.kind)) for k in cache.objects)
            )
            assert cache.get(key_of(policy("cluster-policy"))) is None  # owned objects only
            passes = len(results)
            assert results[-1].requeue_after is None  # nothing but an event brings the next pass
            c.api.patch(
                "DaemonSet",
                "gpunode-exporter",
                {"metadata": {"labels": {"app.kubernetes.io/name": None}}},
                NS,
                manager="kubectl-label",
            )
            c.api.delete("Service", "gpunode-exporter", NS)

            def fixed() -> bool:
                ds = c.api.get("DaemonSet", "gpunode-exporter", NS) or {"metadata": {}}
                labels = ds["metadata"].get("labels") or {}
                return (
                    "app.kubernetes.io/name" in labels
                    and c.api.get("Service", "gpunode-exporter", NS) is not None
                )

            await until(lambda: fixed() and len(results) > passes and quiet(), 30)
            written = [k for r in results[passes:] for k in r.applied]
            assert sorted(written) == [f"DaemonSet {NS}/gpunode-exporter", f"Service {NS}/gpunode-exporter"]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# A policy that renders a RuntimeClass (workloads on NVIDIA's runtime, not CDI), and one that renders none.
CDI = {"cdi": {"enabled": True}}


def legacy(name: str) -> dict[str, Any]:
    return {"cdi": {"enabled": False}, "operator": {"runtimeClass": name}}


def runtime_class(name: str, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": meta, "handler": name}


async def test_a_runtime_class_no_longer_named_is_deleted_but_never_a_users(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.api.create("RuntimeClass", runtime_class("user-rc"))
        c.api.create("RuntimeClass", runtime_class("kata", **{"app.kubernetes.io/part-of": "gpunode"}))
        await c.kube.apply(policy("cluster-policy", legacy("nvidia")), field_manager="user")
        await c.until_ready()
        ours = c.api.get("RuntimeClass", "nvidia")
        assert ours is not None
        assert ours["metadata"]["ownerReferences"][0]["kind"] == "ClusterPolicy"

        await c.kube.apply(policy("cluster-policy", legacy("nvidia-legacy")), field_manager="user")
        result = await c.controller.reconcile()
        assert result.deleted == ["RuntimeClass nvidia"]
        assert "RuntimeClass nvidia-legacy" in result.applied
        assert c.api.get("RuntimeClass", "nvidia") is None

        # a restarted operator (no memory of the old name) finds its strays by ownership
        await c.kube.apply(policy("cluster-policy", CDI), field_manager="user")
        fresh = ClusterPolicyController(c.kube, render, namespace=NS)
        result = await fresh.reconcile()
        assert result.deleted == ["RuntimeClass nvidia-legacy"]
        assert sorted(o["metadata"]["name"] for o in c.api.objects("RuntimeClass")) == ["kata", "user-rc"]
        assert (await fresh.reconcile()).writes == 0


async def test_a_users_runtime_class_of_the_named_name_is_neither_taken_over_nor_deleted(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as c:
        c.api.create("RuntimeClass", runtime_class("nvidia"))
        await c.kube.apply(policy("cluster-policy", legacy("nvidia")), field_manager="user")
        result = await c.until_ready()
        before = c.api.get("RuntimeClass", "nvidia")
        assert before is not None
        assert "ownerReferences" not in before["metadata"]
        await c.kube.apply(policy("cluster-policy", CDI), field_manager="user")
        result = await c.controller.reconcile()
        assert not [k for k in (*result.applied, *result.deleted) if "RuntimeClass" in k]
        assert c.api.get("RuntimeClass", "nvidia") == before


async def test_a_409_fails_the_pass_and_the_next_one_converges(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.api.fail_next(1, status=409, method="PATCH", path_contains="daemonsets")
        with pytest.raises(KubeConflict):
            await c.controller.reconcile()
        await c.until_ready()
        error = next(x for x in c.status("cluster-policy")["conditions"] if x["type"] == "Error")
        assert error["status"] == "False"
        assert len(gpunode_daemonsets(c.api)) == 7


async def test_a_policy_rendering_refuses_is_not_ready_naming_why_and_applies_nothing(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.until_ready()
        running = {d["metadata"]["name"]: d["metadata"]["resourceVersion"] for d in gpunode_daemonsets(c.api)}

        def unknown_kind(p: Any, namespace: str) -> Mapping[str, Sequence[dict[str, Any]]]:
            out = dict(render(p, namespace))
            widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
            return {**out, "common": [*out["common"], widget]}

        def refused(p: Any, namespace: str) -> Mapping[str, Sequence[dict[str, Any]]]:
            raise ValueError("spec.dcgmExporter.serviceMonitor.scrapeTimeout: longer than the interval")

        for renderer, why in ((unknown_kind, "unknown kind Widget"), (refused, "scrapeTimeout")):
            controller = ClusterPolicyController(c.kube, renderer, namespace=NS)
            result = await controller.reconcile()
            assert (result.state, result.applied, result.deleted) == ("notReady", [], [])
            error = next(x for x in c.status("cluster-policy")["conditions"] if x["type"] == "Error")
            assert error["status"] == "True"
            assert why in error["message"]
        assert {
            d["metadata"]["name"]: d["metadata"]["resourceVersion"] for d in gpunode_daemonsets(c.api)
        } == (running)
        result = await c.controller.reconcile()  # rendering works again: ready, nothing rewritten
        assert (result.state, result.applied) == ("ready", [])

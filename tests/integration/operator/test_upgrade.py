"""The driver upgrade controller on the test API server (issue 17): limits that hold at every write,
failures that say why and stay failed, an administrator's cordon kept, a pod-only change that evicts
nothing, ``autoUpgrade: false`` cleaning up, bad limits refused without touching a node, and the
controller killed at every state converging without evicting twice or leaving a node cordoned."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from gpunode.api.clusterpolicy_crd import crd
from gpunode.deploy.render import render_by_agent
from gpunode.kube.client import Kube
from gpunode.kube.operands import RECORD_ANNOTATION as OPERANDS_ANNOTATION
from gpunode.kube.operands import PauseRecord, paused_value
from gpunode.operator import upgrade_plan as plan
from gpunode.operator.controller import ClusterPolicyController
from gpunode.operator.metrics import create_operator_metrics
from gpunode.operator.upgrade import UpgradeController, check_policy
from gpunode.sim.apiserver import FakeApiServer
from helpers.upgrades import (
    DRIVER,
    NS,
    POLICY,
    UpgradeCluster,
    cluster_policy,
    ready_status,
    set_driver_env,
    set_driver_pod_label,
    upgrade_cluster,
)

GPU = {"nvidia.com/gpu": "1"}


def settled(c: UpgradeCluster) -> bool:
    return bool(c.passes) and c.controller.synced()


def all_in(c: UpgradeCluster, *states: str) -> bool:
    found = c.states()
    return bool(found) and all(s in states for s in found.values())


def cordoned(c: UpgradeCluster) -> list[str]:
    return sorted(n["metadata"]["name"] for n in c.api.objects("Node") if n["spec"].get("unschedulable"))


def evictions(c: UpgradeCluster) -> Counter[str]:
    return Counter(r.path for r in c.api.requests if r.path.endswith("/eviction") and r.method == "POST")


def gpu_workload(api: FakeApiServer, node: str, name: str, **kw: Any) -> None:
    api.add_pod("ml", name, node=node, requests=GPU, owner_kind="ReplicaSet", owner_name="trainer", **kw)


def upgrade_status(c: UpgradeCluster) -> dict[str, Any]:
    policy = c.api.get("ClusterPolicy", POLICY) or {}
    return dict((policy.get("status") or {}).get("driverUpgrade") or {"nodes": {}, "failed": []})


def reason(c: UpgradeCluster, node: str) -> str:
    return str(c.node(node)["metadata"]["annotations"].get(plan.REASON_ANNOTATION, ""))


async def test_hundred_nodes_upgrade_within_both_limits_at_every_write(tmp_path: Path) -> None:
    up = {"autoUpgrade": True, "maxParallelUpgrades": 10, "maxUnavailable": "25%"}

    def workloads(api: FakeApiServer) -> None:
        for i in range(0, 100, 7):
            gpu_workload(api, f"gpu-{i:04}", f"train-{i}")

    async with upgrade_cluster(tmp_path, 100, up, validator=True, prepare=workloads, history=20000) as c:
        await c.until(lambda: settled(c))
        assert all_in(c, "")  # nothing to do at the first revision
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        await c.until(lambda: all_in(c, "upgrade-done"), 120)
        assert c.checker.violations == []
        assert 0 < c.checker.peak_active <= 10
        assert 0 < c.checker.peak_unavailable <= 25
        assert cordoned(c) == []
        # the GPU workloads were evicted once each; every node's driver pod is the newest
        assert len(evictions(c)) == 15
        assert set(evictions(c).values()) == {1}
        assert [p for p in c.api.pods() if p["metadata"]["namespace"] == "ml"] == []
        hashes = {
            p["metadata"]["labels"]["controller-revision-hash"]
            for p in c.api.pods()
            if p["metadata"]["name"].startswith(DRIVER)
        }
        assert len(hashes) == 1
        # every transition says why, on the node and in an Event
        assert "uncordoned" in reason(c, "gpu-0042")
        events = [e for e in c.api.objects("Event", "default") if e["involvedObject"]["name"] == "gpu-0042"]
        assert [e["reason"] for e in events][-1] == "DriverUpgradeUpgradeDone"
        assert len(events) == 8  # required, cordon, jobs, deletion, restart, validation, uncordon, done
        await c.until(lambda: upgrade_status(c)["nodes"]["done"] == 100)  # written after the pass's writes
        assert upgrade_status(c)["failed"] == []
        # the operator's metrics count what was done
        metrics = create_operator_metrics(process_metrics=False)
        metrics.upgrades = c.controller
        text = generate_latest(metrics.registry).decode()
        assert 'gpunode_operator_driver_upgrade_transitions_total{state="upgrade-done"} 100.0' in text
        assert "gpunode_operator_driver_upgrade_evictions_total 15.0" in text


async def test_a_crash_looping_driver_pod_fails_its_node_with_the_reason_while_others_finish(
    tmp_path: Path,
) -> None:
    up = {"autoUpgrade": True, "maxParallelUpgrades": 2, "maxUnavailable": 2}
    crashing = {"on": True}

    def crash_loop(api: FakeApiServer) -> None:
        def status(pod: dict[str, Any]) -> dict[str, Any] | None:
            if not (crashing["on"] and pod["spec"]["nodeName"] == "gpu-0003"):
                return ready_status(pod)
            if not pod["metadata"]["name"].startswith(DRIVER) or "580.2" not in json.dumps(pod["spec"]):
                return ready_status(pod)
            restarts = [{"name": "driver", "ready": False, "restartCount": 11}]
            ready = [{"type": "Ready", "status": "False"}]
            return {"phase": "Running", "conditions": ready, "containerStatuses": restarts}

        api.daemon_pod_status = status

    async with upgrade_cluster(tmp_path, 8, up, prepare=crash_loop) as c:
        await c.until(lambda: settled(c))
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        await c.until(
            lambda: (
                all_in(c, "upgrade-done", "upgrade-failed") and "upgrade-required" not in c.states().values()
            )
        )
        states = c.states()
        assert states.pop("gpu-0003") == "upgrade-failed"
        assert set(states.values()) == {"upgrade-done"}
        assert "pod-restart-required: driver pod crash-looping (11 restarts)" in reason(c, "gpu-0003")
        assert cordoned(c) == []  # a failed node does not keep a slot or its cordon
        assert c.checker.violations == []
        await c.until(lambda: bool(upgrade_status(c)["failed"]))
        status = upgrade_status(c)
        assert status["failed"][0]["node"] == "gpu-0003"
        assert "crash-looping" in status["failed"][0]["reason"]
        # it stays failed by itself, pass after pass ...
        for _ in range(3):
            await c.controller.reconcile()
        assert c.states()["gpu-0003"] == "upgrade-failed"
        # ... until someone asks for a retry (the driver fixed meanwhile)
        crashing["on"] = False
        c.api.delete(
            "Pod",
            next(p for p in c.api.pods("gpu-0003") if p["metadata"]["name"].startswith(DRIVER))["metadata"][
                "name"
            ],
            NS,
        )
        c.api.patch_node("gpu-0003", {"metadata": {"annotations": {plan.RETRY_ANNOTATION: "now"}}})
        await c.until(lambda: c.states()["gpu-0003"] == "upgrade-done")
        assert plan.RETRY_ANNOTATION not in c.node("gpu-0003")["metadata"]["annotations"]


async def test_a_disruption_budget_blocks_the_drain_until_its_timeout_and_the_reason_is_recorded(
    tmp_path: Path,
) -> None:
    up = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 0,
        "maxUnavailable": "100%",
        "podDeletion": {"timeoutSeconds": 1},
        "drain": {"enable": True, "timeoutSeconds": 1},
    }

    def guarded(api: FakeApiServer) -> None:
        gpu_workload(api, "gpu-0001", "guarded", labels={"app": "guarded"})
        api.create(
            "PodDisruptionBudget",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "guarded", "namespace": "ml"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
            },
        )

    async with upgrade_cluster(tmp_path, 4, up, prepare=guarded) as c:
        await c.until(lambda: settled(c))
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        await c.until(lambda: c.states()["gpu-0001"] == "upgrade-failed", 30)
        why = reason(c, "gpu-0001")
        assert why.startswith(
            "drain-required: pods would not leave within drain.timeoutSeconds 1: ml/guarded"
        )
        assert "PodDisruptionBudget" in why
        await c.until(lambda: all_in(c, "upgrade-done", "upgrade-failed"))
        assert [n for n, s in c.states().items() if s != "upgrade-done"] == ["gpu-0001"]
        assert [
            p["metadata"]["name"] for p in c.api.pods("gpu-0001") if p["metadata"]["namespace"] == "ml"
        ] == ["guarded"]
        assert cordoned(c) == []


async def test_an_admin_cordoned_node_stays_cordoned(tmp_path: Path) -> None:
    up = {"autoUpgrade": True, "maxParallelUpgrades": 0, "maxUnavailable": 1}

    def admin(api: FakeApiServer) -> None:
        api.patch_node("gpu-0002", {"spec": {"unschedulable": True}})

    async with upgrade_cluster(tmp_path, 4, up, prepare=admin) as c:
        await c.until(lambda: settled(c))
        # one write refused on another node: that node is tried again, the others are not held up
        c.api.fail_next(1, status=403, method="PATCH", path_contains="/nodes/gpu-0001")
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        await c.until(lambda: all_in(c, "upgrade-done"))
        assert c.controller.stats.node_errors == 1
        assert cordoned(c) == ["gpu-0002"]
        assert "left cordoned" in reason(c, "gpu-0002")
        assert plan.CORDONED_BY_US_ANNOTATION not in c.node("gpu-0002")["metadata"].get("annotations", {})
        assert c.checker.violations == []


async def test_a_label_only_change_restarts_driver_pods_and_evicts_nothing(tmp_path: Path) -> None:
    up = {"autoUpgrade": True, "maxParallelUpgrades": 0, "maxUnavailable": "50%"}

    def workloads(api: FakeApiServer) -> None:
        for i in range(4):
            gpu_workload(api, f"gpu-{i:04}", f"train-{i}")

    async with upgrade_cluster(tmp_path, 4, up, prepare=workloads) as c:
        await c.until(lambda: settled(c))
        old = {p["metadata"]["uid"] for p in c.api.pods() if p["metadata"]["name"].startswith(DRIVER)}
        set_driver_pod_label(c.api, "example.com/team", "infra")
        await c.until(lambda: all_in(c, "upgrade-done"))
        assert evictions(c) == Counter()
        assert len([p for p in c.api.pods() if p["metadata"]["namespace"] == "ml"]) == 4
        new = {p["metadata"]["uid"] for p in c.api.pods() if p["metadata"]["name"].startswith(DRIVER)}
        assert not old & new  # every driver pod restarted on the new revision
        assert "pod-deletion-required" not in c.controller.stats.by_state
        assert "same DRIVER_CONFIG_DIGEST" in "".join(
            e["message"]
            for e in c.api.objects("Event", "default")
            if e["reason"] == "DriverUpgradeUpgradeRequired"
        )
        assert cordoned(c) == []
        # a change of the log level alone is not an install change either
        set_driver_env(c.api, "LOG_LEVEL", "debug")
        await c.until(lambda: c.controller.stats.by_state.get("upgrade-done", 0) == 8)
        assert evictions(c) == Counter()


async def test_auto_upgrade_off_removes_the_state_labels_and_lifts_our_cordons(tmp_path: Path) -> None:
    up = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 1,
        "maxUnavailable": 1,
        "podDeletion": {"timeoutSeconds": 0},
    }

    def stuck(api: FakeApiServer) -> None:  # a GPU pod that never leaves (no timeout): gpu-0000 stays put
        gpu_workload(api, "gpu-0000", "stuck", labels={"app": "stuck"})
        api.create(
            "PodDisruptionBudget",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "stuck", "namespace": "ml"},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "stuck"}}},
            },
        )

    async with upgrade_cluster(tmp_path, 3, up, prepare=stuck) as c:
        await c.until(lambda: settled(c))
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        await c.until(lambda: c.states()["gpu-0000"] == "pod-deletion-required")
        assert cordoned(c) == ["gpu-0000"]
        c.api.patch("ClusterPolicy", POLICY, {"spec": {"driver": {"upgradePolicy": {"autoUpgrade": False}}}})
        await c.until(
            lambda: all(plan.STATE_LABEL not in n["metadata"]["labels"] for n in c.api.objects("Node"))
        )
        assert cordoned(c) == []
        annotations = c.node("gpu-0000")["metadata"].get("annotations", {})
        assert plan.CORDONED_BY_US_ANNOTATION not in annotations
        assert plan.REASON_ANNOTATION not in annotations
        await c.until(lambda: upgrade_status(c)["autoUpgrade"] is False)


async def test_the_controller_killed_at_every_state_converges(tmp_path: Path) -> None:
    """A fresh controller object (nothing in memory) takes over each time a state first appears."""
    up = {"autoUpgrade": True, "maxParallelUpgrades": 2, "maxUnavailable": 2}

    def workloads(api: FakeApiServer) -> None:
        for i in range(6):
            gpu_workload(api, f"gpu-{i:04}", f"train-{i}")

    async with upgrade_cluster(tmp_path, 6, up, validator=True, prepare=workloads) as c:
        await c.until(lambda: settled(c))
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        killed: set[str] = set()
        clients: list[Kube] = []
        for _ in range(400):
            seen = set(c.states().values()) - {""} - killed
            if seen:  # a new process: a new client, a new controller, nothing in memory
                killed |= seen
                await c.stop()
                clients.append(Kube.connect_cluster(str(c.kubeconfig), namespace=NS, backoff=(0.01, 0.05)))
                c.start(UpgradeController(clients[-1], namespace=NS))
            if all_in(c, "upgrade-done"):
                break
            await asyncio.sleep(0.005)
        try:
            await c.until(lambda: all_in(c, "upgrade-done"))
        except AssertionError as exc:  # say where each node stands, with its pods
            lines = [str(exc), f"killed at {sorted(killed)}; {c.controller.stats}"]
            for n, st in sorted(c.states().items()):
                if st != "upgrade-done":
                    lines.append(f"{n} {st}: {c.node(n)['metadata'].get('annotations')}")
                    lines += [f"  {p['metadata']['name']} {p['status']}" for p in c.api.pods(n)]
            raise AssertionError("\n".join(lines)) from None
        await c.stop()
        for client in clients:
            await client.aclose()
        assert {"upgrade-required", "cordon-required", "pod-restart-required"} <= killed
        assert c.checker.violations == []
        assert cordoned(c) == []
        assert set(evictions(c).values()) == {1}  # never evicted twice
        assert len(evictions(c)) == 6


async def test_the_validators_go_before_the_driver_pod_so_a_failed_delete_revalidates(tmp_path: Path) -> None:
    """The driver pod's delete fails once (a controller that died there): the validators deleted before it
    are deleted again before the retry, so no validator older than the new driver pod passes it."""
    up = {"autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": 1}
    async with upgrade_cluster(tmp_path, 1, up, validator=True) as c:
        await c.until(lambda: settled(c))
        c.api.fail_next(1, status=403, method="DELETE", path_contains=f"/pods/{DRIVER}-")  # not retried
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        await c.until(lambda: all_in(c, "upgrade-done"))
        deletes = [
            "driver" if DRIVER in r.path else "validator"
            for r in c.api.requests
            if r.method == "DELETE" and "/pods/" in r.path
        ]
        assert deletes == ["validator", "driver", "validator", "driver"]  # the first driver delete failed
        driver = next(p for p in c.api.pods("gpu-0000") if p["metadata"]["name"].startswith(DRIVER))
        assert "580.2" in json.dumps(driver["spec"])


async def test_operands_paused_for_the_upgrade_come_back(tmp_path: Path) -> None:
    """gpu-0000: the driver manager died with the operands paused (its record's lease ran out): they are
    restored with the uncordon. gpu-0001: a live pause holds the node, cordoned, until its holder is done."""
    up = {"autoUpgrade": True, "maxParallelUpgrades": 0, "maxUnavailable": "100%"}
    deploy = "nvidia.com/gpu.deploy.device-plugin"
    held_until = time.time() + 600

    def paused(api: FakeApiServer) -> None:
        for node, until in (("gpu-0000", 0.0), ("gpu-0001", held_until)):
            record = PauseRecord("gpunode-driver-manager", "driver-upgrade", {deploy: "true"}, "", until)
            api.patch_node(
                node,
                {
                    "metadata": {
                        "labels": {deploy: paused_value("driver-upgrade")},
                        "annotations": {OPERANDS_ANNOTATION: record.to_json()},
                    }
                },
            )

    async with upgrade_cluster(tmp_path, 3, up, prepare=paused) as c:
        await c.until(lambda: settled(c))
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        await c.until(lambda: c.states()["gpu-0000"] == "upgrade-done")
        labels, annotations = (
            c.node("gpu-0000")["metadata"]["labels"],
            c.node("gpu-0000")["metadata"]["annotations"],
        )
        assert labels[deploy] == "true"
        assert OPERANDS_ANNOTATION not in annotations
        await c.until(lambda: c.states()["gpu-0001"] == "uncordon-required")
        for _ in range(2):
            await c.controller.reconcile()
        assert c.states()["gpu-0001"] == "uncordon-required"  # its holder is still at work: it waits
        assert "gpu-0001" in cordoned(c)
        # the holder (the driver manager) finishes: labels back, record gone; the node goes on
        c.api.patch_node(
            "gpu-0001", {"metadata": {"labels": {deploy: "true"}, "annotations": {OPERANDS_ANNOTATION: None}}}
        )
        await c.until(lambda: all_in(c, "upgrade-done"))
        assert c.node("gpu-0001")["metadata"]["labels"][deploy] == "true"
        assert cordoned(c) == []


@pytest.mark.parametrize(
    ("upgrade", "field"),
    [
        ({"maxUnavailable": "150%"}, "spec.driver.upgradePolicy.maxUnavailable: '150%' is over 100%"),
        ({"maxUnavailable": -1}, "spec.driver.upgradePolicy.maxUnavailable: -1 is negative"),
        ({"maxUnavailable": "ten%"}, "spec.driver.upgradePolicy.maxUnavailable: 'ten%' is not a count"),
        ({"maxParallelUpgrades": -2}, "spec.driver.upgradePolicy.maxParallelUpgrades: -2 is negative"),
        ({"drain": {"podSelector": "app in (a"}}, "spec.driver.upgradePolicy.drain.podSelector: unbalanced"),
    ],
)
async def test_a_bad_limit_or_selector_is_an_error_condition_and_no_node_is_touched(
    tmp_path: Path, upgrade: dict[str, Any], field: str
) -> None:
    up = {"autoUpgrade": True, **upgrade}
    async with upgrade_cluster(tmp_path, 3, up, start=False) as c:
        set_driver_env(c.api, "DRIVER_VERSION", "580.2")
        created = c.checker.writes
        await c.until(lambda: c.controller.synced() or True)
        c.start()
        await c.until(lambda: bool(c.passes))
        assert field in (c.passes[-1].error or "")
        # the ClusterPolicy controller, with the operator's parser, says so in the Error condition
        cp = ClusterPolicyController(
            c.kube, lambda p, ns: render_by_agent(p, namespace=ns), namespace=NS, parse=check_policy
        )
        await cp.reconcile()
        status = c.api.get("ClusterPolicy", POLICY)["status"]  # type: ignore[index]
        error = next(x for x in status["conditions"] if x["type"] == "Error")
        assert error["status"] == "True"
        assert field in error["message"]
        assert c.checker.writes == created  # no node touched
        assert all_in(c, "")


async def test_the_cluster_policy_controller_keeps_the_upgrade_status(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        api.apply("CustomResourceDefinition", crd(), manager="test")
        api.create("ClusterPolicy", cluster_policy({"autoUpgrade": True}))
        api.patch(
            "ClusterPolicy", POLICY, {"status": {"driverUpgrade": {"message": "kept"}}}, subresource="status"
        )
        kube = Kube.connect_cluster(str(api.write_kubeconfig(tmp_path / "kc")), namespace=NS)
        try:
            cp = ClusterPolicyController(
                kube, lambda p, ns: render_by_agent(p, namespace=ns), namespace=NS, parse=check_policy
            )
            await cp.reconcile()
            await cp.reconcile()
        finally:
            await kube.aclose()
        status = api.get("ClusterPolicy", POLICY)["status"]  # type: ignore[index]
        assert status["driverUpgrade"] == {"message": "kept"}
        assert status["state"]


def test_controller_construction_needs_no_loop() -> None:
    assert UpgradeController  # imported without a running loop

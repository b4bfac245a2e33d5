"""The driver manager against the test API server, whose DaemonSet controller really removes and recreates
operand pods as their deploy labels change, with a fake DriverOps that records what it is asked to do:
host driver, nothing loaded, matching digest, the full upgrade (pause, cordon, evict GPU pods only,
unload, load, uncordon, restore), the ways it fails (pods that may not be evicted, pods that do not
leave, a driver in use, a forbidden eviction, a failing load), auto-drain, disruption budgets, and runs
that were cancelled or killed halfway."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpunode.common.settings import SettingsParser
from gpunode.driver_loader.ops import DriverInUse, DriverUser
from gpunode.driver_loader.settings import UpgradeSettings
from gpunode.driver_loader.upgrade import DriverUpgrade, run_upgrade
from gpunode.driver_loader.upgrade_state import (
    OWNER,
    PAUSE_REASON,
    RECORD_ANNOTATION,
    UpgradeOptions,
    UpgradeOutcome,
)
from gpunode.kube.client import Kube, load_kubeconfig
from gpunode.kube.operands import RECORD_ANNOTATION as PAUSE_ANNOTATION
from gpunode.kube.operands import PauseRecord
from gpunode.sim.apiserver import FakeApiServer

NODE = "node-1"
NS = "gpu-operator"
PREFIX = "nvidia.com/gpu.deploy."
DP, GFD, EXP, DCGM = (PREFIX + n for n in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm"))
VAL, TK, DRIVER = (PREFIX + n for n in ("operator-validator", "container-toolkit", "driver"))
PAUSED = "paused-for-driver-upgrade"
OPERAND_APPS = {
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-operator-validator",
    "nvidia-container-toolkit-daemonset",
}
WORKLOADS = ["ml/mig-job", "ml/trainer", "monitoring/gpu-monitor", "web/frontend"]
FAST = {
    "poll": 0.05,
    "evict_retry": 0.05,
    "operand_timeout": 10.0,
    "drain_timeout": 10.0,
    "progress_interval": 0.2,
}


# -- the cluster -----------------------------------------------------------------------------------------
@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    """node-1 with the operator's operands as DaemonSets (dcgm disabled), and four workloads: two GPU
    pods (one whole GPU, one MIG slice), a CPU pod, and a GPU-requesting DaemonSet pod."""
    with FakeApiServer() as server:
        deploy = {
            DP: "true",
            GFD: "true",
            EXP: "true",
            VAL: "true",
            TK: "true",
            DCGM: "false",
            DRIVER: "true",
        }
        server.add_node(
            NODE, labels={"kubernetes.io/hostname": NODE, "nvidia.com/gpu.present": "true", **deploy}
        )
        server.write_kubeconfig(tmp_path / "kubeconfig")
        for label, app in (
            (DP, "nvidia-device-plugin-daemonset"),
            (GFD, "gpu-feature-discovery"),
            (EXP, "nvidia-dcgm-exporter"),
            (VAL, "nvidia-operator-validator"),
            (TK, "nvidia-container-toolkit-daemonset"),
        ):
            server.add_daemonset(NS, app, {label: "true"}, {"app": app})
        gpu = {"nvidia.com/gpu": "1"}
        server.add_pod(
            "ml", "trainer", node=NODE, requests=gpu, owner_kind="ReplicaSet", owner_name="trainer-7d"
        )
        server.add_pod("ml", "mig-job", node=NODE, requests={"nvidia.com/mig-1g.5gb": "1"}, owner_kind="Job")
        server.add_pod("web", "frontend", node=NODE, requests={"cpu": "1"}, owner_kind="ReplicaSet")
        server.add_pod("monitoring", "gpu-monitor", node=NODE, requests=gpu, owner_kind="DaemonSet")
        assert server.wait_for(lambda: len(server.pods(NODE)) == 9)
        yield server


def labels(api: FakeApiServer) -> dict[str, str]:
    return dict(api.node(NODE)["metadata"].get("labels", {}))


def annotations(api: FakeApiServer) -> dict[str, str]:
    return dict(api.node(NODE)["metadata"].get("annotations", {}))


def cordoned(api: FakeApiServer) -> bool:
    return bool(api.node(NODE).get("spec", {}).get("unschedulable"))


def workloads(api: FakeApiServer) -> list[str]:
    keys = (f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in api.pods(NODE))
    return sorted(k for k in keys if not k.startswith(NS + "/"))


def operand_pods(api: FakeApiServer) -> list[str]:
    return sorted(
        p["metadata"]["name"] for p in api.pods(NODE) if p["metadata"]["labels"].get("app") in OPERAND_APPS
    )


def node_patches(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH" and r.path.endswith(f"/nodes/{NODE}"))


def evictions(api: FakeApiServer, status: int | None = None) -> int:
    return sum(
        1
        for r in api.requests
        if r.method == "POST" and r.path.endswith("/eviction") and status in (None, r.status)
    )


def events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The structlog events captured (each record's message is the event dict)."""
    return [r.msg for r in caplog.records if isinstance(r.msg, dict)]


# -- the driver ------------------------------------------------------------------------------------------
@dataclass
class FakeOps:
    """DriverOps that records calls and what the node looked like when each was made."""

    api: FakeApiServer
    host: str | None = None
    is_loaded: bool = True
    digest: bool = False
    unload_errors: list[BaseException] = field(default_factory=list)
    load_error: BaseException | None = None
    unload_gate: asyncio.Event | None = None
    calls: list[str] = field(default_factory=list)
    nodes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    pods: dict[str, list[list[str]]] = field(default_factory=dict)
    unloading: asyncio.Event = field(default_factory=asyncio.Event)

    def _called(self, name: str) -> None:
        self.calls.append(name)
        self.nodes.setdefault(name, []).append(self.api.node(NODE))
        self.pods.setdefault(name, []).append(
            sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in self.api.pods(NODE))
        )

    async def host_driver(self) -> str | None:
        self._called("host_driver")
        return self.host

    async def loaded(self) -> bool:
        self._called("loaded")
        return self.is_loaded

    async def digest_matches(self) -> bool:
        self._called("digest_matches")
        return self.digest

    async def users(self) -> list[DriverUser]:
        self._called("users")
        return []

    async def unload(self) -> None:
        self._called("unload")
        self.unloading.set()
        if self.unload_gate is not None:
            await self.unload_gate.wait()
        if self.unload_errors:
            raise self.unload_errors.pop(0)
        self.is_loaded = False

    async def load(self) -> None:
        self._called("load")
        if self.load_error is not None:
            raise self.load_error
        self.is_loaded = True


IN_USE = DriverInUse(
    [
        DriverUser("process", "python", pid=4242, detail="/dev/nvidia0"),
        DriverUser("module", "nvidia_uvm", detail="refcnt 1"),
    ]
)


def kube(tmp_path: Path) -> Kube:
    return Kube(NODE, load_kubeconfig(str(tmp_path / "kubeconfig")), backoff=(0.01, 0.05))


async def upgrade(tmp_path: Path, ops: FakeOps, **options: Any) -> UpgradeOutcome:
    k = kube(tmp_path)
    try:
        return await DriverUpgrade(k, ops, UpgradeOptions(**{**FAST, **options})).run()
    finally:
        await k.aclose()


def assert_restored(api: FakeApiServer, before: dict[str, str], *, still_cordoned: bool = False) -> None:
    assert labels(api) == before
    assert cordoned(api) is still_cordoned
    assert RECORD_ANNOTATION not in annotations(api)
    assert PAUSE_ANNOTATION not in annotations(api)


# -- the easy cases: nothing to drain --------------------------------------------------------------------
async def test_a_host_driver_labels_the_node_and_does_nothing_else(
    api: FakeApiServer, tmp_path: Path
) -> None:
    before = labels(api)
    ops = FakeOps(api, host="550.54.15")
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "pre-installed"
    assert outcome.ok
    assert ops.calls == ["host_driver"]
    assert labels(api) == {**before, DRIVER: "pre-installed"}
    assert node_patches(api) == 1  # the label; nothing paused, no cordon, no record
    assert not cordoned(api)
    assert workloads(api) == WORKLOADS


async def test_no_driver_loaded_loads_without_draining(api: FakeApiServer, tmp_path: Path) -> None:
    ops = FakeOps(api, is_loaded=False)
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "loaded"
    assert ops.calls == ["host_driver", "loaded", "load"]
    assert node_patches(api) == 0
    assert evictions(api) == 0
    assert workloads(api) == WORKLOADS


async def test_a_matching_digest_keeps_the_driver_and_pauses_nothing(
    api: FakeApiServer, tmp_path: Path
) -> None:
    before = labels(api)
    ops = FakeOps(api, digest=True)
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "kept"
    assert ops.calls == ["host_driver", "loaded", "digest_matches"]
    assert node_patches(api) == 0
    assert labels(api) == before
    assert workloads(api) == WORKLOADS


# -- the full upgrade ------------------------------------------------------------------------------------
@pytest.mark.parametrize("force_reinstall", [False, True], ids=["digest-changed", "force-reinstall"])
async def test_the_full_upgrade_evicts_only_gpu_pods_and_puts_everything_back(
    api: FakeApiServer, tmp_path: Path, force_reinstall: bool
) -> None:
    api.pod_deletion_delay = 0.2  # pods take a moment to terminate, as real ones do
    before = labels(api)
    ops = FakeOps(api, digest=force_reinstall)  # with FORCE_REINSTALL even a matching driver goes
    outcome = await upgrade(tmp_path, ops, force_reinstall=force_reinstall)
    assert outcome.result == "upgraded", outcome.reason
    expected = (
        ["host_driver", "loaded"] + ([] if force_reinstall else ["digest_matches"]) + ["unload", "load"]
    )
    assert ops.calls == expected

    # while unloading: operands paused and gone, node cordoned and recorded, GPU pods gone
    node = ops.nodes["unload"][0]
    now = node["metadata"]["labels"]
    assert now[DP] == now[GFD] == now[EXP] == now[VAL] == now[TK] == PAUSED
    assert now[DCGM] == "false"  # false stays false
    assert now[DRIVER] == "true"  # the driver's own label is not an operand
    assert "nvidia.com/gpu.deploy.nvsm" not in now  # absent is not created
    assert node["spec"]["unschedulable"] is True
    record = json.loads(node["metadata"]["annotations"][RECORD_ANNOTATION])
    assert record["cordoned"] is True
    assert record["step"] == "unload"
    assert record["started"]
    assert json.loads(node["metadata"]["annotations"][PAUSE_ANNOTATION])["owner"] == OWNER
    assert ops.pods["unload"][0] == [
        "monitoring/gpu-monitor",
        "web/frontend",
    ]  # CPU pod and DaemonSet pod stay

    # afterwards: everything back
    assert outcome.evicted == ("ml/mig-job", "ml/trainer")
    assert evictions(api) == 2  # through the Eviction API, not a plain delete
    assert_restored(api, before)
    assert workloads(api) == ["monitoring/gpu-monitor", "web/frontend"]
    assert api.wait_for(lambda: len(operand_pods(api)) == 5)  # the DaemonSets bring the operands back


async def test_a_node_an_administrator_cordoned_stays_cordoned(api: FakeApiServer, tmp_path: Path) -> None:
    api.patch_node(NODE, {"spec": {"unschedulable": True}})
    before = labels(api)
    ops = FakeOps(api)
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "upgraded", outcome.reason
    record = json.loads(ops.nodes["unload"][0]["metadata"]["annotations"][RECORD_ANNOTATION])
    assert record["cordoned"] is False
    assert_restored(api, before, still_cordoned=True)


# -- pods that may not or do not leave -------------------------------------------------------------------
async def test_an_unmanaged_gpu_pod_stops_the_upgrade_before_anything_is_evicted(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.add_pod("ml", "notebook", node=NODE, requests={"nvidia.com/gpu": "1"})  # no controller
    before = labels(api)
    ops = FakeOps(api)
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "failed"
    assert outcome.step == "evict-gpu-pods"
    assert "ml/notebook" in outcome.reason
    assert "DRAIN_USE_FORCE=true" in outcome.reason
    assert "unload" not in ops.calls
    assert evictions(api) == 0  # all or nothing, as kubectl drain
    assert "ml/trainer" in workloads(api)
    assert_restored(api, before)


async def test_drain_use_force_evicts_unmanaged_gpu_pods(api: FakeApiServer, tmp_path: Path) -> None:
    api.add_pod("ml", "notebook", node=NODE, requests={"nvidia.com/gpu": "1"})
    before = labels(api)
    outcome = await upgrade(tmp_path, FakeOps(api), drain_use_force=True)
    assert outcome.result == "upgraded", outcome.reason
    assert outcome.evicted == ("ml/mig-job", "ml/notebook", "ml/trainer")
    assert_restored(api, before)


def add_pod_with_scratch(api: FakeApiServer) -> None:
    pod = api.add_pod(
        "ml",
        "scratchy",
        node=NODE,
        requests={"nvidia.com/gpu": "1"},
        owner_kind="ReplicaSet",
        owner_name="rs",
    )
    api.delete("pods", "scratchy", "ml")
    pod["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    for key in ("resourceVersion", "uid", "creationTimestamp", "deletionTimestamp"):
        pod["metadata"].pop(key, None)
    api.create("pods", pod)


async def test_a_gpu_pod_with_emptydir_data_blocks_unless_allowed(api: FakeApiServer, tmp_path: Path) -> None:
    add_pod_with_scratch(api)
    before = labels(api)
    outcome = await upgrade(tmp_path, FakeOps(api))
    assert outcome.result == "failed"
    assert "ml/scratchy" in outcome.reason
    assert "DRAIN_DELETE_EMPTYDIR_DATA" in outcome.reason
    assert evictions(api) == 0
    assert_restored(api, before)
    outcome = await upgrade(tmp_path, FakeOps(api), drain_delete_emptydir_data=True)
    assert outcome.result == "upgraded", outcome.reason
    assert "ml/scratchy" in outcome.evicted


async def test_auto_drain_is_not_tried_for_a_pod_it_could_not_evict_either(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.add_pod("ml", "notebook", node=NODE, requests={"nvidia.com/gpu": "1"})
    before = labels(api)
    outcome = await upgrade(tmp_path, FakeOps(api), auto_drain=True)
    assert outcome.result == "failed"
    assert "ml/notebook" in outcome.reason
    assert "not tried" in outcome.reason
    assert "web/frontend" in workloads(api)  # no collateral eviction for nothing
    assert_restored(api, before)


async def test_gpu_pods_that_outlive_the_drain_timeout_fail_the_upgrade_naming_them(
    api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpunode.driver_loader.upgrade")
    api.pod_deletion_delay = 1.5  # a long grace period
    before = labels(api)
    ops = FakeOps(api)
    outcome = await upgrade(tmp_path, ops, drain_timeout=0.3)
    assert outcome.result == "failed"
    assert "ml/trainer (terminating)" in outcome.reason
    assert "ml/mig-job (terminating)" in outcome.reason
    assert "ENABLE_AUTO_DRAIN" in outcome.reason
    assert "unload" not in ops.calls
    assert_restored(api, before)
    progress = [e for e in events(caplog) if e["event"] == "driver_upgrade_evicting"]
    assert progress[0]["pods_left"] == 2
    assert progress[0]["pods"] == ["ml/mig-job", "ml/trainer"]
    assert progress[-1]["waited_s"] >= 0.2  # shown while waiting, every progress_interval
    failed = [e for e in events(caplog) if e["event"] == "driver_upgrade_failed"]
    assert failed[0]["step"] == "evict-gpu-pods"


async def test_auto_drain_drains_the_node_when_a_disruption_budget_holds_a_gpu_pod(
    api: FakeApiServer, tmp_path: Path
) -> None:
    # A budget that never relents: the GPU pass times out, the node is drained (the CPU pod goes too),
    # and the budget still holds the pod, so the upgrade fails naming it, with everything put back.
    api.fail_next(100_000, status=429, path_contains="/namespaces/ml/pods/trainer/eviction")
    before = labels(api)
    ops = FakeOps(api)
    outcome = await upgrade(tmp_path, ops, auto_drain=True, drain_timeout=0.4)
    assert outcome.result == "failed"
    assert outcome.step == "drain-node"
    assert "ml/trainer (eviction refused by a PodDisruptionBudget" in outcome.reason
    assert workloads(api) == ["ml/trainer", "monitoring/gpu-monitor"]  # drained but for the held pod
    assert "web/frontend" in outcome.evicted
    assert "unload" not in ops.calls
    assert_restored(api, before)


async def test_a_disruption_budget_429_is_retried(api: FakeApiServer, tmp_path: Path) -> None:
    api.fail_next(3, status=429, path_contains="/eviction")
    before = labels(api)
    outcome = await upgrade(tmp_path, FakeOps(api))
    assert outcome.result == "upgraded", outcome.reason
    assert evictions(api, 429) == 3
    assert evictions(api, 201) == 2
    assert workloads(api) == ["monitoring/gpu-monitor", "web/frontend"]
    assert_restored(api, before)


async def test_a_forbidden_eviction_fails_saying_what_to_grant(api: FakeApiServer, tmp_path: Path) -> None:
    api.forbid("create", "pods/eviction")
    before = labels(api)
    ops = FakeOps(api)
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "failed"
    assert "pods/eviction" in outcome.reason
    assert "grant" in outcome.reason
    assert "unload" not in ops.calls
    assert_restored(api, before)


# -- the driver in use -----------------------------------------------------------------------------------
async def test_a_driver_in_use_fails_listing_its_users(api: FakeApiServer, tmp_path: Path) -> None:
    before = labels(api)
    ops = FakeOps(api, unload_errors=[IN_USE])
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "failed"
    assert outcome.step == "unload"
    assert "python (pid 4242, /dev/nvidia0)" in outcome.reason
    assert "module nvidia_uvm" in outcome.reason
    assert "monitoring/gpu-monitor (DaemonSet" in outcome.reason  # the GPU pod left on the node
    assert "ENABLE_AUTO_DRAIN=true" in outcome.reason
    assert ops.calls[-1] == "unload"  # no load
    assert_restored(api, before)


async def test_a_driver_in_use_with_auto_drain_drains_the_node_and_retries_once(
    api: FakeApiServer, tmp_path: Path
) -> None:
    before = labels(api)
    ops = FakeOps(api, unload_errors=[IN_USE])
    outcome = await upgrade(tmp_path, ops, auto_drain=True)
    assert outcome.result == "upgraded", outcome.reason
    assert ops.calls[-3:] == ["unload", "unload", "load"]
    assert ops.pods["unload"][1] == ["monitoring/gpu-monitor"]  # the whole node drained but DaemonSet pods
    assert outcome.evicted == ("ml/mig-job", "ml/trainer", "web/frontend")
    assert_restored(api, before)


async def test_a_driver_still_in_use_after_the_drain_fails(api: FakeApiServer, tmp_path: Path) -> None:
    before = labels(api)
    ops = FakeOps(api, unload_errors=[IN_USE, IN_USE])
    outcome = await upgrade(tmp_path, ops, auto_drain=True)
    assert outcome.result == "failed"
    assert "even after draining the node" in outcome.reason
    assert ops.calls.count("unload") == 2
    assert "load" not in ops.calls
    assert_restored(api, before)


async def test_with_the_upgrade_controller_in_charge_nothing_is_evicted(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.patch_node(NODE, {"metadata": {"annotations": {"nvidia.com/gpu-driver-upgrade-enabled": "true"}}})
    before = labels(api)
    ops = FakeOps(api, unload_errors=[IN_USE])
    outcome = await upgrade(tmp_path, ops, auto_drain=True)
    assert outcome.result == "failed"
    assert "nvidia.com/gpu-driver-upgrade-state=upgrade-required" in outcome.reason
    assert ops.nodes["unload"][0]["spec"].get("unschedulable") is None  # not cordoned
    assert "ml/trainer" in ops.pods["unload"][0]
    assert evictions(api) == 0
    assert_restored(api, before)


async def test_a_failing_load_restores(api: FakeApiServer, tmp_path: Path) -> None:
    before = labels(api)
    ops = FakeOps(api, load_error=RuntimeError("modprobe nvidia failed: Key was rejected by service"))
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "failed"
    assert outcome.step == "load"
    assert "Key was rejected by service" in outcome.reason
    assert_restored(api, before)


async def test_a_custom_eviction_label_is_paused_and_restored(api: FakeApiServer, tmp_path: Path) -> None:
    custom = "example.com/gpu-workload"
    api.patch_node(NODE, {"metadata": {"labels": {custom: "inference"}}})
    api.add_daemonset("serving", "triton", {custom: "inference"}, {"app": "triton"})
    assert api.wait_for(lambda: any(p["metadata"]["namespace"] == "serving" for p in api.pods(NODE)))
    before = labels(api)
    ops = FakeOps(api)
    outcome = await upgrade(tmp_path, ops, eviction_label=custom)
    assert outcome.result == "upgraded", outcome.reason
    assert ops.nodes["unload"][0]["metadata"]["labels"][custom] == PAUSED
    assert not any(p.startswith("serving/") for p in ops.pods["unload"][0])
    assert_restored(api, before)


# -- interrupted runs ------------------------------------------------------------------------------------
async def test_cancellation_mid_flight_uncordons_and_restores(api: FakeApiServer, tmp_path: Path) -> None:
    before = labels(api)
    ops = FakeOps(api, unload_gate=asyncio.Event())  # unload never returns
    k = kube(tmp_path)
    try:
        task = asyncio.create_task(DriverUpgrade(k, ops, UpgradeOptions(**FAST)).run())
        await asyncio.wait_for(ops.unloading.wait(), 10)
        assert cordoned(api)
        assert labels(api)[DP] == PAUSED
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert_restored(api, before)
    finally:
        await k.aclose()


def leave_a_crashed_run(api: FakeApiServer, *, we_cordoned: bool = True) -> dict[str, str]:
    """The node as a run killed during the unload leaves it: operands paused with their record, the node
    cordoned, our record. Returns the labels as they were before."""
    before = labels(api)
    previous = {DP: "true", GFD: "true", EXP: "true", VAL: "true", TK: "true"}
    pause = PauseRecord(OWNER, PAUSE_REASON, previous, "2025-01-01T00:00:00Z", time.time() + 3600)
    record = {"cordoned": we_cordoned, "started": "2025-01-01T00:00:00Z", "step": "unload"}
    api.patch_node(
        NODE,
        {
            "metadata": {
                "labels": dict.fromkeys(previous, PAUSED),
                "annotations": {PAUSE_ANNOTATION: pause.to_json(), RECORD_ANNOTATION: json.dumps(record)},
            },
            "spec": {"unschedulable": True},
        },
    )
    return before


@pytest.mark.parametrize("we_cordoned", [True, False], ids=["our-cordon", "an-admins-cordon"])
async def test_the_next_run_finishes_a_crashed_one_before_anything_else(
    api: FakeApiServer, tmp_path: Path, we_cordoned: bool
) -> None:
    before = leave_a_crashed_run(api, we_cordoned=we_cordoned)
    ops = FakeOps(api, digest=True)
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "kept"
    assert outcome.recovered
    first = ops.nodes["host_driver"][0]  # the node as the first driver call saw it: already recovered
    assert first["metadata"]["labels"] == before
    assert bool(first["spec"].get("unschedulable")) is not we_cordoned
    assert RECORD_ANNOTATION not in first["metadata"].get("annotations", {})
    assert_restored(api, before, still_cordoned=not we_cordoned)


CRASHER = textwrap.dedent(
    """
    import asyncio, sys
    from gpunode.kube.client import Kube, load_kubeconfig
    from gpunode.driver_loader.upgrade import DriverUpgrade
    from gpunode.driver_loader.upgrade_state import UpgradeOptions

    class Ops:
        async def host_driver(self): return None
        async def loaded(self): return True
        async def digest_matches(self): return False
        async def users(self): return []
        async def load(self): pass
        async def unload(self):
            print("unloading", flush=True)
            await asyncio.sleep(3600)

    async def main():
        kube = Kube("node-1", load_kubeconfig(sys.argv[1]), backoff=(0.01, 0.05))
        await DriverUpgrade(kube, Ops(), UpgradeOptions(poll=0.05, evict_retry=0.05)).run()

    asyncio.run(main())
    """
)


async def test_a_killed_run_is_finished_by_the_next_one(api: FakeApiServer, tmp_path: Path) -> None:
    before = labels(api)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CRASHER,
        str(tmp_path / "kubeconfig"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"unloading"
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no finally blocks run: a crash
        await asyncio.wait_for(proc.wait(), 10)
    assert cordoned(api)
    assert labels(api)[DP] == PAUSED
    assert RECORD_ANNOTATION in annotations(api)
    ops = FakeOps(api, is_loaded=False)
    outcome = await upgrade(tmp_path, ops)
    assert outcome.result == "loaded"
    assert outcome.recovered
    assert ops.nodes["host_driver"][0]["metadata"]["labels"] == before
    assert_restored(api, before)


async def test_an_api_server_still_coming_up_is_waited_for(api: FakeApiServer, tmp_path: Path) -> None:
    api.fail_next(7, status=503, method="GET")  # more than the client's own five attempts
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(0.01)

    k = kube(tmp_path)
    try:
        ops = FakeOps(api, digest=True)
        outcome = await DriverUpgrade(k, ops, UpgradeOptions(**FAST), sleep=sleep).run()
    finally:
        await k.aclose()
    assert outcome.result == "kept"
    assert slept == [1.0]


# -- the entry point -------------------------------------------------------------------------------------
def values(environ: dict[str, str]) -> UpgradeSettings:
    parser = SettingsParser(UpgradeSettings, prog="gpunode-driver-loader upgrade")
    return parser.parse([], environ, exit_on_error=False).settings


async def test_run_upgrade_exit_codes(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = str(tmp_path / "kubeconfig")
    assert await run_upgrade(values({"KUBECONFIG": kubeconfig}), FakeOps(api)) == 2
    assert "NODE_NAME" in capsys.readouterr().err

    env = {"KUBECONFIG": kubeconfig, "NODE_NAME": NODE, "DRAIN_TIMEOUT_SECONDS": "0s"}
    assert await run_upgrade(values(env), FakeOps(api, is_loaded=False)) == 0

    ops = FakeOps(api, unload_errors=[IN_USE])
    assert await run_upgrade(values(env), ops) == 1
    err = capsys.readouterr().err
    assert "driver upgrade failed at step unload" in err
    assert "python (pid 4242" in err
    assert not cordoned(api)


async def test_the_flags_do_not_load_the_kubernetes_client() -> None:
    # The driver loader adds these flags on every start; lightkube costs about 0.3 s and 30 MB.
    code = (
        "import sys; from gpunode.driver_loader import cli, settings, upgrade, upgrade_state; "
        "from gpunode.common.settings import SettingsParser; "
        "SettingsParser(settings.UpgradeSettings, prog='x'); "
        "print('lightkube' in sys.modules, len(upgrade_state.DRIVER_OPERANDS))"
    )
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert out.split() == [b"False", b"16"]

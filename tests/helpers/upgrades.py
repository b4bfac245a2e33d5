"""A simulated cluster for the driver upgrade controller: GPU nodes on the test API server, a driver
DaemonSet (OnDelete, as rendered) whose pods the server's miniature controller replaces, optionally a
validator DaemonSet, the ClusterPolicy with its ``driver.upgradePolicy``, and :class:`LimitChecker`, which
sees every write the server records and checks both limits after each one."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.api.clusterpolicy_crd import crd
from gpunode.kube.client import Kube
from gpunode.operator import upgrade_plan as plan
from gpunode.operator.upgrade import PassResult, UpgradeController, run_upgrades
from gpunode.sim.apiserver import FakeApiServer, WatchEvent

NS = "gpunode"
POLICY = "cluster-policy"
DRIVER = "gpunode-driver-loader"
DRIVER_LABELS = {"app.kubernetes.io/name": DRIVER, "app.kubernetes.io/part-of": "gpunode"}
VALIDATOR_LABELS = {"app.kubernetes.io/name": "gpunode-validator"}
GPU_LABELS = {"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.deploy.driver": "true"}
ACTIVE = frozenset(plan.ACTIVE_STATES)


def driver_daemonset(version: str = "570.1") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": DRIVER, "namespace": NS, "labels": dict(DRIVER_LABELS)},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": DRIVER}},
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"labels": dict(DRIVER_LABELS)},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
                    "containers": [
                        {
                            "name": "driver",
                            "image": "gpunode:dev",
                            "command": [DRIVER, "init"],
                            "env": [
                                {"name": "DRIVER_VERSION", "value": version},
                                {"name": "LOG_LEVEL", "value": "info"},
                            ],
                        }
                    ],
                },
            },
        },
    }


def validator_daemonset() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "gpunode-validator", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": dict(VALIDATOR_LABELS)},
            "template": {
                "metadata": {"labels": dict(VALIDATOR_LABELS)},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
                    "containers": [{"name": "validator", "image": "gpunode:dev"}],
                },
            },
        },
    }


def ready_status(pod: dict[str, Any]) -> dict[str, Any]:
    """A daemon pod that started and passed its readiness probe, as a kubelet reports it."""
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def cluster_policy(upgrade: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": POLICY},
        "spec": {"driver": {"enabled": True, "upgradePolicy": upgrade}},
    }


def set_driver_env(api: FakeApiServer, name: str, value: str) -> None:
    """A change of what the driver installs (an env var of its container)."""
    ds = api.get("DaemonSet", DRIVER, NS)
    assert ds is not None
    container = ds["spec"]["template"]["spec"]["containers"][0]
    env = [e for e in container["env"] if e["name"] != name] + [{"name": name, "value": value}]
    container["env"] = env
    api.patch("DaemonSet", DRIVER, {"spec": {"template": ds["spec"]["template"]}}, NS)


def set_driver_pod_label(api: FakeApiServer, key: str, value: str) -> None:
    """A change of the driver pods only (a label of the template): a new revision, the same install."""
    api.patch("DaemonSet", DRIVER, {"spec": {"template": {"metadata": {"labels": {key: value}}}}}, NS)


@dataclass
class LimitChecker:
    """Every recorded Node write, in order: after each one, upgrades in progress (state label in an
    active state) <= ``max_parallel`` (0: unlimited) and nodes unavailable (cordoned by the upgrade, or
    NotReady) <= ``max_unavailable``. Runs under the server's lock, so it sees every instant."""

    max_parallel: int
    max_unavailable: int
    nodes: dict[str, tuple[bool, bool]] = field(default_factory=dict)  # name -> (active, unavailable)
    states: dict[str, str] = field(default_factory=dict)  # name -> its state label ("" without)
    active: int = 0
    unavailable: int = 0
    peak_active: int = 0
    peak_unavailable: int = 0
    violations: list[str] = field(default_factory=list)
    writes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, event: WatchEvent) -> None:
        if event.resource != "nodes":
            return
        self.writes += 1
        meta = event.obj.get("metadata") or {}
        name = str(meta.get("name"))
        old = self.nodes.pop(name, (False, False))
        self.active -= old[0]
        self.unavailable -= old[1]
        self.states.pop(name, None)
        if event.type != "DELETED":
            labels = meta.get("labels") or {}
            self.states[name] = str(labels.get(plan.STATE_LABEL, ""))
            annotations = meta.get("annotations") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (event.obj.get("status") or {}).get("conditions") or []
            )
            cordoned = bool((event.obj.get("spec") or {}).get("unschedulable")) and (
                annotations.get(plan.CORDONED_BY_US_ANNOTATION) == "true"
            )
            now = (labels.get(plan.STATE_LABEL) in ACTIVE, cordoned or not ready)
            self.nodes[name] = now
            self.active += now[0]
            self.unavailable += now[1]
        self.peak_active = max(self.peak_active, self.active)
        self.peak_unavailable = max(self.peak_unavailable, self.unavailable)
        if self.max_parallel and self.active > self.max_parallel:
            self.violations.append(f"rv {event.rv}: {self.active} upgrading > {self.max_parallel}")
        if self.unavailable > self.max_unavailable:
            self.violations.append(f"rv {event.rv}: {self.unavailable} unavailable > {self.max_unavailable}")


@dataclass
class UpgradeCluster:
    api: FakeApiServer
    kube: Kube
    controller: UpgradeController
    checker: LimitChecker
    kubeconfig: Path
    passes: list[PassResult] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def states(self) -> dict[str, str]:
        """Each node's state label as of the last write (the checker's record: no copies of the nodes)."""
        return dict(self.checker.states)

    def node(self, name: str) -> dict[str, Any]:
        return self.api.node(name)

    def start(self, controller: UpgradeController | None = None) -> None:
        """(Re)start the controller loop: a fresh controller object knows only what the cluster says."""
        if controller is not None:
            self.controller = controller
        self.task = asyncio.create_task(run_upgrades(self.controller, on_pass=self.passes.append))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None

    def new_controller(self, **kw: Any) -> UpgradeController:
        return UpgradeController(self.kube, namespace=NS, **kw)

    async def until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            if loop.time() > deadline:
                raise AssertionError(f"not reached in {timeout} s; states: {self.summary()}")
            await asyncio.sleep(0.02)

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.states().values():
            out[s or "-"] = out.get(s or "-", 0) + 1
        return out


@contextlib.asynccontextmanager
async def upgrade_cluster(
    tmp_path: Path,
    nodes: int,
    upgrade: dict[str, Any],
    *,
    validator: bool = False,
    start: bool = True,
    history: int = 1000,
    prepare: Callable[[FakeApiServer], None] = lambda api: None,
) -> AsyncIterator[UpgradeCluster]:
    """``nodes`` GPU nodes each with a driver pod at the first revision, the policy, the controller
    running (``start``) with the checker attached to the server."""
    total = nodes
    try:
        limit = plan.max_unavailable(upgrade.get("maxUnavailable", "25%"), total)
    except plan.LimitError:
        limit = 0  # a bad limit: the controller refuses it, and no node may become unavailable
    checker = LimitChecker(int(upgrade.get("maxParallelUpgrades", 1)), limit)
    with FakeApiServer(history=history) as api:
        api.observers.append(checker)
        api.apply("CustomResourceDefinition", crd(), manager="test")
        api.create("ClusterPolicy", cluster_policy(upgrade))
        for i in range(nodes):
            api.add_node(f"gpu-{i:04}", labels={"kubernetes.io/hostname": f"gpu-{i:04}", **GPU_LABELS})
        api.create("DaemonSet", driver_daemonset())
        if validator:
            api.create("DaemonSet", validator_daemonset())
        api.daemon_pod_status = ready_status
        prepare(api)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Kube.connect_cluster(str(kubeconfig), namespace=NS, backoff=(0.01, 0.05))
        c = UpgradeCluster(api, kube, UpgradeController(kube, namespace=NS), checker, kubeconfig)
        try:
            if start:
                c.start()
            yield c
        finally:
            await c.stop()
            await kube.aclose()

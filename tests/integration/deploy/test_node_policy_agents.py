"""The node policies admit what the agents really write: the device plugin's config report, the MIG
manager's state label and operand pause (and its restoring a pause the driver manager left behind), the
driver manager's host-driver label and a whole upgrade (record, cordon, pause, evictions, restore,
uncordon), each run by the agent's own code against the test API server. Every node write is recorded
(the node before and after) and evaluated with the agent's rendered ValidatingAdmissionPolicy, its token
bound to a pod on that node. The other node is never touched, and every pod list the agents make is
scoped to their node by a field selector (admission does not see reads: the RBAC tables rely on it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpunode.api.clusterpolicy import load_policy
from gpunode.common.logging import get_logger
from gpunode.common.settings import CommonSettings, KubeSettings
from gpunode.deploy.render import render
from gpunode.driver_loader.ops import DriverUser
from gpunode.driver_loader.upgrade import DriverUpgrade
from gpunode.driver_loader.upgrade_state import UpgradeOptions
from gpunode.kube import client as kube_client
from gpunode.kube.api import NodeInfo
from gpunode.kube.client import Kube, load_kubeconfig
from gpunode.kube.labelconfig import LabelConfig, LabelConfigOptions
from gpunode.kube.operands import RECORD_ANNOTATION, PauseRecord
from gpunode.mig.kube_mode import MigNodeState, PausedOperands, connect_kube
from gpunode.sim.apiserver import FakeApiServer
from helpers.admission import denials

POLICIES = Path(__file__).resolve().parents[3] / "containers" / "policies"
NODE, OTHER = "node-1", "node-2"
NS = "gpu-operator"
PREFIX = "nvidia.com/gpu.deploy."
OPERANDS = {
    "device-plugin": "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery": "gpu-feature-discovery",
    "dcgm-exporter": "nvidia-dcgm-exporter",
    "operator-validator": "nvidia-operator-validator",
    "container-toolkit": "nvidia-container-toolkit-daemonset",
}
POLICY = {
    o["metadata"]["name"].removesuffix("-own-node"): o
    for o in render(load_policy(POLICIES / "mig-mixed-timeslicing.yaml").policy)
    if o["kind"] == "ValidatingAdmissionPolicy"
}


class Recording(Kube):
    """The agents' client, noting the node before and after each of its writes."""

    api: ClassVar[FakeApiServer]
    writes: ClassVar[list[tuple[dict[str, Any], dict[str, Any]]]] = []

    async def patch_node(self, **kw: Any) -> NodeInfo:
        before = self.api.node(self.node_name)
        try:
            return await super().patch_node(**kw)
        finally:
            self.writes.append((before, self.api.node(self.node_name)))

    async def set_unschedulable(self, unschedulable: bool) -> NodeInfo:
        before = self.api.node(self.node_name)
        try:
            return await super().set_unschedulable(unschedulable)
        finally:
            self.writes.append((before, self.api.node(self.node_name)))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    """node-1 with the operands as DaemonSets and two GPU pods; node-2 beside it."""
    with FakeApiServer() as server:
        deploy = {PREFIX + name: "true" for name in OPERANDS} | {PREFIX + "driver": "true"}
        for name in (NODE, OTHER):
            server.add_node(
                name, labels={"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true", **deploy}
            )
        server.write_kubeconfig(tmp_path / "kubeconfig")
        for name, app in OPERANDS.items():
            server.add_daemonset(NS, app, {PREFIX + name: "true"}, {"app": app})
        gpu = {"nvidia.com/gpu": "1"}
        server.add_pod(
            "ml", "trainer", node=NODE, requests=gpu, owner_kind="ReplicaSet", owner_name="trainer-7d"
        )
        server.add_pod(
            "ml", "other-trainer", node=OTHER, requests=gpu, owner_kind="ReplicaSet", owner_name="o"
        )
        assert server.wait_for(lambda: len(server.pods(NODE)) == 6)
        Recording.api = server
        Recording.writes = []
        yield server


def kube(tmp_path: Path) -> Recording:
    return Recording(NODE, load_kubeconfig(str(tmp_path / "kubeconfig")), backoff=(0.01, 0.05))


def assert_admitted(agent: str, writes: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    assert writes, "the flow wrote nothing"
    user = f"system:serviceaccount:gpunode:{agent}"
    for before, after in writes:
        assert denials(POLICY[agent], before, after, user=user, node_claim=[NODE]) == [], (before, after)
        # and the same write by the same agent's token from another node is refused
        assert denials(POLICY[agent], before, after, user=user, node_claim=[OTHER]), (before, after)


def assert_scoped(api: FakeApiServer, before: dict[str, Any], *, pod_lists: bool = False) -> None:
    """node-2 untouched; every pod list (``pod_lists``: there were some) scoped to node-1; no node list."""
    assert api.node(OTHER) == before
    lists = [r for r in api.requests if r.method == "GET" and r.path.endswith("/pods")]
    assert bool(lists) is pod_lists
    for r in lists:
        assert r.query.get("fieldSelector") == f"spec.nodeName={NODE}", r
    assert not [r for r in api.requests if r.method == "GET" and r.path.endswith("/nodes")]


async def test_the_device_plugins_config_report(api: FakeApiServer, tmp_path: Path) -> None:
    other = api.node(OTHER)
    k = kube(tmp_path)
    try:
        configs = LabelConfig(
            LabelConfigOptions(tmp_path),
            lambda _path: None,
            log=get_logger("test"),
            count_error=lambda _reason: None,
            kube=k,
            report=True,
        )
        await configs.report_final("no usable config")
    finally:
        await k.aclose()
    annotations = api.node(NODE)["metadata"]["annotations"]
    assert annotations["nvidia.com/device-plugin.config.state"] == "failed: no usable config"
    assert_admitted("gpunode-device-plugin", Recording.writes)
    assert_scoped(api, other)


async def test_the_mig_manager_pauses_sets_its_state_and_restores(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = api.node(OTHER)
    monkeypatch.setattr(kube_client, "Kube", Recording)  # connect_kube builds the client it always builds
    common = CommonSettings(node_name=NODE)
    settings = KubeSettings(
        kubeconfig=str(tmp_path / "kubeconfig"), namespace="gpunode", kube_api_timeout=5.0
    )
    k, pauser = connect_kube(common, settings)
    assert isinstance(k, Recording)
    pauser.poll = 0.05
    try:
        state = MigNodeState(k)
        await state.set("pending", "", "all-balanced")
        async with PausedOperands(pauser).paused(10.0):
            labels = api.node(NODE)["metadata"]["labels"]
            assert labels[PREFIX + "device-plugin"] == "paused-for-mig-change"
            await state.set("failed", "GPU 3: in use", "all-balanced")
        await state.set("success", "", "all-balanced")
    finally:
        await k.aclose()
    assert api.node(NODE)["metadata"]["labels"][PREFIX + "device-plugin"] == "true"
    assert_admitted("gpunode-mig-manager", Recording.writes)
    assert_scoped(api, other, pod_lists=True)  # it waited for the operand pods to leave


async def test_the_mig_manager_restores_a_pause_the_driver_manager_left(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver manager that died mid-upgrade left its operands paused; the MIG manager, starting after
    the lease ran out, puts them back: the driver's operand labels are the MIG manager's to restore too."""
    other = api.node(OTHER)
    paused = {PREFIX + n: "paused-for-driver-upgrade" for n in ("container-toolkit", "operator-validator")}
    record = PauseRecord(
        "gpunode-driver-manager", "driver-upgrade", {k: "true" for k in paused}, "2026-01-01T00:00:00Z", 1.0
    )
    api.patch_node(
        NODE, {"metadata": {"labels": paused, "annotations": {RECORD_ANNOTATION: record.to_json()}}}
    )
    monkeypatch.setattr(kube_client, "Kube", Recording)
    k, pauser = connect_kube(
        CommonSettings(node_name=NODE),
        KubeSettings(kubeconfig=str(tmp_path / "kubeconfig"), namespace="gpunode"),
    )
    try:
        assert await pauser.recover() == {k: "true" for k in paused}
    finally:
        await k.aclose()
    assert_admitted("gpunode-mig-manager", Recording.writes)
    assert_scoped(api, other)


@dataclass
class FakeOps:
    """The driver's host operations, recorded; the driver is loaded with another configuration."""

    host: str | None = None
    is_loaded: bool = True
    calls: list[str] = field(default_factory=list)

    async def host_driver(self) -> str | None:
        self.calls.append("host_driver")
        return self.host

    async def loaded(self) -> bool:
        return self.is_loaded

    async def digest_matches(self) -> bool:
        return False

    async def users(self) -> list[DriverUser]:
        return []

    async def unload(self) -> None:
        self.calls.append("unload")
        self.is_loaded = False

    async def load(self) -> None:
        self.calls.append("load")
        self.is_loaded = True


FAST = {
    "poll": 0.05,
    "evict_retry": 0.05,
    "operand_timeout": 10.0,
    "drain_timeout": 10.0,
    "progress_interval": 0.2,
}


async def test_a_whole_driver_upgrade(api: FakeApiServer, tmp_path: Path) -> None:
    api.pod_deletion_delay = 0.1
    other = api.node(OTHER)
    k = kube(tmp_path)
    try:
        outcome = await DriverUpgrade(k, FakeOps(), UpgradeOptions(**FAST)).run()
    finally:
        await k.aclose()
    assert outcome.result == "upgraded", outcome.reason
    assert outcome.evicted == ("ml/trainer",)
    written = [after for _, after in Recording.writes]
    assert any(n.get("spec", {}).get("unschedulable") for n in written)  # it did cordon
    assert not api.node(NODE).get("spec", {}).get("unschedulable")  # and uncordoned
    assert_admitted("gpunode-driver-loader", Recording.writes)
    assert_scoped(api, other, pod_lists=True)  # operand pods waited for, GPU pods found and evicted
    assert [p["metadata"]["name"] for p in api.pods(OTHER) if p["metadata"]["namespace"] == "ml"] == [
        "other-trainer"
    ]


async def test_a_host_driver_label(api: FakeApiServer, tmp_path: Path) -> None:
    other = api.node(OTHER)
    k = kube(tmp_path)
    try:
        outcome = await DriverUpgrade(k, FakeOps(host="580.1"), UpgradeOptions(**FAST)).run()
    finally:
        await k.aclose()
    assert outcome.result == "pre-installed"
    assert api.node(NODE)["metadata"]["labels"][PREFIX + "driver"] == "pre-installed"
    assert_admitted("gpunode-driver-loader", Recording.writes)
    assert_scoped(api, other)

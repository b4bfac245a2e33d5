"""The node-labelling controller against the test API server: real HTTP, list-and-watch, merge patches,
409s, 403s and outages; PATCH requests counted on the server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpunode.kube.client import Kube, load_kubeconfig
from gpunode.operator.labeller import NodeLabeller
from gpunode.operator.labels import (
    DEPLOY_OPERANDS,
    GPU_PRESENT,
    MIG_CONFIG,
    OWNED_ANNOTATION,
    WORKLOAD_OPERANDS,
    LabelPolicy,
)
from gpunode.sim.apiserver import FakeApiServer
from helpers.waiting import until

NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
D = "nvidia.com/gpu.deploy."
CONTAINER = {D + o: "true" for o in WORKLOAD_OPERANDS["container"]}
GPU_NODES = [f"gpu-{i:02d}" for i in range(20)]
CPU_NODES = [f"cpu-{i}" for i in range(5)]
PAUSED = "paused-for-mig-change"


@dataclass
class Running:
    api: FakeApiServer
    kube: Kube
    labeller: NodeLabeller

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.api.node(node)["metadata"].get("labels") or {})

    def annotations(self, node: str) -> dict[str, str]:
        return dict(self.api.node(node)["metadata"].get("annotations") or {})

    def owned(self, node: str) -> list[str]:
        return self.annotations(node).get(OWNED_ANNOTATION, "").split(",")

    def patches(self, node: str | None = None) -> int:
        return sum(
            1
            for r in self.api.requests
            if r.method == "PATCH"
            and r.path.startswith("/api/v1/nodes/")
            and (node is None or r.path == f"/api/v1/nodes/{node}")
        )

    async def settle(self, timeout: float = 10.0) -> None:
        """Until the labeller has seen every node as the server holds it and has nothing left to do."""

        def settled() -> bool:
            server = {
                n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in self.api.objects("Node")
            }
            cached = {name: n.resource_version for name, n in self.labeller.nodes.items()}
            return self.labeller.idle and server == cached

        await until(settled, timeout)

    async def full_pass(self) -> None:
        self.labeller.resync()
        await self.settle()


@contextlib.asynccontextmanager
async def running(
    api: FakeApiServer, tmp_path: Path, policy: LabelPolicy | None = None, **kube_kw: Any
) -> AsyncIterator[Running]:
    kube_kw.setdefault("backoff", (0.01, 0.05))
    kube = Kube("gpunode-operator", load_kubeconfig(str(tmp_path / "kubeconfig")), **kube_kw)
    labeller = NodeLabeller(kube, policy, retry=(0.02, 0.2))
    task = asyncio.create_task(labeller.run())
    try:
        yield Running(api, kube, labeller)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await kube.aclose()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for name in GPU_NODES:
            server.add_node(name, labels={**NFD, "kubernetes.io/hostname": name})
        for name in CPU_NODES:
            server.add_node(name, labels={"kubernetes.io/hostname": name})
        server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


async def test_one_patch_per_gpu_node_none_for_others_and_none_on_a_second_pass(
    api: FakeApiServer, tmp_path: Path
) -> None:
    async with running(api, tmp_path) as r:
        await r.settle()
        for name in GPU_NODES:
            assert r.patches(name) == 1, name
            labels = r.labels(name)
            assert labels[GPU_PRESENT] == "true"
            assert {k: labels[k] for k in CONTAINER} == CONTAINER
            assert D + "mig-manager" not in labels
            assert r.annotations(name)[OWNED_ANNOTATION] == ",".join(sorted(CONTAINER))
        for name in CPU_NODES:
            assert r.patches(name) == 0, name
            assert r.labels(name) == {"kubernetes.io/hostname": name}
        assert r.labeller.gpu_nodes() == GPU_NODES
        assert r.labeller.has_nfd_labels()
        assert r.labeller.stats.patched == 20
        assert r.labeller.problem() is None

        before = r.patches()
        for _ in range(3):
            await r.full_pass()
        assert r.patches() == before  # nothing changed: nothing written
    async with running(api, tmp_path) as r:  # a restarted operator: nothing to write either
        await r.settle()
        assert r.patches() == before


async def test_users_false_and_mig_managers_pause_survive_repeated_passes(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.patch_node("gpu-02", {"metadata": {"labels": {D + "dcgm": "false"}}})  # before the first pass
    async with running(api, tmp_path) as r:
        await r.settle()
        api.patch_node("gpu-00", {"metadata": {"labels": {D + "device-plugin": "false"}}})
        api.patch_node(
            "gpu-01",
            {"metadata": {"labels": {D + "device-plugin": PAUSED, D + "gpu-feature-discovery": PAUSED}}},
        )
        await r.settle()
        for _ in range(3):
            await r.full_pass()
        assert r.labels("gpu-00")[D + "device-plugin"] == "false"
        assert D + "device-plugin" not in r.owned("gpu-00")  # the user's now
        assert r.labels("gpu-01")[D + "device-plugin"] == PAUSED
        assert r.labels("gpu-01")[D + "gpu-feature-discovery"] == PAUSED
        assert r.patches("gpu-01") == 1  # the first labelling only: a pause is left as it is
        assert r.labels("gpu-02")[D + "dcgm"] == "false"
        assert D + "dcgm" not in r.owned("gpu-02")


async def test_operands_false_removes_only_the_operators_labels(api: FakeApiServer, tmp_path: Path) -> None:
    api.patch_node("gpu-00", {"metadata": {"labels": {D + "nvsm": "true"}}})  # someone else's
    async with running(api, tmp_path) as r:
        await r.settle()
        api.patch_node("gpu-00", {"metadata": {"labels": {D + "device-plugin": "false"}}})
        await r.settle()
        api.patch_node("gpu-00", {"metadata": {"labels": {DEPLOY_OPERANDS: "false"}}})
        await r.settle()
        labels = r.labels("gpu-00")
        assert not [k for k in CONTAINER if k in labels and k != D + "device-plugin"]
        assert labels[D + "device-plugin"] == "false"  # the user's stays
        assert labels[D + "nvsm"] == "true"  # not ours: stays
        assert labels[GPU_PRESENT] == "true"
        assert OWNED_ANNOTATION not in r.annotations("gpu-00")
        await r.full_pass()
        assert r.labels("gpu-00") == labels

        api.patch_node("gpu-00", {"metadata": {"labels": {DEPLOY_OPERANDS: None}}})  # operands back on
        await r.settle()
        labels = r.labels("gpu-00")
        assert labels[D + "driver"] == "true"
        assert labels[D + "device-plugin"] == "false"


async def test_node_losing_its_nfd_labels_gets_gpu_present_false(api: FakeApiServer, tmp_path: Path) -> None:
    async with running(api, tmp_path) as r:
        await r.settle()
        api.patch_node(
            "gpu-05", {"metadata": {"labels": {"feature.node.kubernetes.io/pci-10de.present": None}}}
        )
        await r.settle()
        labels = r.labels("gpu-05")
        assert labels[GPU_PRESENT] == "false"
        assert not [k for k in CONTAINER if k in labels]
        assert "gpu-05" not in r.labeller.gpu_nodes()
        assert r.patches("gpu-05") == 2
        await r.full_pass()
        assert r.patches("gpu-05") == 2


async def test_nodes_joining_later_are_labelled_and_deleted_ones_forgotten(
    api: FakeApiServer, tmp_path: Path
) -> None:
    async with running(api, tmp_path) as r:
        await r.settle()
        api.add_node("gpu-new", labels={**NFD, "nvidia.com/mig.capable": "true"})
        api.add_node("cpu-new")
        api.delete("Node", "gpu-00")
        await r.settle()
        labels = r.labels("gpu-new")
        assert labels[D + "mig-manager"] == "true"
        assert labels[MIG_CONFIG] == "all-disabled"
        assert r.patches("gpu-new") == 1
        assert r.patches("cpu-new") == 0
        assert "gpu-00" not in r.labeller.nodes


async def test_a_conflict_reads_the_node_again_and_converges(api: FakeApiServer, tmp_path: Path) -> None:
    api.fail_next(1, status=409, method="PATCH", path_contains="/nodes/gpu-03", reason="Conflict")
    async with running(api, tmp_path) as r:
        await r.settle()
        assert r.labeller.stats.conflicts == 1
        assert r.labels("gpu-03")[D + "driver"] == "true"
        assert r.patches("gpu-03") == 2  # the refused one, then the one that went through


async def test_a_write_refused_with_403_is_named_and_retried(api: FakeApiServer, tmp_path: Path) -> None:
    api.forbid("patch", "nodes")
    async with running(api, tmp_path) as r:
        await until(lambda: len(r.labeller.errors) == len(GPU_NODES))
        problem = r.labeller.problem()
        assert problem is not None
        assert '"patch" on resource "nodes"' in problem
        assert "and 19 more node(s)" in problem
        api.allow_all()
        await r.settle()
        assert r.labeller.problem() is None
        assert all(r.labels(n)[GPU_PRESENT] == "true" for n in GPU_NODES)


async def test_a_forbidden_watch_is_named_and_retried(api: FakeApiServer, tmp_path: Path) -> None:
    api.forbid("list", "nodes")
    async with running(api, tmp_path) as r:
        await until(lambda: r.labeller.watch_error is not None)
        problem = r.labeller.problem()
        assert problem is not None
        assert problem.startswith("cannot watch nodes")
        assert '"list" on resource "nodes"' in problem
        assert not r.labeller.synced.is_set()
        api.allow_all()
        await r.settle()
        assert r.labeller.problem() is None
        assert r.patches() == len(GPU_NODES)


async def test_server_errors_are_retried_with_backoff(api: FakeApiServer, tmp_path: Path) -> None:
    api.fail_next(6, status=503, method="PATCH", path_contains="/nodes/gpu-07")
    async with running(api, tmp_path, attempts=1) as r:  # no retries in the client: the labeller's own
        await r.settle()
        assert r.labeller.stats.failures == 6
        assert r.labels("gpu-07")[D + "driver"] == "true"
        assert r.labeller.problem() is None


async def test_a_policy_change_relabels(api: FakeApiServer, tmp_path: Path) -> None:
    api.patch_node("gpu-00", {"metadata": {"labels": {"nvidia.com/gpu.workload.config": "vm-passthrough"}}})
    async with running(api, tmp_path) as r:
        await r.settle()
        assert r.labels("gpu-00")[D + "driver"] == "true"
        r.labeller.set_policy(LabelPolicy(sandbox_workloads=True))
        await r.settle()
        labels = r.labels("gpu-00")
        assert D + "driver" not in labels
        assert labels[D + "vfio-manager"] == "true"
        assert r.patches("gpu-01") == 1  # a container node stays as it is

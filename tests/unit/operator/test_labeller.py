"""The node-labelling controller's queue and cache against an in-memory API: concurrency cap, one write per
change, stale events, changes made while a node is being written."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import pytest

from gpunode.kube.api import KubeConflict, KubeNotFound
from gpunode.kube.cluster import NodeEvent, NodeSummary
from gpunode.operator.labeller import NodeLabeller, _older
from gpunode.operator.labels import GPU_PRESENT
from helpers.waiting import until

NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}


def merged(current: Mapping[str, str], changes: Mapping[str, str | None] | None) -> dict[str, str]:
    out = dict(current)
    for key, value in (changes or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


class FakeNodes:
    """Nodes in memory, with the API server's optimistic locking and a watch that sees every write."""

    def __init__(self, count: int, labels: Mapping[str, str] = NFD) -> None:
        self.rv = 0
        self.store: dict[str, NodeSummary] = {}
        self.events: asyncio.Queue[NodeEvent] = asyncio.Queue()
        self.patches: list[str] = []
        self.inflight = 0
        self.max_inflight = 0
        self.delay = 0.0
        self.gate: asyncio.Event | None = None  # when set, patches wait for it
        for i in range(count):
            self._put(NodeSummary(f"gpu-{i:03d}", dict(labels), {}, False, True, ""))

    def _put(self, node: NodeSummary) -> NodeSummary:
        self.rv += 1
        node = NodeSummary(node.name, node.labels, node.annotations, False, True, str(self.rv))
        self.store[node.name] = node
        return node

    def change(self, name: str, labels: Mapping[str, str | None]) -> NodeSummary:
        """Someone else relabels the node."""
        old = self.store[name]
        node = self._put(NodeSummary(name, merged(old.labels, labels), old.annotations, False, True, ""))
        self.events.put_nowait(NodeEvent("MODIFIED", node))
        return node

    async def watch_nodes(self) -> AsyncIterator[NodeEvent]:
        yield NodeEvent("SYNC", nodes=tuple(self.store.values()))
        while True:
            yield await self.events.get()

    async def read_node(self, name: str) -> NodeSummary:
        if name not in self.store:
            raise KubeNotFound("get", "nodes", name, status=404)
        return self.store[name]

    async def patch_node_labels(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> NodeSummary:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.delay)
        finally:
            self.inflight -= 1
        self.patches.append(name)
        old = self.store[name]
        if resource_version is not None and resource_version != old.resource_version:
            raise KubeConflict("patch", "nodes", "the object has been modified", status=409)
        node = NodeSummary(
            name, merged(old.labels, labels), merged(old.annotations, annotations), False, True, ""
        )
        node = self._put(node)
        self.events.put_nowait(NodeEvent("MODIFIED", node))
        return node


@contextlib.asynccontextmanager
async def labelling(fake: FakeNodes, **kw: object) -> AsyncIterator[NodeLabeller]:
    labeller = NodeLabeller(fake, **kw)  # type: ignore[arg-type]
    task = asyncio.create_task(labeller.run())
    try:
        yield labeller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def settled(fake: FakeNodes, labeller: NodeLabeller) -> None:
    def done() -> bool:
        cached = {n: s.resource_version for n, s in labeller.nodes.items()}
        return (
            labeller.idle
            and fake.events.empty()
            and cached == {n: s.resource_version for n, s in fake.store.items()}
        )

    await until(done)


async def test_writes_are_capped_at_the_concurrency() -> None:
    fake = FakeNodes(50)
    fake.delay = 0.01
    async with labelling(fake, concurrency=10) as labeller:
        await settled(fake, labeller)
    assert fake.max_inflight == 10
    assert sorted(fake.patches) == sorted(fake.store)  # one write each
    assert all(n.labels[GPU_PRESENT] == "true" for n in fake.store.values())


async def test_our_own_writes_coming_back_queue_nothing_and_stale_events_are_ignored() -> None:
    fake = FakeNodes(3)
    async with labelling(fake) as labeller:
        await settled(fake, labeller)
        planned = labeller.stats.planned
        # The node as it was before our write, delivered late: older than the cache, ignored.
        stale = NodeSummary("gpu-000", dict(NFD), {}, False, True, "1")
        fake.events.put_nowait(NodeEvent("MODIFIED", stale))
        await settled(fake, labeller)
        assert labeller.nodes["gpu-000"].labels[GPU_PRESENT] == "true"
        assert labeller.stats.planned == planned
    assert len(fake.patches) == 3


async def test_a_change_while_the_node_is_written_is_planned_after_it() -> None:
    fake = FakeNodes(1)
    fake.gate = asyncio.Event()
    async with labelling(fake) as labeller:
        await until(lambda: fake.inflight == 1)
        fake.change("gpu-000", {"nvidia.com/gpu.deploy.device-plugin": "false"})  # the user, meanwhile
        await until(
            lambda: labeller.nodes["gpu-000"].labels.get("nvidia.com/gpu.deploy.device-plugin") == "false"
        )
        fake.gate.set()
        await settled(fake, labeller)
        labels = fake.store["gpu-000"].labels
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
        assert labels["nvidia.com/gpu.deploy.driver"] == "true"
        assert labeller.stats.conflicts == 1  # the write planned before the change was refused
    assert fake.patches == ["gpu-000", "gpu-000"]


async def test_a_deleted_node_is_forgotten_and_never_written() -> None:
    fake = FakeNodes(2, labels={})
    async with labelling(fake) as labeller:
        await settled(fake, labeller)
        gone = fake.store.pop("gpu-001")
        fake.events.put_nowait(NodeEvent("DELETED", gone))
        await until(lambda: "gpu-001" not in labeller.nodes)
        labeller.resync(["gpu-001", "gpu-000"])
        await settled(fake, labeller)
    assert fake.patches == []  # not GPU nodes: nothing to write


async def test_a_later_sync_drops_nodes_missing_from_it() -> None:
    fake = FakeNodes(2, labels={})
    async with labelling(fake) as labeller:
        await settled(fake, labeller)
        del fake.store["gpu-001"]
        fake.events.put_nowait(NodeEvent("SYNC", nodes=tuple(fake.store.values())))
        await until(lambda: sorted(labeller.nodes) == ["gpu-000"])


@pytest.mark.parametrize(
    ("version", "than", "older"),
    [
        pytest.param("9", "10", True, id="numbers, not strings"),
        pytest.param("10", "10", False, id="same version"),
        pytest.param("11", "10", False, id="newer"),
        pytest.param("abc", "10", False, id="not a number: arrival order"),
        pytest.param("", "10", False, id="empty: arrival order"),
    ],
)
def test_older(version: str, than: str, older: bool) -> None:
    assert _older(version, than) is older


async def test_membership_changes_are_reported_and_nothing_else() -> None:
    fake = FakeNodes(2)
    calls: list[int] = []
    async with labelling(fake, on_membership=lambda: calls.append(1)) as labeller:
        await settled(fake, labeller)
        assert len(calls) == 2  # both nodes joined (the first list)
        fake.change("gpu-000", {"example.com/team": "a"})  # not about NFD or a GPU
        await settled(fake, labeller)
        assert len(calls) == 2  # our own label patches did not count either
        fake.change("gpu-000", {"feature.node.kubernetes.io/pci-10de.present": None})  # lost its GPU
        await settled(fake, labeller)
        assert len(calls) == 3
        fake.change("gpu-000", {"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"})  # NFD again
        await settled(fake, labeller)
        assert len(calls) == 4
        fake.store.pop("gpu-001")
        fake.events.put_nowait(NodeEvent("DELETED", NodeSummary("gpu-001", dict(NFD), {}, False, True, "99")))
        await settled(fake, labeller)
        assert len(calls) == 5

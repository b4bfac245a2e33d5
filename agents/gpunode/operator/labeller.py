"""The node-labelling controller: watch every node, plan its labels, merge-patch the ones that change.

:class:`NodeLabeller` keeps a cache of every node as a slim :class:`~gpunode.kube.cluster.NodeSummary`, fed
by one cluster-wide list-and-watch. A node is queued when it first appears and whenever its labels or
annotations change (status updates, heartbeats and our own writes coming back change nothing and queue
nothing); :meth:`NodeLabeller.resync` queues every node (a policy change, the operator core's own pass).
The queue holds a node once however often it is queued; ``concurrency`` workers (10) take nodes from it,
so a node is never worked on twice at once.

For each node a worker plans with :func:`~gpunode.operator.labels.plan_node_labels` against the cached
node and sends the plan as **one** merge patch of labels and annotations, with the node's
resourceVersion (optimistic locking). Nothing to change writes nothing. A 409 means someone changed the
node since it was cached: the worker reads it again and plans anew (a few times, then later). Any other
failure puts the node back after a delay growing from 0.1 s to 3 s (NVIDIA's), per node; a 403 is kept in
:attr:`NodeLabeller.errors` with its message naming the verb, resource and group to grant, for the
operator's status. A watch that fails is retried likewise (its 403 in :attr:`NodeLabeller.watch_error`).

NVIDIA's controller lists every node on every event and patches changed ones one by one; here the cache
and the queue do that work once per change. ``on_membership`` is called whenever a node joins or leaves
the NFD-labelled or the GPU nodes (NVIDIA reconciles the ClusterPolicy then): the operator core's cue,
with no polling.

Resource versions only move forward in the cache: an event older than what a patch or a read already
showed is ignored. They are compared as numbers where both are decimal integers (etcd's and the test API
server's); others are taken in arrival order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpunode.common.logging import get_logger
from gpunode.kube.api import KubeConflict, KubeError, KubeForbidden, KubeNotFound
from gpunode.kube.cluster import NodeEvent, NodeSummary
from gpunode.operator.labels import LabelPolicy, has_nfd_labels, is_gpu_node, plan_node_labels

__all__ = ["LabellerStats", "NodeApi", "NodeLabeller"]

WATCH_RETRY_CAP = 30.0  # seconds between tries of a watch that fails (a 403 waits for RBAC to change)


class NodeApi(Protocol):
    """The calls the labeller makes (satisfied by :class:`gpunode.kube.client.Kube`)."""

    def watch_nodes(self) -> AsyncIterator[NodeEvent]: ...

    async def read_node(self, name: str) -> NodeSummary: ...

    async def patch_node_labels(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> NodeSummary: ...


@dataclass
class LabellerStats:
    """Counters since start, for logs, metrics and benchmarks."""

    planned: int = 0  # nodes planned (a plan with nothing to change included)
    patched: int = 0  # merge patches that went through
    conflicts: int = 0  # 409s: the node changed since it was cached
    failures: int = 0  # other failed patches and reads (each retried later)


class NodeLabeller:
    """See the module docstring. Run :meth:`run` as a task; the rest is read by the operator core."""

    def __init__(
        self,
        kube: NodeApi,
        policy: LabelPolicy | None = None,
        *,
        concurrency: int = 10,
        retry: tuple[float, float] = (0.1, 3.0),
        conflicts_in_a_row: int = 5,
        on_membership: Callable[[], None] = lambda: None,
    ) -> None:
        self.kube = kube
        self.on_membership = on_membership
        # Other controllers fed from this one watch (the driver upgrade): one list of every node, and one
        # copy of each, in the operator, however many controllers read them.
        self.listeners: list[Callable[[NodeEvent], None]] = []
        self.policy = policy or LabelPolicy()
        self.concurrency = max(1, concurrency)
        self.retry = retry
        self.conflicts_in_a_row = max(1, conflicts_in_a_row)
        self.nodes: dict[str, NodeSummary] = {}  # every node, as last seen
        self.errors: dict[str, KubeError] = {}  # node -> why its last patch failed (retried later)
        self.watch_error: KubeError | None = None  # why the watch is down (retried later)
        self.stats = LabellerStats()
        self.synced = asyncio.Event()  # the first complete list arrived
        self.log = get_logger("gpunode.operator.labeller")
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()  # queued again while a worker had it
        self._failures: dict[str, int] = {}
        self._retries: dict[str, asyncio.TimerHandle] = {}
        self._idle = asyncio.Event()

    # -- what the operator core reads ------------------------------------------------------------------
    def gpu_nodes(self) -> list[str]:
        """Names of the nodes NFD labels as GPU nodes, sorted."""
        return sorted(name for name, node in self.nodes.items() if is_gpu_node(node.labels))

    def has_nfd_labels(self) -> bool:
        """Whether any node carries an NFD label (NFD runs in the cluster)."""
        return any(has_nfd_labels(node.labels) for node in self.nodes.values())

    def problem(self) -> str | None:
        """What keeps labelling from being done, in a sentence; None when nothing does."""
        if self.watch_error is not None:
            return f"cannot watch nodes: {self.watch_error}"
        if not self.errors:
            return None
        name = min(self.errors)
        more = f" (and {len(self.errors) - 1} more node(s))" if len(self.errors) > 1 else ""
        return f"cannot label node {name}{more}: {self.errors[name]}"

    @property
    def idle(self) -> bool:
        """Synced, nothing queued, nothing being written, no retry pending."""
        return self.synced.is_set() and self._idle.is_set()

    async def wait_idle(self) -> None:
        await self.synced.wait()
        await self._idle.wait()

    # -- what the operator core changes ----------------------------------------------------------------
    def set_policy(self, policy: LabelPolicy) -> None:
        """Label by ``policy`` from now on; every node is planned again when it changed."""
        if policy != self.policy:
            self.policy = policy
            self.resync()

    def resync(self, names: Iterable[str] | None = None) -> None:
        """Plan every cached node (or those named) again; those already right are not written."""
        for name in list(self.nodes) if names is None else names:
            if name in self.nodes:
                self._enqueue(name)

    # -- the loop --------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Watch and label until cancelled."""
        self._check_idle()
        try:
            async with asyncio.TaskGroup() as group:
                for i in range(self.concurrency):
                    group.create_task(self._worker(), name=f"node-labeller-{i}")
                group.create_task(self._watch(), name="node-labeller-watch")
        finally:
            for handle in self._retries.values():
                handle.cancel()
            self._retries.clear()

    async def _watch(self) -> None:
        first = delay = self.retry[0]
        while True:
            try:
                async for event in self.kube.watch_nodes():
                    if self.watch_error is not None:
                        self.log.info("labeller_watch_restored")
                        self.watch_error = None
                    delay = first
                    self._on_event(event)
            except KubeError as exc:
                self.watch_error = exc
                what = "labeller_forbidden" if isinstance(exc, KubeForbidden) else "labeller_watch_failed"
                self.log.warning(what, error=str(exc), retry_in_s=round(delay, 2))
            await asyncio.sleep(delay)
            delay = min(WATCH_RETRY_CAP, delay * 2)

    def _on_event(self, event: NodeEvent) -> None:
        if event.type == "SYNC":
            listed = {node.name: node for node in event.nodes}
            for name in [n for n in self.nodes if n not in listed]:
                self._forget(name)
            for node in event.nodes:
                self._seen(node)
            if not self.synced.is_set():
                self.log.info("labeller_synced", nodes=len(listed), gpu_nodes=len(self.gpu_nodes()))
                self.synced.set()
            self._check_idle()
        elif event.node is not None:
            if event.type == "DELETED":
                self._forget(event.node.name)
            else:
                self._seen(event.node)
        for listener in self.listeners:
            listener(event)

    def _seen(self, node: NodeSummary) -> None:
        """A node from the watch: cache it, and queue it when its labels or annotations changed."""
        old = self.nodes.get(node.name)
        if not self._store(node):
            return
        if _membership(old) != _membership(node):
            self.on_membership()
        if old is None or old.labels != node.labels or old.annotations != node.annotations:
            self._enqueue(node.name)

    def _store(self, node: NodeSummary) -> bool:
        """Cache ``node`` unless the cache already holds a newer version of it."""
        old = self.nodes.get(node.name)
        if old is not None and _older(node.resource_version, old.resource_version):
            return False
        self.nodes[node.name] = node
        return True

    def _forget(self, name: str) -> None:
        if _membership(self.nodes.pop(name, None)) != (False, False):
            self.on_membership()
        self.errors.pop(name, None)
        self._failures.pop(name, None)
        handle = self._retries.pop(name, None)
        if handle is not None:
            handle.cancel()
        self._check_idle()

    # -- the queue -------------------------------------------------------------------------------------
    def _enqueue(self, name: str) -> None:
        handle = self._retries.pop(name, None)
        if handle is not None:
            handle.cancel()
        if name in self._active:
            self._dirty.add(name)
        elif name not in self._queued:
            self._queued.add(name)
            self._queue.put_nowait(name)
        self._idle.clear()

    def _check_idle(self) -> None:
        if not self._queued and not self._active and not self._retries:
            self._idle.set()
        else:
            self._idle.clear()

    def _retry_later(self, name: str, error: KubeError | None) -> None:
        failures = self._failures.get(name, 0) + 1
        self._failures[name] = failures
        first, cap = self.retry
        delay = min(cap, first * 2 ** (failures - 1))
        if error is not None:
            self.errors[name] = error
        old = self._retries.pop(name, None)
        if old is not None:
            old.cancel()
        self._retries[name] = asyncio.get_running_loop().call_later(delay, self._retry_due, name)
        self.log.warning(
            "labeller_forbidden" if isinstance(error, KubeForbidden) else "labeller_retry",
            node=name,
            error=str(error) if error is not None else "the node kept changing",
            attempt=failures,
            retry_in_s=round(delay, 2),
        )

    def _retry_due(self, name: str) -> None:
        self._retries.pop(name, None)
        if name in self.nodes:
            self._enqueue(name)
        self._check_idle()

    async def _worker(self) -> None:
        while True:
            name = await self._queue.get()
            self._queued.discard(name)
            self._active.add(name)
            try:
                await self._label(name)
            except KubeError as exc:
                self.stats.failures += 1
                self._retry_later(name, exc)
            except Exception as exc:  # a bug must not stop the other nodes: log it, retry the node later
                self.stats.failures += 1
                self.log.exception("labeller_error", node=name)
                self._retry_later(name, KubeError("label", "nodes", f"{type(exc).__name__}: {exc}"))
            finally:
                self._active.discard(name)
                if name in self._dirty:
                    self._dirty.discard(name)
                    self._enqueue(name)
                self._check_idle()

    async def _label(self, name: str) -> None:
        for _ in range(self.conflicts_in_a_row):
            node = self.nodes.get(name)
            if node is None:
                return  # deleted meanwhile
            self.stats.planned += 1
            patch = plan_node_labels(node.labels, node.annotations, self.policy)
            if patch is None:
                self._done(name)
                return
            try:
                after = await self.kube.patch_node_labels(
                    name,
                    labels=patch.labels,
                    annotations=patch.annotations,
                    resource_version=node.resource_version,
                )
            except KubeConflict:
                self.stats.conflicts += 1
                try:
                    fresh = await self.kube.read_node(name)
                except KubeNotFound:
                    self._forget(name)
                    return
                self._store(fresh)
                continue
            except KubeNotFound:
                self._forget(name)
                return
            self.stats.patched += 1
            self._store(after)
            self.log.info("node_labelled", node=name, changes=patch.describe())
            self._done(name)
            return
        self._retry_later(name, None)

    def _done(self, name: str) -> None:
        self._failures.pop(name, None)
        if self.errors.pop(name, None) is not None:
            self.log.info("labeller_node_recovered", node=name)


def _membership(node: NodeSummary | None) -> tuple[bool, bool]:
    """(NFD-labelled, GPU node); a node not there is neither."""
    if node is None:
        return False, False
    return has_nfd_labels(node.labels), is_gpu_node(node.labels)


def _older(version: str, than: str) -> bool:
    """Whether resourceVersion ``version`` is older than ``than`` (only known for decimal integers)."""
    if version.isdecimal() and than.isdecimal():
        return int(version) < int(than)
    return False

"""The ClusterPolicy controller: one reconcile pass, and the loop that runs it beside node labelling.

A pass lists the ClusterPolicies and honours the oldest (:mod:`gpunode.operator.selection`); every
other one gets ``status.state: ignored``, persisted, naming the active one. The active policy is parsed
(an invalid one: ``notReady`` with an ``Error`` condition naming the YAML path, nothing applied, the
last good objects left running), rendered by ``gpunode render``'s code (injected: rendering sits above
the agents layer), and applied state by state in NVIDIA's order with server-side apply (field manager
``gpunode-operator``), each object with a controller ownerReference to the policy and a content hash:
an object whose hash is unchanged is not written. The objects of disabled components (rendered with
every component on, but not now) are deleted. Then each state's DaemonSets are judged by NVIDIA's
readiness rules and the status is written only when it changed. The result says when to requeue:
5 s while a state is not ready, 45 s while no node carries NFD labels, otherwise on events only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gpunode.common.errors import ConfigError
from gpunode.common.logging import get_logger
from gpunode.kube.api import KubeError, KubeUnavailable
from gpunode.kube.cluster import (
    CLUSTER_POLICY,
    DAEMON_SET,
    NodeSummary,
    ObjectEvent,
    ResourceKind,
    resource_kind,
)
from gpunode.operator.labels import LabelPolicy, has_nfd_labels, is_gpu_node
from gpunode.operator.queue import WorkQueue
from gpunode.operator.readiness import (
    Readiness,
    daemonset_readiness,
    daemonset_view,
    newest_revision_hash,
    pod_view,
)
from gpunode.operator.selection import active_policy, content_hash, needs_write, policy_ref, with_hash
from gpunode.operator.states import ObjectKey, StateObjects, assign_states, key_of, stale_keys
from gpunode.operator.status import StateStatus, cluster_status, ignored_status, state_status

__all__ = [
    "KEY",
    "NFD_REQUEUE_S",
    "NOT_READY_REQUEUE_S",
    "ClusterPolicyController",
    "ControllerApi",
    "ReconcileResult",
    "Renderer",
    "node_counts",
    "parse_cluster_policy",
]

Obj = dict[str, Any]
# (policy, namespace) -> {"common": [...], "nfd": [...], "<agent>": [...]}: what
# gpunode.deploy.render.render_by_agent returns
Renderer = Callable[[Any, str], Mapping[str, Sequence[Obj]]]

NOT_READY_REQUEUE_S = 5.0
NFD_REQUEUE_S = 45.0
KEY = "cluster-policy"  # the one work key: every event funnels into one cluster-wide reconcile
# Kinds that outlive the policy: the namespace holds the operator itself, CRDs hold users' objects.
NOT_OWNED_KINDS = frozenset({"Namespace", "CustomResourceDefinition"})
# Every component switch of the spec, for rendering "everything on" (what the operator may own).
COMPONENTS = ("driver", "toolkit", "device_plugin", "gfd", "dcgm_exporter", "mig_manager", "nfd")


class ControllerApi(Protocol):
    """The calls the controller makes (satisfied by :class:`gpunode.kube.client.Kube`)."""

    async def apply(
        self, obj: Mapping[str, Any], *, force: bool = False, field_manager: str | None = None
    ) -> dict[str, Any]: ...

    async def get_object(
        self, kind: ResourceKind, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...

    async def list_objects(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        chunk_size: int = 500,
    ) -> tuple[list[dict[str, Any]], str]: ...

    async def delete_object(self, kind: ResourceKind, name: str, namespace: str | None = None) -> bool: ...

    async def patch_status(
        self,
        kind: ResourceKind,
        name: str,
        status: Mapping[str, Any],
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]: ...

    async def daemonset_rollout(
        self, name: str, namespace: str | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]] | None: ...

    async def list_nodes(
        self, *, labels: Mapping[str, str] | None = None, chunk_size: int = 500
    ) -> tuple[list[NodeSummary], str]: ...

    def watch_objects(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        server_timeout: int = 300,
        idle_timeout: float | None = None,
    ) -> AsyncIterator[ObjectEvent]: ...


@dataclass
class ReconcileResult:
    """One pass: ``requeue_after`` seconds (None: events only), what it wrote, the active policy's state."""

    requeue_after: float | None = None
    active: str | None = None
    state: str | None = None
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_writes: int = 0

    @property
    def writes(self) -> int:
        return len(self.applied) + len(self.deleted) + self.status_writes


def parse_cluster_policy(obj: Mapping[str, Any]) -> Any:
    """The ClusterPolicy model of an API object (server-set metadata and status dropped); a
    :class:`~gpunode.common.errors.ConfigError` naming the YAML path of each problem otherwise."""
    from gpunode.api.clusterpolicy import parse_policy_text  # pydantic: only where a policy is parsed

    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    body = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "labels", "annotations") if meta.get(k)},
        "spec": obj.get("spec") or {},
    }
    return parse_policy_text(json.dumps(body), f"ClusterPolicy {name}").policy


def everything_on(policy: Any) -> Any:
    """The policy with every component enabled: its rendering is every object the operator may own."""
    spec = policy.spec
    update = {c: getattr(spec, c).model_copy(update={"enabled": True}) for c in COMPONENTS}
    return policy.model_copy(update={"spec": spec.model_copy(update=update)})


def label_policy(policy: Any) -> LabelPolicy:
    mig = policy.spec.mig_manager
    default = "all-disabled" if mig.enabled and mig.config.default == "all-disabled" else ""
    return LabelPolicy(mig_config_default=default)


def node_counts(labels: Iterable[Mapping[str, str]]) -> tuple[int, int]:
    """(nodes NFD labelled at all, GPU nodes) among the nodes' labels."""
    listed = list(labels)
    return sum(1 for ls in listed if has_nfd_labels(ls)), sum(1 for ls in listed if is_gpu_node(ls))


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner(policy_obj: Mapping[str, Any]) -> Obj:
    meta = policy_obj.get("metadata") or {}
    return {
        "apiVersion": CLUSTER_POLICY.api_version,
        "kind": CLUSTER_POLICY.kind,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned(obj: Mapping[str, Any], owner: Obj) -> Obj:
    if obj.get("kind") in NOT_OWNED_KINDS:
        return dict(obj)
    meta = dict(obj.get("metadata") or {})
    meta["ownerReferences"] = [owner]
    return {**obj, "metadata": meta}


class ClusterPolicyController:
    def __init__(
        self,
        kube: ControllerApi,
        render: Renderer,
        *,
        namespace: str,
        parse: Callable[[Mapping[str, Any]], Any] = parse_cluster_policy,
        now: Callable[[], str] = _utc_now,
        may_write: Callable[[], bool] = lambda: True,
        nodes: Callable[[], Iterable[Mapping[str, str]] | None] = lambda: None,
    ) -> None:
        self.kube = kube
        self.render = render
        self.namespace = namespace
        self.parse = parse
        self.now = now
        self.may_write = may_write  # leader election: False stops every write
        self.nodes = nodes  # node labels from the labeller's cache (None: list the nodes)
        self.label_policy: LabelPolicy | None = None  # what node labelling should follow
        self._applied: dict[ObjectKey, str] = {}  # object -> hash of what we applied (or found applied)
        self._absent: set[ObjectKey] = set()  # stale objects known to be gone
        self.log = get_logger("gpunode.operator.controller")

    async def reconcile(self) -> ReconcileResult:
        result = ReconcileResult()
        policies, _ = await self.kube.list_objects(CLUSTER_POLICY)
        by_name = {str((p.get("metadata") or {}).get("name")): p for p in policies}
        active = active_policy(policy_ref(p) for p in policies)
        if active is None:
            return result
        result.active = active.name
        for name, obj in sorted(by_name.items()):
            if name != active.name:
                await self._write_status(
                    obj, ignored_status(active.name, now=self.now(), previous=obj.get("status")), result
                )
        obj = by_name[active.name]
        try:
            policy = self.parse(obj)
        except (ConfigError, ValueError) as exc:  # shown in the status; nothing of it applied
            return await self._failed(obj, str(exc), result, requeue=None)
        self.label_policy = label_policy(policy)
        nfd_nodes, gpu_nodes = await self._node_counts()
        desired = assign_states(self.render(policy, self.namespace))
        possible = assign_states(self.render(everything_on(policy), self.namespace))
        owner = _owner(obj)
        try:
            for state in desired:
                for rendered in state.objects:
                    await self._apply(_owned(rendered, owner), result)
            for key in stale_keys(possible, desired):
                await self._delete(key, result)
            statuses = [await self._state_status(s) for s in desired]
        except KubeUnavailable:
            raise
        except KubeError as exc:  # 403 names the verb, resource and group to grant
            await self._failed(obj, str(exc), result, requeue=None)
            raise
        status = cluster_status(
            self.namespace,
            statuses,
            now=self.now(),
            nfd_nodes=nfd_nodes,
            gpu_nodes=gpu_nodes,
            previous=obj.get("status"),
        )
        await self._write_status(obj, status, result)
        result.state = status["state"]
        if nfd_nodes == 0:
            result.requeue_after = NFD_REQUEUE_S
        elif status["state"] != "ready":
            result.requeue_after = NOT_READY_REQUEUE_S
        self.log.info(
            "reconciled",
            policy=active.name,
            state=result.state,
            applied=len(result.applied),
            deleted=len(result.deleted),
            status_writes=result.status_writes,
            requeue_after_s=result.requeue_after,
        )
        return result

    # -- pieces ----------------------------------------------------------------------------------------
    async def _node_counts(self) -> tuple[int, int]:
        labels = self.nodes()
        if labels is None:
            nodes, _ = await self.kube.list_nodes()
            labels = [n.labels for n in nodes]
        return node_counts(labels)

    def _check_leader(self) -> None:
        if not self.may_write():
            raise KubeError("write", "", "not the leader (any more): nothing written", reason="NotLeader")

    async def _apply(self, obj: Obj, result: ReconcileResult) -> None:
        key = key_of(obj)
        digest = content_hash(obj)
        self._absent.discard(key)
        if self._applied.get(key) == digest:
            return
        live = await self.kube.get_object(
            resource_kind(key.api_version, key.kind), key.name, key.namespace or None
        )
        if needs_write(obj, live):
            self._check_leader()
            await self.kube.apply(with_hash(obj), force=True)
            result.applied.append(str(key))
        self._applied[key] = digest

    async def _delete(self, key: ObjectKey, result: ReconcileResult) -> None:
        if key in self._absent:
            return
        kind = resource_kind(key.api_version, key.kind)
        if await self.kube.get_object(kind, key.name, key.namespace or None) is not None:
            self._check_leader()
            if await self.kube.delete_object(kind, key.name, key.namespace or None):
                result.deleted.append(str(key))
        self._applied.pop(key, None)
        self._absent.add(key)

    async def _state_status(self, state: StateObjects) -> StateStatus:
        if not state.enabled:
            return state_status(state.name, {}, enabled=False)
        verdicts: dict[str, Readiness] = {}
        for obj in state.objects:
            if obj.get("kind") != DAEMON_SET.kind:
                continue
            key = key_of(obj)
            found = await self.kube.daemonset_rollout(key.name, key.namespace or None)
            if found is None:  # deleted behind our back: applied again next pass
                self._applied.pop(key, None)
                verdicts[key.name] = Readiness(False, 0, 0, 0, (), "DaemonSet missing")
                continue
            ds, pods, revisions = found
            verdicts[key.name] = daemonset_readiness(
                daemonset_view(ds), [pod_view(p) for p in pods], newest_revision_hash(revisions)
            )
        return state_status(state.name, verdicts)

    async def _failed(
        self, obj: Mapping[str, Any], error: str, result: ReconcileResult, *, requeue: float | None
    ) -> ReconcileResult:
        status = cluster_status(
            self.namespace,
            [],
            now=self.now(),
            nfd_nodes=1,
            gpu_nodes=1,
            error=error,
            previous=obj.get("status"),
        )
        previous_states = (obj.get("status") or {}).get("states")
        if previous_states is not None:
            status["states"] = previous_states  # what is running is still the last good policy's
        await self._write_status(obj, status, result)
        result.state = status["state"]
        result.requeue_after = requeue
        self.log.warning("reconcile_failed", policy=(obj.get("metadata") or {}).get("name"), error=error)
        return result

    async def _write_status(
        self, obj: Mapping[str, Any], status: Mapping[str, Any], result: ReconcileResult
    ) -> None:
        previous = obj.get("status") or {}
        if previous == status:
            return
        self._check_leader()
        patch = {**{k: None for k in previous if k not in status}, **status}
        await self.kube.patch_status(CLUSTER_POLICY, str((obj.get("metadata") or {}).get("name")), patch)
        result.status_writes += 1


async def run_controller(
    controller: ClusterPolicyController,
    *,
    queue: WorkQueue[str] | None = None,
    on_result: Callable[[ReconcileResult], None] = lambda r: None,
) -> None:
    """Reconcile on every ClusterPolicy or owned-DaemonSet event, and when a pass asks to be requeued;
    failures retried with backoff (0.1-3 s). Runs until cancelled."""
    work: WorkQueue[str] = queue or WorkQueue()
    log = controller.log

    async def watch(kind: ResourceKind, namespace: str | None) -> None:
        delay = 0.1
        while True:
            try:
                async for _ in controller.kube.watch_objects(kind, namespace=namespace):
                    delay = 0.1
                    work.add(KEY)
            except KubeError as exc:
                log.warning("watch_failed", resource=kind.plural, error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(30.0, delay * 2)

    async def worker() -> None:
        while True:
            key = await work.get()
            try:
                result = await controller.reconcile()
            except KubeError as exc:
                log.warning("reconcile_retry", error=str(exc), retry_in_s=work.retry(key))
            else:
                work.forget(key)
                if result.requeue_after is not None:
                    work.add(key, result.requeue_after)
                on_result(result)
            finally:
                work.done(key)

    work.add(KEY)
    async with asyncio.TaskGroup() as group:
        group.create_task(watch(CLUSTER_POLICY, None), name="watch-clusterpolicies")
        group.create_task(watch(DAEMON_SET, controller.namespace), name="watch-daemonsets")
        group.create_task(worker(), name="clusterpolicy-reconciler")

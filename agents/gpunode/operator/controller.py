"""The ClusterPolicy controller: one reconcile pass, and the loop that runs it beside node labelling.

A pass lists the ClusterPolicies and honours the oldest (:mod:`gpunode.operator.selection`); every
other one gets ``status.state: ignored``, persisted, naming the active one. The active policy is parsed
(an invalid one: ``notReady`` with an ``Error`` condition naming the YAML path, nothing applied, the
last good objects left running), rendered by ``gpunode render``'s code (injected: rendering sits above
the agents layer), and applied state by state in NVIDIA's order with server-side apply (field manager
``gpunode-operator``), each object with a controller ownerReference to the policy and a content hash:
an object is written only when it is missing, its hash changed, or someone changed what the operator
manages in it (:func:`~gpunode.operator.selection.needs_write`: a hand-edited image or env value, a
removed label): drift is put right on the next pass, and watch events on the owned objects
(:class:`~gpunode.operator.cache.ObjectCache`) queue that pass at once. Objects the policy no longer
renders are deleted: those of disabled components (rendered with every component on, but not now) and
any other object the policy controls (a RuntimeClass it named before), but only objects carrying a
controller ownerReference to a ClusterPolicy: never a user's. A RuntimeClass that exists without one
(the user's own, or the toolkit's) is left as it is, not taken over. Then each state's DaemonSets are
judged by NVIDIA's readiness rules and the status is written only when it changed. The result says
when to requeue: 5 s while a state is not ready, 45 s while no node carries NFD labels, otherwise on
events only.
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
from gpunode.kube.api import KubeConflict, KubeError, KubeNotFound, KubeUnavailable
from gpunode.kube.cluster import (
    CLUSTER_POLICY,
    CONFIG_MAP,
    DAEMON_SET,
    NodeSummary,
    ObjectEvent,
    ResourceKind,
    resource_kind,
)
from gpunode.operator.cache import OWNED_SELECTOR, ObjectCache
from gpunode.operator.labels import LabelPolicy, has_nfd_labels, is_gpu_node
from gpunode.operator.queue import WorkQueue, serve
from gpunode.operator.readiness import (
    Readiness,
    daemonset_readiness,
    daemonset_view,
    newest_revision_hash,
    pod_view,
)
from gpunode.operator.seed import SEED_ANNOTATION, SEED_FIELD_MANAGER, SEED_NAME, SeedError, parse_seed
from gpunode.operator.selection import (
    HASH_ANNOTATION,
    active_policy,
    content_hash,
    needs_write,
    policy_ref,
    view_hash,
    with_hash,
)
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
FOREIGN_STATUS_KEYS = frozenset({"driverUpgrade"})  # status keys written by another controller
KEY = "cluster-policy"  # the one work key: every event funnels into one cluster-wide reconcile
# Kinds that outlive the policy: the namespace holds the operator itself, CRDs hold users' objects.
NOT_OWNED_KINDS = frozenset({"Namespace", "CustomResourceDefinition"})
# Every component switch of the spec, for rendering "everything on" (what the operator may own).
COMPONENTS = ("driver", "toolkit", "device_plugin", "gfd", "dcgm_exporter", "mig_manager", "nfd")
# Named by the policy (spec.operator.runtimeClass), so "everything on" does not render an old name:
# always looked at for strays the policy controls.
RUNTIME_CLASS = resource_kind("node.k8s.io/v1", "RuntimeClass")


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


def controlled_by_a_policy(obj: Mapping[str, Any], uid: str | None = None) -> bool:
    """Whether ``obj`` has a controller ownerReference to a ClusterPolicy (with ``uid``: that one)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if (
            isinstance(ref, Mapping)
            and ref.get("kind") == CLUSTER_POLICY.kind
            and str(ref.get("apiVersion", "")).startswith(CLUSTER_POLICY.group + "/")
            and ref.get("controller") is True
            and (uid is None or ref.get("uid") == uid)
        ):
            return True
    return False


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
        cache: ObjectCache | None = None,
    ) -> None:
        self.kube = kube
        self.render = render
        self.namespace = namespace
        self.parse = parse
        self.now = now
        self.may_write = may_write  # leader election: False stops every write
        self.nodes = nodes  # node labels from the labeller's cache (None: list the nodes)
        self.label_policy: LabelPolicy | None = None  # what node labelling should follow
        self.last_policy: str | None = None  # the active policy's name and its last status (metrics)
        self.last_status: dict[str, Any] | None = None
        self.cache = cache  # the owned objects, watched (None: read from the API server each pass)
        # object -> (content hash, view hash of the live object after our write or as found right)
        self._baseline: dict[ObjectKey, tuple[str, str]] = {}
        self._kinds: set[ResourceKind] = {RUNTIME_CLASS}  # every kind rendered (or applied) so far
        self._kept: set[ObjectKey] = set()  # not ours: left alone (logged once)
        self._seeded: str | None = None  # the install ConfigMap's digest once its policy is in place
        self._seed_error: str | None = None  # what was wrong with it (logged once)
        if cache is not None:
            cache.watch([CONFIG_MAP])  # the install's ConfigMap: a new render applied queues a pass
        self.log = get_logger("gpunode.operator.controller")

    async def reconcile(self) -> ReconcileResult:
        result = ReconcileResult()
        await self._apply_seed(result)
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
        try:
            desired = assign_states(self.render(policy, self.namespace))
            possible = assign_states(self.render(everything_on(policy), self.namespace))
            wanted = {key_of(o) for s in desired for o in s.objects}
            for k in (*wanted, *(key_of(o) for s in possible for o in s.objects)):
                kind = resource_kind(k.api_version, k.kind)  # KeyError: a kind the client cannot write
                if k.kind not in NOT_OWNED_KINDS:
                    self._kinds.add(kind)
        except (ConfigError, ValueError, KeyError) as exc:  # rendering refused it: nothing applied
            why = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            return await self._failed(obj, why, result, requeue=None)
        owner = _owner(obj)
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if self.cache is not None:
            self.cache.watch(sorted(self._kinds, key=lambda k: k.plural))
        try:
            for state in desired:
                for rendered in state.objects:
                    await self._apply(_owned(rendered, owner), result)
            stale = stale_keys(possible, desired)
            stale += [k for k in await self._controlled(uid) if k not in wanted and k not in stale]
            for key in stale:
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
        self.last_policy, self.last_status = active.name, status
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
    async def _apply_seed(self, result: ReconcileResult) -> None:
        """The install's ClusterPolicy (:mod:`gpunode.operator.seed`): applied when missing or when the
        install's ConfigMap changed; a KubeError (the CRD not served yet) retries the pass."""
        key = ObjectKey("v1", "ConfigMap", self.namespace, SEED_NAME)
        configmap = await self._live(key)
        if configmap is None:
            return
        try:
            seed = parse_seed(configmap)
        except SeedError as exc:
            if self._seed_error != str(exc):
                self._seed_error = str(exc)
                self.log.error("clusterpolicy_seed_invalid", configmap=str(key), error=str(exc))
            return
        self._seed_error = None
        if seed is None or seed[1] == self._seeded:
            return
        policy, digest = seed
        name = policy["metadata"]["name"]
        live = await self.kube.get_object(CLUSTER_POLICY, name)
        found = ((live or {}).get("metadata") or {}).get("annotations") or {}
        if live is None or found.get(SEED_ANNOTATION) != digest:
            self._check_leader()
            try:
                await self.kube.apply(policy, force=True, field_manager=SEED_FIELD_MANAGER)
            except (KubeNotFound, KubeUnavailable, KubeConflict):
                raise  # the CRD not served yet, the API away, a race: the pass is retried
            except KubeError as exc:  # refused (invalid, forbidden): said once; the cluster's policies serve
                self._seeded = digest
                self.log.error("clusterpolicy_seed_refused", policy=name, error=str(exc))
                return
            result.applied.append(f"ClusterPolicy {name}")
            self.log.info(
                "clusterpolicy_applied_from_install", policy=name, created=live is None, digest=digest
            )
        self._seeded = digest

    async def _node_counts(self) -> tuple[int, int]:
        labels = self.nodes()
        if labels is None:
            nodes, _ = await self.kube.list_nodes()
            labels = [n.labels for n in nodes]
        return node_counts(labels)

    def _check_leader(self) -> None:
        if not self.may_write():
            raise KubeError("write", "", "not the leader (any more): nothing written", reason="NotLeader")

    async def _live(self, key: ObjectKey) -> Obj | None:
        """The object as it is now: from the cache once its kind is synced, else read."""
        kind = resource_kind(key.api_version, key.kind)
        if self.cache is not None and self.cache.synced(kind):
            return self.cache.get(key)
        return await self.kube.get_object(kind, key.name, key.namespace or None)

    async def _controlled(self, uid: str) -> list[ObjectKey]:
        """Every labelled object of the kinds the operator renders that the policy ``uid`` controls."""
        found: list[ObjectKey] = []
        for kind in sorted(self._kinds, key=lambda k: k.plural):
            if self.cache is not None and self.cache.synced(kind):
                objs = self.cache.of_kind(kind)
            else:
                try:
                    objs, _ = await self.kube.list_objects(
                        kind, namespace=self.namespace if kind.namespaced else None, labels=OWNED_SELECTOR
                    )
                except KubeNotFound:  # the kind is not served (a CRD not installed)
                    continue
            found += sorted(key_of(o) for o in objs if controlled_by_a_policy(o, uid))
        return found

    def _keep(self, key: ObjectKey, why: str) -> None:
        if key not in self._kept:
            self._kept.add(key)
            self.log.info("object_left_alone", object=str(key), reason=why)

    async def _apply(self, obj: Obj, result: ReconcileResult) -> None:
        key = key_of(obj)
        digest = content_hash(obj)
        live = await self._live(key)
        if key.kind == RUNTIME_CLASS.kind and live is not None and not controlled_by_a_policy(live):
            # someone else's RuntimeClass of that name (the toolkit's, a user's): it serves the pods
            # that name it as it is; taking it over would delete it with the policy
            self._keep(key, "a RuntimeClass of that name exists without a ClusterPolicy owning it")
            return
        base = self._baseline.get(key)
        baseline = base[1] if base is not None and base[0] == digest else None
        applied = with_hash(obj)
        if not needs_write(obj, live, baseline):
            if baseline is None and live is not None:
                self._baseline[key] = (digest, view_hash(applied, live))
            return
        self._check_leader()
        stored = await self.kube.apply(applied, force=True)
        result.applied.append(str(key))
        if (
            live is not None
            and ((live.get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION) == digest
        ):  # the same desired object: someone changed it
            self.log.info("drift_corrected", object=str(key))
        self._baseline[key] = (digest, view_hash(applied, stored))
        if key.kind not in NOT_OWNED_KINDS:
            self._kinds.add(resource_kind(key.api_version, key.kind))
        if self.cache is not None:
            self.cache.store(stored)

    async def _delete(self, key: ObjectKey, result: ReconcileResult) -> None:
        kind = resource_kind(key.api_version, key.kind)
        live = await self._live(key)
        self._baseline.pop(key, None)
        if live is None:
            return
        if not controlled_by_a_policy(live):
            self._keep(key, "no longer rendered, but no ClusterPolicy owns it: not deleted")
            return
        self._check_leader()
        if await self.kube.delete_object(kind, key.name, key.namespace or None):
            result.deleted.append(str(key))
        if self.cache is not None:
            self.cache.forget(key)

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
                self._baseline.pop(key, None)
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
        self.last_policy, self.last_status = str((obj.get("metadata") or {}).get("name")), status
        await self._write_status(obj, status, result)
        result.state = status["state"]
        result.requeue_after = requeue
        self.log.warning("reconcile_failed", policy=(obj.get("metadata") or {}).get("name"), error=error)
        return result

    async def _write_status(
        self, obj: Mapping[str, Any], status: Mapping[str, Any], result: ReconcileResult
    ) -> None:
        # keys other controllers own (the upgrade controller's driverUpgrade) are neither compared nor removed
        previous = {k: v for k, v in (obj.get("status") or {}).items() if k not in FOREIGN_STATUS_KEYS}
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
    on_pass: Callable[[float, bool], None] = lambda seconds, ok: None,
) -> None:
    """Reconcile on every ClusterPolicy event, every event of an owned object (the controller's cache;
    without one: of the DaemonSets in its namespace), and when a pass asks to be requeued; failures
    retried with backoff (0.1-3 s). Runs until cancelled. ``on_pass(seconds, ok)`` after each
    pass (metrics)."""
    work: WorkQueue[str] = queue if queue is not None else WorkQueue()  # an empty queue is falsy
    log = controller.log

    if controller.cache is not None:
        controller.cache.on_change = lambda: work.add(KEY)

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

    work.add(KEY)
    async with asyncio.TaskGroup() as group:
        group.create_task(watch(CLUSTER_POLICY, None), name="watch-clusterpolicies")
        if controller.cache is None:
            group.create_task(watch(DAEMON_SET, controller.namespace), name="watch-daemonsets")
        else:  # every owned object, DaemonSets included: hand edits and deletions queue a pass
            group.create_task(controller.cache.run(), name="owned-objects")
        group.create_task(
            serve(
                work,
                controller.reconcile,
                log=log,
                retry_event="reconcile_retry",
                error_event="reconcile_error",
                on_result=on_result,
                on_pass=on_pass,
            ),
            name="clusterpolicy-reconciler",
        )

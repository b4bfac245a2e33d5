"""The cluster-wide driver upgrade controller (issue 17): every GPU node walked through NVIDIA's states in
the node label ``nvidia.com/gpu-driver-upgrade-state``, within ``driver.upgradePolicy``'s limits.

It reads the driver DaemonSet(s) of the operator's namespace, their ControllerRevisions and pods (one
label-selected watch each, :class:`~gpunode.operator.cache.ObjectCache`) and every node (a watch of slim
nodes), and decides with :mod:`gpunode.operator.upgrade_plan`. A pass:

1. the active ClusterPolicy's ``driver.upgradePolicy`` (:func:`upgrade_policy`: a bad limit or selector
   is a :class:`~gpunode.common.errors.ConfigError` naming the field; the ClusterPolicy controller shows
   it in the ``Error`` condition, and this controller touches no node);
2. ``autoUpgrade: false`` (or the driver disabled): the state labels and our annotations are removed, and
   a node we cordoned is uncordoned;
3. each node in progress takes its next steps (:func:`~gpunode.operator.upgrade_plan.step`), as far as it
   can without waiting: the cordon and the state are one patch, refused if the node changed since it was
   read (an administrator's cordon is never taken for ours); GPU pods are evicted and nodes drained by
   :mod:`gpunode.kube.drain`'s rules (the driver loader's ``upgrade`` uses the same), through the
   Eviction API, so PodDisruptionBudgets hold; the node's validator pods, then its stale driver pod,
   are deleted; the uncordon, the operands the driver manager paused (:mod:`gpunode.kube.operands`' record,
   restored here once its holder is gone) and the state go back in one patch;
4. then, and only then, nodes waiting in ``upgrade-required`` are admitted within both limits
   (:func:`~gpunode.operator.upgrade_plan.admit`), so a write never raises a count past a limit;
5. the ClusterPolicy's ``status.driverUpgrade`` names the nodes waiting for a slot, those holding one,
   and the failed ones with why.

Every transition writes the reason (annotation ``gpunode.io/driver-upgrade-reason``, with the time in
``gpunode.io/driver-upgrade-since``, from which step timeouts are measured) and an Event on the node. The
controller keeps nothing that matters in memory: killed at any step, the next leader resumes from the
labels and annotations. Its own writes are stored in its node cache at once (a late watch event of an
older version does not undo them), so two passes never admit on a stale count.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpunode.common.errors import ConfigError
from gpunode.common.logging import get_logger
from gpunode.kube.api import KubeConflict, KubeError, KubeNotFound, KubeUnavailable, PodInfo
from gpunode.kube.cluster import (
    CLUSTER_POLICY,
    CONTROLLER_REVISION,
    DAEMON_SET,
    POD,
    NodeEvent,
    NodeSummary,
    ObjectEvent,
)
from gpunode.kube.drain import is_gpu_pod, plan_drain
from gpunode.kube.operands import RECORD_ANNOTATION as OPERANDS_ANNOTATION
from gpunode.kube.operands import PauseRecord, plan_restore
from gpunode.kube.selectors import LabelSelector
from gpunode.operator import upgrade_plan as plan
from gpunode.operator.cache import ObjectCache
from gpunode.operator.queue import WorkQueue, serve
from gpunode.operator.selection import active_policy, policy_ref

__all__ = [
    "DRIVER_LABELS",
    "STATUS_KEY",
    "UpgradeController",
    "UpgradePolicy",
    "check_policy",
    "install_digest",
    "run_upgrades",
    "upgrade_policy",
]

Obj = dict[str, Any]
# The rendered driver DaemonSet's pods, revisions and the DaemonSet itself carry this label.
DRIVER_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "gpunode-driver-loader"}
# Pods that validate a node's driver: NVIDIA's operator validator, or a gpunode validator DaemonSet.
VALIDATOR_SELECTORS: tuple[Mapping[str, str], ...] = (
    {"app": "nvidia-operator-validator"},
    {"app.kubernetes.io/name": "gpunode-validator"},
)
STATUS_KEY = "driverUpgrade"  # the ClusterPolicy status key this controller owns
SINCE_ANNOTATION = "gpunode.io/driver-upgrade-since"
FAILED_REVISION_ANNOTATION = "gpunode.io/driver-upgrade-failed-revision"
# NVIDIA's: the upgrade controller owns eviction and draining here (the driver manager's are then off).
UPGRADE_ENABLED_ANNOTATION = "nvidia.com/gpu-driver-upgrade-enabled"
DIGEST_ENV = "DRIVER_CONFIG_DIGEST"
# Container env that never changes what the driver loader installs (logging, the downward API's node).
NOT_INSTALL_ENV = frozenset(
    {"LOG_LEVEL", "LOG_FORMAT", "NODE_NAME", "GPUNODE_LOG_LEVEL", "GPUNODE_LOG_FORMAT"}
)
MAX_STATUS_NODES = 5
BUSY_REQUEUE_S = 1.0  # while any node is in progress or waiting
IDLE_REQUEUE_S = 120.0  # NVIDIA's controller also runs every 2 minutes
EVENT_BATCH_S = 0.1  # watch events within this long make one pass
CONCURRENCY = 16  # nodes advanced at once within a pass
CHAIN = 8  # steps one node may take in one pass without waiting on anything


# -- the policy ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpgradePolicy:
    """``driver.upgradePolicy`` checked and parsed (selectors compiled)."""

    auto_upgrade: bool
    driver_enabled: bool
    max_parallel: int
    max_unavailable: int | str
    steps: plan.Steps
    wait_selector: LabelSelector = field(default_factory=LabelSelector)
    drain_selector: LabelSelector = field(default_factory=LabelSelector)
    deletion_force: bool = False
    deletion_empty_dir: bool = False
    drain_force: bool = False
    drain_empty_dir: bool = False


BASE_PATH = "spec.driver.upgradePolicy"


def upgrade_policy(policy: Any, source: str = "ClusterPolicy") -> UpgradePolicy:
    """The policy's upgrade settings; :class:`ConfigError` naming each bad field (``maxUnavailable`` over
    100%, negative or unparsable; a negative count or timeout; an invalid pod selector)."""
    up = policy.spec.driver.upgrade_policy
    problems: list[str] = []
    if up.max_parallel_upgrades < 0:
        problems.append(
            f"{BASE_PATH}.maxParallelUpgrades: {up.max_parallel_upgrades} is negative (0 = unlimited)"
        )
    try:
        plan.max_unavailable(up.max_unavailable, 100, path=f"{BASE_PATH}.maxUnavailable")
    except plan.LimitError as exc:
        problems.append(str(exc))
    for path, seconds in (
        ("waitForCompletion.timeoutSeconds", up.wait_for_completion.timeout_seconds),
        ("podDeletion.timeoutSeconds", up.pod_deletion.timeout_seconds),
        ("drain.timeoutSeconds", up.drain.timeout_seconds),
    ):
        if seconds < 0:
            problems.append(f"{BASE_PATH}.{path}: {seconds} is negative (0 = no limit)")
    selectors: dict[str, LabelSelector] = {}
    for path, text in (
        ("waitForCompletion.podSelector", up.wait_for_completion.pod_selector),
        ("drain.podSelector", up.drain.pod_selector),
    ):
        try:
            selectors[path] = LabelSelector.parse(text)
        except ValueError as exc:
            problems.append(f"{BASE_PATH}.{path}: {exc}")
    if problems:
        raise ConfigError(source, problems)
    return UpgradePolicy(
        auto_upgrade=up.auto_upgrade,
        driver_enabled=policy.spec.driver.enabled,
        max_parallel=up.max_parallel_upgrades,
        max_unavailable=up.max_unavailable,
        steps=plan.Steps(
            wait_for_jobs_selector=up.wait_for_completion.pod_selector,
            wait_for_jobs_timeout=up.wait_for_completion.timeout_seconds,
            pod_deletion_timeout=up.pod_deletion.timeout_seconds,
            drain_enable=up.drain.enable,
            drain_timeout=up.drain.timeout_seconds,
        ),
        wait_selector=selectors["waitForCompletion.podSelector"],
        drain_selector=selectors["drain.podSelector"],
        deletion_force=up.pod_deletion.force,
        deletion_empty_dir=up.pod_deletion.delete_empty_dir,
        drain_force=up.drain.force,
        drain_empty_dir=up.drain.delete_empty_dir,
    )


def check_policy(obj: Mapping[str, Any]) -> Any:
    """:func:`gpunode.operator.controller.parse_cluster_policy` and then :func:`upgrade_policy`: the
    ClusterPolicy controller's parser in the operator, so a bad upgrade policy is its ``Error``."""
    from gpunode.operator.controller import parse_cluster_policy

    policy = parse_cluster_policy(obj)
    name = str((obj.get("metadata") or {}).get("name") or "")
    upgrade_policy(policy, f"ClusterPolicy {name}")
    return policy


# -- what a driver pod installs --------------------------------------------------------------------------
def install_digest(pod_spec: Mapping[str, Any]) -> str:
    """What decides the driver a pod installs: the ``DRIVER_CONFIG_DIGEST`` its containers set, else a
    digest of its containers' images, commands, arguments and env (logging and the node name left out).
    Labels, annotations, resources, tolerations, probes and the init containers (the driver manager's
    settings) do not count: a change of those only restarts the driver pod."""
    containers = [c for c in pod_spec.get("containers") or [] if isinstance(c, Mapping)]
    for c in containers:
        for e in c.get("env") or []:
            if isinstance(e, Mapping) and e.get("name") == DIGEST_ENV and e.get("value"):
                return str(e["value"])
    parts = [
        {
            "name": c.get("name"),
            "image": c.get("image"),
            "command": c.get("command"),
            "args": c.get("args"),
            "env": sorted(
                json.dumps(e, sort_keys=True)
                for e in c.get("env") or []
                if isinstance(e, Mapping) and e.get("name") not in NOT_INSTALL_ENV
            ),
        }
        for c in sorted(containers, key=lambda c: str(c.get("name")))
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    if "deletionTimestamp" in _meta(pod):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return True


def _restarts(pod: Mapping[str, Any]) -> int:
    status = pod.get("status") or {}
    total = 0
    for key in ("containerStatuses", "initContainerStatuses"):
        for c in status.get(key) or []:
            if isinstance(c, Mapping) and isinstance(c.get("restartCount"), int):
                total += c["restartCount"]
    return total


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _newer(version: str, than: str) -> bool:
    if version.isdecimal() and than.isdecimal():
        return int(version) >= int(than)
    return True


@dataclass
class _Driver:
    """A node's driver pod and its DaemonSet's newest revision."""

    owner: str = ""  # the DaemonSet's uid
    pod: Obj | None = None
    newest: str | None = None
    newest_digest: str | None = None
    complete: bool = True


@dataclass
class UpgradeStats:
    passes: int = 0
    transitions: int = 0
    node_writes: int = 0
    evictions: int = 0
    events: int = 0
    status_writes: int = 0
    node_errors: int = 0  # API errors advancing one node (retried next pass)
    cpu_s: float = 0.0
    by_state: dict[str, int] = field(default_factory=dict)


@dataclass
class PassResult:
    requeue_after: float | None
    error: str | None = None


class UpgradeController:
    """See the module docstring. Run with :func:`run_upgrades` (watches and passes)."""

    def __init__(
        self,
        kube: Any,
        *,
        namespace: str,
        driver_labels: Mapping[str, str] = DRIVER_LABELS,
        validators: Sequence[Mapping[str, str]] = VALIDATOR_SELECTORS,
        event_namespace: str = "default",
        may_write: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        parse: Callable[[Mapping[str, Any]], Any] | None = None,
        on_transition: Callable[[str, str, str, str], None] = lambda node, old, new, why: None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.driver_labels = dict(driver_labels)
        self.validators = tuple(dict(v) for v in validators)
        self.event_namespace = event_namespace
        self.may_write = may_write
        self.clock = clock
        self.parse = parse or check_policy
        self.on_transition = on_transition
        self.cache = ObjectCache(kube, namespace=namespace, labels=self.driver_labels)
        self.cache.watch([DAEMON_SET, CONTROLLER_REVISION, POD])
        self.nodes: dict[str, NodeSummary] = {}
        self.nodes_synced = asyncio.Event()
        self.wake: Callable[[], None] = lambda: None  # queues a pass (set by run_upgrades)
        self.stats = UpgradeStats()
        self.status: dict[str, Any] | None = None  # the last status.driverUpgrade written
        self.policy_name: str | None = None
        self._policy_obj: Mapping[str, Any] = {}
        self.policies: dict[str, Obj] | None = None  # from the watch (None: read them each pass)
        self._digests: dict[tuple[str, str], str] = {}  # (uid, resourceVersion) -> install digest
        self.error: str | None = None
        self._refused: dict[str, dict[str, str]] = {}  # node -> pod key -> why its eviction was refused
        self._seq = 0
        self.log = get_logger("gpunode.operator.upgrade")

    # -- node cache ------------------------------------------------------------------------------------
    def store_node(self, node: NodeSummary) -> None:
        """A node as seen (a watch event, or the answer to our own write): kept unless older."""
        old = self.nodes.get(node.name)
        if old is None or _newer(node.resource_version, old.resource_version):
            self.nodes[node.name] = node

    def node_event(self, event: NodeEvent) -> None:
        """A node event from another controller's watch: cached, and a pass queued."""
        self.on_node_event(event)
        self.wake()

    def on_node_event(self, event: NodeEvent) -> None:
        if event.type == "SYNC":
            listed = {n.name for n in event.nodes}
            for name in [n for n in self.nodes if n not in listed]:
                del self.nodes[name]
            for node in event.nodes:
                self.nodes[node.name] = node
            self.nodes_synced.set()
        elif event.node is not None:
            if event.type == "DELETED":
                self.nodes.pop(event.node.name, None)
            else:
                self.store_node(event.node)

    def synced(self) -> bool:
        return self.nodes_synced.is_set() and all(
            self.cache.synced(k) for k in (DAEMON_SET, CONTROLLER_REVISION, POD)
        )

    # -- reading -----------------------------------------------------------------------------------------
    def drivers(self) -> dict[str, _Driver]:
        """Each node's driver pod and its DaemonSet's newest revision, from the cache."""
        revisions: dict[str, tuple[int, str, str]] = {}  # DaemonSet uid -> (revision, hash, digest)
        for cr in self.cache.of_kind(CONTROLLER_REVISION):
            meta = _meta(cr)
            number = cr.get("revision")
            if not isinstance(number, int):
                continue
            digest = self._digest(
                cr, (((cr.get("data") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            )
            rev_hash = str((meta.get("labels") or {}).get("controller-revision-hash") or "")
            if not rev_hash:
                rev_hash = str(meta.get("name", "")).rsplit("-", 1)[-1]
            for ref in meta.get("ownerReferences") or []:
                uid = str(ref.get("uid"))
                if ref.get("controller") and (uid not in revisions or revisions[uid][0] < number):
                    revisions[uid] = (number, rev_hash, digest)
        daemonsets = {str(_meta(ds).get("uid")): ds for ds in self.cache.of_kind(DAEMON_SET)}
        out: dict[str, _Driver] = {}
        live: dict[str, int] = {}
        for pod in self.cache.of_kind(POD):
            meta = _meta(pod)
            owner = next(
                (str(r.get("uid")) for r in meta.get("ownerReferences") or [] if r.get("controller")), ""
            )
            if owner not in daemonsets:
                continue
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if not node:
                continue
            _, newest, digest = revisions.get(owner, (0, "", ""))
            found = out.setdefault(
                node, _Driver(owner=owner, newest=newest or None, newest_digest=digest or None)
            )
            terminating = "deletionTimestamp" in meta
            if not terminating:
                live[owner] = live.get(owner, 0) + 1
            if found.pod is None or ("deletionTimestamp" in _meta(found.pod) and not terminating):
                found.pod = pod
        # A DaemonSet short of pods holds back its own nodes, but for the pods we deleted ourselves.
        for uid, ds in daemonsets.items():
            desired = int((ds.get("status") or {}).get("desiredNumberScheduled") or 0)
            ours = sum(
                1
                for name, d in out.items()
                if d.owner == uid
                and (d.pod is None or "deletionTimestamp" in _meta(d.pod))
                and self._state(name) in plan.ACTIVE_STATES
            )
            complete = live.get(uid, 0) + ours >= desired
            for d in out.values():
                if d.owner == uid:
                    d.complete = complete
        return out

    def _digest(self, obj: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
        """:func:`install_digest` of an object's pod spec, once per object version."""
        meta = _meta(obj)
        key = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
        found = self._digests.get(key)
        if found is None:
            if len(self._digests) > 50_000:  # old versions: dropped wholesale, recomputed on demand
                self._digests.clear()
            found = self._digests[key] = install_digest(spec)
        return found

    def _state(self, name: str) -> str:
        node = self.nodes.get(name)
        return node.labels.get(plan.STATE_LABEL, "") if node is not None else ""

    def views(self, drivers: Mapping[str, _Driver] | None = None) -> dict[str, plan.NodeView]:
        """The nodes the upgrade concerns (a driver pod, or our label or annotations on them)."""
        found = self.drivers() if drivers is None else drivers
        out: dict[str, plan.NodeView] = {}
        for name, node in self.nodes.items():
            d = found.get(name)
            ours = plan.STATE_LABEL in node.labels or plan.CORDONED_BY_US_ANNOTATION in node.annotations
            if d is None and not ours:
                continue
            state = node.labels.get(plan.STATE_LABEL, "")
            pod = d.pod if d is not None else None
            out[name] = plan.NodeView(
                name=name,
                state=state if state in plan.STATES else "",
                skip=node.labels.get(plan.SKIP_LABEL) == "true",
                unschedulable=node.unschedulable,
                ready=node.ready,
                cordoned_by_us=node.annotations.get(plan.CORDONED_BY_US_ANNOTATION) == "true",
                pod_revision=(
                    str((_meta(pod).get("labels") or {}).get("controller-revision-hash") or "") or None
                    if pod is not None
                    else None
                ),
                newest_revision=d.newest if d is not None else None,
                pod_digest=self._digest(pod, pod.get("spec") or {}) if pod is not None else None,
                newest_digest=d.newest_digest if d is not None else None,
                daemonset_complete=d.complete if d is not None else True,
                requested=node.annotations.get(plan.REQUESTED_ANNOTATION) == "true",
                retry=plan.RETRY_ANNOTATION in node.annotations,
                failed_revision=node.annotations.get(FAILED_REVISION_ANNOTATION),
            )
        return out

    def on_policy_event(self, event: ObjectEvent) -> None:
        """A ClusterPolicy watch event: the policies are kept, so a pass reads none."""
        if event.type == "SYNC":
            self.policies = {str(_meta(o).get("name")): dict(o) for o in event.objects}
        elif event.obj is not None and self.policies is not None:
            name = str(_meta(event.obj).get("name"))
            if event.type == "DELETED":
                self.policies.pop(name, None)
            else:
                self.policies[name] = dict(event.obj)

    async def read_policy(self) -> tuple[str, UpgradePolicy] | None:
        """The active ClusterPolicy's upgrade settings (None: no policy); :class:`ConfigError` if bad."""
        if self.policies is not None:
            policies = list(self.policies.values())
        else:
            try:
                policies, _ = await self.kube.list_objects(CLUSTER_POLICY)
            except KubeNotFound:  # the CRD is not installed (yet): no policy
                return None
        active = active_policy(policy_ref(p) for p in policies)
        if active is None:
            return None
        obj = next(p for p in policies if str(_meta(p).get("name")) == active.name)
        self.policy_name = active.name
        self._policy_obj = obj
        return active.name, upgrade_policy(self.parse(obj), f"ClusterPolicy {active.name}")

    # -- one pass ----------------------------------------------------------------------------------------
    async def reconcile(self) -> PassResult:
        started = time.thread_time()  # this thread's: a test API server in the same process is not ours
        try:
            return await self._reconcile()
        finally:
            self.stats.passes += 1
            self.stats.cpu_s += time.thread_time() - started

    async def _reconcile(self) -> PassResult:
        try:
            found = await self.read_policy()
        except (ConfigError, ValueError) as exc:
            why = str(exc)
            if why != self.error:
                self.log.warning("driver_upgrade_policy_invalid", error=why, action="no node touched")
            self.error = why
            return PassResult(None, why)
        self.error = None
        if found is None or not self.synced():
            return PassResult(BUSY_REQUEUE_S if found is not None else None)
        _, pol = found
        if not pol.auto_upgrade or not pol.driver_enabled:
            await self._disable()
            off = _status(False, "autoUpgrade is off: no node is upgraded, the state labels are removed")
            await self._write_status(off)
            return PassResult(None)
        drivers = self.drivers()
        views = self.views(drivers)
        sem = asyncio.Semaphore(CONCURRENCY)

        async def advance(view: plan.NodeView) -> None:
            async with sem:
                try:
                    await self._advance(view, pol, drivers)
                except KubeError as exc:  # this node again next pass; the others go on
                    self.stats.node_errors += 1
                    self.log.warning("driver_upgrade_node_failed", node=view.name, error=str(exc))

        if not self.may_write():
            return PassResult(BUSY_REQUEUE_S)
        async with asyncio.TaskGroup() as group:
            for view in views.values():
                if view.state != "upgrade-required":
                    group.create_task(advance(view))
        views = self.views(self.drivers())
        limits = plan.Limits(pol.max_parallel, plan.max_unavailable(pol.max_unavailable, len(views)))
        admission = plan.admit(views.values(), limits)
        started: list[plan.NodeView] = []
        for name in admission.start:
            try:
                moved = await self._transition(
                    views[name], plan.Step("cordon-required", "a slot is free: starting")
                )
            except KubeError as exc:  # not admitted after all: its slot stays free this pass
                self.stats.node_errors += 1
                self.log.warning("driver_upgrade_node_failed", node=name, error=str(exc))
                continue
            if moved is not None:
                started.append(moved)
        if started:  # on at once: cordoning a node admitted here raises no count past what admit() allowed
            drivers = self.drivers()
            async with asyncio.TaskGroup() as group:
                for view in started:
                    group.create_task(advance(view))
        views = self.views(self.drivers())
        await self._write_status(self._summary(views, plan.admit(views.values(), limits)))
        busy = any(v.state not in ("", "upgrade-done", "upgrade-failed") for v in views.values())
        return PassResult(BUSY_REQUEUE_S if busy else IDLE_REQUEUE_S)

    async def _advance(self, view: plan.NodeView, pol: UpgradePolicy, drivers: Mapping[str, _Driver]) -> None:
        pods: list[PodInfo] | None = None
        for _ in range(CHAIN):
            if view.state in ("drain-required", "pod-deletion-required", "wait-for-jobs-required"):
                if pods is None:
                    pods = await self.kube.list_node_pods(view.name)
            elif view.state == "validation-required" and pods is None:
                pods = await self.kube.list_node_pods(view.name)
            seen, targets = self._observe(view, pol, drivers.get(view.name), pods or [])
            if view.state == "uncordon-required":
                holder = self._operands_held(view.name)
                if holder:
                    self._note(view.name, holder)
                    return
            nxt = plan.step(view, seen, pol.steps)
            if nxt.action in ("evict-gpu-pods", "drain"):
                await self._evict(view.name, targets)
                return
            if nxt.action == "delete-driver-pod":
                await self._restart_driver(view.name, drivers.get(view.name), pods)
                return
            if nxt.to == view.state:
                return
            updated = await self._transition(view, nxt)
            if updated is None or nxt.to in ("upgrade-required", "upgrade-done", "upgrade-failed"):
                return
            view = updated

    def _observe(
        self, view: plan.NodeView, pol: UpgradePolicy, driver: _Driver | None, pods: Sequence[PodInfo]
    ) -> tuple[plan.Observed, tuple[PodInfo, ...]]:
        node = self.nodes.get(view.name)
        since = _epoch(node.annotations.get(SINCE_ANNOTATION)) if node is not None else None
        in_state = max(0.0, self.clock() - since) if since is not None else 0.0
        state = view.state
        if state == "wait-for-jobs-required":
            jobs = [
                p
                for p in pods
                if pol.wait_selector.terms
                and pol.wait_selector.matches(p.labels)
                and p.phase not in ("Succeeded", "Failed")
            ]
            return plan.Observed(in_state_s=in_state, jobs_left=len(jobs)), ()
        if state in ("pod-deletion-required", "drain-required"):
            deletion = state == "pod-deletion-required"

            def select(p: PodInfo) -> bool:
                if p.labels.get(plan.DRAIN_SKIP_POD_LABEL) == "true":
                    return False
                return is_gpu_pod(p) if deletion else pol.drain_selector.matches(p.labels)

            drain = plan_drain(
                pods,
                select=select,
                force=pol.deletion_force if deletion else pol.drain_force,
                delete_emptydir_data=pol.deletion_empty_dir if deletion else pol.drain_empty_dir,
            )
            refused = self._refused.get(view.name, {})
            left = {p.key for p in drain.targets}
            blocked = tuple(f"{k} ({why})" for k, why in sorted(refused.items()) if k in left)
            cannot = tuple(str(d) for d in drain.blocked)
            count = len(drain.targets)
            return (
                plan.Observed(
                    in_state_s=in_state,
                    gpu_pods_left=count if deletion else 0,
                    drain_left=0 if deletion else count,
                    blocked=blocked,
                    refused=cannot,
                ),
                drain.evict,
            )
        if state == "pod-restart-required":
            pod = driver.pod if driver is not None else None
            return (
                plan.Observed(
                    in_state_s=in_state,
                    driver_ready=pod is not None and _pod_ready(pod),
                    driver_restarts=_restarts(pod) if pod is not None else 0,
                ),
                (),
            )
        if state == "validation-required":
            validators = [
                p
                for p in pods
                if any(all(p.labels.get(k) == v for k, v in s.items()) for s in self.validators)
            ]
            ready = all(p.ready and not p.deleting for p in validators)
            return plan.Observed(in_state_s=in_state, validator_ready=ready), ()
        return plan.Observed(in_state_s=in_state), ()

    def _operands_held(self, name: str) -> str | None:
        """Why the node must wait before it is uncordoned: a live pause of its operands (the driver
        manager's, still at work); None when none is held (an abandoned one is restored with the uncordon)."""
        node = self.nodes.get(name)
        text = node.annotations.get(OPERANDS_ANNOTATION) if node is not None else None
        record = PauseRecord.from_json(text) if text else None
        if record is not None and record.lease_until > self.clock():
            return f"operands paused by {record.owner} for {record.reason}: waiting for them to come back"
        return None

    def _note(self, name: str, why: str) -> None:
        self.log.info("driver_upgrade_waiting", node=name, reason=why)

    # -- writing -----------------------------------------------------------------------------------------
    async def _transition(self, view: plan.NodeView, nxt: plan.Step) -> plan.NodeView | None:
        """Move a node to ``nxt.to`` in one patch (state, reason, time, and the cordon or uncordon with
        its record); an Event says so. None when the node changed under us (done again next pass)."""
        node = self.nodes.get(view.name)
        if node is None or not self.may_write():
            return None
        now = self.clock()
        labels: dict[str, str | None] = {plan.STATE_LABEL: nxt.to}
        annotations: dict[str, str | None] = {
            plan.REASON_ANNOTATION: nxt.reason[:1000],
            SINCE_ANNOTATION: _iso(now),
        }
        unschedulable: bool | None = None
        version: str | None = None
        if nxt.action == "cordon":
            unschedulable, version = True, node.resource_version
            annotations[plan.CORDONED_BY_US_ANNOTATION] = "true"
            annotations[UPGRADE_ENABLED_ANNOTATION] = "true"
        if nxt.to in ("upgrade-done", "upgrade-failed") and view.cordoned_by_us:
            if node.unschedulable:
                unschedulable = False
            annotations[plan.CORDONED_BY_US_ANNOTATION] = None
        if nxt.to == "upgrade-done":
            text = node.annotations.get(OPERANDS_ANNOTATION)
            record = PauseRecord.from_json(text) if text else None
            if text is not None:
                annotations[OPERANDS_ANNOTATION] = None
            if record is not None:
                changes, _ = plan_restore(node.labels, record)
                labels.update(changes)
        if nxt.to == "upgrade-failed":
            annotations[FAILED_REVISION_ANNOTATION] = view.newest_revision or ""
        if view.state == "upgrade-failed":
            annotations[FAILED_REVISION_ANNOTATION] = None
            annotations[plan.RETRY_ANNOTATION] = None
        if view.requested and nxt.to == "upgrade-done":
            annotations[plan.REQUESTED_ANNOTATION] = None
        try:
            stored = await self.kube.patch_node_labels(
                view.name,
                labels=labels,
                annotations=annotations,
                resource_version=version,
                unschedulable=unschedulable,
            )
        except KubeConflict:
            self.store_node(await self.kube.read_node(view.name))
            return None
        except KubeNotFound:
            self.nodes.pop(view.name, None)
            return None
        self.store_node(stored)
        self.stats.node_writes += 1
        self.stats.transitions += 1
        self.stats.by_state[nxt.to] = self.stats.by_state.get(nxt.to, 0) + 1
        if nxt.to not in ("pod-deletion-required", "drain-required"):
            self._refused.pop(view.name, None)
        self.log.info(
            "driver_upgrade_transition",
            node=view.name,
            previous=view.state or None,
            state=nxt.to,
            reason=nxt.reason,
            cordoned=unschedulable,
        )
        self.on_transition(view.name, view.state, nxt.to, nxt.reason)
        await self._event(view.name, view.state, nxt)
        return replace(
            view,
            state=nxt.to,
            unschedulable=stored.unschedulable,
            cordoned_by_us=stored.annotations.get(plan.CORDONED_BY_US_ANNOTATION) == "true",
        )

    async def _event(self, node: str, previous: str, nxt: plan.Step) -> None:
        self._seq += 1
        name = f"{node}.gpu-driver-upgrade.{time.time_ns():x}{self._seq:x}"
        now = _iso(self.clock())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name[:253], "namespace": self.event_namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": "DriverUpgrade" + "".join(w.title() for w in (nxt.to or "none").split("-")),
            "message": f"{previous or 'none'} -> {nxt.to}: {nxt.reason}"[:1024],
            "type": "Warning" if nxt.to == "upgrade-failed" else "Normal",
            "source": {"component": "gpunode-operator"},
            "reportingComponent": "gpunode-operator",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.apply(event)
            self.stats.events += 1
        except KubeError as exc:  # the transition stands; the Event is a convenience
            self.log.warning("driver_upgrade_event_failed", node=node, error=str(exc))

    async def _evict(self, name: str, pods: Sequence[PodInfo]) -> None:
        refused = self._refused.setdefault(name, {})
        for pod in pods:
            if not self.may_write():  # the lease lost meanwhile: the next leader goes on
                return
            try:
                await self.kube.evict_pod(pod.namespace, pod.name)
            except KubeUnavailable as exc:
                refused[pod.key] = f"API server unavailable: {exc.message}"
                continue
            except KubeError as exc:
                if exc.status == 429:
                    refused[pod.key] = f"eviction refused by a PodDisruptionBudget: {exc.message}"
                    continue
                refused[pod.key] = f"eviction failed: {exc}"
                continue
            refused.pop(pod.key, None)
            self.stats.evictions += 1
            self.log.info("driver_upgrade_pod_evicted", node=name, pod=pod.key, uid=pod.uid)

    async def _restart_driver(self, name: str, driver: _Driver | None, pods: list[PodInfo] | None) -> None:
        """Delete the node's validator pods, then its stale driver pod: the DaemonSets put the newest in
        their place, and the new validators validate the new driver. Validators first: a controller
        killed between the two deletes leaves the stale driver pod, so the next one does both again; the
        other order would leave an old validator, Ready from the old driver, to pass validation unseen."""
        pod = driver.pod if driver is not None else None
        if pod is None or "deletionTimestamp" in _meta(pod) or not self.may_write():
            return  # gone or going: waiting for the new one
        if pods is None:
            pods = await self.kube.list_node_pods(name)
        for p in pods:
            if (
                any(all(p.labels.get(k) == v for k, v in s.items()) for s in self.validators)
                and not p.deleting
            ):
                await self.kube.delete_pod(p.namespace, p.name)
        meta = _meta(pod)
        await self.kube.delete_pod(str(meta.get("namespace")), str(meta.get("name")))
        self.log.info(
            "driver_upgrade_driver_pod_deleted", node=name, pod=f"{meta.get('namespace')}/{meta.get('name')}"
        )

    async def _disable(self) -> None:
        """``autoUpgrade`` off: every state label and our annotations removed, our cordons lifted."""
        for name, node in list(self.nodes.items()):
            ours = [
                k
                for k in (
                    plan.REASON_ANNOTATION,
                    SINCE_ANNOTATION,
                    FAILED_REVISION_ANNOTATION,
                    plan.CORDONED_BY_US_ANNOTATION,
                    UPGRADE_ENABLED_ANNOTATION,
                )
                if k in node.annotations
            ]
            if plan.STATE_LABEL not in node.labels and not ours:
                continue
            if not self.may_write():
                return
            uncordon = node.annotations.get(plan.CORDONED_BY_US_ANNOTATION) == "true" and node.unschedulable
            try:
                stored = await self.kube.patch_node_labels(
                    name,
                    labels={plan.STATE_LABEL: None} if plan.STATE_LABEL in node.labels else None,
                    annotations=dict.fromkeys(ours) or None,
                    unschedulable=False if uncordon else None,
                )
            except KubeNotFound:
                continue
            self.store_node(stored)
            self.stats.node_writes += 1
            self.log.info("driver_upgrade_disabled", node=name, uncordoned=uncordon)

    # -- status ------------------------------------------------------------------------------------------
    def _summary(self, views: Mapping[str, plan.NodeView], admission: plan.Admission) -> dict[str, Any]:
        counts = {"pending": 0, "upgrading": 0, "done": 0, "failed": 0, "held": 0}
        failed: list[dict[str, str]] = []
        for name in sorted(views):
            v = views[name]
            if v.state == "upgrade-required":
                counts["pending"] += 1
            elif v.state in plan.ACTIVE_STATES:
                counts["upgrading"] += 1
            elif v.state == "upgrade-done":
                counts["done"] += 1
            elif v.state == "upgrade-failed":
                counts["failed"] += 1
                if len(failed) < MAX_STATUS_NODES:
                    node = self.nodes.get(name)
                    why = node.annotations.get(plan.REASON_ANNOTATION, "") if node is not None else ""
                    failed.append({"node": name, "reason": why})
            if v.state in ("", "upgrade-done") and plan.need(v)[0] == "held":
                counts["held"] += 1
        waiting = sorted(admission.waiting)
        parts = [f"{counts['upgrading']} upgrading", f"{counts['pending']} waiting for a slot"]
        parts += [f"{counts['done']} done", f"{counts['failed']} failed"]
        if counts["held"]:
            parts.append(f"{counts['held']} held")
        return _status(
            True,
            ", ".join(parts),
            counts=counts,
            upgrading=sorted(admission.holding)[:MAX_STATUS_NODES],
            waiting=waiting[:MAX_STATUS_NODES],
            waiting_reason=admission.waiting[waiting[0]] if waiting else "",
            failed=failed,
        )

    async def _write_status(self, summary: dict[str, Any]) -> None:
        """``status.driverUpgrade`` of the active policy, when it changed (every key written, so the
        merge patch replaces what was there)."""
        if summary == self.status or self.policy_name is None or not self.may_write():
            return
        previous = (self._policy_obj.get("status") or {}).get(STATUS_KEY)
        if previous == summary:
            self.status = summary
            return
        try:
            await self.kube.patch_status(CLUSTER_POLICY, self.policy_name, {STATUS_KEY: summary})
        except KubeError as exc:
            self.log.warning("driver_upgrade_status_failed", error=str(exc))
            return
        self.status = summary
        self.stats.status_writes += 1


def _status(
    auto: bool,
    message: str,
    *,
    counts: Mapping[str, int] | None = None,
    upgrading: Sequence[str] = (),
    waiting: Sequence[str] = (),
    waiting_reason: str = "",
    failed: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    return {
        "autoUpgrade": auto,
        "message": message,
        "nodes": dict(counts or dict.fromkeys(("pending", "upgrading", "done", "failed", "held"), 0)),
        "upgrading": list(upgrading),
        "waiting": list(waiting),
        "waitingReason": waiting_reason,
        "failed": [dict(f) for f in failed],
    }


# -- the loop --------------------------------------------------------------------------------------------
async def run_upgrades(
    controller: UpgradeController,
    *,
    queue: WorkQueue[str] | None = None,
    on_pass: Callable[[PassResult], None] = lambda r: None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    watch_nodes_too: bool = True,
) -> None:
    """Watch nodes, the ClusterPolicies and the driver's objects; a pass on every change (batched over
    ``EVENT_BATCH_S``), while busy every second, idle every 2 minutes; failures retried with backoff.

    ``watch_nodes_too=False``: the node events come from elsewhere (the operator feeds the labeller's
    watch to :meth:`UpgradeController.node_event`), so nodes are not listed and kept twice."""
    key = "driver-upgrade"
    work: WorkQueue[str] = queue if queue is not None else WorkQueue()
    kube = controller.kube
    log = controller.log
    controller.cache.on_change = lambda: work.add(key, EVENT_BATCH_S)
    controller.wake = lambda: work.add(key, EVENT_BATCH_S)

    async def watch_nodes() -> None:
        delay = 0.1
        while True:
            try:
                async for event in kube.watch_nodes():
                    delay = 0.1
                    controller.on_node_event(event)
                    work.add(key, EVENT_BATCH_S)
            except KubeError as exc:
                log.warning("driver_upgrade_watch_failed", resource="nodes", error=str(exc), retry_in_s=delay)
            await sleep(delay)
            delay = min(30.0, delay * 2)

    async def watch_policies() -> None:
        delay = 0.1
        while True:
            try:
                async for event in kube.watch_objects(CLUSTER_POLICY):
                    delay = 0.1
                    controller.on_policy_event(event)
                    work.add(key, EVENT_BATCH_S)
            except KubeError as exc:
                controller.policies = None
                log.warning(
                    "driver_upgrade_watch_failed",
                    resource=CLUSTER_POLICY.plural,
                    error=str(exc),
                    retry_in_s=delay,
                )
            await sleep(delay)
            delay = min(30.0, delay * 2)

    work.add(key)
    async with asyncio.TaskGroup() as group:
        if watch_nodes_too:
            group.create_task(watch_nodes(), name="upgrade-nodes")
        group.create_task(watch_policies(), name="upgrade-clusterpolicies")
        group.create_task(controller.cache.run(), name="upgrade-driver-objects")
        group.create_task(
            serve(
                work,
                controller.reconcile,
                log=log,
                retry_event="driver_upgrade_retry",
                error_event="driver_upgrade_error",
                on_result=on_pass,
            ),
            name="driver-upgrade",
        )

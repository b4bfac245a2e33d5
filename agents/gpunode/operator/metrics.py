"""gpunode-operator's own metrics, served at ``/metrics`` beside ``/healthz`` and ``/readyz``.

Counted as things happen: reconcile passes by result and their duration, Kubernetes API errors by verb
and HTTP status (every call of the operator's one client goes through :class:`CountingKube`). Read at
scrape time from what the operator already keeps: the active ClusterPolicy's status (its state, each
state's DaemonSet pod counts) and the node labeller's cache (nodes, NFD and GPU nodes, label patches,
and how many nodes are in each state of NVIDIA's driver upgrade label
``nvidia.com/gpu-driver-upgrade-state``, the label the upgrade controller walks nodes through).

The names (``gpunode_operator_*``) are what ``containers/monitoring/`` alerts on and the dashboard
draws; the README's metrics table lists them.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpunode.common.metrics import AgentMetrics, create_metrics
from gpunode.kube.api import KubeError
from gpunode.operator.labels import has_nfd_labels, is_gpu_node
from gpunode.operator.upgrade_plan import STATE_LABEL, STATES

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from prometheus_client.metrics_core import Metric

    from gpunode.operator.controller import ClusterPolicyController
    from gpunode.operator.labeller import NodeLabeller
    from gpunode.operator.upgrade import UpgradeController

__all__ = [
    "AGENT",
    "UPGRADE_STATES",
    "UPGRADE_STATE_LABEL",
    "CountingKube",
    "OperatorMetrics",
    "create_operator_metrics",
]

AGENT = "operator"
# NVIDIA's driver upgrade state machine: the node label and its values (the label absent: no upgrade).
UPGRADE_STATE_LABEL = STATE_LABEL
UPGRADE_STATES = STATES[1:]  # the label's values (absent or empty: no upgrade)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(eq=False)  # registered as a collector: hashed by identity
class OperatorMetrics:
    """The operator's registry; :meth:`attach` hands it the leader's labeller and controller."""

    base: AgentMetrics
    reconciles: Counter  # gpunode_operator_reconciles_total{result}
    duration: Histogram  # gpunode_operator_reconcile_duration_seconds
    api_errors: Counter  # gpunode_operator_api_errors_total{verb,code}
    labeller: NodeLabeller | None = None
    controller: ClusterPolicyController | None = None
    leading: Callable[[], bool] = field(default=lambda: False)
    upgrades: UpgradeController | None = None  # the driver upgrade controller (leader only)

    @property
    def registry(self) -> Any:
        return self.base.registry

    def attach(self, labeller: NodeLabeller | None, controller: ClusterPolicyController | None) -> None:
        """What the scrape reads (None, None: this replica stopped leading)."""
        self.labeller = labeller
        self.controller = controller

    def observe_pass(self, seconds: float, ok: bool) -> None:
        """One reconcile pass that took ``seconds`` and succeeded or failed."""
        self.reconciles.labels(result="success" if ok else "error").inc()
        self.duration.observe(seconds)
        if ok:
            self.base.mark_success("reconcile")
        else:
            self.base.count_error("reconcile")

    def count_api_error(self, exc: KubeError) -> None:
        code = str(exc.status) if exc.status is not None else "none"
        self.api_errors.labels(verb=exc.verb or "unknown", code=code).inc()

    # -- read at scrape time ---------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        leader = GaugeMetricFamily(
            "gpunode_operator_leader", "1 while this replica leads (reconciles and labels nodes)."
        )
        leader.add_metric([], 1.0 if self.leading() else 0.0)
        yield leader

        status = self.controller.last_status if self.controller is not None else None
        policy = self.controller.last_policy if self.controller is not None else None
        ready = GaugeMetricFamily(
            "gpunode_operator_clusterpolicy_ready",
            "1 while the active ClusterPolicy's status.state is ready, 0 otherwise.",
            labels=["clusterpolicy"],
        )
        state_ready = GaugeMetricFamily(
            "gpunode_operator_state_ready",
            "1 while a state of the active ClusterPolicy is ready, 0 while not (disabled states absent).",
            labels=["state"],
        )
        desired = GaugeMetricFamily(
            "gpunode_operator_state_desired_pods",
            "Pods the state's DaemonSets should run (summed desiredNumberScheduled).",
            labels=["state"],
        )
        ready_pods = GaugeMetricFamily(
            "gpunode_operator_state_ready_pods",
            "Pods of the state's DaemonSets that are up to date and ready.",
            labels=["state"],
        )
        if status is not None and policy is not None:
            ready.add_metric([policy], 1.0 if status.get("state") == "ready" else 0.0)
            for entry in status.get("states") or []:
                if not isinstance(entry, Mapping) or entry.get("state") == "disabled":
                    continue
                name = str(entry.get("name"))
                state_ready.add_metric([name], 1.0 if entry.get("state") == "ready" else 0.0)
                desired.add_metric([name], float(entry.get("desired") or 0))
                ready_pods.add_metric([name], float(entry.get("ready") or 0))
        yield from (ready, state_ready, desired, ready_pods)
        yield from self._upgrade_counters()

        labeller = self.labeller
        if labeller is None or not labeller.synced.is_set():
            return
        nodes = list(labeller.nodes.values())  # one C-level copy: safe beside the event loop's writes
        counts = GaugeMetricFamily(
            "gpunode_operator_nodes", "Nodes in the cluster, all, NFD-labelled and GPU.", labels=["kind"]
        )
        counts.add_metric(["all"], float(len(nodes)))
        counts.add_metric(["nfd"], float(sum(1 for n in nodes if has_nfd_labels(n.labels))))
        counts.add_metric(["gpu"], float(sum(1 for n in nodes if is_gpu_node(n.labels))))
        yield counts
        patches = CounterMetricFamily(
            "gpunode_operator_node_label_patches",
            "Node label patches the node labeller wrote (nodes labelled).",
        )
        patches.add_metric([], float(labeller.stats.patched))
        yield patches
        conflicts = CounterMetricFamily(
            "gpunode_operator_node_label_conflicts",
            "Node label patches refused with 409 (the node changed since it was cached; retried).",
        )
        conflicts.add_metric([], float(labeller.stats.conflicts))
        yield conflicts
        upgrade = GaugeMetricFamily(
            "gpunode_operator_driver_upgrade_nodes",
            f"Nodes per value of the {UPGRADE_STATE_LABEL} label (NVIDIA's driver upgrade states).",
            labels=["state"],
        )
        by_state: dict[str, int] = dict.fromkeys(UPGRADE_STATES, 0)
        for node in nodes:
            value = node.labels.get(UPGRADE_STATE_LABEL)
            if value:
                by_state[value] = by_state.get(value, 0) + 1
        for name, n in by_state.items():
            upgrade.add_metric([name], float(n))
        yield upgrade

    def _upgrade_counters(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        stats = self.upgrades.stats if self.upgrades is not None else None
        transitions = CounterMetricFamily(
            "gpunode_operator_driver_upgrade_transitions",
            "Driver upgrade state transitions the upgrade controller wrote, by the state entered.",
            labels=["state"],
        )
        for state in UPGRADE_STATES:
            transitions.add_metric([state], float(stats.by_state.get(state, 0) if stats else 0))
        yield transitions
        evictions = CounterMetricFamily(
            "gpunode_operator_driver_upgrade_evictions",
            "Pods the upgrade controller evicted (GPU pods, drains) through the Eviction API.",
        )
        evictions.add_metric([], float(stats.evictions if stats else 0))
        yield evictions

    def describe(self) -> list[Metric]:
        return []  # families are built at scrape time


def create_operator_metrics(*, process_metrics: bool = True) -> OperatorMetrics:
    from prometheus_client import Counter, Histogram

    base = create_metrics(AGENT, process_metrics=process_metrics)
    registry = base.registry
    metrics = OperatorMetrics(
        base=base,
        reconciles=Counter(
            "gpunode_operator_reconciles",
            "ClusterPolicy reconcile passes, by result (success, error).",
            labelnames=("result",),
            registry=registry,
        ),
        duration=Histogram(
            "gpunode_operator_reconcile_duration_seconds",
            "How long a ClusterPolicy reconcile pass took.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        ),
        api_errors=Counter(
            "gpunode_operator_api_errors",
            "Kubernetes API calls that failed, by verb and HTTP status (none: no answer).",
            labelnames=("verb", "code"),
            registry=registry,
        ),
    )
    for result in ("success", "error"):
        metrics.reconciles.labels(result=result)
    registry.register(metrics)
    return metrics


class CountingKube:
    """The operator's Kubernetes client with every :class:`KubeError` counted by verb on its way out.

    Forwards every attribute; coroutine methods and async-iterator methods (the watches) are wrapped.
    """

    def __init__(self, kube: Any, count: Callable[[KubeError], None]) -> None:
        self._kube = kube
        self._count = count

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._kube, name)
        if inspect.iscoroutinefunction(target):

            async def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await target(*args, **kwargs)
                except KubeError as exc:
                    self._count(exc)
                    raise

            return call
        if name.startswith("watch_") and callable(target):

            def watch(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                return self._watch(target(*args, **kwargs))

            return watch
        return target

    async def _watch(self, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        try:
            async for event in events:
                yield event
        except KubeError as exc:
            self._count(exc)
            raise
        finally:
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()

"""gpunode-operator's wiring: one cluster-wide client, node labelling and the ClusterPolicy controller,
behind leader election when asked, with ``/healthz``, ``/readyz`` and ``/metrics``
(:mod:`gpunode.operator.metrics`).

The renderer is a parameter: rendering (``gpunode.deploy``) sits above the agents layer, so the console
script's module, which lives there, hands it in.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gpunode.common.logging import get_logger
from gpunode.operator.cache import ObjectCache
from gpunode.operator.controller import (
    KEY,
    ClusterPolicyController,
    ReconcileResult,
    Renderer,
    run_controller,
)
from gpunode.operator.labeller import NodeLabeller
from gpunode.operator.leader import LeaderElector
from gpunode.operator.metrics import CountingKube, create_operator_metrics
from gpunode.operator.queue import WorkQueue
from gpunode.operator.settings import DEFAULT_NAMESPACE, OperatorSettings
from gpunode.operator.upgrade import UpgradeController, check_policy, run_upgrades

if TYPE_CHECKING:
    from gpunode.kube.client import Kube

__all__ = ["OperatorState", "election_timings", "resolve_namespace", "run_operator"]

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def resolve_namespace(settings: OperatorSettings, sa_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """``--namespace``, else the pod's own namespace (its service account says), else gpunode."""
    if settings.namespace:
        return settings.namespace
    with contextlib.suppress(OSError):
        found = sa_file.read_text(encoding="utf-8").strip()
        if found:
            return found
    return DEFAULT_NAMESPACE


def election_timings(lease_duration: float) -> tuple[float, float]:
    """(renew deadline, retry period) for a lease duration, in client-go's default proportions
    (15 s: 10 s and 2 s)."""
    return lease_duration * 2 / 3, lease_duration * 2 / 15


@dataclass
class OperatorState:
    """What ``/readyz`` and the tests read."""

    leading: bool = False
    last: ReconcileResult | None = None


async def run_operator(
    settings: OperatorSettings,
    render: Renderer,
    *,
    environ: Mapping[str, str] | None = None,
    kube: Kube | None = None,
    state: OperatorState | None = None,
    on_result: Callable[[ReconcileResult], None] = lambda r: None,
) -> None:
    """Run until cancelled."""
    from gpunode.common.http import HealthServer

    log = get_logger("gpunode.operator")
    namespace = resolve_namespace(settings)
    if kube is None:
        from gpunode.kube.client import Kube

        kube = Kube.connect_cluster(
            settings.kubeconfig, namespace=namespace, timeout=settings.kube_api_timeout
        )
    status = state or OperatorState()
    metrics = create_operator_metrics()
    metrics.leading = lambda: status.leading
    client = cast("Kube", CountingKube(kube, metrics.count_api_error))  # API errors counted by verb
    elector: LeaderElector | None = None
    if settings.leader_elect:
        renew, retry = election_timings(settings.lease_duration)
        elector = LeaderElector(
            client,
            name=settings.lease_name,
            namespace=namespace,
            identity=settings.identity or socket.gethostname(),
            lease_duration=settings.lease_duration,
            renew_deadline=renew,
            retry_period=retry,
        )
    leader = elector

    def may_write() -> bool:
        return leader is None or leader.is_leader

    async def lead() -> None:
        status.leading = True
        work: WorkQueue[str] = WorkQueue()
        # NVIDIA reconciles when a node gains or loses NFD's GPU labels: the labeller says when
        labeller = NodeLabeller(client, on_membership=lambda: work.add(KEY))
        controller = ClusterPolicyController(
            client,
            render,
            namespace=namespace,
            may_write=may_write,
            nodes=lambda: [n.labels for n in labeller.nodes.values()] if labeller.synced.is_set() else None,
            cache=ObjectCache(client, namespace=namespace),
            parse=check_policy,  # a bad driver.upgradePolicy is the policy's Error condition
        )
        # the rolling driver upgrade: its own loop, under the same lease
        upgrades = UpgradeController(client, namespace=namespace, may_write=may_write)
        labeller.listeners.append(upgrades.node_event)  # one node watch for both
        metrics.upgrades = upgrades

        metrics.attach(labeller, controller)

        def reconciled(result: ReconcileResult) -> None:
            status.last = result
            if controller.label_policy is not None:
                labeller.set_policy(controller.label_policy)
            on_result(result)

        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(labeller.run(), name="node-labeller")
                group.create_task(
                    run_controller(
                        controller, queue=work, on_result=reconciled, on_pass=metrics.observe_pass
                    ),
                    name="clusterpolicy",
                )
                group.create_task(run_upgrades(upgrades, watch_nodes_too=False), name="driver-upgrade")
        finally:
            status.leading = False
            metrics.attach(None, None)
            metrics.upgrades = None

    http: HealthServer | None = None
    if settings.http.http_port >= 0:
        http = HealthServer(
            metrics.registry, host=settings.http.listen_host(environ or {}), port=settings.http.http_port
        )
        http.add_check("kube", lambda: (client.available is not False, client.last_error or "reachable"))
        http.add_check(
            "leader", lambda: (True, "leading" if status.leading else "standing by (another replica leads)")
        )
    log.info("operator_starting", namespace=namespace, leader_elect=settings.leader_elect)
    try:
        async with asyncio.TaskGroup() as group:
            if http is not None:
                group.create_task(http.serve(), name="http")
            if elector is None:
                group.create_task(lead(), name="lead")
            else:
                elected = elector

                async def campaign() -> None:
                    while True:  # stand again after losing the lease
                        await elected.run(lead)

                group.create_task(campaign(), name="leader-election")
    finally:
        await client.aclose()

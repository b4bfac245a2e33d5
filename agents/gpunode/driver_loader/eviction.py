"""Evicting pods for the driver manager, as ``kubectl drain`` does: all-or-nothing up front, then the
Eviction API with disruption budgets honoured, waiting for the pods to be gone.

:meth:`Evictor.drain` plans with :func:`gpunode.kube.drain.plan_drain`: pods that may not be removed
(no controller without ``DRAIN_USE_FORCE``, emptyDir without ``DRAIN_DELETE_EMPTYDIR_DATA``) fail it
before anything is evicted. A 429 (a PodDisruptionBudget) or an unreachable API server is retried every
``evict_retry`` seconds until the drain timeout; pods are waited for by uid (a StatefulSet pod that comes
back under the same name does not count as still there), with progress logged while waiting.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from gpunode.common.logging import Logger
from gpunode.driver_loader.upgrade_state import UpgradeFailed, UpgradeOptions
from gpunode.kube.api import KubeError, KubeForbidden, KubeUnavailable, PodInfo
from gpunode.kube.drain import PodDecision, plan_drain

if TYPE_CHECKING:
    from gpunode.kube.client import Kube

__all__ = ["Evictor", "PodsInTheWay", "StepReporter"]


class StepReporter(Protocol):
    """Where the evictor reports a step it finished (the driver manager's ``driver_upgrade_step``)."""

    def __call__(self, step: str, detail: str, **fields: object) -> None: ...


class PodsInTheWay(Exception):
    """Pods that may not be evicted (``blocked``: nothing was evicted) or that outlived the drain
    timeout (``left``, described with why)."""

    def __init__(
        self, blocked: Sequence[PodDecision] = (), left: Sequence[str] = (), waited: float = 0.0
    ) -> None:
        self.blocked = tuple(blocked)
        self.left = tuple(left)
        self.waited = waited
        if self.blocked:
            text = "; ".join(str(d) for d in self.blocked)
            message = f"{len(self.blocked)} pod(s) may not be evicted: {text}"
        else:
            message = (
                f"{len(self.left)} pod(s) still on the node after {waited:.0f} s: {', '.join(self.left)}"
            )
        super().__init__(message)


class Evictor:
    """Evicts the pods of one node and waits for them; ``evicted`` lists every pod it evicted."""

    def __init__(
        self,
        kube: Kube,
        options: UpgradeOptions,
        *,
        report: StepReporter,
        log: Logger,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.kube = kube
        self.options = options
        self.report = report
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self.evicted: list[str] = []

    async def drain(self, step: str, what: str, select: Callable[[PodInfo], bool]) -> None:
        """Evict the selected pods and wait until they are gone; :class:`PodsInTheWay` when some may
        not be evicted (nothing evicted then) or outlive the drain timeout."""
        pods = await self.kube.list_pods()
        plan = plan_drain(
            pods,
            select=select,
            force=self.options.drain_use_force,
            delete_emptydir_data=self.options.drain_delete_emptydir_data,
        )
        if plan.ignored and what == "GPU":
            self.log.warning(
                "driver_upgrade_pods_not_evicted",
                pods=[str(d) for d in plan.ignored],
                hint="if they hold the GPUs the unload fails; NODE_LABEL_FOR_GPU_POD_EVICTION can pause "
                "the label their DaemonSet selects",
            )
        if plan.blocked:
            raise PodsInTheWay(blocked=plan.blocked)
        targets = {p.uid: p for p in plan.targets}
        if not targets:
            self.report(step, f"no {what} pods to evict")
            return
        timeout = self.options.drain_timeout
        started = self.clock()
        deadline = started + timeout if timeout > 0 else math.inf
        pending = {p.uid: p for p in plan.evict}  # eviction not accepted yet
        refused: dict[str, str] = {}
        next_try = started
        last_seen: tuple[str, ...] = ()
        last_log = started
        while True:
            if pending and self.clock() >= next_try:
                await self._evict(step, pending, refused)
                next_try = self.clock() + self.options.evict_retry
            present = {p.uid: p for p in await self.kube.list_pods()}
            left = {uid: pod for uid, pod in targets.items() if uid in present}
            pending = {uid: pod for uid, pod in pending.items() if uid in present}
            now = self.clock()
            waited = now - started
            if not left:
                self.report(
                    step,
                    f"{len(targets)} {what} pod(s) gone",
                    pods=sorted(p.key for p in targets.values()),
                    waited_s=round(waited, 2),
                )
                return
            names = tuple(sorted(pod.key for pod in left.values()))
            if names != last_seen or now - last_log >= self.options.progress_interval:
                self.log.info(
                    "driver_upgrade_evicting",
                    what=what,
                    pods_left=len(names),
                    pods=list(names[:20]),
                    refused={targets[u].key: why for u, why in refused.items() if u in left},
                    waited_s=round(waited, 1),
                    timeout_s=timeout or None,
                )
                last_seen, last_log = names, now
            if now >= deadline:
                described = [
                    f"{pod.key} ({refused.get(uid) or ('not evicted' if uid in pending else 'terminating')})"
                    for uid, pod in sorted(left.items(), key=lambda item: item[1].key)
                ]
                raise PodsInTheWay(left=described, waited=waited)
            await self.sleep(max(0.0, min(self.options.poll, deadline - now)))

    async def _evict(self, step: str, pending: dict[str, PodInfo], refused: dict[str, str]) -> None:
        """One round of eviction requests: accepted pods leave ``pending``, refusals are noted in
        ``refused`` (retried next round); any other error fails the step."""
        for uid, pod in list(pending.items()):
            try:
                accepted = await self.kube.evict_pod(pod.namespace, pod.name)
            except KubeForbidden as exc:
                raise UpgradeFailed(f"cannot evict {pod.key}: {exc}", step=step) from None
            except KubeUnavailable as exc:
                refused[uid] = f"API server unavailable: {exc.message}"
                continue
            except KubeError as exc:
                if exc.status != 429:
                    raise UpgradeFailed(f"evicting {pod.key} failed: {exc}", step=step) from None
                refused[uid] = "eviction refused by a PodDisruptionBudget, retrying"
                continue
            del pending[uid]
            refused.pop(uid, None)
            if accepted:
                self.evicted.append(pod.key)
                self.log.info("driver_upgrade_pod_evicted", pod=pod.key, uid=pod.uid)

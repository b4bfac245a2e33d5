"""The driver manager: clear the way for a driver load, as NVIDIA's k8s-driver-manager ``uninstall_driver``.

Before a driver container loads its modules, a driver already loaded must go, and it cannot while
anything holds the GPUs. :class:`DriverUpgrade` decides what the node needs and does it:

1. a driver installed on the host itself: label ``nvidia.com/gpu.deploy.driver=pre-installed`` (the
   driver DaemonSet stops selecting the node) and do nothing else;
2. no driver loaded: nothing to drain, load it;
3. loaded with the configuration we would load now (and no ``FORCE_REINSTALL``): keep the modules;
4. otherwise: pause the GPU operands (their ``nvidia.com/gpu.deploy.*`` labels read
   ``paused-for-driver-upgrade`` until their pods have left), cordon the node and evict the pods that
   request ``nvidia.com/gpu*`` / ``nvidia.com/mig-*`` (``ENABLE_GPU_POD_EVICTION``), unload (a driver
   still in use fails, or with ``ENABLE_AUTO_DRAIN`` drains the whole node and retries once), load,
   then uncordon and restore the labels.

How it differs from NVIDIA's, and why:

- **Nothing is left behind.** Whatever happens (success, failure, an exception, cancellation) the
  operand labels come back, the node is uncordoned and the record is removed. Before cordoning, the
  node annotation ``nvidia.com/gpunode.driver-upgrade`` (JSON ``{cordoned, started, step}``) says that
  we cordon it; a run that died halfway is finished by the next start *before anything else*: the
  operand labels are restored (:meth:`OperandPauser.recover`) and the node is uncordoned if the record
  says we cordoned it. NVIDIA's manager forgets a crashed run's cordon.
- **An administrator's cordon is kept.** A node already unschedulable is not cordoned by us, so it is
  not uncordoned either (NVIDIA always uncordons at the end).
- **The drain is all-or-nothing up front, as ``kubectl drain``.** Pods that may not be removed (no
  controller without ``DRAIN_USE_FORCE``, emptyDir without ``DRAIN_DELETE_EMPTYDIR_DATA``) fail the
  step before anything is evicted, naming each pod and the setting that would allow it. The whole-node
  drain follows the same rules, so it is not tried for such pods: it would only evict unrelated
  workloads and fail on the same pod. It is the fallback when GPU pods do not leave in time (a
  PodDisruptionBudget, slow termination) and when the driver is still in use after the GPU pods left
  (processes in pods that use a GPU without requesting one).
- **Pods are evicted with the Eviction API** (disruption budgets honoured: a 429 is retried until the
  drain timeout), each with its own grace period, and waited for by uid (a StatefulSet pod that comes
  back under the same name does not count as still there). Progress (pods left, seconds waited) is
  logged while waiting.
- **The driver is loaded here**, inside the pause: operands come back once the new driver is up.
- **A pre-installed host driver is reported, not failed** (NVIDIA sleeps 60 s and exits non-zero).
- ``DRAIN_TIMEOUT_SECONDS`` defaults to 300 s, not NVIDIA's ``0s`` (no limit): a pod that never
  leaves should end in a failure that names it rather than an init container waiting forever.
  ``0`` / ``0s`` still means no limit.
- The node annotation ``nvidia.com/gpu-driver-upgrade-enabled=true`` (the GPU Operator's upgrade
  controller owns eviction and draining) switches our eviction and auto-drain off, as NVIDIA's does.

Pods with emptyDir volumes (``PodInfo.empty_dirs``) are evicted only with ``DRAIN_DELETE_EMPTYDIR_DATA``,
as kubectl drain does: their data goes with them.

The pure parts (operands, the node record, options, outcomes) are in
:mod:`~gpunode.driver_loader.upgrade_state`, the eviction loop in :mod:`~gpunode.driver_loader.eviction`,
the settings in :mod:`~gpunode.driver_loader.settings`. The Kubernetes client is imported only when an
upgrade runs: the settings cost the driver loader nothing.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpunode.common.errors import UsageError
from gpunode.common.logging import get_logger
from gpunode.driver_loader.eviction import Evictor, PodsInTheWay
from gpunode.driver_loader.ops import DriverInUse, DriverOps
from gpunode.driver_loader.settings import UpgradeSettings, pod_selector
from gpunode.driver_loader.upgrade_state import (
    DRIVER_DEPLOY_LABEL,
    OWNER,
    PAUSE_REASON,
    PRE_INSTALLED,
    RECORD_ANNOTATION,
    UPGRADE_CONTROLLER_ANNOTATION,
    Result,
    UpgradeFailed,
    UpgradeOptions,
    UpgradeOutcome,
    UpgradeRecord,
    driver_operands,
    in_use_advice,
)
from gpunode.kube.api import KubeConflict, KubeError, KubeUnavailable
from gpunode.kube.drain import is_gpu_pod, plan_drain
from gpunode.kube.operands import OperandPauser, OperandsBusy, OperandsNotStopped

if TYPE_CHECKING:
    from gpunode.kube.client import Kube

__all__ = ["DriverUpgrade", "run_upgrade"]

PROG = "gpunode-driver-loader"


class DriverUpgrade:
    """One driver-manager run against this node; see the module docstring."""

    def __init__(
        self,
        kube: Kube,
        ops: DriverOps,
        options: UpgradeOptions | None = None,
        *,
        pauser: OperandPauser | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.kube = kube
        self.ops = ops
        self.options = options or UpgradeOptions()
        self.operands = driver_operands(self.options.eviction_label)
        self.pauser = pauser or OperandPauser(kube, OWNER, operands=self.operands, poll=self.options.poll)
        self.selector = pod_selector(self.options.drain_pod_selector)
        self.clock = clock
        self.sleep = sleep
        self.log = get_logger("gpunode.driver_loader.upgrade")
        self.step = ""
        self.evictor = Evictor(kube, self.options, report=self._step, log=self.log, clock=clock, sleep=sleep)
        self._cordoned = False  # we cordoned the node: uncordon it at the end
        self._started = ""
        self._controller_owned = False

    # -- the run ---------------------------------------------------------------------------------------
    async def run(self) -> UpgradeOutcome:
        """Recover, decide, act; never raises but for cancellation (after cleaning up)."""
        began = self.clock()
        self._started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.log.info("driver_upgrade_started", node=self.kube.node_name, **self.options.summary())
        recovered = False
        try:
            self._step("recover", "finishing what an interrupted run left")
            recovered = await self._first_contact(self.recover)
            self._step("host-driver", "looking for a driver installed on the host")
            version = await self.ops.host_driver()
            if version:
                await self.kube.patch_node(labels={DRIVER_DEPLOY_LABEL: PRE_INSTALLED})
                self._step(
                    "host-driver",
                    f"driver {version} is installed on the host: labelled {DRIVER_DEPLOY_LABEL}="
                    f"{PRE_INSTALLED}, nothing else to do",
                    version=version,
                )
                return self._finished("pre-installed", began, recovered)
            if not await self.ops.loaded():
                self._step("load", "no driver loaded: nothing to drain, loading")
                await self.ops.load()
                return self._finished("loaded", began, recovered)
            if not self.options.force_reinstall and await self.ops.digest_matches():
                self._step("keep", "the loaded driver has the configuration we would load: kept")
                return self._finished("kept", began, recovered)
            why = "FORCE_REINSTALL" if self.options.force_reinstall else "configuration changed"
            await self._upgrade(why)
            return self._finished("upgraded", began, recovered)
        except asyncio.CancelledError:
            self.log.warning(
                "driver_upgrade_cancelled", step=self.step, seconds=round(self.clock() - began, 2)
            )
            raise
        except UpgradeFailed as exc:
            return self._failed(str(exc), exc.step or self.step, began, recovered)
        except KubeError as exc:
            return self._failed(str(exc), self.step, began, recovered)
        except Exception as exc:  # the top of the task: report, never crash with a traceback only
            if isinstance(exc, OperandsNotStopped | OperandsBusy):
                return self._failed(str(exc), self.step, began, recovered)
            self.log.error("driver_upgrade_error", step=self.step, error=str(exc), exc_info=True)
            return self._failed(f"{type(exc).__name__}: {exc}", self.step, began, recovered)

    async def recover(self) -> bool:
        """Finish a run that died halfway: operand labels back, our cordon lifted, record removed.
        Whether there was anything to finish."""
        restored = await self.pauser.recover()
        node = await self.kube.get_node()
        text = node.annotations.get(RECORD_ANNOTATION)
        if text is None:
            if restored:
                self.log.warning("driver_upgrade_recovered", operands_restored=restored, uncordoned=False)
            return bool(restored)
        record = UpgradeRecord.from_json(text)
        uncordoned = False
        if record is not None and record.cordoned and node.unschedulable:
            await self.kube.set_unschedulable(False)
            uncordoned = True
        await self.kube.patch_node(annotations={RECORD_ANNOTATION: None})
        self.log.warning(
            "driver_upgrade_recovered",
            interrupted_step=record.step if record else None,
            interrupted_started=record.started if record else None,
            record=None if record else text[:200],
            uncordoned=uncordoned,
            operands_restored=restored,
        )
        return True

    async def _first_contact(self, fn: Callable[[], Awaitable[bool]]) -> bool:
        """The API server may still be coming up (a node boot): wait for it, within ``api_wait``."""
        delay, deadline = 1.0, self.clock() + self.options.api_wait
        while True:
            try:
                return await fn()
            except KubeUnavailable as exc:
                if self.clock() + delay > deadline:
                    raise
                self.log.warning("kube_unavailable", error=str(exc), retry_in_s=delay)
                await self.sleep(delay)
                delay = min(30.0, delay * 2)

    async def _upgrade(self, why: str) -> None:
        node = await self.kube.get_node()
        evict, auto_drain = self.options.gpu_pod_eviction, self.options.auto_drain
        if node.annotations.get(UPGRADE_CONTROLLER_ANNOTATION) == "true":
            self._controller_owned = True
            evict = auto_drain = False
            self._step(
                "pause-operands",
                f"the GPU Operator's upgrade controller owns eviction and draining on this node "
                f"({UPGRADE_CONTROLLER_ANNOTATION}=true): ours are off",
            )
        await self._write_record("pause-operands")
        try:
            self._step("pause-operands", f"driver loaded, {why}: pausing the GPU operands")
            async with self.pauser.paused(PAUSE_REASON, timeout=self.options.operand_timeout) as state:
                self._step(
                    "pause-operands",
                    "operand pods have left the node",
                    paused=sorted(state.paused),
                    waited_s=round(state.waited_s, 2),
                )
                if evict:
                    await self._cordon()
                    await self._clear_gpu_pods(auto_drain)
                await self._unload(auto_drain)
                await self._write_record("load")
                self._step("load", "loading the driver")
                await self.ops.load()
                self._step("restore", "driver loaded: restoring the operands")
        finally:
            await _run_to_end(self._cleanup())

    # -- cordon and the record -------------------------------------------------------------------------
    async def _write_record(
        self, step: str, *, resource_version: str | None = None, cordon: bool | None = None
    ) -> None:
        record = UpgradeRecord(cordoned=self._cordoned, started=self._started, step=step)
        await self.kube.patch_node(
            annotations={RECORD_ANNOTATION: record.to_json()},
            resource_version=resource_version,
            unschedulable=cordon,
        )

    async def _cordon(self) -> None:
        if self._cordoned:
            return
        for _ in range(5):
            node = await self.kube.get_node()
            if node.unschedulable:
                self._step("cordon", "the node was already cordoned: it stays cordoned afterwards")
                return
            self._cordoned = True  # the record and the cordon in one patch, refused if the node changed
            try:
                await self._write_record("cordon", resource_version=node.resource_version, cordon=True)
            except KubeConflict:
                self._cordoned = False
                continue
            except BaseException:
                self._cordoned = False
                raise
            self._step("cordon", "node cordoned")
            return
        raise UpgradeFailed("the node kept changing while we tried to cordon it", step="cordon")

    async def _cleanup(self) -> None:
        """Uncordon (if we cordoned) and remove the record; retried through API hiccups. A failure
        leaves the record for the next start to finish."""
        if self._cordoned:
            if not await self._retrying("uncordon", lambda: self.kube.set_unschedulable(False)):
                return
            self._cordoned = False
            self.log.info("driver_upgrade_step", step="uncordon", detail="node uncordoned")
        await self._retrying(
            "remove-record", lambda: self.kube.patch_node(annotations={RECORD_ANNOTATION: None})
        )

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[object]], attempts: int = 6) -> bool:
        for attempt in range(1, attempts + 1):
            try:
                await fn()
                return True
            except Exception as exc:
                if attempt == attempts:
                    self.log.error(
                        "driver_upgrade_cleanup_failed",
                        action=what,
                        error=str(exc),
                        then=f"the {RECORD_ANNOTATION} annotation stays; the next start finishes it",
                    )
                    return False
                await self.sleep(min(5.0, 0.5 * attempt))
        return False

    # -- pods --------------------------------------------------------------------------------------------
    async def _clear_gpu_pods(self, auto_drain: bool) -> None:
        await self._write_record("evict-gpu-pods")
        self._step("evict-gpu-pods", "evicting the pods that use GPUs")
        try:
            await self.evictor.drain("evict-gpu-pods", "GPU", is_gpu_pod)
            return
        except PodsInTheWay as exc:
            if exc.blocked:
                hint = (
                    "; the node drain (ENABLE_AUTO_DRAIN) follows the same rules, so it was not tried"
                    if auto_drain
                    else ""
                )
                raise UpgradeFailed(
                    f"cannot evict the GPU pods: {exc}{hint}", step="evict-gpu-pods"
                ) from None
            if not auto_drain:
                raise UpgradeFailed(
                    f"GPU pods did not leave: {exc}; ENABLE_AUTO_DRAIN=true drains the node instead",
                    step="evict-gpu-pods",
                ) from None
            self._step("drain-node", f"GPU pods did not leave ({exc}): draining the node (ENABLE_AUTO_DRAIN)")
        await self._drain_node()
        pods = await self.kube.list_pods()
        left = plan_drain(
            pods, select=is_gpu_pod, force=True, delete_emptydir_data=True
        ).targets  # any GPU pod a drain could have removed
        if left:
            raise UpgradeFailed(
                "GPU pods still on the node after draining it: "
                + ", ".join(p.key for p in left)
                + (f" (DRAIN_POD_SELECTOR_LABEL={self.selector.text!r})" if self.selector.terms else ""),
                step="drain-node",
            )

    async def _drain_node(self) -> None:
        await self._cordon()
        await self._write_record("drain-node")
        self._step("drain-node", "draining the node", selector=self.selector.text or None)
        try:
            await self.evictor.drain("drain-node", "node", lambda pod: self.selector.matches(pod.labels))
        except PodsInTheWay as exc:
            raise UpgradeFailed(f"cannot drain the node: {exc}", step="drain-node") from None

    # -- the driver ------------------------------------------------------------------------------------
    async def _unload(self, auto_drain: bool) -> None:
        await self._write_record("unload")
        self._step("unload", "unloading the driver")
        try:
            await self.ops.unload()
            return
        except DriverInUse as exc:
            if not auto_drain:
                raise UpgradeFailed(await self._in_use(exc), step="unload") from None
            users = "; ".join(str(u) for u in exc.users) or "unknown users"
            self._step("drain-node", f"driver in use ({users}): draining the node, then unloading once more")
        await self._drain_node()
        await self._write_record("unload")
        self._step("unload", "unloading the driver again")
        try:
            await self.ops.unload()
        except DriverInUse as exc:
            raise UpgradeFailed(
                await self._in_use(exc) + " (even after draining the node)", step="unload"
            ) from None

    async def _in_use(self, exc: DriverInUse) -> str:
        """The in-use error, with the GPU pods still here and what would let the upgrade through."""
        try:
            pods = await self.kube.list_pods()
        except Exception:
            pods = []
        return in_use_advice(str(exc), pods, self.options, controller_owned=self._controller_owned)

    # -- reporting -------------------------------------------------------------------------------------
    def _step(self, step: str, detail: str, **fields: object) -> None:
        self.step = step
        self.log.info("driver_upgrade_step", step=step, detail=detail, **fields)

    def _finished(self, result: Result, began: float, recovered: bool) -> UpgradeOutcome:
        seconds = self.clock() - began
        self.log.info(
            "driver_upgrade_finished",
            result=result,
            seconds=round(seconds, 2),
            evicted=list(self.evictor.evicted),
            recovered=recovered,
        )
        return UpgradeOutcome(result, "", self.step, seconds, tuple(self.evictor.evicted), recovered)

    def _failed(self, reason: str, step: str, began: float, recovered: bool) -> UpgradeOutcome:
        seconds = self.clock() - began
        self.log.error(
            "driver_upgrade_failed",
            reason=reason,
            step=step,
            seconds=round(seconds, 2),
            evicted=list(self.evictor.evicted),
        )
        return UpgradeOutcome("failed", reason, step, seconds, tuple(self.evictor.evicted), recovered)


async def _run_to_end(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run ``cleanup`` to its end even when cancelled meanwhile (a second cancellation included), then
    pass the cancellation on."""
    task = asyncio.ensure_future(cleanup)
    interrupted = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError
    task.result()


# ============================================================================================ entry point
async def run_upgrade(settings: UpgradeSettings, ops: DriverOps) -> int:
    """One driver-manager run with ``upgrade``'s settings: 0 done (or nothing to do), 1 failed (the
    reason on stderr and in the logs), 2 usage error."""
    try:
        options = UpgradeOptions.from_settings(settings)
        from gpunode.kube.client import Kube

        kube = Kube.connect(
            settings.common.node_name,
            settings.kube.kubeconfig,
            namespace=options.operator_namespace,
            timeout=settings.kube.kube_api_timeout or 10.0,
            field_manager=OWNER,
        )
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        outcome = await DriverUpgrade(kube, ops, options).run()
    finally:
        await kube.aclose()
    if not outcome.ok:
        print(f"{PROG}: driver upgrade failed at step {outcome.step}: {outcome.reason}", file=sys.stderr)
        return 1
    return 0

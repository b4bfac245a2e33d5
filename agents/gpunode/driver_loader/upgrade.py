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

The settings are :class:`~gpunode.driver_loader.settings.UpgradeSettings`. The Kubernetes client is
imported only when an upgrade runs: the settings cost the driver loader nothing.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from gpunode.common.errors import UsageError
from gpunode.common.logging import get_logger
from gpunode.driver_loader.ops import DriverInUse, DriverOps
from gpunode.driver_loader.settings import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_OPERAND_TIMEOUT,
    UpgradeSettings,
    pod_selector,
)
from gpunode.kube.api import KubeConflict, KubeError, KubeForbidden, KubeUnavailable, PodInfo
from gpunode.kube.drain import PodDecision, decide_pod, is_gpu_pod, plan_drain
from gpunode.kube.operands import (
    DEPLOY_PREFIX,
    LabelOperand,
    Operand,
    OperandPauser,
    OperandsBusy,
    OperandsNotStopped,
)

if TYPE_CHECKING:
    from gpunode.kube.client import Kube

__all__ = [
    "DRIVER_OPERANDS",
    "DRIVER_OPERAND_PODS",
    "OWNER",
    "PAUSE_REASON",
    "PRE_INSTALLED",
    "RECORD_ANNOTATION",
    "DriverUpgrade",
    "Outcome",
    "UpgradeFailed",
    "UpgradeOptions",
    "UpgradeRecord",
    "driver_operands",
    "run_upgrade",
]

PROG = "gpunode-driver-loader"
OWNER = "gpunode-driver-manager"  # owner of the operand pause record; field manager of our writes
PAUSE_REASON = "driver-upgrade"  # labels read paused-for-driver-upgrade, as NVIDIA's
RECORD_ANNOTATION = "nvidia.com/gpunode.driver-upgrade"
DRIVER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.driver"
PRE_INSTALLED = "pre-installed"
UPGRADE_CONTROLLER_ANNOTATION = "nvidia.com/gpu-driver-upgrade-enabled"
UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"

_OURS = "app.kubernetes.io/name"
# The operands NVIDIA's driver manager pauses (reference 1.9), with the pod labels of NVIDIA's DaemonSets
# and of ours. Operands without known pod labels are still waited for: any pod whose nodeSelector names
# the paused label counts.
DRIVER_OPERAND_PODS: tuple[tuple[str, tuple[Mapping[str, str], ...]], ...] = (
    ("operator-validator", ({"app": "nvidia-operator-validator"}, {_OURS: "gpunode-validator"})),
    ("container-toolkit", ({"app": "nvidia-container-toolkit-daemonset"}, {_OURS: "gpunode-toolkit"})),
    ("device-plugin", ({"app": "nvidia-device-plugin-daemonset"}, {_OURS: "gpunode-device-plugin"})),
    ("gpu-feature-discovery", ({"app": "gpu-feature-discovery"}, {_OURS: "gpunode-feature-discovery"})),
    ("dcgm-exporter", ({"app": "nvidia-dcgm-exporter"}, {_OURS: "gpunode-exporter"})),
    ("dcgm", ({"app": "nvidia-dcgm"},)),
    ("mig-manager", ({"app": "nvidia-mig-manager"}, {_OURS: "gpunode-mig-manager"})),
    ("nvsm", ()),
    ("sandbox-validator", ({"app": "nvidia-sandbox-validator"},)),
    ("sandbox-device-plugin", ({"app": "nvidia-sandbox-device-plugin-daemonset"},)),
    ("vgpu-device-manager", ({"app": "nvidia-vgpu-device-manager"},)),
    ("client", ()),
    ("dra-driver", ()),
    ("dra-validator", ()),
    ("dcgm-dra", ()),
    ("dcgm-exporter-dra", ()),
)


# ============================================================================================ operands
def driver_operands(extra_label: str = "") -> tuple[Operand, ...]:
    """The operands paused for a driver upgrade, plus ``extra_label`` (``NODE_LABEL_FOR_GPU_POD_EVICTION``:
    any node label key, paused and restored like a deploy label)."""
    operands: list[Operand] = [Operand(name, tuple(pods)) for name, pods in DRIVER_OPERAND_PODS]
    if extra_label and extra_label not in {o.label for o in operands}:
        if extra_label.startswith(DEPLOY_PREFIX):
            operands.append(Operand(extra_label[len(DEPLOY_PREFIX) :]))
        else:
            operands.append(LabelOperand(name=extra_label, key=extra_label))
    return tuple(operands)


DRIVER_OPERANDS = driver_operands()


# ============================================================================================ pure parts
@dataclass(frozen=True)
class UpgradeRecord:
    """The node annotation ``nvidia.com/gpunode.driver-upgrade``: an upgrade in progress."""

    cordoned: bool  # we cordoned the node (or are about to): uncordon it when finishing
    started: str
    step: str

    def to_json(self) -> str:
        return json.dumps(
            {"cordoned": self.cordoned, "started": self.started, "step": self.step}, separators=(",", ":")
        )

    @classmethod
    def from_json(cls, text: str) -> UpgradeRecord | None:
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("cordoned"), bool):
                return None
            return cls(data["cordoned"], str(data.get("started", "")), str(data.get("step", "")))
        except ValueError:
            return None


# ============================================================================================ options
@dataclass(frozen=True)
class UpgradeOptions:
    gpu_pod_eviction: bool = True  # ENABLE_GPU_POD_EVICTION
    auto_drain: bool = False  # ENABLE_AUTO_DRAIN
    drain_use_force: bool = False  # DRAIN_USE_FORCE
    drain_pod_selector: str = ""  # DRAIN_POD_SELECTOR_LABEL
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # DRAIN_TIMEOUT_SECONDS; 0: no limit
    drain_delete_emptydir_data: bool = False  # DRAIN_DELETE_EMPTYDIR_DATA
    operator_namespace: str = "gpu-operator"  # OPERATOR_NAMESPACE
    eviction_label: str = ""  # NODE_LABEL_FOR_GPU_POD_EVICTION
    force_reinstall: bool = False  # FORCE_REINSTALL
    operand_timeout: float = DEFAULT_OPERAND_TIMEOUT  # GPUNODE_OPERAND_TIMEOUT
    poll: float = 1.0  # seconds between looks at the pods being waited for
    evict_retry: float = 5.0  # seconds between evictions a disruption budget refused (as kubectl)
    api_wait: float = 300.0  # how long the first contact waits for an unreachable API server
    progress_interval: float = 10.0  # seconds between progress events while nothing changes

    @classmethod
    def from_settings(cls, settings: UpgradeSettings) -> UpgradeOptions:
        """From ``upgrade``'s settings (already parsed and checked by their flags); :class:`UsageError`
        for a timeout out of range."""
        try:
            options = cls(
                gpu_pod_eviction=settings.enable_gpu_pod_eviction,
                auto_drain=settings.enable_auto_drain,
                drain_use_force=settings.drain_use_force,
                drain_pod_selector=settings.drain_pod_selector_label or "",
                drain_timeout=_seconds(settings.drain_timeout_seconds),
                drain_delete_emptydir_data=settings.drain_delete_emptydir_data,
                operator_namespace=settings.operator_namespace or "gpu-operator",
                eviction_label=settings.node_label_for_gpu_pod_eviction or "",
                force_reinstall=settings.force_reinstall,
                operand_timeout=_seconds(settings.operand_timeout),
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if options.operand_timeout <= 0:
            raise UsageError("--operand-timeout (GPUNODE_OPERAND_TIMEOUT) must be more than 0 seconds")
        return options

    def summary(self) -> dict[str, Any]:
        return {
            "gpu_pod_eviction": self.gpu_pod_eviction,
            "auto_drain": self.auto_drain,
            "drain_use_force": self.drain_use_force,
            "drain_pod_selector": self.drain_pod_selector,
            "drain_timeout_s": self.drain_timeout or None,
            "drain_delete_emptydir_data": self.drain_delete_emptydir_data,
            "eviction_label": self.eviction_label or None,
            "force_reinstall": self.force_reinstall,
            "operand_timeout_s": self.operand_timeout,
        }


def _seconds(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"invalid duration {value!r}: must be 0 or more seconds")
    return value


# ============================================================================================ the flow
class UpgradeFailed(Exception):
    """The upgrade cannot go on; the message says why and what would let it."""

    def __init__(self, message: str, step: str = "") -> None:
        super().__init__(message)
        self.step = step


class _PodsInTheWay(Exception):
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


Result = Literal["pre-installed", "loaded", "kept", "upgraded", "failed"]


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``pre-installed`` (host driver, labelled), ``loaded`` (none was loaded),
    ``kept`` (the loaded driver matches), ``upgraded`` (unloaded and loaded again) or ``failed``."""

    result: Result
    reason: str = ""
    step: str = ""
    seconds: float = 0.0
    evicted: tuple[str, ...] = ()
    recovered: bool = False  # a previous run's leftovers were cleaned up first

    @property
    def ok(self) -> bool:
        return self.result != "failed"


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
        self.evicted: list[str] = []
        self._cordoned = False  # we cordoned the node: uncordon it at the end
        self._started = ""
        self._controller_owned = False

    # -- the run ---------------------------------------------------------------------------------------
    async def run(self) -> Outcome:
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

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[Any]], attempts: int = 6) -> bool:
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
            await self._drain("evict-gpu-pods", "GPU", is_gpu_pod)
            return
        except _PodsInTheWay as exc:
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
            await self._drain("drain-node", "node", lambda pod: self.selector.matches(pod.labels))
        except _PodsInTheWay as exc:
            raise UpgradeFailed(f"cannot drain the node: {exc}", step="drain-node") from None

    async def _drain(self, step: str, what: str, select: Callable[[PodInfo], bool]) -> None:
        """Evict the selected pods and wait until they are gone; :class:`_PodsInTheWay` when some may
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
            raise _PodsInTheWay(blocked=plan.blocked)
        targets = {p.uid: p for p in plan.targets}
        if not targets:
            self._step(step, f"no {what} pods to evict")
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
                next_try = self.clock() + self.options.evict_retry
            present = {p.uid: p for p in await self.kube.list_pods()}
            left = {uid: pod for uid, pod in targets.items() if uid in present}
            pending = {uid: pod for uid, pod in pending.items() if uid in present}
            now = self.clock()
            waited = now - started
            if not left:
                self._step(
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
                raise _PodsInTheWay(left=described, waited=waited)
            await self.sleep(max(0.0, min(self.options.poll, deadline - now)))

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
        parts = [str(exc)]
        try:
            pods = [p for p in await self.kube.list_pods() if is_gpu_pod(p)]
        except Exception:
            pods = []
        if pods:
            force, emptydir = self.options.drain_use_force, self.options.drain_delete_emptydir_data
            parts.append(
                "GPU pods on this node: "
                + ", ".join(str(decide_pod(p, force=force, delete_emptydir_data=emptydir)) for p in pods)
            )
        if self._controller_owned:
            parts.append(
                "the GPU Operator's upgrade controller owns eviction here: let it drain the node (label "
                f"it {UPGRADE_STATE_LABEL}=upgrade-required), stop the GPU workloads, or disable the "
                "upgrade policy"
            )
        elif not self.options.auto_drain:
            first = (
                "" if self.options.gpu_pod_eviction else "ENABLE_GPU_POD_EVICTION=true evicts the GPU pods, "
            )
            parts.append(f"stop the GPU workloads; {first}ENABLE_AUTO_DRAIN=true drains the node")
        return "; ".join(parts)

    # -- reporting -------------------------------------------------------------------------------------
    def _step(self, step: str, detail: str, **fields: Any) -> None:
        self.step = step
        self.log.info("driver_upgrade_step", step=step, detail=detail, **fields)

    def _finished(self, result: Result, began: float, recovered: bool) -> Outcome:
        seconds = self.clock() - began
        self.log.info(
            "driver_upgrade_finished",
            result=result,
            seconds=round(seconds, 2),
            evicted=list(self.evicted),
            recovered=recovered,
        )
        return Outcome(result, "", self.step, seconds, tuple(self.evicted), recovered)

    def _failed(self, reason: str, step: str, began: float, recovered: bool) -> Outcome:
        seconds = self.clock() - began
        self.log.error(
            "driver_upgrade_failed",
            reason=reason,
            step=step,
            seconds=round(seconds, 2),
            evicted=list(self.evicted),
        )
        return Outcome("failed", reason, step, seconds, tuple(self.evicted), recovered)


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

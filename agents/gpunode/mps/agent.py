"""The MPS control daemon agent: plan the daemons, keep them running, say when they are ready.

At start (and on SIGHUP, with the config file read again) the node's GPUs and the file's ``sharing.mps``
give one :class:`~gpunode.api.mps.DaemonPlan` per shared resource (:func:`~gpunode.api.mps.plan_daemons`,
computed by a short-lived child process, :mod:`gpunode.mps.plan`, so that pydantic and NVML never stay
resident; what NVIDIA refuses is a :class:`~gpunode.common.errors.UsageError`: exit 2 with the path). Then,
in a loop that sleeps between checks:

* the control binary is looked up under the driver root; missing: not ready (``/readyz`` and the log say
  where it was looked for), ``.ready`` absent, looked up again every ``--retry-interval``;
* ``<root>/shm`` is made a tmpfs (:func:`~gpunode.mps.shm.mount_shm`, NVIDIA's ``mount-shm``) unless
  one is mounted there already; without the privilege that is skipped and logged (``mps_shm_not_mounted``);
* every daemon not running is started (:class:`~gpunode.mps.daemon.ControlDaemon`), its GPUs set to
  ``EXCLUSIVE_PROCESS`` first (through a child process, as NVIDIA runs ``nvidia-smi -c``; refused: not
  ready with the reason); a failed start is retried after ``--retry-interval``;
* once all run, ``<root>/.ready`` is written (atomically) with :func:`~gpunode.api.mps.ready_document`;
* a daemon found dead (every ``--watch-interval``) removes ``.ready`` at once (the device plugin stops
  advertising its resource) and is started again.

The config file may be chosen by the node label (:class:`~gpunode.mps.labelled.LabelledConfig`) or be
the one the node's device plugin serves and publishes (:class:`~gpunode.mps.follow.FollowedConfig`,
``--follow-device-plugin``): either way a change plans again, and a changed plan restarts the daemons.

Every daemon's ``control.log`` is followed (:class:`~gpunode.mps.logtail.LogTail`, every
``--log-interval``) and each new line logged as ``mps_control_log``.

On SIGTERM (the task cancelled): ``.ready`` is removed first, then every daemon gets ``quit`` and its
GPUs go back to the ``DEFAULT`` compute mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpunode.api.mps import DaemonPlan, MpsRoot, ready_document
from gpunode.common import sdnotify
from gpunode.common.atomic import atomic_write_json
from gpunode.common.errors import UsageError
from gpunode.common.http import HealthServer
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import on_sighup, trim_memory
from gpunode.mps.daemon import ControlDaemon, MpsCommandError, find_control_binary
from gpunode.mps.follow import FollowedConfig
from gpunode.mps.labelled import LabelledConfig
from gpunode.mps.logtail import LogTail
from gpunode.mps.shm import mount_shm

__all__ = ["AGENT", "ComputeModeFailed", "MpsAgent", "MpsOptions", "Plan", "PlanFailed", "SetComputeMode"]

AGENT = "mps-control-daemon"


class PlanFailed(RuntimeError):
    """The planning step failed for a reason that may pass (NVML not up yet): retried."""


class ComputeModeFailed(RuntimeError):
    """The GPUs' compute mode could not be set (``permission``: NVML refused, the agent is not root)."""

    def __init__(self, message: str, *, permission: bool = False) -> None:
        super().__init__(message)
        self.permission = permission


#: Set a compute mode ("exclusive-process" or "default") on GPUs given by UUID; ComputeModeFailed.
SetComputeMode = Callable[[str, Sequence[str]], Awaitable[None]]


@dataclass(frozen=True)
class Plan:
    """What the planning step found: the sharing settings as the readiness file records them (None: the
    strategy is not MPS), the daemons, what to log, and the MPS root the file names (None: not set)."""

    sharing: Mapping[str, Any] | None
    daemons: tuple[DaemonPlan, ...] = ()
    warnings: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    file_mps_root: str | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Plan:
        return cls(
            sharing=doc.get("sharing"),
            daemons=tuple(DaemonPlan.from_json(p) for p in doc.get("plans", ())),
            warnings=tuple(doc.get("warnings", ())),
            ignored=tuple(doc.get("ignored", ())),
            file_mps_root=(doc.get("file") or {}).get("mpsRoot"),
        )


@dataclass(frozen=True)
class MpsOptions:
    mps_root: str | None  # None: the file's flags.mpsRoot, else the default
    default_root: str
    driver_root: str
    watch_interval: float = 5.0
    retry_interval: float = 30.0
    http_host: str = "127.0.0.1"
    http_port: int | None = None  # None: no HTTP endpoint
    environ: Mapping[str, str] = field(default_factory=dict)
    shm_size: str | None = None  # None: <root>/shm is not mounted by the agent
    log_interval: float = 1.0  # how often control.log is read


class MpsAgent:
    """The agent; ``planner`` makes a :class:`Plan` (again on SIGHUP): UsageError for a refusal, PlanFailed
    for a failure worth retrying."""

    def __init__(
        self,
        opts: MpsOptions,
        planner: Callable[[], Awaitable[Plan]],
        compute_mode: SetComputeMode | None = None,
        labelled: LabelledConfig | FollowedConfig | None = None,
    ) -> None:
        self.opts = opts
        self.planner = planner
        self.compute_mode = compute_mode
        # where the config file comes from when it may change: the node label, or the device plugin
        self.labelled = labelled
        self.tails: dict[str, LogTail] = {}  # resource -> its control.log
        self.shm_checked = False
        self.root = MpsRoot(opts.mps_root or opts.default_root)
        self.log = get_logger("gpunode.mps")
        self.metrics = create_metrics(AGENT)
        if labelled is not None:  # gpunode_errors_total{reason=kube...}; /readyz says what it waits for
            labelled.bind(self.metrics.count_error, self._unready)
        self.http = (
            HealthServer(self.metrics.registry, host=opts.http_host, port=opts.http_port)
            if opts.http_port is not None
            else None
        )
        self.plan: Plan | None = None
        self.daemons: list[ControlDaemon] = []
        self.ready = False
        self.reason = "starting"
        self.wake = asyncio.Event()  # SIGHUP: plan again now
        self.planned = asyncio.Event()  # a first plan was made
        self.lock = asyncio.Lock()  # a check of the daemons and a change of plan never overlap

    # -- planning ---------------------------------------------------------------------------------------
    async def make_plan(self) -> bool:
        """Plan (again); True when the plan changed. UsageError for what NVIDIA refuses."""
        plan = await self.planner()
        for message in plan.ignored:
            self.log.warning("config_field_ignored", detail=message)
        for warning in plan.warnings:
            self.log.warning("mps_config_warning", detail=warning)
        changed = plan != self.plan
        self.plan = plan
        self.planned.set()
        if self.opts.mps_root is None and plan.file_mps_root:
            self.root = MpsRoot(plan.file_mps_root)
        if plan.sharing is None:
            self.log.info(
                "mps_not_configured", detail="the sharing strategy is not MPS; waiting indefinitely"
            )
        elif not plan.daemons:
            self.log.info("mps_no_devices", detail="no devices are configured for MPS sharing; waiting")
        elif changed:
            self.log.info(
                "mps_planned",
                mps_root=self.root.path,
                resources={p.resource: [g.index for g in p.gpus] for p in plan.daemons},
                active_thread_percentage={p.resource: p.thread_percentage for p in plan.daemons},
                pinned_mem_limit_mib={p.resource: p.pinned_limits() for p in plan.daemons},
            )
        return changed

    # -- readiness --------------------------------------------------------------------------------------
    def _unready(self, reason: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root.ready_file)
        if reason != self.reason:
            self.log.warning("mps_not_ready", reason=reason)
        self.ready, self.reason = False, reason

    def _set_ready(self) -> None:
        plan = self.plan
        if plan is not None and plan.sharing is not None:
            os.makedirs(self.root.path, exist_ok=True)
            atomic_write_json(self.root.ready_file, ready_document(plan.sharing, plan.daemons), mode=0o644)
        if not self.ready:
            self.log.info("mps_ready", resources=[d.resource for d in self.daemons])
            sdnotify.notify(ready=True, status=f"{len(self.daemons)} MPS control daemon(s) running")
        self.ready, self.reason = True, ""

    # -- the loop ---------------------------------------------------------------------------------------
    async def step(self) -> float:
        """Bring the daemons up (or notice they are down); seconds until the next check."""
        plan = self.plan
        if plan is None or plan.sharing is None or not plan.daemons:
            self._set_ready()  # nothing to run (an MPS plan without devices: a .ready with no resource)
            return 3600.0
        if not self.daemons:
            binary, looked = find_control_binary(self.opts.driver_root)
            if binary is None:
                where = ", ".join(looked)
                self._unready(f"nvidia-cuda-mps-control not found under the driver root (looked at {where})")
                self.metrics.count_error("binary")
                return self.opts.retry_interval
            self.daemons = [
                ControlDaemon(p, self.root, binary, self.opts.environ, self.opts.driver_root)
                for p in plan.daemons
            ]
        down = [d for d in self.daemons if not d.started()]
        if not down:
            if not self.ready:
                self._set_ready()
            return self.opts.watch_interval
        if self.ready:
            self.log.error(
                "mps_daemon_died", resources=[d.resource for d in down], action="starting it again"
            )
            self.metrics.count_error("daemon")
        self._unready(f"control daemon of {', '.join(d.resource for d in down)} not running")
        self._ensure_shm()
        for daemon in down:
            if not await self._exclusive(daemon):
                return self.opts.retry_interval
            self._follow_log(daemon)
            try:
                await daemon.start()
            except (MpsCommandError, OSError) as exc:
                self.log.error(
                    "mps_daemon_start_failed",
                    resource=daemon.resource,
                    error=str(exc),
                    retry_in_s=self.opts.retry_interval,
                )
                self.metrics.count_error("start")
                self._unready(f"control daemon of {daemon.resource} failed to start: {exc}")
                return self.opts.retry_interval
            self.log.info(
                "mps_daemon_started",
                resource=daemon.resource,
                pid=daemon.pid(),
                gpus=[g.uuid for g in daemon.plan.gpus],
            )
        self._set_ready()
        trim_memory()
        return self.opts.watch_interval

    # -- shm, compute mode, control.log ------------------------------------------------------------------
    def _ensure_shm(self) -> None:
        """NVIDIA's mount-shm: once per agent (and per MPS root)."""
        if self.shm_checked or self.opts.shm_size is None:
            return
        self.shm_checked = True
        try:
            result = mount_shm(self.root.shm_dir, self.opts.shm_size)
        except (OSError, ValueError) as exc:
            self.log.warning("mps_shm_not_mounted", path=self.root.shm_dir, reason=str(exc))
            return
        if result.outcome == "mounted":
            self.log.info("mps_shm_mounted", path=result.path, detail=result.detail)
        elif result.outcome == "present":
            self.log.info("mps_shm_present", path=result.path, fstype=result.detail)
        else:
            self.log.warning(
                "mps_shm_not_mounted",
                path=result.path,
                reason=result.detail,
                using="the directory as it is (its file system is shared with the clients' mounts)",
            )

    async def _exclusive(self, daemon: ControlDaemon) -> bool:
        """The daemon's GPUs in EXCLUSIVE_PROCESS (NVIDIA's order: before the daemon starts)."""
        if self.compute_mode is None:
            return True
        uuids = [g.uuid for g in daemon.plan.gpus]
        try:
            await self.compute_mode("exclusive-process", uuids)
        except ComputeModeFailed as exc:
            self.log.error(
                "mps_compute_mode_failed",
                resource=daemon.resource,
                mode="EXCLUSIVE_PROCESS",
                error=str(exc),
                retry_in_s=self.opts.retry_interval,
            )
            self.metrics.count_error("compute-mode")
            self._unready(f"compute mode EXCLUSIVE_PROCESS for {daemon.resource} not set: {exc}")
            return False
        self.log.info("mps_compute_mode_set", resource=daemon.resource, mode="EXCLUSIVE_PROCESS", gpus=uuids)
        return True

    async def _default_mode(self, daemon: ControlDaemon) -> None:
        if self.compute_mode is None:
            return
        uuids = [g.uuid for g in daemon.plan.gpus]
        try:
            await self.compute_mode("default", uuids)
        except ComputeModeFailed as exc:
            self.log.error(
                "mps_compute_mode_failed", resource=daemon.resource, mode="DEFAULT", error=str(exc)
            )
            return
        self.log.info("mps_compute_mode_set", resource=daemon.resource, mode="DEFAULT", gpus=uuids)

    def _follow_log(self, daemon: ControlDaemon) -> None:
        """Follow the daemon's control.log from what it holds now (earlier lines were an earlier run's)."""
        if daemon.resource not in self.tails:
            path = os.path.join(self.root.log_dir(daemon.resource), "control.log")
            self.tails[daemon.resource] = LogTail(path, from_end=True)

    def forward_logs(self) -> int:
        """New control.log lines into our log (``mps_control_log``); how many."""
        count = 0
        for resource, tail in list(self.tails.items()):
            got = tail.read()
            if got.reset is not None:
                self.log.info("mps_control_log_reset", resource=resource, file=tail.path, reason=got.reset)
            if got.skipped:
                self.log.warning(
                    "mps_control_log_skipped", resource=resource, file=tail.path, bytes=got.skipped
                )
            for line in got.lines:
                self.log.info("mps_control_log", resource=resource, line=line)
            count += len(got.lines)
        return count

    async def _forward_loop(self) -> None:
        while True:
            await asyncio.sleep(self.opts.log_interval)
            self.forward_logs()

    async def stop_daemons(self) -> None:
        """``.ready`` first (the plugin stops advertising), then ``quit`` to every daemon."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root.ready_file)
        self.ready, self.reason = False, "stopped"
        for daemon in self.daemons:
            try:
                out = await daemon.stop()
                self.log.info("mps_daemon_stopped", resource=daemon.resource, output=out or None)
            except (MpsCommandError, OSError) as exc:
                self.log.error("mps_daemon_stop_failed", resource=daemon.resource, error=str(exc))
                continue  # still running: its GPUs keep their mode
            await self._default_mode(daemon)
        self.forward_logs()  # the daemons' last words
        self.daemons = []
        self.tails = {}

    async def reload(self) -> None:
        """SIGHUP: plan again; the daemons are restarted when the plan changed (a refused file keeps
        the daemons as they are, logged as ``reload_failed``)."""
        async with self.lock:
            try:
                changed = await self.make_plan()
            except PlanFailed as exc:
                self.log.error("mps_plan_failed", error=str(exc), keeping="the current daemons")
                return
            if changed:
                self.log.info("mps_config_changed", action="restarting the control daemons")
                await self.stop_daemons()
        self.wake.set()

    async def replan(self) -> str | None:
        """A newly chosen config file (the node label): None once it is in force (the daemons restarted
        when the plan changed), else why it was refused (the daemons stay as they are)."""
        async with self.lock:
            try:
                changed = await self.make_plan()
            except (UsageError, PlanFailed) as exc:
                return str(exc)
            if changed:
                self.log.info("mps_config_changed", action="restarting the control daemons")
                await self.stop_daemons()
        self.wake.set()
        return None

    async def _first_plan(self) -> None:
        if self.labelled is not None:
            await self.labelled.first()
        while True:
            try:
                await self.make_plan()
                return
            except PlanFailed as exc:
                self._unready(f"planning failed: {exc}")
                self.metrics.count_error("plan")
                await asyncio.sleep(self.opts.retry_interval)

    async def _loop(self) -> None:
        await self._first_plan()
        while True:
            async with self.lock:
                delay = await self.step()
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), delay)

    async def _follow_label(self, labelled: LabelledConfig | FollowedConfig) -> None:
        await self.planned.wait()  # the first plan (made with the first choice) comes first
        await labelled.follow(self.replan)

    async def run(self) -> None:
        try:
            if self.http is not None:
                self.http.add_check("mps", lambda: (self.ready, self.reason or "ready"))
            async with asyncio.TaskGroup() as tg:
                if self.http is not None:
                    tg.create_task(self.http.serve(), name="http")
                tg.create_task(sdnotify.watchdog_task(), name="watchdog")
                tg.create_task(on_sighup(self.reload, metrics=self.metrics, log=self.log), name="sighup")
                tg.create_task(self._loop(), name="mps-daemons")
                tg.create_task(self._forward_loop(), name="mps-control-log")
                if self.labelled is not None:
                    tg.create_task(self._follow_label(self.labelled), name="config-label")
        finally:
            sdnotify.notify(stopping=True, status="stopping")
            await self.stop_daemons()

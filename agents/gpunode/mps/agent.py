"""The MPS control daemon agent: plan the daemons, keep them running, say when they are ready.

At start (and on SIGHUP, with the config file read again) the node's GPUs and the file's ``sharing.mps``
give one :class:`~gpunode.api.mps.DaemonPlan` per shared resource (:func:`~gpunode.api.mps.plan_daemons`;
what NVIDIA refuses is a :class:`~gpunode.common.errors.ConfigError`: exit 2 with the path). Then, in
a loop that sleeps between checks:

* the control binary is looked up under the driver root; missing: not ready (``/readyz`` and the log say
  where it was looked for), ``.ready`` absent, looked up again every ``--retry-interval``;
* every daemon not running is started (:class:`~gpunode.mps.daemon.ControlDaemon`); a failed start is
  retried after ``--retry-interval``;
* once all run, ``<root>/.ready`` is written (atomically) with :func:`~gpunode.api.mps.ready_document`;
* a daemon found dead (every ``--watch-interval``) removes ``.ready`` at once (the device plugin stops
  advertising its resource) and is started again.

On SIGTERM (the task cancelled): ``.ready`` is removed first, then every daemon gets ``quit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpunode.api.mps import DaemonPlan, MpsConfigError, MpsGpu, MpsRoot, plan_daemons, ready_document
from gpunode.api.plugin_types import TimeSlicing
from gpunode.common import sdnotify
from gpunode.common.atomic import atomic_write_json
from gpunode.common.errors import ConfigError
from gpunode.common.http import HealthServer
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import on_sighup, trim_memory
from gpunode.mps.daemon import ControlDaemon, MpsCommandError, find_control_binary

if TYPE_CHECKING:
    from gpunode.nvml import Nvml

__all__ = ["AGENT", "MpsAgent", "MpsOptions"]

AGENT = "mps-control-daemon"


@dataclass(frozen=True)
class MpsOptions:
    mps_root: str
    driver_root: str
    config_source: str  # the config file's name, for errors
    watch_interval: float = 5.0
    retry_interval: float = 30.0
    http_host: str = "127.0.0.1"
    http_port: int | None = None  # None: no HTTP endpoint


class MpsAgent:
    """The agent; ``read_sharing`` gives the effective sharing settings (again on SIGHUP)."""

    def __init__(
        self,
        opts: MpsOptions,
        open_nvml: Callable[[], Awaitable[Nvml]],
        read_sharing: Callable[[], TimeSlicing | None],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.opts = opts
        self.open_nvml = open_nvml
        self.read_sharing = read_sharing
        self.environ = dict(os.environ if environ is None else environ)
        self.root = MpsRoot(opts.mps_root)
        self.log = get_logger("gpunode.mps")
        self.metrics = create_metrics(AGENT)
        self.http = (
            HealthServer(self.metrics.registry, host=opts.http_host, port=opts.http_port)
            if opts.http_port is not None
            else None
        )
        self.sharing: TimeSlicing | None = None
        self.plans: list[DaemonPlan] = []
        self.daemons: list[ControlDaemon] = []
        self.ready = False
        self.reason = "starting"
        self.wake = asyncio.Event()  # SIGHUP: plan again now

    # -- planning ---------------------------------------------------------------------------------------
    async def plan(self, nvml: Nvml) -> None:
        """Read the sharing settings and the GPUs; ConfigError for what NVIDIA refuses."""
        sharing = self.read_sharing()
        gpus = [
            MpsGpu(g.index, g.uuid, g.memory_total_mib, g.compute_capability, g.mig_enabled)
            for g in await nvml.gpus()
        ]
        warnings: list[str] = []
        try:
            plans = plan_daemons(sharing, gpus, warnings=warnings)
        except MpsConfigError as exc:
            raise ConfigError(self.opts.config_source, [str(exc)]) from None
        for warning in warnings:
            self.log.warning("mps_config_warning", detail=warning)
        self.sharing, self.plans = sharing, plans
        if sharing is None or not sharing.mps:
            self.log.info(
                "mps_not_configured", detail="the sharing strategy is not MPS; waiting indefinitely"
            )
        elif not plans:
            self.log.info("mps_no_devices", detail="no devices are configured for MPS sharing; waiting")
        else:
            self.log.info(
                "mps_planned",
                resources={p.resource: [g.index for g in p.gpus] for p in plans},
                active_thread_percentage={p.resource: p.thread_percentage for p in plans},
                pinned_mem_limit_mib={p.resource: p.pinned_limits() for p in plans},
            )

    # -- readiness --------------------------------------------------------------------------------------
    def _unready(self, reason: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root.ready_file)
        if self.ready or reason != self.reason:
            self.log.warning("mps_not_ready", reason=reason)
        self.ready, self.reason = False, reason

    def _set_ready(self) -> None:
        if self.sharing is not None and self.sharing.mps:
            os.makedirs(self.root.path, exist_ok=True)
            atomic_write_json(self.root.ready_file, ready_document(self.sharing, self.plans), mode=0o644)
        if not self.ready:
            self.log.info("mps_ready", resources=[d.resource for d in self.daemons])
            sdnotify.notify(ready=True, status=f"{len(self.daemons)} MPS control daemon(s) running")
        self.ready, self.reason = True, ""

    # -- the loop ---------------------------------------------------------------------------------------
    async def step(self) -> float:
        """Bring the daemons up (or notice they are down); seconds until the next check."""
        if self.sharing is None or not self.sharing.mps or not self.plans:
            if self.sharing is not None and self.sharing.mps:
                self._set_ready()  # nothing to run: ready, with no resource
            else:
                self.ready, self.reason = True, ""
            return 3600.0
        if not self.daemons:
            binary, looked = find_control_binary(self.opts.driver_root)
            if binary is None:
                self._unready(
                    f"nvidia-cuda-mps-control not found under the driver root (looked at {', '.join(looked)})"
                )
                self.metrics.count_error("binary")
                return self.opts.retry_interval
            self.daemons = [ControlDaemon(p, self.root, binary, self.environ) for p in self.plans]
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
        for daemon in down:
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
        self.daemons = []

    async def reload(self) -> None:
        """SIGHUP: plan again; the daemons are restarted when the plan changed."""
        assert self.nvml is not None
        before = (self.sharing, self.plans)
        await self.plan(self.nvml)
        if (self.sharing, self.plans) != before:
            self.log.info("mps_config_changed", action="restarting the control daemons")
            await self.stop_daemons()
        self.wake.set()

    async def _loop(self) -> None:
        while True:
            delay = await self.step()
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), delay)

    async def run(self) -> None:
        self.nvml: Nvml | None = await self.open_nvml()
        try:
            await self.plan(self.nvml)
            async with asyncio.TaskGroup() as tg:
                if self.http is not None:
                    self.http.add_check("mps", lambda: (self.ready, self.reason or "ready"))
                    tg.create_task(self.http.serve(), name="http")
                tg.create_task(sdnotify.watchdog_task(), name="watchdog")
                tg.create_task(on_sighup(self.reload, metrics=self.metrics, log=self.log), name="sighup")
                tg.create_task(self._loop(), name="mps-daemons")
        finally:
            sdnotify.notify(stopping=True, status="stopping")
            await self.stop_daemons()
            with contextlib.suppress(Exception):
                await self.nvml.close()

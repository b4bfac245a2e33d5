"""The health daemon: ``init`` without ``--oneshot``, then keep the driver healthy until SIGTERM.

Every ``--health-interval`` seconds: missing modules are loaded again, missing or wrong device nodes
made again, a dead nvidia-persistenced restarted; while any of that fails the readiness files are
removed and ``/readyz`` fails. SIGTERM removes what NVIDIA's preStop hook removes (``.driver-ctr-ready``,
``.driver-daemons-status``) and leaves the modules loaded, so restarting the agent never disturbs
running GPU work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING

from gpunode.driver_loader import devnodes, kmod
from gpunode.driver_loader.loader import DriverLoader
from gpunode.driver_loader.modules import modules_to_load, sysfs_name
from gpunode.driver_loader.ops import DriverInUse
from gpunode.driver_loader.readiness import iso
from gpunode.driver_loader.steps import LoaderError, StepOutcome

if TYPE_CHECKING:
    from gpunode.common.http import HealthServer
    from gpunode.common.metrics import AgentMetrics

__all__ = ["AGENT", "HealthDaemon"]

AGENT = "driver-loader"


class HealthDaemon:
    """One loader kept healthy: its health checks, its HTTP endpoint, its stop."""

    def __init__(self, loader: DriverLoader) -> None:
        self.loader = loader
        self.metrics: AgentMetrics | None = None
        self.persistenced_restarts = 0
        self._last_health: tuple[bool, str] = (True, "")

    async def health_check(self) -> bool:
        """Reconcile what drifted (missing modules, nodes, persistenced) and report; readiness follows."""
        loader = self.loader
        cfg, log = loader.cfg, loader.log
        problems: list[str] = []
        if loader.host_driver_version is not None:
            if not await loader.loaded():
                problems.append("the host driver's nvidia module is no longer loaded")
        else:
            wanted = modules_to_load(cfg.rdma)
            missing = [m for m in wanted if sysfs_name(m) not in kmod.loaded_modules(loader.paths)]
            try:
                if missing:
                    log.warning("modules_missing", modules=missing)
                    await loader.load_missing(missing)
                await loader.ensure_nodes(StepOutcome(), udev=False)
                tool = loader.ops.which("nvidia-persistenced")
                if tool is not None and loader.persistenced_pid() is None:
                    log.warning("persistenced_not_running", restarting=True)
                    await loader.ensure_persistenced(tool)
                    self.persistenced_restarts += 1
                    if self.metrics is not None:
                        self.metrics.count_error("persistenced_restart")
            except (LoaderError, devnodes.NodeError, OSError) as exc:
                problems.append(str(exc))
        healthy = not problems
        detail = "; ".join(problems)
        if (healthy, detail) != self._last_health:
            if healthy:
                log.info("driver_healthy")
            else:
                log.error("driver_unhealthy", detail=detail)
            self._last_health = (healthy, detail)
        if healthy:
            loader.files.write_readiness(
                rdma=cfg.rdma,
                host_driver=loader.host_driver_version is not None,
                driver_root=cfg.driver_root,
            )
            loader.files.daemons_status(True)
        else:
            loader.files.remove_readiness()
        loader.ready, loader.health_detail = healthy, detail
        if loader.book is not None:
            loader.book.health = {
                "state": "healthy" if healthy else "unhealthy",
                "detail": detail,
                "checkedAt": iso(loader.clock()),
                "persistencedRestarts": self.persistenced_restarts,
            }
            loader.book.save()
        if self.metrics is not None and healthy:
            self.metrics.mark_success("health")
        return healthy

    async def serve(self, *, http_port: int | None = None, http_host: str | None = None) -> int:
        """``init``, then keep the driver healthy until cancelled (SIGTERM); the exit code.

        ``http_host`` defaults to the agents' rule (127.0.0.1 under systemd, all addresses in pods).
        """
        async with self.loader.locked():
            http = self._http(http_host, http_port)
            try:
                if http is None:
                    return await self._daemon()
                async with http:  # /healthz, /readyz, /metrics on their own thread, heartbeat task
                    return await self._daemon()
            finally:
                self._stopped()

    async def _daemon(self) -> int:
        loader = self.loader
        try:
            await loader.init()
        except (LoaderError, DriverInUse):
            return 1
        assert loader.book is not None
        loader.book.finish("serving")
        from gpunode.common.runtime import trim_memory

        trim_memory()
        loader.log.info("serving", health_interval_s=loader.cfg.health_interval)
        while True:
            await asyncio.sleep(loader.cfg.health_interval)
            await self.health_check()

    def _stopped(self) -> None:
        """On SIGTERM: what NVIDIA's preStop removes; modules, nodes and persistenced stay."""
        book, files = self.loader.book, self.loader.files
        if book is not None and book.phase == "serving":
            for name in (".driver-ctr-ready", ".driver-daemons-status"):
                with contextlib.suppress(OSError):
                    (files.validations / name).unlink()
            book.finish("stopped")

    def _http(self, host: str | None, port: int | None) -> HealthServer | None:
        if port is None:
            return None
        from prometheus_client import Gauge

        from gpunode.common.http import HealthServer
        from gpunode.common.httpcore import default_listen_host
        from gpunode.common.metrics import create_metrics

        loader = self.loader
        host = host or default_listen_host(os.environ)
        self.metrics = create_metrics(AGENT)
        ready = Gauge(
            "gpunode_driver_ready",
            "1 while the driver is loaded, healthy and the readiness files are written.",
            registry=self.metrics.registry,
        )
        ready.set_function(lambda: 1.0 if loader.ready else 0.0)
        http = HealthServer(self.metrics.registry, host=host, port=port)
        http.add_check("driver", lambda: (loader.ready, loader.health_detail or "ready"))
        return http

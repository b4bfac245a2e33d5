"""The resource servers kept in line with the node: inventory -> resources -> one gRPC server per resource.

:meth:`Resources.reconcile` starts a server for each new resource, updates changed ones (the stream sends
the new list, the server stays) and withdraws gone ones; :meth:`Resources.restart` restarts one whose
socket went away; :meth:`Resources.follow_mig_changes` re-advertises once a burst of MIG layout changes
is over. Which resources still need registering is kept in ``pending``; the registrar
(:mod:`gpunode.device_plugin.registrar`) works through it when ``kick`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.runtime import sleep_or
from gpunode.device_plugin.devices import DeviceConfigError, Resource, build_inventory
from gpunode.device_plugin.server import ResourceServer, SharedState
from gpunode.nvml.caps import read_mig_minors

if TYPE_CHECKING:
    from gpunode.common.hostpaths import HostPaths
    from gpunode.common.logging import Logger
    from gpunode.common.metrics import AgentMetrics
    from gpunode.device_plugin.metrics import DevicePluginMetrics
    from gpunode.device_plugin.settings import PluginSettings
    from gpunode.nvml import Nvml
    from gpunode.nvml.api import GpuInfo

__all__ = ["Resources"]

MIG_QUIET = 0.3  # a MIG layout change is a burst of events: re-advertise once it has been quiet this long


class Resources:
    """The node's GPUs as the plugin last read them and the server of each advertised resource."""

    def __init__(
        self,
        state: SharedState,
        *,
        plugin_dir: Path,
        host: HostPaths,
        metrics: DevicePluginMetrics,
        base_metrics: AgentMetrics,
        log: Logger,
    ) -> None:
        self.state = state
        self.plugin_dir = plugin_dir
        self.host = host
        self.metrics = metrics
        self.base_metrics = base_metrics
        self.log = log
        self.nvml: Nvml | None = None
        self.gpus: list[GpuInfo] = []
        self.servers: dict[str, ResourceServer] = {}
        self.pending: set[str] = set()  # resources the kubelet has not been told of (yet, or again)
        self.kick = asyncio.Event()  # the registrar has something to do
        self.rebuild = asyncio.Event()  # the MIG layout changed
        self.lock = asyncio.Lock()

    def _numa(self, gpu: GpuInfo) -> int | None:
        from_sysfs = self.host.read_numa_node(gpu.pci.sysfs_bus_id)
        return from_sysfs if from_sysfs is not None else gpu.numa_node

    async def build(self, settings: PluginSettings) -> list[Resource]:
        assert self.nvml is not None
        gpus = await self.nvml.gpus()
        migs = {g.index: await self.nvml.mig_devices(g.index) for g in gpus if g.mig_enabled}
        minors = read_mig_minors(self.host)
        inventory = build_inventory(gpus, migs, settings, numa=self._numa, mig_minors=minors)
        for warning in inventory.warnings:
            self.log.warning("inventory_warning", detail=warning)
        self.gpus = gpus
        return list(inventory.resources)

    async def reconcile(self, settings: PluginSettings | None = None, *, initial: bool = False) -> str | None:
        """Bring the servers in line with the node for ``settings`` (default: those in force).

        Returns None, or (after start) why the resources for ``settings`` were refused: the current ones
        stay. At start (``initial``) the refusal is raised: :class:`DeviceConfigError`."""
        async with self.lock:
            assert self.nvml is not None
            target = settings or self.state.settings
            try:
                resources = await self.build(target)
            except DeviceConfigError as exc:
                if initial:
                    raise
                self.log.error("resources_rejected", error=str(exc), keeping="the current resources")
                self.base_metrics.count_error("resources")
                return str(exc)
            self.state.settings = target
            self.state.dev_root = Path(target.dev_root)
            self.state.topology = await self.nvml.topology()
            self.state.health.forget(g.uuid for g in self.gpus)
            wanted = {r.name: r for r in resources if r.devices}
            for name in list(self.servers):
                if name not in wanted:
                    await self._withdraw(name)
            for name, resource in wanted.items():
                existing = self.servers.get(name)
                if existing is None:
                    server = ResourceServer(resource, self.plugin_dir, self.state)
                    await server.start()
                    self.servers[name] = server
                    self.pending.add(name)
                elif existing.resource != resource:
                    await existing.update(resource)
                    self.log.info("resource_updated", resource=name, devices=len(resource.devices))
                else:
                    await existing.update()
            self.log.info(
                "resources",
                advertised={n: len(r.devices) for n, r in wanted.items()},
                mig_strategy=target.mig_strategy,
            )
            if not wanted:
                self.log.warning("no_devices", hint="no GPU matched; the plugin waits and advertises nothing")
            self.kick.set()
            return None

    async def _withdraw(self, name: str) -> None:
        server = self.servers.pop(name)
        self.pending.discard(name)
        try:
            await server.withdraw()
            await asyncio.sleep(0.05)  # let the kubelet read the empty list before the stream ends
        finally:
            await server.stop()
        self.metrics.forget(name)
        self.log.info("resource_withdrawn", resource=name)

    async def restart(self, server: ResourceServer, why: str) -> None:
        """Serve ``server``'s socket anew and have it registered again."""
        async with self.lock:  # never race a reconcile that is withdrawing this very server
            if self.servers.get(server.name) is not server:
                return
            self.log.info("plugin_restarting", resource=server.name, reason=why)
            await server.stop(grace=0.1)
            await server.start()
            self.pending.add(server.name)
            self.kick.set()

    async def follow_mig_changes(self) -> None:
        """MIG layout changes arrive as bursts of events: wait for a quiet moment, then re-advertise."""
        while True:
            await self.rebuild.wait()
            while True:
                self.rebuild.clear()
                if not await sleep_or(self.rebuild, MIG_QUIET):
                    break
            self.log.info("mig_layout_changed")
            try:
                await self.reconcile()
            except Exception:
                self.log.error("reconcile_failed", exc_info=True)
                self.base_metrics.count_error("reconcile")

    async def stop_all(self) -> None:
        for server in list(self.servers.values()):
            with contextlib.suppress(Exception):
                await server.stop(grace=0.2)
        self.servers.clear()

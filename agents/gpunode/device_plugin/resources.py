"""The resource servers kept in line with the node: inventory -> resources -> one gRPC server per resource.

:meth:`Resources.reconcile` starts a server for each new resource, updates changed ones (the stream sends
the new list, the server stays) and withdraws gone ones; :meth:`Resources.restart` restarts one whose
socket went away; :meth:`Resources.follow_mig_changes` re-advertises once a burst of MIG layout changes
is over. Which resources still need registering is kept in ``pending``; the registrar
(:mod:`gpunode.device_plugin.registrar`) works through it when ``kick`` is set.

Faults leave no stale state. A GPU that is lost (fallen off the bus) keeps the devices last read of it,
advertised Unhealthy, instead of failing the rebuild of the others; the GPUs a rebuild could not read
(``stale``: lost since the last read, or before they were ever read) are read again once they answer,
so a layout changed just before its GPU was lost is not left behind. What the health probe watches
(``gpus``) is replaced only by a rebuild that succeeded. A rebuild that fails (an NVML error) is retried
with backoff until one succeeds, and a MIG layout change is re-advertised only once the layout has been
quiet for a moment: a half-applied layout is not published.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.runtime import Backoff, settle, sleep_or
from gpunode.device_plugin.devices import DeviceConfigError, Resource, build_inventory
from gpunode.device_plugin.imex import resolve_channels
from gpunode.device_plugin.server import ResourceServer, SharedState
from gpunode.nvml import errors
from gpunode.nvml.caps import read_mig_minors

if TYPE_CHECKING:
    from gpunode.common.hostpaths import HostPaths
    from gpunode.common.logging import Logger
    from gpunode.common.metrics import AgentMetrics
    from gpunode.device_plugin.metrics import DevicePluginMetrics
    from gpunode.device_plugin.settings import PluginSettings
    from gpunode.nvml import Nvml
    from gpunode.nvml.api import GpuInfo, MigDevice, Topology

__all__ = ["MIG_SETTLE", "MIG_SETTLE_MAX", "Resources"]

# A MIG layout change is a burst of events (every GPU and compute instance destroyed and created): it is
# re-advertised once no MIG event came for MIG_SETTLE seconds, or MIG_SETTLE_MAX seconds after the burst
# began, whichever comes first (a layout changing without end is still advertised now and then).
MIG_SETTLE = 1.0
MIG_SETTLE_MAX = 5.0
RETRY_FIRST = 0.5  # a failed rebuild is retried after this long, then twice as long, ...
RETRY_MAX = 30.0  # ... up to this


@dataclass(frozen=True)
class Built:
    """One read of the node: the GPUs (lost ones as last read), their MIG devices, the resources."""

    gpus: list[GpuInfo]
    migs: dict[int, list[MigDevice]]
    resources: list[Resource]
    lost: frozenset[int]  # GPUs lost now, advertised as last read
    unread: frozenset[int]  # GPUs lost now and never read: nothing of them is advertised


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
        mig_settle: float = MIG_SETTLE,
        mig_settle_max: float = MIG_SETTLE_MAX,
    ) -> None:
        self.state = state
        self.mig_settle = mig_settle
        self.mig_settle_max = mig_settle_max
        self.plugin_dir = plugin_dir
        self.host = host
        self.metrics = metrics
        self.base_metrics = base_metrics
        self.log = log
        self.nvml: Nvml | None = None
        self.gpus: list[GpuInfo] = []  # as the last successful rebuild read them; the health probe's
        self.migs: dict[int, list[MigDevice]] = {}  # MIG devices per GPU index, as last read
        self.stale: frozenset[int] = frozenset()  # GPUs the last rebuild could not read (lost)
        self.servers: dict[str, ResourceServer] = {}
        self.pending: set[str] = set()  # resources the kubelet has not been told of (yet, or again)
        self.kick = asyncio.Event()  # the registrar has something to do
        self.rebuild = asyncio.Event()  # the MIG layout changed
        self.lock = asyncio.Lock()

    def _numa(self, gpu: GpuInfo) -> int | None:
        from_sysfs = self.host.read_numa_node(gpu.pci.sysfs_bus_id)
        return from_sysfs if from_sysfs is not None else gpu.numa_node

    async def build(self, settings: PluginSettings) -> Built:
        """Read the node and derive the resources for ``settings``; nothing of ``self`` changes.

        A GPU NVML calls lost (now, or between two calls) keeps what was last read of it; any other NVML
        error fails the read (the caller retries). Raises :class:`DeviceConfigError` for a refused layout."""
        assert self.nvml is not None
        nvml = self.nvml
        lost = set(await nvml.lost_gpus())
        gpus: dict[int, GpuInfo] = {}
        migs: dict[int, list[MigDevice]] = {}
        for gpu in await nvml.gpus():
            if gpu.index in lost:
                continue
            if gpu.mig_enabled:
                try:
                    migs[gpu.index] = await nvml.mig_devices(gpu.index)
                except errors.GpuLost:
                    lost.add(gpu.index)
                    continue
            gpus[gpu.index] = gpu
        kept: set[int] = set()
        for gpu in self.gpus:  # lost since the last read (or gone from gpus() in between): as last read
            if gpu.index not in gpus:
                lost.add(gpu.index)
                kept.add(gpu.index)
                gpus[gpu.index] = gpu
                if gpu.index in self.migs:
                    migs[gpu.index] = self.migs[gpu.index]
        ordered = [gpus[i] for i in sorted(gpus)]
        minors = read_mig_minors(self.host)
        inventory = build_inventory(ordered, migs, settings, numa=self._numa, mig_minors=minors)
        for warning in inventory.warnings:
            self.log.warning("inventory_warning", detail=warning)
        return Built(ordered, migs, list(inventory.resources), frozenset(kept), frozenset(lost - set(gpus)))

    async def _topology(self) -> Topology | None:
        """The GPUs' connectivity; with a GPU lost, the last one read (hardware does not rewire)."""
        assert self.nvml is not None
        try:
            return await self.nvml.topology()
        except errors.GpuLost:
            return self.state.topology

    async def reconcile(self, settings: PluginSettings | None = None, *, initial: bool = False) -> str | None:
        """Bring the servers in line with the node for ``settings`` (default: those in force).

        Returns None, or (after start) why the resources for ``settings`` were refused: the current ones
        stay. At start (``initial``) the refusal is raised: :class:`DeviceConfigError`."""
        async with self.lock:
            assert self.nvml is not None
            target = settings or self.state.settings
            try:
                imex = resolve_channels(target, self.host)  # checked once per configuration, as NVIDIA
                target = imex.settings
                for warning in imex.warnings:
                    self.log.warning("imex_channel_missing", detail=warning)
                built = await self.build(target)
            except DeviceConfigError as exc:
                if initial:
                    raise
                self.log.error("resources_rejected", error=str(exc), keeping="the current resources")
                self.base_metrics.count_error("resources")
                return str(exc)
            topology = await self._topology()
            # every NVML read succeeded: from here on the node as read replaces what was known
            self.gpus, self.migs, self.stale = built.gpus, built.migs, built.lost | built.unread
            if built.lost or built.unread:
                self.log.warning(
                    "gpus_lost",
                    advertised_as_last_read=sorted(built.lost),
                    never_read=sorted(built.unread),
                )
            self.state.settings = target
            self.state.dev_root = Path(target.dev_root)
            self.state.topology = topology
            self.state.health.forget(g.uuid for g in self.gpus)
            wanted = {r.name: r for r in built.resources if r.devices}
            if target.sharing is not None and target.sharing.mps:  # only once its MPS daemon is ready
                # read for these settings only: after a config change, the daemon must say it runs with
                # the new limits (MpsWatch reads .ready again) before a replica is advertised
                ready = (self.state.mps_ready or {}) if self.state.mps_ready_for == target.sharing else {}
                held = sorted(n for n, r in wanted.items() if r.shared and n not in ready)
                for name in held:
                    del wanted[name]
                if held:
                    self.log.warning("mps_resources_withheld", resources=held, reason="MPS daemon not ready")
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
        """Re-advertise after a MIG layout change (``rebuild``) once the layout is quiet (:func:`settle`);
        a rebuild that fails is retried with backoff until one succeeds (sooner after a new MIG event)."""
        backoff = Backoff(first=RETRY_FIRST, cap=RETRY_MAX)
        while True:
            await self.rebuild.wait()
            await settle(self.rebuild, self.mig_settle, self.mig_settle_max)
            self.log.info("mig_layout_changed")
            while True:
                try:
                    await self.reconcile()
                except Exception as exc:
                    delay = backoff.next()
                    self.log.error(
                        "reconcile_failed",
                        error=f"{type(exc).__name__}: {exc}",
                        retry_in_s=delay,
                        exc_info=not isinstance(exc, errors.NvmlError),  # NVML's errors say enough
                    )
                    self.base_metrics.count_error("reconcile")
                    if await sleep_or(self.rebuild, delay):  # the layout changes again: let it settle
                        await settle(self.rebuild, self.mig_settle, self.mig_settle_max)
                    continue
                backoff.reset()
                break

    async def stop_all(self) -> None:
        for server in list(self.servers.values()):
            with contextlib.suppress(Exception):
                await server.stop(grace=0.2)
        self.servers.clear()

"""The device plugin agent: inventory -> resources -> gRPC servers -> kubelet registration, kept current.

One TaskGroup of named tasks: registrar, kubelet directory watch, self-check, NVML events (health and MIG
changes), health probe (lost GPUs, recovery), config watch, SIGHUP reload, HTTP endpoint, watchdog.

With ``--config-file`` naming a directory of named configs (a ConfigMap mount), the node label
``nvidia.com/device-plugin.config`` chooses the file (:mod:`gpunode.kube.labelconfig`), in process: the
node is watched (node-watch), the directory too (config-watch), changes of either are applied live
(config-select), and the outcome is written to the node's annotations (config-report). This replaces
NVIDIA's config-manager sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common import sdnotify
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.fswatch import watch_directory
from gpunode.common.hostpaths import HostPaths
from gpunode.common.http import HealthServer
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import Backoff, on_sighup, sleep_or, supervise, trim_memory
from gpunode.device_plugin.devices import DeviceConfigError, Resource, build_inventory
from gpunode.device_plugin.health import HealthTracker, XidPolicy
from gpunode.device_plugin.metrics import DevicePluginMetrics
from gpunode.device_plugin.registration import RegistrationFailed, register
from gpunode.device_plugin.server import ResourceServer, SharedState
from gpunode.device_plugin.settings import PluginSettings
from gpunode.kube.labelconfig import (
    InForce,
    LabelConfig,
    LabelConfigOptions,
    Loaded,
    NoUsableConfig,
    one_line,
)
from gpunode.nvml import errors
from gpunode.nvml.caps import read_mig_minors

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.kube.client import Kube

from gpunode.nvml.api import EVENT_DBE, EVENT_MIG_CONFIG, EVENT_SBE, EVENT_XID, EventKind, GpuInfo, Nvml

AGENT = "device-plugin"
EVENT_MASK = EVENT_XID | EVENT_SBE | EVENT_DBE | EVENT_MIG_CONFIG
EVENTS_READY_TIMEOUT = 5.0  # a wedged event registration must not hold back registration


ConfigDirOptions = LabelConfigOptions  # --config-file naming a directory: the node label chooses the file
DirConfig = tuple["PluginConfig | None", PluginSettings]  # what a file of the directory loads into


@dataclass(frozen=True)
class AgentOptions:
    """Everything the agent needs that is not in the plugin settings."""

    kubelet_socket: Path | None  # None: serve but never register (NVIDIA's --kubelet-socket="")
    config_file: Path | None
    load_settings: Callable[[PluginConfig | None], PluginSettings]  # precedence applied by the CLI
    host: HostPaths = field(default_factory=HostPaths)
    recovery_period: float = 300.0
    policy: XidPolicy = field(default_factory=XidPolicy)
    http_host: str = "127.0.0.1"
    http_port: int | None = 0  # None: no HTTP endpoint
    config_dir: ConfigDirOptions | None = None  # set: config_file is None, the label chooses the file
    self_check_interval: float = 5.0
    probe_interval: float = 10.0
    nvml_retry_interval: float = 30.0

    @property
    def plugin_dir(self) -> Path:
        if self.kubelet_socket is not None:
            return self.kubelet_socket.parent
        return self.host.device_plugin_dir


class DevicePlugin:
    def __init__(
        self,
        opts: AgentOptions,
        open_nvml: Callable[[], Awaitable[Nvml]],
        settings: PluginSettings,
        config: PluginConfig | None,
        *,
        kube: Kube | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.opts = opts
        self.kube = kube  # only with a config directory and a node name
        self.open_nvml = open_nvml
        self.config = config
        self.clock = clock
        self.log = get_logger("gpunode.device_plugin")
        self.base_metrics = create_metrics(AGENT)
        self.metrics = DevicePluginMetrics(self.base_metrics)
        self.state = SharedState(
            settings=settings,
            health=HealthTracker(recovery_period=opts.recovery_period),
            metrics=self.metrics,
            dev_root=Path(settings.dev_root),
        )
        self.http = (
            HealthServer(self.base_metrics.registry, host=opts.http_host, port=opts.http_port)
            if opts.http_port is not None
            else None
        )
        self.nvml: Nvml | None = None
        self.gpus: list[GpuInfo] = []
        self.servers: dict[str, ResourceServer] = {}
        self.pending: set[str] = set()
        self.kick = asyncio.Event()
        self.rebuild = asyncio.Event()
        self.ready = asyncio.Event()
        self._config_digest = self._digest()
        self._lock = asyncio.Lock()
        self._silent_since: dict[str, float] = {}
        self._trimmed = 0.0
        # label-selected config (opts.config_dir)
        self.dir_config: LabelConfig[DirConfig] | None = None
        if opts.config_dir is not None:
            self.dir_config = LabelConfig(
                opts.config_dir,
                self._load_dir_config,
                kube=kube,
                report=True,  # the device plugin says on the node which config it serves
                log=self.log,
                count_error=self.base_metrics.count_error,
            )
        self._starting_name: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    async def run(self) -> None:
        if self.http is not None:
            self.http.add_check(
                "nvml", lambda: (self.nvml is not None, "" if self.nvml else "NVML unavailable")
            )
            self.http.add_check("registered", self._registered_check)
            if self.kube is not None and self.dir_config is not None:
                self.http.add_check("kube", self.dir_config.kube_check)
        dir_config = self.dir_config
        loaded: Loaded[DirConfig] | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                if self.http is not None:
                    tg.create_task(self.http.serve(), name="http")
                tg.create_task(sdnotify.watchdog_task(), name="watchdog")
                if dir_config is not None:
                    if self.kube is not None:
                        tg.create_task(
                            self._supervised("node-watch", dir_config.watch_node), name="node-watch"
                        )
                        tg.create_task(
                            self._supervised("config-report", dir_config.report_state), name="config-report"
                        )
                        await dir_config.wait_for_label()
                    loaded = await self._first_dir_config(dir_config)
                self.nvml = await self._open_nvml()
                try:
                    await self.reconcile(initial=True)
                except ConfigError as exc:
                    if dir_config is not None:
                        await dir_config.report_final(one_line(exc))
                    raise
                if dir_config is not None and loaded is not None:
                    dir_config.took(loaded.chosen, loaded.failure)
                trim_memory()
                # Health events are watched before the kubelet hears of any device: an XID in between
                # would otherwise go unseen.
                watching = asyncio.Event()
                tg.create_task(
                    self._supervised("nvml-events", lambda: self._events(watching)), name="nvml-events"
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watching.wait(), EVENTS_READY_TIMEOUT)
                tg.create_task(self._registrar(), name="registrar")
                if self.opts.kubelet_socket is not None:
                    tg.create_task(
                        self._supervised("kubelet-watch", self._kubelet_watch), name="kubelet-watch"
                    )
                tg.create_task(self._self_check(), name="self-check")
                tg.create_task(self._supervised("health-probe", self._prober), name="health-probe")
                tg.create_task(self._rebuilder(), name="rebuild")
                if self.opts.config_file is not None:
                    tg.create_task(self._supervised("config-watch", self._config_watch), name="config-watch")
                if dir_config is not None:
                    tg.create_task(
                        self._supervised("config-watch", dir_config.watch_directory), name="config-watch"
                    )
                    tg.create_task(
                        self._supervised(
                            "config-select", lambda: dir_config.follow_changes(self._apply_dir_config)
                        ),
                        name="config-select",
                    )
                tg.create_task(on_sighup(self.reload, metrics=self.base_metrics, log=self.log), name="sighup")
        finally:
            sdnotify.notify(stopping=True, status="stopping")
            await self._stop_all()
            if self.nvml is not None:
                await self.nvml.close()
            if self.kube is not None:
                with contextlib.suppress(Exception):
                    await self.kube.aclose()

    def _registered_check(self) -> tuple[bool, str]:
        if not self.servers:
            return (True, "no devices to advertise")
        if self.pending:
            return (False, "not registered: " + ", ".join(sorted(self.pending)))
        return (True, ", ".join(sorted(self.servers)))

    async def _supervised(self, name: str, fn: Callable[[], Awaitable[object]]) -> None:
        await supervise(
            name,
            fn,
            metrics=self.base_metrics,
            log=self.log,
            initial_backoff=0.5,
            max_backoff=30,
            restart_on_return=True,
        )

    async def _open_nvml(self) -> Nvml:
        """NVML, or (with --fail-on-init-error=false) wait for it, not ready and advertising nothing."""
        try:
            return await self.open_nvml()
        except errors.NvmlError as exc:
            if self.state.settings.fail_on_init_error:
                raise
            self.log.error(
                "nvml_unavailable",
                error=str(exc),
                retry_every_s=self.opts.nvml_retry_interval,
                hint="set --fail-on-init-error=true to exit instead",
            )
            sdnotify.notify(ready=True, status=f"NVML unavailable: {exc}; advertising nothing")
        while True:
            await asyncio.sleep(self.opts.nvml_retry_interval)
            try:
                nvml = await self.open_nvml()
            except errors.NvmlError:
                continue  # logged once above; no crash loop, no log flood
            self.log.info("nvml_available")
            return nvml

    async def _stop_all(self) -> None:
        for server in list(self.servers.values()):
            with contextlib.suppress(Exception):
                await server.stop(grace=0.2)
        self.servers.clear()

    # -- inventory and resources -----------------------------------------------------------------------
    def _numa(self, gpu: GpuInfo) -> int | None:
        from_sysfs = self.opts.host.read_numa_node(gpu.pci.sysfs_bus_id)
        return from_sysfs if from_sysfs is not None else gpu.numa_node

    def _mig_minors(self) -> dict[str, int] | None:
        return read_mig_minors(self.opts.host)

    async def build(self, settings: PluginSettings) -> list[Resource]:
        assert self.nvml is not None
        gpus = await self.nvml.gpus()
        migs = {g.index: await self.nvml.mig_devices(g.index) for g in gpus if g.mig_enabled}
        inventory = build_inventory(gpus, migs, settings, numa=self._numa, mig_minors=self._mig_minors())
        for warning in inventory.warnings:
            self.log.warning("inventory_warning", detail=warning)
        self.gpus = gpus
        return list(inventory.resources)

    async def reconcile(self, initial: bool = False, settings: PluginSettings | None = None) -> str | None:
        """Bring the servers in line with the node: start new resources, update changed ones, withdraw
        gone ones. A resource whose devices changed keeps its server; its stream sends the new list.

        Returns None, or (after start) why the resources for ``settings`` were refused: the current ones
        stay. At start such a refusal is a :class:`ConfigError`."""
        async with self._lock:
            assert self.nvml is not None
            target = settings or self.state.settings
            try:
                resources = await self.build(target)
            except DeviceConfigError as exc:
                if initial:
                    raise ConfigError(self._config_source(), [str(exc)]) from None
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
                    server = self.servers.pop(name)
                    self.pending.discard(name)
                    try:
                        await server.withdraw()
                        await asyncio.sleep(
                            0.05
                        )  # let the kubelet read the empty list before the stream ends
                    finally:
                        await server.stop()
                    self.metrics.forget(name)
                    self.log.info("resource_withdrawn", resource=name)
            for name, resource in wanted.items():
                existing = self.servers.get(name)
                if existing is None:
                    server = ResourceServer(resource, self.opts.plugin_dir, self.state)
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

    # -- registration ----------------------------------------------------------------------------------
    async def _registrar(self) -> None:
        backoff = Backoff()
        outage_logged = False
        announced = False
        while True:
            await self.kick.wait()
            self.kick.clear()
            if self.opts.kubelet_socket is None:
                self.pending.clear()
            while self.pending:
                name = sorted(self.pending)[0]
                server = self.servers.get(name)
                if server is None:
                    self.pending.discard(name)
                    continue
                try:
                    await register(self.opts.kubelet_socket, server.socket_path.name, name)  # type: ignore[arg-type]
                except RegistrationFailed as exc:
                    if not outage_logged:
                        self.log.warning(
                            "kubelet_unavailable", error=str(exc), socket=str(self.opts.kubelet_socket)
                        )
                        outage_logged = True
                    if await sleep_or(self.kick, backoff.next()):
                        # something changed (the kubelet's socket appeared): retry quickly again, since
                        # the socket can exist a moment before the kubelet answers on it
                        backoff.reset()
                    self.kick.clear()
                    continue
                self.pending.discard(name)
                self._silent_since.pop(name, None)
                backoff.reset()
                outage_logged = False
                self.metrics.registered(name, time.time())
                self.log.info("registered", resource=name, endpoint=server.socket_path.name)
            if not announced:
                announced = True
                sdnotify.notify(
                    ready=True, status=f"serving {', '.join(sorted(self.servers)) or 'no devices'}"
                )
            self.ready.set()

    async def _restart(self, server: ResourceServer, why: str) -> None:
        async with self._lock:  # never race a reconcile that is withdrawing this very server
            if self.servers.get(server.name) is not server:
                return
            self.log.info("plugin_restarting", resource=server.name, reason=why)
            await server.stop(grace=0.1)
            await server.start()
            self.pending.add(server.name)
            self.kick.set()

    async def _kubelet_watch(self) -> None:
        assert self.opts.kubelet_socket is not None
        kubelet = self.opts.kubelet_socket.name
        async for event in watch_directory(self.opts.plugin_dir):
            if event.kind == "created" and event.name == kubelet:
                self.log.info("kubelet_restarted")
                for server in list(self.servers.values()):
                    if not server.socket_present():
                        await self._restart(server, "socket removed by the kubelet")
                self.pending.update(self.servers)
                self.kick.set()
            elif event.kind == "deleted":
                for server in list(self.servers.values()):
                    if event.name == server.socket_path.name and not server.socket_path.exists():
                        await self._restart(server, "socket deleted")

    async def _self_check(self) -> None:
        """Belt and braces for missed inotify events: our sockets exist and the kubelet is listening."""
        while True:
            await asyncio.sleep(self.opts.self_check_interval)
            now = self.clock()
            for server in list(self.servers.values()):
                if not server.socket_present():
                    await self._restart(server, "self-check: socket missing")
                    continue
                if self.opts.kubelet_socket is None or server.name in self.pending:
                    continue
                if server.streams > 0:
                    self._silent_since.pop(server.name, None)
                    continue
                since = self._silent_since.setdefault(server.name, now)
                if now - since >= 2 * self.opts.self_check_interval:
                    self.log.warning("kubelet_not_watching", resource=server.name, action="re-registering")
                    self._silent_since.pop(server.name, None)
                    self.pending.add(server.name)
                    self.kick.set()
            self.base_metrics.mark_success("self-check")
            if now - self._trimmed >= 60:  # hand memory that RPC bursts freed back to the OS
                self._trimmed = now
                trim_memory()

    # -- health ----------------------------------------------------------------------------------------
    async def _push_health(self, uuid: str) -> None:
        for server in self.servers.values():
            if uuid in server.resource.devices_per_gpu:
                await server.update()
        self.metrics.unhealthy_gpus.set(len(self.state.health.unhealthy()))

    async def _events(self, ready: asyncio.Event | None = None) -> None:
        assert self.nvml is not None
        policy = self.opts.policy
        async for ev in self.nvml.events(mask=EVENT_MASK, ready=ready):
            now = self.clock()
            if ev.kind is EventKind.MIG_CONFIG:
                self.rebuild.set()
                continue
            if not policy.enabled:
                continue
            if ev.kind is EventKind.XID and ev.xid is not None:
                if self.state.health.on_xid(ev.gpu_uuid, ev.xid, policy, now):
                    self.log.warning("device_unhealthy", uuid=ev.gpu_uuid, xid=ev.xid, gpu=ev.gpu_index)
                    await self._push_health(ev.gpu_uuid)
                elif not policy.is_fatal(ev.xid):
                    self.log.info("xid_ignored", uuid=ev.gpu_uuid, xid=ev.xid)
            elif ev.kind is EventKind.DOUBLE_BIT_ECC:
                if self.state.health.on_double_bit_ecc(ev.gpu_uuid, policy, now):
                    self.log.warning("device_unhealthy", uuid=ev.gpu_uuid, reason="double-bit ECC")
                    await self._push_health(ev.gpu_uuid)
            elif ev.kind is EventKind.SINGLE_BIT_ECC:
                self.log.info("ecc_corrected", uuid=ev.gpu_uuid, count=ev.data)

    async def _prober(self) -> None:
        """Lost GPUs become Unhealthy; quiet ones recover after the hold-down period."""
        assert self.nvml is not None
        while True:
            await asyncio.sleep(self.opts.probe_interval)
            if not self.opts.policy.enabled:
                continue
            lost = set(await self.nvml.lost_gpus())
            now = self.clock()
            for gpu in self.gpus:
                if gpu.index in lost:
                    if self.state.health.on_lost(gpu.uuid, now):
                        self.log.warning(
                            "device_unhealthy", uuid=gpu.uuid, gpu=gpu.index, reason="GPU is lost"
                        )
                        await self._push_health(gpu.uuid)
                elif self.state.health.on_probe(gpu.uuid, True, now):
                    self.log.info("device_recovered", uuid=gpu.uuid, gpu=gpu.index)
                    await self._push_health(gpu.uuid)
            self.base_metrics.mark_success("health-probe")

    async def _rebuilder(self) -> None:
        """MIG layout changes arrive as bursts of events: wait for a quiet moment, then re-advertise."""
        while True:
            await self.rebuild.wait()
            while True:
                self.rebuild.clear()
                if not await sleep_or(self.rebuild, 0.3):
                    break
            self.log.info("mig_layout_changed")
            try:
                await self.reconcile()
            except Exception:
                self.log.error("reconcile_failed", exc_info=True)
                self.base_metrics.count_error("reconcile")

    # -- configuration ---------------------------------------------------------------------------------
    def _digest(self) -> str | None:
        path = self.opts.config_file
        if path is None:
            return None
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return None

    def _config_source(self) -> str:
        """What the settings came from, for messages: the file, the chosen file of a directory, flags."""
        if self.opts.config_file is not None:
            return str(self.opts.config_file)
        d = self.opts.config_dir
        if d is not None:
            in_force = self.dir_config.in_force if self.dir_config is not None else None
            name = in_force.name if in_force is not None else self._starting_name
            return str(d.directory / name) if name else f"{d.directory} (no file: built-in defaults)"
        return "<flags>"

    async def reload(self) -> None:
        """SIGHUP or a changed config file: a bad new config is logged and the last good one stays."""
        if self.dir_config is not None:
            await self.dir_config.reload(self._apply_dir_config)
            return
        new_config = self.config
        if self.opts.config_file is not None:
            from gpunode.api.plugin_config import PluginConfig
            from gpunode.common.config import load_config

            try:
                new_config = load_config(self.opts.config_file, PluginConfig)
            except ConfigError as exc:
                self.log.error("config_rejected", error=str(exc), keeping="the last good configuration")
                self.base_metrics.count_error("config")
                return
        try:
            settings = self.opts.load_settings(new_config)
        except (ConfigError, ValueError) as exc:
            self.log.error("config_rejected", error=str(exc), keeping="the last good configuration")
            self.base_metrics.count_error("config")
            return
        before = set(self.servers)
        await self.reconcile(settings=settings)
        if self.state.settings is settings:
            self.config = new_config
            self.log.info(
                "config_reloaded",
                added=sorted(set(self.servers) - before),
                removed=sorted(before - set(self.servers)),
            )

    async def _config_watch(self) -> None:
        path = self.opts.config_file
        assert path is not None
        async for _ in watch_directory(path.parent, writes=True):
            digest = self._digest()
            if digest is None or digest == self._config_digest:
                continue
            await asyncio.sleep(0.1)  # let a ConfigMap's ..data swap finish
            digest = self._digest()
            if digest is None or digest == self._config_digest:
                continue
            self._config_digest = digest
            self.log.info("config_changed", file=str(path))
            await self.reload()

    # -- configuration chosen by a node label (a directory of named configs) -------------------------
    def _load_dir_config(self, path: Path | None) -> DirConfig:
        """A file of the directory (None: no file) -> its config and the effective settings (flags and
        env vars still win); ConfigError if bad."""
        d = self.opts.config_dir
        assert d is not None
        config = None
        if path is not None:
            from gpunode.api.plugin_config import PluginConfig
            from gpunode.common.config import load_config

            config = load_config(path, PluginConfig)
        try:
            return config, self.opts.load_settings(config)
        except (ValueError, UsageError) as exc:
            raise ConfigError(str(path or d.directory), [str(exc)]) from None

    async def _first_dir_config(self, dir_config: LabelConfig[DirConfig]) -> Loaded[DirConfig]:
        """The settings the first reconcile serves with; ConfigError (exit 2) when nothing loads."""
        try:
            loaded = await dir_config.first()
        except NoUsableConfig as exc:
            raise ConfigError(exc.directory, [exc.reason]) from None
        self._starting_name = loaded.chosen.name
        self.config, self.state.settings = loaded.config
        return loaded

    async def _apply_dir_config(self, loaded: DirConfig, chosen: InForce) -> str | None:
        """Serve a newly chosen (or changed) config: None, or why its resources were refused."""
        config, settings = loaded
        before = set(self.servers)
        refused = await self.reconcile(settings=settings)
        if refused is not None:
            return refused
        self.config = config
        self.log.info(
            "config_reloaded",
            config=chosen.name,
            added=sorted(set(self.servers) - before),
            removed=sorted(before - set(self.servers)),
        )
        return None

"""The device plugin agent: inventory -> resources -> gRPC servers -> kubelet registration, kept current.

One TaskGroup of named tasks: registrar, kubelet directory watch, self-check, NVML events (health and MIG
changes), health probe (lost GPUs, recovery), config watch, SIGHUP reload, HTTP endpoint, watchdog.

With ``--config-file`` naming a directory of named configs (a ConfigMap mount), the node label
``nvidia.com/device-plugin.config`` chooses the file (:mod:`gpunode.common.labelconfig`), in process: the
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
from gpunode.common.labelconfig import (
    DEFAULT_FALLBACKS,
    DEVICE_PLUGIN_CONFIG_LABEL,
    Selection,
    SelectionSource,
    list_configs,
    select_config,
)
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import Backoff, on_sighup, sleep_or, supervise, trim_memory
from gpunode.device_plugin.devices import DeviceConfigError, Resource, build_inventory
from gpunode.device_plugin.health import HealthTracker, XidPolicy
from gpunode.device_plugin.metrics import DevicePluginMetrics
from gpunode.device_plugin.registration import RegistrationFailed, register
from gpunode.device_plugin.server import ResourceServer, SharedState
from gpunode.device_plugin.settings import PluginSettings
from gpunode.nvml import errors
from gpunode.nvml.caps import read_mig_minors

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.kube.client import Kube

from gpunode.nvml.api import EVENT_DBE, EVENT_MIG_CONFIG, EVENT_SBE, EVENT_XID, EventKind, GpuInfo, Nvml

AGENT = "device-plugin"
EVENT_MASK = EVENT_XID | EVENT_SBE | EVENT_DBE | EVENT_MIG_CONFIG
EVENTS_READY_TIMEOUT = 5.0  # a wedged event registration must not hold back registration
STATE_ANNOTATION = "nvidia.com/device-plugin.config.state"  # "applied" or "failed: <reason>"
APPLIED_ANNOTATION = "nvidia.com/device-plugin.config.applied"  # the config in force ("" = built-in)
MAX_REASON = 300  # characters of a failure reason in the annotation


@dataclass(frozen=True)
class ConfigDirOptions:
    """``--config-file`` naming a directory of named configs, one of them chosen by a node label."""

    directory: Path
    node_label: str = DEVICE_PLUGIN_CONFIG_LABEL
    default_config: str | None = None
    fallbacks: tuple[str, ...] = DEFAULT_FALLBACKS
    first_label_wait: float = 10.0  # at start, how long to wait for the node's label (then: default chain)
    settle: float = 0.1  # a ConfigMap update is several renames in a row: wait for quiet


@dataclass(frozen=True)
class InForce:
    """The named config the plugin serves with; ``name`` None: no file (built-in defaults)."""

    name: str | None
    source: SelectionSource
    digest: str | None


def one_line(error: BaseException | str, limit: int = MAX_REASON) -> str:
    """A failure as one short line for a node annotation (every problem of a ConfigError, joined)."""
    text = f"{error.path}: {'; '.join(error.problems)}" if isinstance(error, ConfigError) else str(error)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        self._label: str | None = None  # None: not known yet (API server not reached)
        self._label_known = asyncio.Event()
        self._reselect = asyncio.Event()
        self._in_force: InForce | None = None
        self._rejected: tuple[str | None, str | None, str] | None = None  # (name, digest, reason)
        self._selection_error: str | None = None
        self._want: dict[str, str] = {}  # the annotations the node should carry
        self._reported: dict[str, str] | None = None  # what it carries (None: not read yet)
        self._report_kick = asyncio.Event()
        self._kube_error = ""
        self._starting_name: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    async def run(self) -> None:
        if self.http is not None:
            self.http.add_check(
                "nvml", lambda: (self.nvml is not None, "" if self.nvml else "NVML unavailable")
            )
            self.http.add_check("registered", self._registered_check)
            if self.kube is not None:
                self.http.add_check("kube", self._kube_check)
        config_dir = self.opts.config_dir
        chosen: InForce | None = None
        failure: str | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                if self.http is not None:
                    tg.create_task(self.http.serve(), name="http")
                tg.create_task(sdnotify.watchdog_task(), name="watchdog")
                if config_dir is not None:
                    if self.kube is not None:
                        tg.create_task(self._supervised("node-watch", self._node_watch), name="node-watch")
                        tg.create_task(
                            self._supervised("config-report", self._config_reporter), name="config-report"
                        )
                        await self._wait_for_label(config_dir.first_label_wait)
                    chosen, failure = await self._select_at_start(config_dir)
                self.nvml = await self._open_nvml()
                try:
                    await self.reconcile(initial=True)
                except ConfigError as exc:
                    if config_dir is not None:
                        await self._report_final(one_line(exc))
                    raise
                if chosen is not None:
                    self._took(chosen, failure)
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
                if config_dir is not None:
                    tg.create_task(
                        self._supervised("config-watch", self._config_dir_watch), name="config-watch"
                    )
                    tg.create_task(
                        self._supervised("config-select", self._config_selector), name="config-select"
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
            name = self._in_force.name if self._in_force is not None else self._starting_name
            return str(d.directory / name) if name else f"{d.directory} (no file: built-in defaults)"
        return "<flags>"

    async def reload(self) -> None:
        """SIGHUP or a changed config file: a bad new config is logged and the last good one stays."""
        if self.opts.config_dir is not None:
            await self._apply_selection(force=True)
            return
        new_config = self.config
        if self.opts.config_file is not None:
            from gpunode.common.config import load_config
            from gpunode.api.plugin_config import PluginConfig

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
    def _select(self, d: ConfigDirOptions, label: str | None) -> tuple[Selection, tuple[str, ...]]:
        try:
            names = list_configs(d.directory)
        except OSError as exc:
            reason = f"cannot list {d.directory}: {exc.strerror or exc}"
            return Selection(None, None, "the directory cannot be listed", reason), ()
        chosen = select_config(
            names, label, default_config=d.default_config, fallbacks=d.fallbacks, where=d.directory
        )
        return chosen, names

    def _read(self, d: ConfigDirOptions, name: str | None) -> tuple[bytes | None, str | None]:
        """The named file's content and digest ((None, None) for no file); ConfigError if unreadable."""
        if name is None:
            return None, None
        path = d.directory / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
        return data, hashlib.sha256(data).hexdigest()

    def _parse(
        self, d: ConfigDirOptions, name: str | None, data: bytes | None
    ) -> tuple[PluginConfig | None, PluginSettings]:
        """The config and the effective settings (flags and env vars still win); ConfigError if bad."""
        config = None
        if name is not None and data is not None:
            from gpunode.common.config import parse_config_text
            from gpunode.api.plugin_config import PluginConfig

            path = str(d.directory / name)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(path, [f"not valid UTF-8 (byte offset {exc.start})"]) from None
            config = parse_config_text(text, path, PluginConfig)
        try:
            return config, self.opts.load_settings(config)
        except (ValueError, UsageError) as exc:
            raise ConfigError(str(d.directory / (name or "")), [str(exc)]) from None

    async def _wait_for_label(self, limit: float) -> None:
        """At start: the node's label, unless the API server is away (then the default chain serves)."""
        assert self.kube is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not self._label_known.is_set():
            waited = loop.time() - started
            away = self.kube.available is False or bool(self._kube_error)
            if waited >= limit or (away and waited >= 1.0):
                self.log.warning(
                    "node_label_unknown",
                    error=self._kube_error or self.kube.last_error or f"no answer within {limit:g}s",
                    action="serving with the default config chain; the label applies once the API answers",
                )
                return
            await sleep_or(self._label_known, 0.05)

    async def _select_at_start(self, d: ConfigDirOptions) -> tuple[InForce, str | None]:
        """The first config: the label's, else the default chain's (nothing is in force to keep yet).

        Sets the settings the first reconcile serves with; a :class:`ConfigError` (exit 2) when no
        choice can be loaded at all.
        """
        selection, names = self._select(d, self._label)
        failures: list[str] = []
        candidates = [selection]
        if selection.source == "label":  # should its content be refused, the default chain is next
            candidates.append(self._select(d, None)[0])
        tried: set[str | None] = set()
        for candidate in candidates:
            if candidate.error and candidate.error not in failures:
                failures.append(candidate.error)
            if not candidate.chosen or candidate.name in tried:
                continue
            tried.add(candidate.name)
            digest = None
            try:
                data, digest = self._read(d, candidate.name)
                config, settings = self._parse(d, candidate.name, data)
            except ConfigError as exc:
                self.log.error("config_rejected", error=str(exc), config=candidate.name)
                self.base_metrics.count_error("config")
                failures.append(one_line(exc))
                self._rejected = (candidate.name, digest, one_line(exc))  # not again for the same content
                continue
            assert candidate.source is not None
            self._starting_name = candidate.name
            self.config = config
            self.state.settings = settings
            if selection.error:
                self._selection_error = selection.error
                self.log.error("config_selection_failed", reason=selection.error, label=self._label)
            return InForce(candidate.name, candidate.source, digest), "; ".join(failures) or None
        reason = "; ".join(failures) or f"no usable config in {d.directory} (have: {', '.join(names)})"
        self.log.error("config_selection_failed", reason=reason, label=self._label)
        await self._report_final(one_line(reason))
        raise ConfigError(str(d.directory), [reason])

    def _took(self, chosen: InForce, failure: str | None) -> None:
        """``chosen`` is in force now: log it and say so on the node."""
        kept = self._in_force is not None and self._in_force.name == chosen.name and failure is not None
        self._in_force = chosen
        self.log.info(
            "config_selected",
            name=chosen.name,
            source=chosen.source,
            label=self._label,
            **({"kept": "the selection failed; the config in force follows its file"} if kept else {}),
        )
        self._set_state(failure)

    def _set_state(self, *reasons: str | None) -> None:
        problems = [r for r in reasons if r]
        state = "failed: " + one_line("; ".join(problems)) if problems else "applied"
        applied = ""
        if self._in_force is not None and self._in_force.name is not None:
            applied = self._in_force.name
        want = {STATE_ANNOTATION: state, APPLIED_ANNOTATION: applied}
        if want != self._want:
            self._want = want
            self.log.info("config_state", state=state, applied=applied)
            self._report_kick.set()

    async def _apply_selection(self, *, force: bool = False) -> None:
        """Choose again (the label or the directory changed) and apply what changed.

        Keep-last-good: a label naming a missing file, a directory that cannot be read, a file that
        does not parse, or resources the kubelet could not take leave the config in force as it is;
        each is logged and reported on the node. The content of the config in force is still followed.
        """
        d = self.opts.config_dir
        assert d is not None
        current = self._in_force
        assert current is not None  # set at start
        selection, _ = self._select(d, self._label)
        if selection.error != self._selection_error:
            self._selection_error = selection.error
            if selection.error:
                self.log.error("config_selection_failed", reason=selection.error, label=self._label)
                self.base_metrics.count_error("config-selection")
        name: str | None
        if selection.source is not None and selection.error is None:
            name, source = selection.name, selection.source
        else:
            name, source = current.name, current.source  # keep the config in force
        try:
            data, digest = self._read(d, name)
        except ConfigError as exc:
            if name == current.name:  # the file in force went away: keep serving what was read
                self._set_state(selection.error, one_line(exc))
                return
            data, digest = None, None
            problem: str | None = one_line(exc)
        else:
            problem = None
        if problem is None and not force and (name, digest) == (current.name, current.digest):
            if source != current.source:
                self._in_force = InForce(name, source, digest)
            self._rejected = None
            self._set_state(selection.error)
            return
        rejected = self._rejected
        if problem is None and not force and rejected is not None and rejected[:2] == (name, digest):
            self._set_state(selection.error, rejected[2])  # still the content refused before
            return
        if problem is None:
            try:
                config, settings = self._parse(d, name, data)
            except ConfigError as exc:
                self.log.error(
                    "config_rejected",
                    error=str(exc),
                    config=name,
                    keeping=f"the config in force ({current.name or 'built-in defaults'})",
                )
                self.base_metrics.count_error("config")
                problem = one_line(exc)
            else:
                before = set(self.servers)
                refused = await self.reconcile(settings=settings)
                if refused is None:
                    self.config = config
                    self._rejected = None
                    self.log.info(
                        "config_reloaded",
                        config=name,
                        added=sorted(set(self.servers) - before),
                        removed=sorted(before - set(self.servers)),
                    )
                    self._took(InForce(name, source, digest), selection.error)
                    return
                problem = one_line(f"{d.directory / (name or '')}: {refused}")
        self._rejected = (name, digest, problem)
        self._set_state(selection.error, problem)

    async def _config_dir_watch(self) -> None:
        """Any change in the directory (a ConfigMap update swaps ``..data``) makes the choice again."""
        d = self.opts.config_dir
        assert d is not None
        async for _ in watch_directory(d.directory, writes=True):
            self._reselect.set()

    async def _config_selector(self) -> None:
        d = self.opts.config_dir
        assert d is not None
        self._reselect.set()  # one pass at once: a change between the first choice and the watch counts
        while True:
            await self._reselect.wait()
            while True:  # wait for a quiet moment: one ConfigMap update is several renames
                self._reselect.clear()
                if not await sleep_or(self._reselect, d.settle):
                    break
            await self._apply_selection()

    async def _node_watch(self) -> None:
        """The node's label (and our annotations on it), from one watch that survives API outages."""
        from gpunode.kube.api import KubeError

        d = self.opts.config_dir
        assert self.kube is not None
        assert d is not None
        backoff = Backoff(first=0.5, cap=30.0)
        while True:
            try:
                async for node in self.kube.watch_node():
                    backoff.reset()
                    self._kube_error = ""
                    if self._reported is None:
                        self._reported = {
                            k: node.annotations[k]
                            for k in (STATE_ANNOTATION, APPLIED_ANNOTATION)
                            if k in node.annotations
                        }
                        self._report_kick.set()
                    label = node.labels.get(d.node_label, "")
                    if not self._label_known.is_set() or label != self._label:
                        if self._label_known.is_set():
                            self.log.info(
                                "node_label_changed", label=d.node_label, value=label, previous=self._label
                            )
                        self._label = label
                        self._label_known.set()
                        self._reselect.set()
            except KubeError as exc:  # 403 / 404: the watch itself retries outages
                self._kube_error = str(exc)
                delay = backoff.next()
                self.log.error("node_watch_failed", error=str(exc), retry_in_s=delay)
                self.base_metrics.count_error("kube")
                await asyncio.sleep(delay)

    async def _config_reporter(self) -> None:
        """Write the wanted annotations when they differ from what the node carries; retry failures."""
        from gpunode.kube.api import KubeError

        assert self.kube is not None
        backoff = Backoff(first=0.5, cap=30.0)
        while True:
            await self._report_kick.wait()
            self._report_kick.clear()
            if self._reported is None:
                continue  # the node has not been read yet; the watch kicks when it is
            patch = {k: v for k, v in self._want.items() if self._reported.get(k) != v}
            if not patch:
                continue
            try:
                await self.kube.patch_node(annotations=patch)
            except KubeError as exc:
                delay = backoff.next()
                self.log.warning("config_state_not_reported", error=str(exc), retry_in_s=delay)
                self.base_metrics.count_error("kube")
                await sleep_or(self._report_kick, delay)
                self._report_kick.set()
                continue
            backoff.reset()
            self._reported.update(patch)
            self.log.info("config_state_reported", annotations=patch)

    async def _report_final(self, reason: str) -> None:
        """Before exiting for want of any usable config: say why on the node, if the API answers soon."""
        if self.kube is None:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(3.0):
                await self.kube.patch_node(
                    annotations={STATE_ANNOTATION: f"failed: {one_line(reason)}", APPLIED_ANNOTATION: ""}
                )

    def _kube_check(self) -> tuple[bool, str]:
        kube = self.kube
        assert kube is not None
        if self._kube_error:
            return (False, self._kube_error)
        if kube.available is None:
            return (False, "API server not reached yet")
        if not kube.available:
            return (False, kube.last_error or "API server unreachable")
        return (True, f"node {kube.node_name}")

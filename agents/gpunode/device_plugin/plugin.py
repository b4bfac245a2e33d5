"""The device plugin agent's task wiring: inventory -> resources -> gRPC servers -> kubelet registration.

One TaskGroup of named tasks, each the work of one part: the registrar, the kubelet directory watch and
the self-check (:mod:`~gpunode.device_plugin.registrar`), NVML events and the health probe
(:mod:`~gpunode.device_plugin.healthwatch`), the MIG rebuild (:mod:`~gpunode.device_plugin.resources`),
the config watch, SIGHUP reload and, with a config directory, the node label's choice
(:mod:`~gpunode.device_plugin.configwatch`: node-watch, config-watch, config-select, config-report), the
HTTP endpoint and the watchdog. Here: the order they start in, NVML's opening, and the shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common import sdnotify
from gpunode.common.errors import ConfigError
from gpunode.common.hostpaths import HostPaths
from gpunode.common.http import HealthServer
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import on_sighup, supervise, trim_memory
from gpunode.device_plugin.configwatch import ConfigWatch, DirConfig, LoadSettings
from gpunode.device_plugin.devices import DeviceConfigError
from gpunode.device_plugin.health import HealthTracker, XidPolicy
from gpunode.device_plugin.healthwatch import HealthWatch
from gpunode.device_plugin.metrics import DevicePluginMetrics
from gpunode.device_plugin.mps import DEFAULT_INTERVAL as MPS_POLL_INTERVAL
from gpunode.device_plugin.mps import MpsWatch
from gpunode.device_plugin.registrar import Registrar
from gpunode.device_plugin.resources import MIG_SETTLE, MIG_SETTLE_MAX, Resources
from gpunode.device_plugin.server import ResourceServer, SharedState
from gpunode.kube.labelconfig import LabelConfig, LabelConfigOptions, Loaded, one_line
from gpunode.nvml import errors

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.device_plugin.flags import DevicePluginFlags
    from gpunode.device_plugin.settings import PluginSettings
    from gpunode.kube.client import Kube
    from gpunode.nvml import Nvml
    from gpunode.nvml.api import GpuInfo

__all__ = ["AGENT", "AgentOptions", "DevicePlugin", "probe_interval"]

AGENT = "device-plugin"
EVENTS_READY_TIMEOUT = 5.0  # a wedged event registration must not hold back registration


def probe_interval(recovery_period: float) -> float:
    """How often lost GPUs and recoveries are checked: every 10 s, or finer for a short hold-down."""
    if recovery_period <= 0:
        return 10.0
    return min(10.0, max(0.2, recovery_period / 5))


@dataclass(frozen=True)
class AgentOptions:
    """Everything the agent needs that is not in the plugin settings."""

    kubelet_socket: Path | None  # None: serve but never register (NVIDIA's --kubelet-socket="")
    config_file: Path | None
    load_settings: LoadSettings  # precedence applied by the CLI
    host: HostPaths = field(default_factory=HostPaths)
    recovery_period: float = 300.0
    policy: XidPolicy = field(default_factory=XidPolicy)
    http_host: str = "127.0.0.1"
    http_port: int | None = 0  # None: no HTTP endpoint
    config_dir: LabelConfigOptions | None = None  # set: config_file is None, the label chooses the file
    self_check_interval: float = 5.0
    probe_interval: float = 10.0
    nvml_retry_interval: float = 30.0
    mig_settle: float = MIG_SETTLE  # a MIG layout is advertised once no MIG event came for this long ...
    mig_settle_max: float = MIG_SETTLE_MAX  # ... or this long after its first event
    mps_poll_interval: float = MPS_POLL_INTERVAL  # how often the MPS daemon's readiness file is checked

    @classmethod
    def from_flags(
        cls,
        flags: DevicePluginFlags,
        load_settings: LoadSettings,
        *,
        config_dir: LabelConfigOptions | None,
        policy: XidPolicy,
        http_host: str,
    ) -> AgentOptions:
        """The options the command line gives (``config_dir``: ``--config-file`` names a directory)."""
        kubelet = flags.kubelet_socket
        config_file = flags.common.config_file
        period = flags.health_recovery_period
        return cls(
            kubelet_socket=Path(kubelet) if kubelet else None,
            config_file=Path(config_file) if config_file and config_dir is None else None,
            config_dir=config_dir,
            load_settings=load_settings,
            host=HostPaths(root=flags.host_root),
            recovery_period=period,
            probe_interval=probe_interval(period),
            policy=policy,
            http_host=http_host,
            http_port=None if flags.http.http_port < 0 else flags.http.http_port,
        )

    @property
    def plugin_dir(self) -> Path:
        if self.kubelet_socket is not None:
            return self.kubelet_socket.parent
        return self.host.device_plugin_dir


class DevicePlugin:
    """The agent: its parts (``resources``, ``registrar``, ``health_watch``, ``configs``) and their tasks."""

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
        self.resources = Resources(
            self.state,
            plugin_dir=opts.plugin_dir,
            host=opts.host,
            metrics=self.metrics,
            base_metrics=self.base_metrics,
            log=self.log,
            mig_settle=opts.mig_settle,
            mig_settle_max=opts.mig_settle_max,
        )
        self.mps_watch = MpsWatch(self.resources, opts.host, log=self.log, interval=opts.mps_poll_interval)
        self.registrar = Registrar(
            self.resources,
            kubelet_socket=opts.kubelet_socket,
            self_check_interval=opts.self_check_interval,
            log=self.log,
            clock=clock,
        )
        self.health_watch = HealthWatch(
            self.resources, policy=opts.policy, probe_interval=opts.probe_interval, log=self.log, clock=clock
        )
        self.configs = ConfigWatch(
            self.resources,
            config_file=opts.config_file,
            config_dir=opts.config_dir,
            load_settings=opts.load_settings,
            config=config,
            kube=kube,
            log=self.log,
            publish=self.mps_watch.publish_config,
        )

    # -- the parts' state, where tests and benchmarks look ---------------------------------------------
    @property
    def nvml(self) -> Nvml | None:
        return self.resources.nvml

    @nvml.setter
    def nvml(self, nvml: Nvml | None) -> None:
        self.resources.nvml = nvml

    @property
    def gpus(self) -> list[GpuInfo]:
        return self.resources.gpus

    @property
    def servers(self) -> dict[str, ResourceServer]:
        return self.resources.servers

    @property
    def ready(self) -> asyncio.Event:
        """Set once the first round of registrations is done."""
        return self.registrar.ready

    @property
    def config(self) -> PluginConfig | None:
        return self.configs.config

    @property
    def dir_config(self) -> LabelConfig[DirConfig] | None:
        return self.configs.dir_config

    @property
    def _config_digest(self) -> str | None:
        return self.configs.digest

    @_config_digest.setter
    def _config_digest(self, digest: str | None) -> None:
        self.configs.digest = digest

    async def reconcile(self, initial: bool = False, settings: PluginSettings | None = None) -> str | None:
        """:meth:`Resources.reconcile`; at start, refused resources are a :class:`ConfigError`."""
        try:
            return await self.resources.reconcile(settings, initial=initial)
        except DeviceConfigError as exc:  # only at start
            raise ConfigError(self.configs.source(), [str(exc)]) from None

    async def reload(self) -> None:
        """SIGHUP: :meth:`ConfigWatch.reload`."""
        await self.configs.reload()

    async def _stop_all(self) -> None:
        await self.resources.stop_all()

    # -- lifecycle -------------------------------------------------------------------------------------
    def _add_checks(self, http: HealthServer) -> None:
        http.add_check("nvml", lambda: (self.nvml is not None, "" if self.nvml else "NVML unavailable"))
        http.add_check("registered", self.registrar.registered_check)
        if self.kube is not None and self.dir_config is not None:
            http.add_check("kube", self.dir_config.kube_check)

    async def run(self) -> None:
        if self.http is not None:
            self._add_checks(self.http)
        configs = self.configs
        dir_config = configs.dir_config
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
                    loaded = await configs.first_dir_config(dir_config)
                self.nvml = await self._open_nvml()
                self.mps_watch.refresh()  # MPS resources are advertised only once their daemon is ready
                try:
                    await self.reconcile(initial=True)
                except ConfigError as exc:
                    if dir_config is not None:
                        await dir_config.report_final(one_line(exc))
                    raise
                if dir_config is not None and loaded is not None:
                    dir_config.took(loaded.chosen, loaded.failure)
                configs.publish(loaded.chosen if loaded is not None else None)
                trim_memory()
                # Health events are watched before the kubelet hears of any device: an XID in between
                # would otherwise go unseen.
                watching = asyncio.Event()
                tg.create_task(
                    self._supervised("nvml-events", lambda: self.health_watch.events(watching)),
                    name="nvml-events",
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watching.wait(), EVENTS_READY_TIMEOUT)
                tg.create_task(self.registrar.run(), name="registrar")
                if self.opts.kubelet_socket is not None:
                    tg.create_task(
                        self._supervised("kubelet-watch", self.registrar.watch_kubelet), name="kubelet-watch"
                    )
                tg.create_task(self.registrar.self_check(), name="self-check")
                tg.create_task(self._supervised("health-probe", self.health_watch.probe), name="health-probe")
                tg.create_task(self.resources.follow_mig_changes(), name="rebuild")
                tg.create_task(self._supervised("mps-watch", self.mps_watch.run), name="mps-watch")
                if self.opts.config_file is not None:
                    tg.create_task(self._supervised("config-watch", configs.watch_file), name="config-watch")
                if dir_config is not None:
                    tg.create_task(
                        self._supervised("config-watch", dir_config.watch_directory), name="config-watch"
                    )
                    tg.create_task(
                        self._supervised(
                            "config-select", lambda: dir_config.follow_changes(configs.apply_dir_config)
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

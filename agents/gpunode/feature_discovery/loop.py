"""The labeling service: when passes run and what wakes them.

A pass every interval, sooner when the MIG layout changes, a GPU is lost, SIGHUP re-reads the config
file, or the node label chooses another config of a config directory. A MIG layout change is labeled
once the layout is quiet (no MIG event for ``mig_settle`` seconds, at most ``mig_settle_max`` after the
first), so a half-applied layout is not published. Also the service's wiring: NVML
opened (or retried while unavailable), the health endpoint, the systemd watchdog, and what is left behind
on stop. One pass itself is :class:`~gpunode.feature_discovery.labeler.Labeler`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common import sdnotify
from gpunode.common.hostpaths import HostPaths
from gpunode.common.http import HealthServer
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import on_sighup, settle, trim_memory
from gpunode.feature_discovery.config import LabelingConfig
from gpunode.feature_discovery.labeler import Labeler, LabelerOptions
from gpunode.feature_discovery.output import NodeFeatureOutput
from gpunode.kube.labelconfig import InForce, LabelConfig, LabelConfigOptions, NoUsableConfig
from gpunode.nvml import Nvml, errors
from gpunode.nvml.api import EVENT_MIG_CONFIG, EVENT_XID, EventKind

if TYPE_CHECKING:
    from gpunode.feature_discovery.settings import FdSettings, LabelsOnExit
    from gpunode.kube.client import Kube

__all__ = ["FdOptions", "FeatureDiscovery"]

AGENT = "feature-discovery"
EVENTS_READY_TIMEOUT = 5.0  # a wedged event registration must not hold back the first labels
WAKE_DELAY = 0.5  # a pass woken by an event waits this long: a burst of events makes one pass
# A MIG layout change is labeled once no MIG event came for MIG_SETTLE seconds (well inside the 2 s
# promise), or MIG_SETTLE_MAX seconds after its first event, whichever comes first.
MIG_SETTLE = 0.5
MIG_SETTLE_MAX = 5.0


@dataclass(frozen=True)
class FdOptions:
    labeling: LabelerOptions  # oneshot and the interval (None: label once, then only on events and signals)
    config: LabelingConfig  # at start (with a config directory: until the label's file is read)
    read_config: Callable[[Path | None], LabelingConfig]  # SIGHUP (None), a directory's file; raises when bad
    config_dir: LabelConfigOptions | None = None  # --config-file naming a directory: a node label chooses
    no_timestamp: bool = False
    fail_on_init_error: bool = True
    on_exit: LabelsOnExit = "expire"
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    nvml_retry_interval: float = 30.0
    mig_settle: float = MIG_SETTLE
    mig_settle_max: float = MIG_SETTLE_MAX

    @classmethod
    def from_settings(
        cls,
        s: FdSettings,
        config: LabelingConfig,
        read_config: Callable[[Path | None], LabelingConfig],
        *,
        interval: float | None,
        directory: Path | None,
        http_host: str,
    ) -> FdOptions:
        """The options for ``s`` (``interval``: its sleep interval, parsed; ``directory``: its config
        file when that names a directory)."""
        machine = s.machine_type_file
        return cls(
            LabelerOptions(
                s.output_file,
                Path(machine) if machine else None,
                HostPaths(root=s.host_root),
                s.oneshot,
                interval,
            ),
            config,
            read_config,
            s.label_config.options(directory) if directory is not None else None,
            no_timestamp=s.no_timestamp,
            fail_on_init_error=s.fail_on_init_error,
            on_exit=s.labels_on_exit,
            http_host=http_host,
            http_port=None if s.http.http_port < 0 or s.oneshot else s.http.http_port,
        )


class FeatureDiscovery:
    def __init__(
        self,
        opts: FdOptions,
        open_nvml: Callable[[], Awaitable[Nvml]],
        *,
        clock: Callable[[], float] = time.time,
        node_feature: NodeFeatureOutput | None = None,
        kube: Kube | None = None,
    ) -> None:
        self.opts = opts
        self.oneshot = opts.labeling.oneshot
        self.interval = opts.labeling.interval
        self.node_feature = node_feature
        self.kube = kube if kube is not None else (node_feature.kube if node_feature is not None else None)
        self.open_nvml = open_nvml
        self.clock = clock
        self.log = get_logger("gpunode.feature_discovery")
        self.metrics = create_metrics(AGENT)
        self.nvml: Nvml | None = None
        self.labeler = Labeler(
            opts.labeling,
            opts.config,
            lambda: self.nvml,
            timestamp=None if opts.no_timestamp else int(clock()),
            log=self.log,
            metrics=self.metrics,
            node_feature=node_feature,
        )
        self.wake = asyncio.Event()  # label now (after WAKE_DELAY, or once a MIG change is quiet)
        self.mig_changed = asyncio.Event()  # the MIG layout is changing (wake is set as well)
        self.http = (
            HealthServer(self.metrics.registry, host=opts.http_host, port=opts.http_port)
            if opts.http_port is not None
            else None
        )
        self.dir_config: LabelConfig[LabelingConfig] | None = None  # --config-file naming a directory
        if opts.config_dir is not None:
            self.dir_config = LabelConfig(
                opts.config_dir,
                opts.read_config,
                kube=self.kube,
                log=self.log,
                count_error=self.metrics.count_error,
            )

    async def run(self) -> None:
        try:
            if self.dir_config is not None:
                await self._first_config(self.dir_config)
            self.nvml = await self._open_nvml()
            if self.oneshot:
                await self.labeler.label_once()
                return
            async with asyncio.TaskGroup() as tg:
                if self.http is not None:
                    self.http.add_check(
                        "nvml", lambda: (self.nvml is not None, "" if self.nvml else "NVML unavailable")
                    )
                    self.http.add_check(
                        "labeled", lambda: (self.labeler.passes > 0, f"{self.labeler.passes} passes")
                    )
                    if self.node_feature is not None:
                        kube = self.node_feature.kube
                        self.http.add_check(
                            "kube", lambda: (kube.available is not False, kube.last_error or "reachable")
                        )
                    tg.create_task(self.http.serve(), name="http")
                tg.create_task(sdnotify.watchdog_task(), name="watchdog")
                if self.nvml is not None:
                    # Watch before the first pass: a GPU lost in between is then either seen by the
                    # pass or wakes the next one, never missed until the next interval.
                    watching = asyncio.Event()
                    tg.create_task(self._events(watching), name="nvml-events")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(watching.wait(), EVENTS_READY_TIMEOUT)
                else:
                    tg.create_task(self._retry_nvml(), name="nvml-retry")
                await self.labeler.write_with_retry()
                trim_memory()
                last = self.labeler.last
                sdnotify.notify(ready=True, status=f"{len(last.labels) if last else 0} labels")
                tg.create_task(on_sighup(self.reload, metrics=self.metrics, log=self.log), name="sighup")
                if self.dir_config is not None:
                    tg.create_task(self.dir_config.watch_directory(), name="config-watch")
                    tg.create_task(
                        self.dir_config.follow_changes(self._apply_dir_config), name="config-select"
                    )
                    if self.kube is not None:
                        tg.create_task(self.dir_config.watch_node(), name="node-watch")
                tg.create_task(self._passes(), name="labeling")
        finally:
            self.labeler.leave(self.opts.on_exit)
            if self.node_feature is not None:
                with contextlib.suppress(Exception):
                    await self.node_feature.kube.aclose()
            if self.nvml is not None:
                with contextlib.suppress(Exception):
                    await self.nvml.close()

    # -- NVML ------------------------------------------------------------------------------------------
    async def _open_nvml(self) -> Nvml | None:
        try:
            return await self.open_nvml()
        except errors.NvmlError as exc:
            if self.opts.fail_on_init_error:
                raise
            self.log.error(
                "nvml_unavailable",
                error=str(exc),
                action="writing no GPU labels",
                hint="set --fail-on-init-error=true to exit instead",
            )
            return None

    async def _retry_nvml(self) -> None:
        while self.nvml is None:
            await asyncio.sleep(self.opts.nvml_retry_interval)
            try:
                self.nvml = await self.open_nvml()
            except errors.NvmlError:
                continue
            self.log.info("nvml_available")
            self.wake.set()
            await self._events()

    # -- what wakes a pass -----------------------------------------------------------------------------
    async def _passes(self) -> None:
        while True:
            timeout = self.interval
            try:
                if timeout is None:
                    await self.wake.wait()
                else:
                    await asyncio.wait_for(self.wake.wait(), timeout)
                if not self.mig_changed.is_set():
                    await asyncio.sleep(WAKE_DELAY)  # coalesce a burst of events
            except TimeoutError:
                pass
            if self.mig_changed.is_set():  # the layout is changing: label it once it is quiet
                await settle(self.mig_changed, self.opts.mig_settle, self.opts.mig_settle_max)
            self.wake.clear()
            await self.labeler.write_with_retry()

    async def _events(self, ready: asyncio.Event | None = None) -> None:
        """MIG config changes and fatal XIDs (a GPU falling off the bus) trigger a pass at once."""
        assert self.nvml is not None
        while True:
            try:
                async for ev in self.nvml.events(mask=EVENT_MIG_CONFIG | EVENT_XID, ready=ready):
                    if ev.kind is EventKind.MIG_CONFIG:
                        self.mig_changed.set()
                        self.wake.set()
                    elif ev.kind is EventKind.XID and ev.xid == 79:
                        self.wake.set()
            except errors.NvmlError as exc:
                self.log.warning("nvml_events_failed", error=str(exc), retry_in_s=5)
                await asyncio.sleep(5)

    async def reload(self) -> None:
        """SIGHUP: re-read the config (a bad one keeps the last good), new timestamp, label at once."""
        if self.dir_config is not None:
            await self.dir_config.reload(self._apply_dir_config)
        else:
            try:
                fresh = self.opts.read_config(None)
            except Exception as exc:
                self.log.error("config_rejected", error=str(exc), keeping="the last good configuration")
                self.metrics.count_error("config")
                return
            self.labeler.config = fresh
        if self.labeler.timestamp is not None:
            self.labeler.timestamp = int(self.clock())
        self.wake.set()

    # -- the config chosen by a node label (--config-file naming a directory) ---------------------------
    async def _first_config(self, dir_config: LabelConfig[LabelingConfig]) -> None:
        """The label's config before the first pass; the default chain when the API server is away.
        With no usable config at all, the flags' settings serve until one loads."""
        await dir_config.wait_for_label(run_watch=True)  # the node watch proper starts after the first pass
        try:
            loaded = await dir_config.first()
        except NoUsableConfig:
            return  # logged; a later change of the label or the directory may bring a usable config
        self.labeler.config = loaded.config
        dir_config.took(loaded.chosen, loaded.failure)

    async def _apply_dir_config(self, fresh: LabelingConfig, chosen: InForce) -> str | None:
        """Label with a newly chosen (or changed) config, at once."""
        self.labeler.config = fresh
        self.wake.set()
        return None

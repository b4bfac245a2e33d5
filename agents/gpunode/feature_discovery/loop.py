"""The labeling loop: a pass every interval, sooner when the MIG layout changes or a GPU is lost."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.api.plugin_types import TimeSlicing
from gpunode.common import sdnotify
from gpunode.common.hostpaths import HostPaths
from gpunode.common.http import HealthServer
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import on_sighup, trim_memory
from gpunode.feature_discovery.facts import gather_facts
from gpunode.feature_discovery.labels import LabelResult, NodeFacts, compute_labels
from gpunode.feature_discovery.output import FeatureFile, NodeFeatureOutput, OutputError, expiry_after_stop
from gpunode.kube.labelconfig import InForce, LabelConfig, LabelConfigOptions, NoUsableConfig
from gpunode.nvml import errors

if TYPE_CHECKING:
    from gpunode.kube.client import Kube
from gpunode.nvml.api import EVENT_MIG_CONFIG, EVENT_XID, EventKind, Nvml

AGENT = "feature-discovery"
EVENTS_READY_TIMEOUT = 5.0  # a wedged event registration must not hold back the first labels
MIG_EVENT_DELAY = 0.5  # let a burst of MIG config-change events settle (well inside the 2 s promise)


@dataclass(frozen=True)
class FdOptions:
    output_file: str
    mig_strategy: str
    sharing: TimeSlicing | None
    interval: float | None  # None: label once, then only on events and signals ("infinite")
    oneshot: bool = False
    no_timestamp: bool = False
    fail_on_init_error: bool = True
    machine_type_file: Path | None = None
    host: HostPaths = field(default_factory=HostPaths)
    on_exit: str = "expire"  # expire | delete | keep
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    nvml_retry_interval: float = 30.0
    reload: Callable[[], FdReload] | None = None  # SIGHUP: re-read the config file
    config_dir: ConfigDir | None = None  # --config-file naming a directory: a node label chooses


@dataclass(frozen=True, kw_only=True)
class ConfigDir(LabelConfigOptions):
    """The device plugin's config directory (a ConfigMap mount); the node label chooses the file, as
    for the device plugin, so sharing labels always describe what the plugin advertises."""

    load: Callable[[Path | None], FdReload]  # a file's settings (None: no file); raises when bad


@dataclass(frozen=True)
class FdReload:
    mig_strategy: str
    sharing: TimeSlicing | None


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
        self.node_feature = node_feature
        self.kube = kube if kube is not None else (node_feature.kube if node_feature is not None else None)
        self.open_nvml = open_nvml
        self.clock = clock
        self.log = get_logger("gpunode.feature_discovery")
        self.metrics = create_metrics(AGENT)
        self.output = FeatureFile(opts.output_file)
        self.mig_strategy = opts.mig_strategy
        self.sharing = opts.sharing
        self.timestamp = None if opts.no_timestamp else int(clock())
        self.nvml: Nvml | None = None
        self.wake = asyncio.Event()
        self.passes = 0
        self.last: LabelResult | None = None
        self._warned: set[str] = set()
        self.http = (
            HealthServer(self.metrics.registry, host=opts.http_host, port=opts.http_port)
            if opts.http_port is not None
            else None
        )
        self.dir_config: LabelConfig[FdReload] | None = None  # --config-file naming a directory
        if opts.config_dir is not None:
            self.dir_config = LabelConfig(
                opts.config_dir,
                opts.config_dir.load,
                kube=self.kube,
                log=self.log,
                count_error=self.metrics.count_error,
            )

    # -- one pass --------------------------------------------------------------------------------------
    async def facts(self) -> NodeFacts:
        if self.nvml is None:
            return NodeFacts(system=None, gpus=(), mig_devices={}, pci_classes={}, machine=None)
        return await gather_facts(self.nvml, self.opts.host, self.opts.machine_type_file)

    async def label_once(self) -> LabelResult:
        facts = await self.facts()
        if (
            self.opts.machine_type_file is not None
            and facts.machine is None
            and "machine" not in self._warned
        ):
            self._warned.add("machine")
            self.log.warning(
                "machine_type_unreadable",
                file=str(self.opts.machine_type_file),
                label="nvidia.com/gpu.machine=unknown",
            )
        result = compute_labels(
            facts, mig_strategy=self.mig_strategy, sharing=self.sharing, timestamp=self.timestamp
        )
        for warning in result.warnings:
            if warning not in self._warned:  # say it once, not every minute
                self._warned.add(warning)
                self.log.warning("label_warning", detail=warning)
        for key, original, written in result.adjusted:
            if f"{key}={original}" not in self._warned:
                self._warned.add(f"{key}={original}")
                self.log.warning(
                    "label_value_adjusted",
                    key=key,
                    original=original,
                    written=written,
                    reason="Kubernetes label values are at most 63 of [A-Za-z0-9._-]",
                )
        if self.node_feature is not None:
            changed = await self.node_feature.write(result.labels)
            where = {"nodefeature": f"{self.node_feature.namespace}/{self.node_feature.name}"}
            if self.node_feature.owner_warning and "owner" not in self._warned:
                self._warned.add("owner")
                self.log.warning("nodefeature_owner_unknown", detail=self.node_feature.owner_warning)
        else:
            changed = self.output.write(result.labels)
            where = {"file": self.opts.output_file or "<stdout>"}
        self.passes += 1
        self.last = result
        self.log.info("labels_written" if changed else "labels_unchanged", labels=len(result.labels), **where)
        if len(result.labels) <= 1:
            self.log.warning("no_labels", hint="no GPU found or NVML unavailable")
        self.metrics.mark_success("labeling")
        return result

    async def write_with_retry(self) -> None:
        """A pass; an unwritable output is retried with backoff (daemon mode), never a crash loop."""
        delay = 1.0
        while True:
            try:
                await self.label_once()
                return
            except OutputError as exc:
                if self.opts.oneshot:
                    raise
                self.log.error("output_failed", error=str(exc), retry_in_s=delay)
                self.metrics.count_error("output")
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.opts.interval or 60.0)

    # -- the loop --------------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            if self.dir_config is not None:
                await self._first_config(self.dir_config)
            self.nvml = await self._open_nvml()
            if self.opts.oneshot:
                await self.label_once()
                return
            async with asyncio.TaskGroup() as tg:
                if self.http is not None:
                    self.http.add_check(
                        "nvml", lambda: (self.nvml is not None, "" if self.nvml else "NVML unavailable")
                    )
                    self.http.add_check("labeled", lambda: (self.passes > 0, f"{self.passes} passes"))
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
                await self.write_with_retry()
                trim_memory()
                sdnotify.notify(ready=True, status=f"{len(self.last.labels) if self.last else 0} labels")
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
            self._on_exit()
            if self.node_feature is not None:
                with contextlib.suppress(Exception):
                    await self.node_feature.kube.aclose()
            if self.nvml is not None:
                with contextlib.suppress(Exception):
                    await self.nvml.close()

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

    async def _passes(self) -> None:
        while True:
            timeout = self.opts.interval
            try:
                if timeout is None:
                    await self.wake.wait()
                else:
                    await asyncio.wait_for(self.wake.wait(), timeout)
                await asyncio.sleep(MIG_EVENT_DELAY)  # coalesce a burst of events
            except TimeoutError:
                pass
            self.wake.clear()
            await self.write_with_retry()

    async def _events(self, ready: asyncio.Event | None = None) -> None:
        """MIG config changes and fatal XIDs (a GPU falling off the bus) trigger a pass at once."""
        assert self.nvml is not None
        while True:
            try:
                async for ev in self.nvml.events(mask=EVENT_MIG_CONFIG | EVENT_XID, ready=ready):
                    if ev.kind is EventKind.MIG_CONFIG or (ev.kind is EventKind.XID and ev.xid == 79):
                        self.wake.set()
            except errors.NvmlError as exc:
                self.log.warning("nvml_events_failed", error=str(exc), retry_in_s=5)
                await asyncio.sleep(5)

    async def reload(self) -> None:
        """SIGHUP: re-read the config (a bad one keeps the last good), new timestamp, label at once."""
        if self.dir_config is not None:
            await self.dir_config.reload(self._apply_dir_config)
        elif self.opts.reload is not None:
            try:
                fresh = self.opts.reload()
            except Exception as exc:
                self.log.error("config_rejected", error=str(exc), keeping="the last good configuration")
                self.metrics.count_error("config")
                return
            self.mig_strategy, self.sharing = fresh.mig_strategy, fresh.sharing
        if self.timestamp is not None:
            self.timestamp = int(self.clock())
        self.wake.set()

    def _on_exit(self) -> None:
        """The feature file stays with an expiry (or goes, or stays as is); a NodeFeature always stays,
        as NVIDIA's does: its owners' garbage collection removes it."""
        if (
            self.opts.oneshot
            or self.node_feature is not None
            or self.output.path is None
            or self.last is None
        ):
            return
        if self.opts.on_exit == "delete":
            self.output.delete()
            self.log.info("labels_deleted", file=str(self.output.path))
        elif self.opts.on_exit == "expire":
            expiry = expiry_after_stop(self.opts.interval or 60.0, datetime.now(UTC))
            with contextlib.suppress(OutputError):
                self.output.write(self.last.labels, expiry)
            self.log.info("labels_expire", file=str(self.output.path), at=expiry.isoformat())

    # -- the config chosen by a node label (--config-file naming a directory) ---------------------------
    async def _first_config(self, dir_config: LabelConfig[FdReload]) -> None:
        """The label's config before the first pass; the default chain when the API server is away.
        With no usable config at all, the flags' settings serve until one loads."""
        await dir_config.wait_for_label(run_watch=True)  # the node watch proper starts after the first pass
        try:
            loaded = await dir_config.first()
        except NoUsableConfig:
            return  # logged; a later change of the label or the directory may bring a usable config
        self.mig_strategy, self.sharing = loaded.config.mig_strategy, loaded.config.sharing
        dir_config.took(loaded.chosen, loaded.failure)

    async def _apply_dir_config(self, fresh: FdReload, chosen: InForce) -> str | None:
        """Label with a newly chosen (or changed) config, at once."""
        self.mig_strategy, self.sharing = fresh.mig_strategy, fresh.sharing
        self.wake.set()
        return None

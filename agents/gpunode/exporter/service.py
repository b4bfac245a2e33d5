"""The exporter process: sampler, XID watch and the HTTP endpoint, in one TaskGroup."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import choose_encoder

from gpunode.common import sdnotify
from gpunode.common.asynchttp import AsyncEndpoint
from gpunode.common.httpcore import Health, metrics_route
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import trim_memory
from gpunode.exporter.collector import ExporterCollector, Options, type_counters
from gpunode.exporter.counters import Counter, unavailable
from gpunode.exporter.podresources import PodResourcesClient
from gpunode.exporter.sampler import EMPTY, Sampler, Snapshot
from gpunode.nvml.api import Nvml

AGENT = "exporter"
SELF_METRICS_MAX_AGE = 1.0  # seconds a rendered scrape is reused (the GPU part: until the next sample)


@dataclass(frozen=True)
class ExporterOptions:
    host: str
    port: int
    interval: float
    counters: Sequence[Counter]
    hostname: str | None
    kubernetes: bool = False
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    virtual_gpus: bool = False
    resource_names: tuple[str, ...] = ()
    old_namespace: bool = False


class Exporter:
    def __init__(self, opts: ExporterOptions, open_nvml: Callable[[], Awaitable[Nvml]]) -> None:
        self.opts = opts
        self.open_nvml = open_nvml
        self.log = get_logger("gpunode.exporter")
        self.metrics = create_metrics(AGENT)
        registry = self.metrics.registry
        self.duration = Gauge(
            "gpunode_exporter_collection_duration_seconds",
            "How long the last sampling pass took.",
            registry=registry,
        )
        self.pod_failures = PromCounter(
            "gpunode_exporter_podresources_failures",
            "Failed kubelet PodResources List calls.",
            registry=registry,
        )
        self.sampler: Sampler | None = None
        self.collector: ExporterCollector | None = None
        self.gpu_registry = CollectorRegistry(auto_describe=False)  # the GPU series, rendered once per sample
        self._cache: dict[str, tuple[float, float, bytes]] = {}
        self.ready = asyncio.Event()
        # /readyz answers 503 until the first sample: never "ready" before there is something to scrape
        self.health = Health()  # /healthz: answered by the event loop, so it is alive
        self.health.add_check(
            "sampled",
            lambda: (True, "first sample taken") if self.ready.is_set() else (False, "no sample yet"),
        )
        # served by the event loop itself: fair and fast under many concurrent scrapers (see asynchttp)
        self.http = AsyncEndpoint(
            self.health.routes(metrics_route(self.render, self.log)), host=opts.host, port=opts.port
        )

    def latest(self) -> Snapshot:
        return self.sampler.latest if self.sampler is not None else EMPTY

    def render(self, accept: str) -> tuple[bytes, str]:
        """A scrape: the GPU series rendered once per snapshot (cached per format), then the live
        self-metrics. Scrapes cost no NVML call and, between samples, almost no rendering."""
        encoder, content_type = choose_encoder(accept)
        taken = self.latest().taken_at
        now = time.monotonic()
        cached = self._cache.get(content_type)  # only the event loop renders (see _metrics): no lock
        if cached is None or cached[0] != taken or now - cached[1] >= SELF_METRICS_MAX_AGE:
            gpu_part = encoder(self.gpu_registry)
            if gpu_part.endswith(b"# EOF\n"):  # OpenMetrics: one EOF, at the very end
                gpu_part = gpu_part[: -len(b"# EOF\n")]
            elif self.collector is not None:  # the text format: dcgm-exporter's counters typed counter
                gpu_part = type_counters(gpu_part, self.collector.counter_names)
            cached = (taken, now, gpu_part + encoder(self.metrics.registry))
            self._cache[content_type] = cached
        return cached[2], content_type

    def _pod_failure(self, reason: str) -> None:
        self.pod_failures.inc()
        self.metrics.count_error("podresources")
        self.log.warning("podresources_unavailable", error=reason, effect="series without pod labels")

    def _sampled(self, snap: Snapshot) -> None:
        self.duration.set(snap.duration_s)
        self.metrics.mark_success("sampling")
        if not self.ready.is_set():
            self.ready.set()
            sdnotify.notify(ready=True, status=f"exporting {len(snap.gpus)} GPUs")

    async def run(self) -> int:
        missing = unavailable(self.opts.counters)
        if missing:
            self.log.info(
                "metrics_unavailable",
                metrics=missing,
                reason="NVML cannot supply them; not faked",
            )
        async with contextlib.AsyncExitStack() as stack:
            try:
                await self.http.start()
            except OSError as exc:
                self.log.error(
                    "listen_failed", host=self.opts.host or "*", port=self.opts.port, error=str(exc)
                )
                return 1
            stack.push_async_callback(self.http.close)
            self.log.info("http_listening", host=self.opts.host or "*", port=self.http.port)
            nvml = await self.open_nvml()
            stack.push_async_callback(nvml.close)
            pods = PodResourcesClient(self.opts.pod_resources_socket) if self.opts.kubernetes else None
            if pods is not None:
                stack.push_async_callback(pods.close)
            self.sampler = Sampler(
                nvml,
                interval=self.opts.interval,
                pods=pods,
                resource_names=self.opts.resource_names,
                on_pod_failure=self._pod_failure,
            )
            collector = self.collector = ExporterCollector(
                self.opts.counters,
                Options(self.opts.hostname, self.opts.virtual_gpus, self.opts.old_namespace),
                self.latest,
            )
            self.gpu_registry.register(collector)
            async with asyncio.TaskGroup() as tg:
                watching = asyncio.Event()
                tg.create_task(self.sampler.watch_xids(watching), name="xids")
                await watching.wait()  # ready only once no XID can be missed
                await self.sampler.sample()
                self._sampled(self.sampler.latest)
                trim_memory()
                tg.create_task(self._sample_forever(), name="sampling")
                tg.create_task(sdnotify.watchdog_task(), name="watchdog")
        return 0

    async def _sample_forever(self) -> None:
        assert self.sampler is not None
        while True:
            await asyncio.sleep(self.opts.interval)
            try:
                snap = await self.sampler.sample()
            except Exception:
                self.log.error("sample_failed", exc_info=True)
                self.metrics.count_error("sampling")
                continue
            self._sampled(snap)

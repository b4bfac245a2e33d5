"""The exporter process: sampler, XID watch and the HTTP endpoint, in one TaskGroup."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from gpunode.common import sdnotify
from gpunode.common.asynchttp import AsyncEndpoint
from gpunode.common.httpcore import Health, metrics_route
from gpunode.common.logging import get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import trim_memory
from gpunode.exporter.collector import ExporterCollector, Options, type_counters
from gpunode.exporter.counters import Counter, unavailable
from gpunode.exporter.exposition import Unsupported, fast_encoder
from gpunode.exporter.exposition import render as render_families
from gpunode.exporter.podresources import PodResourcesClient
from gpunode.exporter.sampler import EMPTY, Sampler, Snapshot
from gpunode.nvml.api import Nvml

AGENT = "exporter"
T = TypeVar("T")
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


MAX_FORMATS = 8  # content types whose answers are kept: a client's Accept header names the version


def _remember(cache: dict[str, T], content_type: str, value: T) -> None:
    """Keep `value` for `content_type`; beyond MAX_FORMATS the oldest other format is forgotten."""
    cache.pop(content_type, None)
    while len(cache) >= MAX_FORMATS:
        del cache[next(iter(cache))]
    cache[content_type] = value


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
        self._cache: dict[str, tuple[float, float, bytes]] = {}  # content type -> whole answer
        self._gpu_cache: dict[str, tuple[float, bytes]] = {}  # content type -> (snapshot, GPU series)
        # the default formats (exposition.fast_encoder) scraped so far: answered right after each sample
        self._encoders: dict[str, Callable[[Collector], bytes]] = {}
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
        """A scrape: the GPU series rendered once per snapshot and format, then the self-metrics, rendered
        again at most once every SELF_METRICS_MAX_AGE seconds or with a new snapshot. For the default
        formats scraped before (Prometheus' text and OpenMetrics 1.0.0), the whole answer is made right
        after each sample (see :meth:`_sampled`); at most MAX_FORMATS answers are kept. Scrapes cost no
        NVML call and, between samples, no rendering of the GPU series."""
        encoder, content_type = choose_encoder(accept)
        return self._answer(encoder, content_type), content_type

    def _answer(self, encoder: Callable[[Collector], bytes], content_type: str) -> bytes:
        taken = self.latest().taken_at
        now = time.monotonic()
        cached = self._cache.get(content_type)  # only the event loop renders (see _metrics): no lock
        if cached is not None and cached[0] == taken and now - cached[1] < SELF_METRICS_MAX_AGE:
            return cached[2]
        gpu = self._gpu_cache.get(content_type)
        if gpu is None or gpu[0] != taken:
            gpu = self._render_gpu(encoder, content_type, taken)
        cached = (taken, now, gpu[1] + encoder(self.metrics.registry))
        _remember(self._cache, content_type, cached)
        return cached[2]

    def _render_gpu(
        self, encoder: Callable[[Collector], bytes], content_type: str, taken: float
    ) -> tuple[float, bytes]:
        """The GPU series of the snapshot taken at `taken`, in the encoder's format (OpenMetrics without
        its EOF line, which comes once at the very end), remembered for the scrapes until the next one."""
        fmt = fast_encoder(encoder)
        counters = self.collector.counter_names if self.collector is not None else ()
        try:
            if fmt is None:
                raise Unsupported(content_type)
            gpu_part = render_families(self.gpu_registry, fmt, counters)
        except Unsupported:
            gpu_part = encoder(self.gpu_registry)
            if gpu_part.endswith(b"# EOF\n"):  # OpenMetrics: one EOF, at the very end
                gpu_part = gpu_part[: -len(b"# EOF\n")]
            else:  # the text format: dcgm-exporter's counters typed counter
                gpu_part = type_counters(gpu_part, counters)
        if fmt is not None:
            self._encoders[content_type] = encoder
        rendered = (taken, gpu_part)
        _remember(self._gpu_cache, content_type, rendered)
        return rendered

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
        for content_type, encoder in self._encoders.items():  # off the scrapes' path: answered now
            try:
                self._answer(encoder, content_type)
            except Exception:  # the next scrape renders it again, and answers and logs the failure
                self._gpu_cache.pop(content_type, None)
                self._cache.pop(content_type, None)

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

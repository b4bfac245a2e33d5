"""Sampling on its own interval: NVML telemetry, XIDs and pod attribution into one immutable snapshot.

A scrape only renders the latest snapshot; it never calls NVML or the kubelet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpunode.common.logging import get_logger
from gpunode.exporter.podresources import Attribution, PodResourcesClient, PodResourcesUnavailable, attribute
from gpunode.nvml import errors
from gpunode.nvml.api import EVENT_MIG_CONFIG, EVENT_XID, EventKind, GpuInfo, MigDevice, Nvml, Telemetry


@dataclass(frozen=True)
class MigSample:
    device: MigDevice
    memory_used_mib: int | None
    memory_free_mib: int | None


@dataclass(frozen=True)
class GpuSample:
    info: GpuInfo
    telemetry: Telemetry | None  # None: lost (identity series stay, health 0)
    migs: tuple[MigSample, ...] = ()
    gpm: dict[str, float] | None = None  # NVML GPM activity in %, Hopper and later

    @property
    def healthy(self) -> bool:
        return self.telemetry is not None


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    driver_version: str
    gpus: tuple[GpuSample, ...]
    xids: dict[int, int] = field(default_factory=dict)  # GPU index -> last XID
    attribution: Attribution | None = None
    duration_s: float = 0.0
    nvml_version: str = ""


EMPTY = Snapshot(0.0, "", ())
GPM_METRICS = (
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_SM_OCCUPANCY, "
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, DCGM_FI_PROF_DRAM_ACTIVE, DCGM_FI_PROF_PIPE_FP64_ACTIVE, "
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE, DCGM_FI_PROF_PIPE_FP16_ACTIVE"
)
INVENTORY_EVERY = 10  # passes between full inventories (between them: telemetry, MIG mode and devices only)


class Sampler:
    def __init__(
        self,
        nvml: Nvml,
        *,
        interval: float,
        pods: PodResourcesClient | None = None,
        resource_names: tuple[str, ...] = (),
        on_pod_failure: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.interval = interval
        self.pods = pods
        self.resource_names = resource_names
        self.on_pod_failure = on_pod_failure
        self.clock = clock
        self.log = get_logger("gpunode.exporter")
        self.latest: Snapshot = EMPTY
        self.known: dict[int, GpuInfo] = {}  # every GPU ever seen: a lost one keeps its identity
        self.xids: dict[int, int] = {}
        self.layouts: dict[int, tuple[MigDevice, ...]] = {}  # MIG devices per GPU, kept between passes
        self.layout_changed: set[int] = set()
        self.no_gpm: set[int] = set()
        self.driver_version = ""
        self.nvml_version = ""
        self.passes = 0

    async def sample(self) -> Snapshot:
        start = time.perf_counter()
        if not self.driver_version:
            system = await self.nvml.system()
            self.driver_version, self.nvml_version = system.driver_version, system.nvml_version
        refresh = self.passes % INVENTORY_EVERY == 0 or not self.known
        if refresh:
            self.known.update({g.index: g for g in await self.nvml.gpus()})  # full inventory now and then
        # the GPUs are sampled together: the one NVML thread answers their calls back to back instead of
        # each call waiting for the event loop to take the previous answer
        indices = sorted(self.known)
        answers = await asyncio.gather(
            *(self._sample_gpu(i, refresh) for i in indices), return_exceptions=True
        )
        samples = []
        without_gpm: list[int] = []
        for index, answer in zip(indices, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer  # the first error in GPU order, as one GPU after the other
            samples.append(answer)
            if answer.telemetry is None:
                continue  # lost: its identity stays, with health 0
            if answer.gpm is None and self.passes >= 1 and index not in self.no_gpm:
                self.no_gpm.add(index)  # the first call only starts the window; after that None means no GPM
                without_gpm.append(index)
        if without_gpm:  # one event for every GPU found without GPM in this pass (normally the second)
            self.log.info(
                "profiling_metrics_unavailable",
                gpus=without_gpm,
                reason="no NVML GPM on these GPUs (Hopper or later has it); not faked",
                metrics=GPM_METRICS,
            )
        attribution = await self._attribution(samples)
        snap = Snapshot(
            taken_at=self.clock(),
            driver_version=self.driver_version,
            gpus=tuple(samples),
            xids=dict(self.xids),
            attribution=attribution,
            duration_s=time.perf_counter() - start,
            nvml_version=self.nvml_version,
        )
        self.latest = snap
        self.passes += 1
        return snap

    async def _sample_gpu(self, index: int, refresh: bool) -> GpuSample:
        info = self.known[index]
        try:
            tm = await self.nvml.telemetry(index)
            mode = await self.nvml.mig_mode(index)
            if mode != info.mig:
                info = self.known[index] = replace(info, mig=mode)
            migs: tuple[MigSample, ...] = ()
            if mode is not None and mode.current:
                devices = self.layouts.get(index)
                if devices is None or index in self.layout_changed or refresh:
                    # identity of the MIG devices: again only when the layout changed (NVML event);
                    # an event during the read asks again, and so does a read that fails
                    self.layout_changed.discard(index)
                    try:
                        devices = self.layouts[index] = tuple(await self.nvml.mig_devices(index))
                    except BaseException:
                        self.layout_changed.add(index)
                        raise
                    migs = tuple(MigSample(d, d.memory_used_mib, d.memory_free_mib) for d in devices)
                else:
                    memory = await self.nvml.mig_memory(index)
                    migs = tuple(MigSample(d, *memory.get(d.uuid, (None, None))) for d in devices)
            else:
                self.layouts.pop(index, None)
            gpm = await self.nvml.gpm_utilization(index) if index not in self.no_gpm else None
        except errors.GpuLost:
            return GpuSample(info, None)  # lost: its identity stays, with health 0
        return GpuSample(info, tm, migs, gpm)

    async def _attribution(self, samples: list[GpuSample]) -> Attribution | None:
        if self.pods is None:
            return None
        try:
            response = await self.pods.list()
        except PodResourcesUnavailable as exc:
            if self.on_pod_failure is not None:
                self.on_pod_failure(str(exc))
            return None
        mig_by_uuid = {m.device.uuid: (s.info.index, m.device.gi_id) for s in samples for m in s.migs}
        by_name = {f"nvidia{s.info.minor}": s.info.uuid for s in samples}
        return attribute(
            response, resource_names=self.resource_names, mig_by_uuid=mig_by_uuid, gpu_by_device_name=by_name
        )

    async def run(self, on_sample: Callable[[Snapshot], Any] | None = None) -> None:
        while True:
            try:
                snap = await self.sample()
                if on_sample is not None:
                    on_sample(snap)
            except errors.NvmlError as exc:
                self.log.warning("sample_failed", error=str(exc))
            await asyncio.sleep(self.interval)

    async def watch_xids(self, ready: asyncio.Event | None = None) -> None:
        """The last XID per GPU, from NVML events (there is no polled value to read)."""
        async for ev in self.nvml.events(mask=EVENT_XID | EVENT_MIG_CONFIG, ready=ready):
            if ev.kind is EventKind.MIG_CONFIG:
                self.layout_changed.add(ev.gpu_index)
                continue
            if ev.kind is EventKind.XID and ev.xid is not None:
                self.xids[ev.gpu_index] = ev.xid
                self.log.warning("xid", gpu=ev.gpu_index, uuid=ev.gpu_uuid, xid=ev.xid)

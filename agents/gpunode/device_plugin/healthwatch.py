"""Health wiring: NVML events and the health probe feed the health tracker; changes reach the kubelet.

XIDs and double-bit ECC errors (NVML events) and lost GPUs (the probe) make a GPU Unhealthy as
:class:`~gpunode.device_plugin.health.XidPolicy` says; the probe also brings quiet GPUs back after the
hold-down period (:class:`~gpunode.device_plugin.health.HealthTracker` decides both). Each change is
pushed to the streams of the resources on that GPU. A MIG layout change event asks the resources to
be built again, and so does a GPU that answers again after a rebuild could not read it (lost).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpunode.nvml.api import EVENT_DBE, EVENT_MIG_CONFIG, EVENT_SBE, EVENT_XID, EventKind

if TYPE_CHECKING:
    from gpunode.common.logging import Logger
    from gpunode.device_plugin.health import XidPolicy
    from gpunode.device_plugin.resources import Resources

__all__ = ["EVENT_MASK", "HealthWatch"]

EVENT_MASK = EVENT_XID | EVENT_SBE | EVENT_DBE | EVENT_MIG_CONFIG


class HealthWatch:
    """Follows NVML's events and probes for lost and recovered GPUs every ``probe_interval`` seconds."""

    def __init__(
        self,
        resources: Resources,
        *,
        policy: XidPolicy,
        probe_interval: float,
        log: Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resources = resources
        self.policy = policy
        self.probe_interval = probe_interval
        self.log = log
        self.clock = clock

    async def push(self, uuid: str) -> None:
        """Send the new health of GPU ``uuid``'s devices to the kubelet's streams."""
        res = self.resources
        for server in res.servers.values():
            if uuid in server.resource.devices_per_gpu:
                await server.update()
        res.metrics.unhealthy_gpus.set(len(res.state.health.unhealthy()))

    async def events(self, ready: asyncio.Event | None = None) -> None:
        """NVML's events, as they come (``ready`` is set once they are being watched)."""
        res = self.resources
        assert res.nvml is not None
        policy = self.policy
        health = res.state.health
        async for ev in res.nvml.events(mask=EVENT_MASK, ready=ready):
            now = self.clock()
            if ev.kind is EventKind.MIG_CONFIG:
                res.rebuild.set()
                continue
            if not policy.enabled:
                continue
            if ev.kind is EventKind.XID and ev.xid is not None:
                if health.on_xid(ev.gpu_uuid, ev.xid, policy, now):
                    self.log.warning("device_unhealthy", uuid=ev.gpu_uuid, xid=ev.xid, gpu=ev.gpu_index)
                    await self.push(ev.gpu_uuid)
                elif not policy.is_fatal(ev.xid):
                    self.log.info("xid_ignored", uuid=ev.gpu_uuid, xid=ev.xid)
            elif ev.kind is EventKind.DOUBLE_BIT_ECC:
                if health.on_double_bit_ecc(ev.gpu_uuid, policy, now):
                    self.log.warning("device_unhealthy", uuid=ev.gpu_uuid, reason="double-bit ECC")
                    await self.push(ev.gpu_uuid)
            elif ev.kind is EventKind.SINGLE_BIT_ECC:
                self.log.info("ecc_corrected", uuid=ev.gpu_uuid, count=ev.data)

    async def probe(self) -> None:
        """Lost GPUs become Unhealthy; quiet ones recover after the hold-down period; a GPU the last
        rebuild could not read is read again once it answers."""
        res = self.resources
        assert res.nvml is not None
        while True:
            await asyncio.sleep(self.probe_interval)
            if not self.policy.enabled and not res.stale:
                continue
            lost = set(await res.nvml.lost_gpus())
            if res.stale - lost:  # a GPU the last rebuild could not read answers again: read it
                self.log.info("gpus_answer_again", gpus=sorted(res.stale - lost))
                res.stale = frozenset()  # asked once; a rebuild that fails is retried
                res.rebuild.set()
            if not self.policy.enabled:
                continue
            now = self.clock()
            health = res.state.health
            for gpu in res.gpus:
                if gpu.index in lost:
                    if health.on_lost(gpu.uuid, now):
                        self.log.warning(
                            "device_unhealthy", uuid=gpu.uuid, gpu=gpu.index, reason="GPU is lost"
                        )
                        await self.push(gpu.uuid)
                elif health.on_probe(gpu.uuid, True, now):
                    self.log.info("device_recovered", uuid=gpu.uuid, gpu=gpu.index)
                    await self.push(gpu.uuid)
            res.base_metrics.mark_success("health-probe")

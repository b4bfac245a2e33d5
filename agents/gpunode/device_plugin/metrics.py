"""Device plugin metrics, on the agent's own registry (served at /metrics)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from gpunode.common.metrics import AgentMetrics

if TYPE_CHECKING:
    from gpunode._proto.deviceplugin.v1beta1.api_pb2 import Device


class DevicePluginMetrics:
    def __init__(self, base: AgentMetrics) -> None:
        self.base = base
        registry = base.registry
        self.devices = Gauge(
            "gpunode_device_plugin_devices",
            "Devices advertised to the kubelet, by resource and health.",
            ["resource", "health"],
            registry=registry,
        )
        self.allocations = Counter(
            "gpunode_device_plugin_allocations",
            "Container allocations answered, by resource.",
            ["resource"],
            registry=registry,
        )
        self.registrations = Counter(
            "gpunode_device_plugin_registrations",
            "Successful registrations with the kubelet, by resource.",
            ["resource"],
            registry=registry,
        )
        self.last_registration = Gauge(
            "gpunode_device_plugin_last_registration_timestamp_seconds",
            "When each resource last registered with the kubelet (Unix time).",
            ["resource"],
            registry=registry,
        )
        self.unhealthy_gpus = Gauge(
            "gpunode_device_plugin_unhealthy_gpus",
            "Physical GPUs currently marked Unhealthy.",
            registry=registry,
        )

    def observe_devices(self, resource: str, devices: Iterable[Device]) -> None:
        counts = {"Healthy": 0, "Unhealthy": 0}
        for d in devices:
            counts[d.health] = counts.get(d.health, 0) + 1
        for health, n in counts.items():
            self.devices.labels(resource=resource, health=health).set(n)

    def forget(self, resource: str) -> None:
        for health in ("Healthy", "Unhealthy"):
            self.devices.labels(resource=resource, health=health).set(0)

    def registered(self, resource: str, now: float) -> None:
        self.registrations.labels(resource=resource).inc()
        self.last_registration.labels(resource=resource).set(now)

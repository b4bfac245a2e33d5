"""A per-agent Prometheus registry holding the metrics every agent exposes.

Each agent owns one :class:`AgentMetrics` (never the global default registry), adds its own metrics
and collectors to ``metrics.registry``, and serves it from the HTTP endpoint's ``/metrics``.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing prometheus_client reads /proc (its default registry); do that on first use
    from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["AgentMetrics", "create_metrics"]


@dataclass(frozen=True)
class AgentMetrics:
    """The registry of one agent and the standard metrics in it."""

    agent: str
    registry: CollectorRegistry
    errors: Counter  # gpunode_errors_total{agent,reason}
    build_info: Gauge  # gpunode_build_info{agent,version,revision,python_version} 1
    last_success: Gauge  # gpunode_last_success_timestamp_seconds{agent,loop}
    clock: Callable[[], float] = field(default=time.time, repr=False)

    def count_error(self, reason: str, amount: float = 1.0) -> None:
        """Add to ``gpunode_errors_total{agent=<this agent>, reason=<reason>}``."""
        self.errors.labels(agent=self.agent, reason=reason).inc(amount)

    def error_count(self, reason: str) -> float:
        """The current value of the error counter for ``reason`` (0 when never counted)."""
        value = self.registry.get_sample_value(
            "gpunode_errors_total", {"agent": self.agent, "reason": reason}
        )
        return value or 0.0

    def mark_success(self, loop: str) -> None:
        """Record that the periodic loop ``loop`` just completed a pass (wall-clock timestamp)."""
        self.last_success.labels(agent=self.agent, loop=loop).set(self.clock())


def create_metrics(
    agent: str,
    version: str | None = None,
    *,
    revision: str = "unknown",
    process_metrics: bool = True,
    clock: Callable[[], float] = time.time,
) -> AgentMetrics:
    """A fresh registry for ``agent`` with the standard metrics registered.

    ``process_metrics`` adds client_python's ``process_*`` (read from /proc at scrape time, never
    here) and ``python_info`` collectors.
    """
    from prometheus_client import CollectorRegistry, Counter, Gauge
    from prometheus_client.platform_collector import PlatformCollector
    from prometheus_client.process_collector import ProcessCollector

    if version is None:
        from gpunode import __version__ as version

    registry = CollectorRegistry(auto_describe=True)
    errors = Counter(
        "gpunode_errors",
        "Errors caught by a supervisor or handler, by reason.",
        labelnames=("agent", "reason"),
        registry=registry,
    )
    build_info = Gauge(
        "gpunode_build_info",
        "Always 1; the labels describe the running build.",
        labelnames=("agent", "version", "revision", "python_version"),
        registry=registry,
    )
    build_info.labels(
        agent=agent, version=version, revision=revision, python_version=platform.python_version()
    ).set(1)
    last_success = Gauge(
        "gpunode_last_success_timestamp_seconds",
        "Unix time at which a periodic loop last completed successfully.",
        labelnames=("agent", "loop"),
        registry=registry,
    )
    if process_metrics:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return AgentMetrics(
        agent=agent,
        registry=registry,
        errors=errors,
        build_info=build_info,
        last_success=last_success,
        clock=clock,
    )

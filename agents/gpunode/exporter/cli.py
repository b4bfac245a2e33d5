"""gpunode-exporter: dcgm-exporter's GPU metrics from NVML, with pod attribution, on :9400."""

from __future__ import annotations

import socket
from pathlib import Path

from gpunode.agent.main import USAGE_ERRORS, AgentContext, AgentSpec, Started
from gpunode.exporter.counters import CountersError, load_counters
from gpunode.exporter.service import Exporter, ExporterOptions
from gpunode.exporter.settings import ExporterSettings, address

__all__ = ["SPEC", "main"]


def start(ctx: AgentContext[ExporterSettings]) -> Started:
    s = ctx.settings
    host, port = address(s.address)
    counters = load_counters(Path(s.collectors) if s.collectors else None)
    if s.collect_interval <= 0:
        raise ValueError("--collect-interval must be positive")
    hostname = None if s.no_hostname else (s.common.node_name or socket.gethostname())
    opts = ExporterOptions(
        host=host,
        port=port,
        interval=s.collect_interval / 1000,
        counters=counters,
        hostname=hostname,
        kubernetes=s.kubernetes,
        pod_resources_socket=Path(s.pod_resources_socket),
        virtual_gpus=s.kubernetes_virtual_gpus,
        resource_names=tuple(n.strip() for n in s.nvidia_resource_names.split(",") if n.strip()),
        old_namespace=s.use_old_namespace,
    )
    return Started(Exporter(opts, ctx.open_nvml).run())


SPEC = AgentSpec(
    name="exporter",
    console_script="gpunode-exporter",
    settings_type=ExporterSettings,
    start=start,
    description=__doc__,
    http_port=9400,
    usage_errors=(CountersError, *USAGE_ERRORS),
)
main = SPEC.main

"""gpunode-exporter: dcgm-exporter's GPU metrics from NVML, with pod attribution, on :9400."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpunode.common.cli import FlagSet, add_common_flags, log_effective_config
from gpunode.common.logging import configure_logging
from gpunode.common.runtime import run
from gpunode.exporter.counters import CountersError, load_counters
from gpunode.exporter.service import Exporter, ExporterOptions
from gpunode.nvml import check_simulation


def address(text: str) -> tuple[str, int]:
    """ ":9400", "127.0.0.1:9400", "[::1]:9400" -> (host, port); an empty host listens everywhere."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not [host]:port")
    return host.strip("[]") or "0.0.0.0", int(port)


def flag_set() -> FlagSet:
    f = FlagSet(prog="gpunode-exporter", description=__doc__)
    add_common_flags(f, config_file=False)
    f.add(
        "--address", short="-a", env="DCGM_EXPORTER_LISTEN", default=":9400", help="where /metrics is served"
    )
    f.add(
        "--collect-interval",
        short="-c",
        env="DCGM_EXPORTER_INTERVAL",
        type=int,
        default=30000,
        metavar="MS",
        help="sampling interval in milliseconds",
    )
    f.add(
        "--collectors",
        short="-f",
        env="DCGM_EXPORTER_COLLECTORS",
        default="",
        metavar="CSV",
        help="dcgm-exporter counters file (default: dcgm-exporter's default set)",
    )
    f.add(
        "--kubernetes",
        short="-k",
        env="DCGM_EXPORTER_KUBERNETES",
        type=bool,
        default=False,
        help="add pod, namespace and container labels from the kubelet's PodResources API",
    )
    f.add(
        "--pod-resources-socket",
        env="DCGM_POD_RESOURCES_KUBELET_SOCKET",
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        help="the kubelet's PodResources socket",
    )
    f.add(
        "--kubernetes-virtual-gpus",
        env="KUBERNETES_VIRTUAL_GPUS",
        type=bool,
        default=False,
        help="one series per pod sharing a GPU (time-slicing), with a vgpu label",
    )
    f.add(
        "--nvidia-resource-names",
        env="NVIDIA_RESOURCE_NAMES",
        default="",
        help="extra resource names to attribute (comma-separated, e.g. nvidia.com/gpu.shared)",
    )
    f.add(
        "--no-hostname",
        env="DCGM_EXPORTER_NO_HOSTNAME",
        type=bool,
        default=False,
        help="leave out the Hostname label",
    )
    return f


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    flags = flag_set()
    parsed = flags.parse(argv, env)
    values = parsed.values
    configure_logging(values["log_format"], values["log_level"], agent="exporter", node=values["node_name"])
    try:
        check_simulation(values.get("simulate"), values.get("sim_state"))
        host, port = address(values["address"])
        counters = load_counters(Path(values["collectors"]) if values["collectors"] else None)
        if values["collect_interval"] <= 0:
            raise ValueError("--collect-interval must be positive")
    except (CountersError, ValueError, LookupError) as exc:
        print(f"gpunode-exporter: error: {exc}", file=sys.stderr)
        return 2
    log_effective_config(values, parsed.sources, flags=flags.flags.values())
    hostname = None if values["no_hostname"] else (values["node_name"] or socket.gethostname())
    opts = ExporterOptions(
        host=host,
        port=port,
        interval=values["collect_interval"] / 1000,
        counters=counters,
        hostname=hostname,
        kubernetes=values["kubernetes"],
        pod_resources_socket=Path(values["pod_resources_socket"]),
        virtual_gpus=values["kubernetes_virtual_gpus"],
        resource_names=tuple(n.strip() for n in values["nvidia_resource_names"].split(",") if n.strip()),
    )

    async def open_nvml() -> Any:
        from gpunode.nvml import open_nvml as open_

        return await open_(values["driver_root"], values.get("simulate"), values.get("sim_state"))

    return run(Exporter(opts, open_nvml).run())

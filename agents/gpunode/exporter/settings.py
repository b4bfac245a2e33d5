"""gpunode-exporter's settings: dcgm-exporter's flags and env vars, declared once."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.common.settings import CommonSettings, group, setting

__all__ = ["ExporterSettings", "address"]


def address(text: str) -> tuple[str, int]:
    """ ":9400", "127.0.0.1:9400", "[::1]:9400" -> (host, port); an empty host listens everywhere."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not [host]:port")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True)
class ExporterSettings:
    common: CommonSettings = group(CommonSettings)
    address: str = setting(
        "--address", short="-a", env="DCGM_EXPORTER_LISTEN", default=":9400", help="where /metrics is served"
    )
    collect_interval: int = setting(
        "--collect-interval",
        short="-c",
        env="DCGM_EXPORTER_INTERVAL",
        type=int,
        default=30000,
        metavar="MS",
        help="sampling interval in milliseconds",
    )
    collectors: str = setting(
        "--collectors",
        short="-f",
        env="DCGM_EXPORTER_COLLECTORS",
        default="",
        metavar="CSV",
        help="dcgm-exporter counters file (default: dcgm-exporter's default set)",
    )
    kubernetes: bool = setting(
        "--kubernetes",
        short="-k",
        env="DCGM_EXPORTER_KUBERNETES",
        type=bool,
        default=False,
        help="add pod, namespace and container labels from the kubelet's PodResources API",
    )
    pod_resources_socket: str = setting(
        "--pod-resources-socket",
        env="DCGM_POD_RESOURCES_KUBELET_SOCKET",
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        help="the kubelet's PodResources socket",
    )
    kubernetes_virtual_gpus: bool = setting(
        "--kubernetes-virtual-gpus",
        env="KUBERNETES_VIRTUAL_GPUS",
        type=bool,
        default=False,
        help="one series per pod sharing a GPU (time-slicing), with a vgpu label",
    )
    nvidia_resource_names: str = setting(
        "--nvidia-resource-names",
        env="NVIDIA_RESOURCE_NAMES",
        default="",
        help="extra resource names to attribute (comma-separated, e.g. nvidia.com/gpu.shared)",
    )
    use_old_namespace: bool = setting(
        "--use-old-namespace",
        env="DCGM_EXPORTER_USE_OLD_NAMESPACE",
        type=bool,
        default=False,
        help="dcgm-exporter 1.x label: uuid instead of UUID (metric names come from the counters file)",
    )
    no_hostname: bool = setting(
        "--no-hostname",
        env="DCGM_EXPORTER_NO_HOSTNAME",
        type=bool,
        default=False,
        help="leave out the Hostname label",
    )

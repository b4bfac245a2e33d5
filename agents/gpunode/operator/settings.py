"""gpunode-operator's settings: the Kubernetes API, leader election and the health endpoint."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.common.settings import CommonSettings, HttpSettings, group, setting

__all__ = ["DEFAULT_NAMESPACE", "OperatorSettings"]

DEFAULT_NAMESPACE = "gpunode"
HTTP_PORT = 9455


@dataclass(frozen=True)
class OperatorSettings:
    common: CommonSettings = group(CommonSettings)
    kubeconfig: str | None = setting(
        "--kubeconfig",
        env="KUBECONFIG",
        metavar="FILE",
        help="kubeconfig file; default: the pod's service account (in-cluster)",
    )
    namespace: str | None = setting(
        "--namespace",
        env="NAMESPACE",
        metavar="NS",
        default_help="the pod's own namespace, else gpunode",
        help="namespace of the node agents, and of the leader-election Lease",
    )
    kube_api_timeout: float = setting(
        "--kube-api-timeout",
        env="KUBE_API_TIMEOUT",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="timeout of each Kubernetes API call",
    )
    leader_elect: bool = setting(
        "--leader-elect",
        env="GPUNODE_LEADER_ELECT",
        type=bool,
        default=False,
        help="take a coordination.k8s.io Lease before writing, so two replicas never both write",
    )
    lease_name: str = setting(
        "--lease-name",
        env="GPUNODE_LEASE_NAME",
        default="gpunode-operator",
        metavar="NAME",
        help="name of the leader-election Lease",
    )
    lease_duration: float = setting(
        "--lease-duration",
        env="GPUNODE_LEASE_DURATION",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how long a Lease is valid without renewal (a new leader waits this long after a crash)",
    )
    identity: str | None = setting(
        "--identity",
        env="GPUNODE_IDENTITY",
        metavar="NAME",
        default_help="the host name (in a pod: the pod's name)",
        help="this replica's name in the Lease",
    )
    http: HttpSettings = group(HttpSettings, defaults={"http_port": HTTP_PORT})

"""Kubernetes types for cluster-wide callers (the operator): slim node summaries and their watch events,
the kinds the operator applies, watch events of any object, Leases.

Kept apart from :mod:`gpunode.kube.api` so that a node agent, which imports that module at start, does
not build these classes; like it, this module imports nothing of the client library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpunode.kube.api import NODE_FEATURE_GROUP

OPERATOR_FIELD_MANAGER = "gpunode-operator"  # server-side apply's field manager for the operator's objects


@dataclass(frozen=True)
class NodeSummary:
    """Any node of the cluster, slim: what a cluster-wide controller caches. Of a Node object (10-50 KB
    on real clusters) only these are decoded: no images, addresses, capacity or conditions beyond Ready."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    ready: bool  # condition Ready is "True"
    resource_version: str


@dataclass(frozen=True)
class NodeEvent:
    """What :meth:`gpunode.kube.client.Kube.watch_nodes` yields: ``ADDED`` / ``MODIFIED`` / ``DELETED``
    with ``node``, or ``SYNC`` with ``nodes``, the complete list (after the first list and after every
    re-list): whatever was cached before a ``SYNC`` and is not in it is gone."""

    type: Literal["SYNC", "ADDED", "MODIFIED", "DELETED"]
    node: NodeSummary | None = None
    nodes: tuple[NodeSummary, ...] = ()


# -- any kind (cluster-wide callers: the operator) --------------------------------------------------------
@dataclass(frozen=True)
class ResourceKind:
    """Where a kind lives in the API: ``group`` ``""`` for the core group (``/api/v1``)."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


CLUSTER_POLICY = ResourceKind("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies", False)
DAEMON_SET = ResourceKind("apps", "v1", "DaemonSet", "daemonsets", True)
CONFIG_MAP = ResourceKind("", "v1", "ConfigMap", "configmaps", True)
CONTROLLER_REVISION = ResourceKind("apps", "v1", "ControllerRevision", "controllerrevisions", True)
POD = ResourceKind("", "v1", "Pod", "pods", True)
LEASE = ResourceKind("coordination.k8s.io", "v1", "Lease", "leases", True)
EVENT = ResourceKind("", "v1", "Event", "events", True)

_KINDS: tuple[ResourceKind, ...] = (
    CLUSTER_POLICY,
    DAEMON_SET,
    CONTROLLER_REVISION,
    POD,
    LEASE,
    EVENT,
    ResourceKind("", "v1", "Namespace", "namespaces", False),
    ResourceKind("", "v1", "ServiceAccount", "serviceaccounts", True),
    ResourceKind("", "v1", "ConfigMap", "configmaps", True),
    ResourceKind("", "v1", "Service", "services", True),
    ResourceKind("", "v1", "Node", "nodes", False),
    ResourceKind("apps", "v1", "Deployment", "deployments", True),
    ResourceKind("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    ResourceKind("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    ResourceKind("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    ResourceKind("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    ResourceKind("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", False),
    ResourceKind(
        "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False
    ),
    ResourceKind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        False,
    ),
    ResourceKind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        False,
    ),
    ResourceKind("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors", True),
    ResourceKind("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors", True),
    ResourceKind("monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules", True),
    ResourceKind(NODE_FEATURE_GROUP, "v1alpha1", "NodeFeature", "nodefeatures", True),
    ResourceKind(NODE_FEATURE_GROUP, "v1alpha1", "NodeFeatureRule", "nodefeaturerules", False),
)
_BY_KIND = {(k.api_version, k.kind): k for k in _KINDS}


def resource_kind(api_version: str, kind: str) -> ResourceKind:
    """The known kind ``kind`` of ``api_version``; ``KeyError`` naming it otherwise (the operator applies
    only kinds it renders)."""
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        raise KeyError(f"unknown kind {kind} ({api_version}): not one the Kubernetes layer knows") from None


@dataclass(frozen=True)
class ObjectEvent:
    """What :meth:`gpunode.kube.client.Kube.watch_objects` yields, like :class:`NodeEvent`: ``SYNC`` with
    ``objects`` (the complete list), then ``ADDED`` / ``MODIFIED`` / ``DELETED`` with ``obj`` (JSON)."""

    type: Literal["SYNC", "ADDED", "MODIFIED", "DELETED"]
    obj: Mapping[str, Any] | None = None
    objects: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class LeaseRecord:
    """A ``coordination.k8s.io/v1`` Lease as leader election sees it (times as RFC 3339 text with
    microseconds, as the API stores them; ``None`` when unset)."""

    name: str
    namespace: str
    holder: str = ""
    duration_s: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str = ""

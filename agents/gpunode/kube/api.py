"""What callers of the Kubernetes layer see: small frozen dataclasses and the error family.

:class:`NodeInfo`, :class:`PodInfo`, and for cluster-wide callers :class:`NodeSummary` (any node, slim)
and :class:`NodeEvent`, are what :class:`gpunode.kube.client.Kube` hands back, so no module outside the
client sees a lightkube type. A call that fails becomes a :class:`KubeError` carrying
the HTTP status; 403 becomes :class:`KubeForbidden`, whose message names the verb and resource to grant;
404 :class:`KubeNotFound`; 409 :class:`KubeConflict`; an API server that cannot be reached, times out or
keeps answering 429 / 5xx :class:`KubeUnavailable`.

This module imports nothing of the client library: type hints, ``except`` clauses and pure code (operand
pausing, drain rules) use it at no start-up cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpunode.common.errors import UsageError

__all__ = [
    "CLUSTER_POLICY",
    "CONTROLLER_REVISION",
    "DAEMON_SET",
    "LEASE",
    "NODE_FEATURE_GROUP",
    "OPERATOR_FIELD_MANAGER",
    "POD",
    "KubeConflict",
    "KubeError",
    "KubeForbidden",
    "KubeNotFound",
    "KubeUnavailable",
    "LeaseRecord",
    "NodeEvent",
    "NodeInfo",
    "NodeSummary",
    "ObjectEvent",
    "OwnerRef",
    "PodInfo",
    "ResourceKind",
    "require_node_name",
    "resource_kind",
]

NODE_FEATURE_GROUP = "nfd.k8s-sigs.io"
OPERATOR_FIELD_MANAGER = "gpunode-operator"  # server-side apply's field manager for the operator's objects


# -- errors ----------------------------------------------------------------------------------------------
class KubeError(Exception):
    """An API call that failed; ``status`` is the HTTP status (None when no answer came)."""

    def __init__(
        self, verb: str, resource: str, message: str, *, status: int | None = None, reason: str = ""
    ) -> None:
        self.verb = verb
        self.resource = resource
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(verb, resource, message, status)

    def __str__(self) -> str:
        code = f"HTTP {self.status}" if self.status is not None else "no answer"
        return (
            f"{self.verb} {self.resource}: {code}{' ' + self.reason if self.reason else ''}: {self.message}"
        )


class KubeNotFound(KubeError):
    """404: the object is not there."""


class KubeConflict(KubeError):
    """409: it already exists, or it changed since it was read."""


class KubeForbidden(KubeError):
    """403: the service account lacks a permission; the message says which one to grant."""

    def __init__(
        self, verb: str, resource: str, message: str, *, group: str = "", namespace: str = ""
    ) -> None:
        super().__init__(verb, resource, message, status=403, reason="Forbidden")
        self.group = group
        self.namespace = namespace

    def __str__(self) -> str:
        where = f' in namespace "{self.namespace}"' if self.namespace else ""
        return (
            f"forbidden to {self.verb} {self.resource}{where}: grant the agent's service account the verb "
            f'"{self.verb}" on resource "{self.resource}" (apiGroups: ["{self.group}"]) '
            f"in its ClusterRole/Role; the API server said: {self.message}"
        )


class KubeUnavailable(KubeError):
    """The API server could not be reached, timed out or kept answering 429 / 5xx."""


# -- what callers see ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    resource_version: str


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


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node_name: str
    labels: Mapping[str, str]
    phase: str
    deleting: bool  # deletionTimestamp is set: on its way out
    node_selector: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[OwnerRef, ...] = ()
    requests: frozenset[str] = frozenset()  # extended resources any container requests or limits
    empty_dirs: tuple[str, ...] = ()  # names of its emptyDir volumes (data lost when it is evicted)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


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
CONTROLLER_REVISION = ResourceKind("apps", "v1", "ControllerRevision", "controllerrevisions", True)
POD = ResourceKind("", "v1", "Pod", "pods", True)
LEASE = ResourceKind("coordination.k8s.io", "v1", "Lease", "leases", True)

_KINDS: tuple[ResourceKind, ...] = (
    CLUSTER_POLICY,
    DAEMON_SET,
    CONTROLLER_REVISION,
    POD,
    LEASE,
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


# -- configuration ---------------------------------------------------------------------------------------
def require_node_name(name: str | None) -> str:
    """The node name agents need for the API; a :class:`UsageError` (exit 2) explaining NODE_NAME."""
    if not name:
        raise UsageError(
            "no node name: set --node-name or the NODE_NAME environment variable (in a DaemonSet, "
            "from the downward API: env NODE_NAME valueFrom fieldRef fieldPath spec.nodeName)"
        )
    return name

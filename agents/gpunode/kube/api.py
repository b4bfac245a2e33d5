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

from gpunode.common.errors import UsageError

__all__ = [
    "NODE_FEATURE_GROUP",
    "KubeConflict",
    "KubeError",
    "KubeForbidden",
    "KubeNotFound",
    "KubeUnavailable",
    "NodeInfo",
    "OwnerRef",
    "PodInfo",
    "require_node_name",
]

NODE_FEATURE_GROUP = "nfd.k8s-sigs.io"


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
    ready: bool = False  # condition Ready is "True"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def require_node_name(name: str | None) -> str:
    """The node name agents need for the API; a :class:`UsageError` (exit 2) explaining NODE_NAME."""
    if not name:
        raise UsageError(
            "no node name: set --node-name or the NODE_NAME environment variable (in a DaemonSet, "
            "from the downward API: env NODE_NAME valueFrom fieldRef fieldPath spec.nodeName)"
        )
    return name

"""The test API server itself: store, verbs, controllers and the HTTP front (see the package docstring)."""

from __future__ import annotations

import base64
import bisect
import contextlib
import copy
import json
import math
import re
import secrets
import socket
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from gpunode.kube.selectors import LabelSelector
from gpunode.sim.apiserver.fieldmanager import (
    ApplyConflict,
    conflict_causes,
    record_update,
    same_ignoring_time,
)
from gpunode.sim.apiserver.fieldmanager import apply as fieldmanager_apply
from gpunode.sim.apiserver.patches import (
    FieldRequirement,
    PatchError,
    json_patch,
    merge_patch,
    parse_field_selector,
    strategic_merge_patch,
)
from gpunode.sim.apiserver.workloads import pod_ready, should_run, template_hash

JsonObj = dict[str, Any]

GIT_VERSION = "v1.31.0-gpunode-fake"
DEFAULT_USER = "system:serviceaccount:gpu-operator:gpunode"
NFD_GROUP = "nfd.k8s-sigs.io"
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses for generateName
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
SIM_MANAGER = "gpunode-sim"  # the field manager of writes through the Python API (an outside actor)
CONTROLLER_MANAGER = "kube-controller-manager"  # the DaemonSet controller's writes
GC_MANAGER = "generic-garbage-collector"


# -- resources -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceType:
    plural: str
    singular: str
    kind: str
    group: str
    version: str
    namespaced: bool
    field_labels: frozenset[str]
    short_names: tuple[str, ...] = ()
    custom: bool = False  # a custom resource: no strategic merge patch (415), as the real server
    status: bool = False  # a /status subresource; writes to the main resource keep the old status
    generation: bool = False  # metadata.generation: 1 on create, +1 on every change outside metadata/status
    categories: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Where its objects are stored: the same for every version of a group's resource."""
        return self.qualified

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How the apiserver names the resource in messages: `nodes`, `nodefeatures.nfd.k8s-sigs.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


NODES = ResourceType(
    "nodes", "node", "Node", "", "v1", False, frozenset({"metadata.name", "spec.unschedulable"}), ("no",)
)
PODS = ResourceType(
    "pods",
    "pod",
    "Pod",
    "",
    "v1",
    True,
    frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    ("po",),
)
NODE_FEATURES = ResourceType(
    "nodefeatures",
    "nodefeature",
    "NodeFeature",
    NFD_GROUP,
    "v1alpha1",
    True,
    frozenset({"metadata.name", "metadata.namespace"}),
    custom=True,
)
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


def _builtin(
    plural: str,
    kind: str,
    group: str,
    version: str,
    namespaced: bool,
    *,
    short: tuple[str, ...] = (),
    status: bool = False,
    generation: bool = False,
) -> ResourceType:
    return ResourceType(
        plural,
        kind.lower(),
        kind,
        group,
        version,
        namespaced,
        _META_FIELDS,
        short,
        status=status,
        generation=generation or status,
    )


RBAC_GROUP = "rbac.authorization.k8s.io"
NAMESPACES = _builtin("namespaces", "Namespace", "", "v1", False, short=("ns",))
SERVICE_ACCOUNTS = _builtin("serviceaccounts", "ServiceAccount", "", "v1", True, short=("sa",))
CONFIG_MAPS = _builtin("configmaps", "ConfigMap", "", "v1", True, short=("cm",))
SERVICES = _builtin("services", "Service", "", "v1", True, short=("svc",))
DAEMONSETS = _builtin("daemonsets", "DaemonSet", "apps", "v1", True, short=("ds",), status=True)
DEPLOYMENTS = _builtin("deployments", "Deployment", "apps", "v1", True, short=("deploy",), status=True)
CONTROLLER_REVISIONS = _builtin("controllerrevisions", "ControllerRevision", "apps", "v1", True)
CLUSTER_ROLES = _builtin("clusterroles", "ClusterRole", RBAC_GROUP, "v1", False)
CLUSTER_ROLE_BINDINGS = _builtin("clusterrolebindings", "ClusterRoleBinding", RBAC_GROUP, "v1", False)
ROLES = _builtin("roles", "Role", RBAC_GROUP, "v1", True)
ROLE_BINDINGS = _builtin("rolebindings", "RoleBinding", RBAC_GROUP, "v1", True)
RUNTIME_CLASSES = _builtin("runtimeclasses", "RuntimeClass", "node.k8s.io", "v1", False)
LEASES = _builtin("leases", "Lease", "coordination.k8s.io", "v1", True)
EVENTS = _builtin("events", "Event", "", "v1", True, short=("ev",))
POD_DISRUPTION_BUDGETS = _builtin(
    "poddisruptionbudgets", "PodDisruptionBudget", "policy", "v1", True, short=("pdb",), status=True
)
ADMISSION_GROUP = "admissionregistration.k8s.io"
ADMISSION_POLICIES = _builtin(
    "validatingadmissionpolicies", "ValidatingAdmissionPolicy", ADMISSION_GROUP, "v1", False, status=True
)
ADMISSION_POLICY_BINDINGS = _builtin(
    "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", ADMISSION_GROUP, "v1", False
)
CRDS = _builtin(
    "customresourcedefinitions",
    "CustomResourceDefinition",
    "apiextensions.k8s.io",
    "v1",
    False,
    short=("crd", "crds"),
    status=True,
)
BUILTIN_TYPES: tuple[ResourceType, ...] = (
    NODES,
    PODS,
    NAMESPACES,
    SERVICE_ACCOUNTS,
    CONFIG_MAPS,
    SERVICES,
    NODE_FEATURES,
    DAEMONSETS,
    DEPLOYMENTS,
    CONTROLLER_REVISIONS,
    CLUSTER_ROLES,
    CLUSTER_ROLE_BINDINGS,
    ROLES,
    ROLE_BINDINGS,
    RUNTIME_CLASSES,
    LEASES,
    EVENTS,
    POD_DISRUPTION_BUDGETS,
    ADMISSION_POLICIES,
    ADMISSION_POLICY_BINDINGS,
    CRDS,
)
RESOURCES: dict[str, ResourceType] = {r.plural: r for r in BUILTIN_TYPES}


def _find_type(types: Iterable[ResourceType], kind: str) -> ResourceType:
    wanted = kind.lower()
    for rt in types:
        if wanted in (rt.plural, rt.singular, rt.kind.lower(), rt.qualified.lower()):
            return rt
    raise ValueError(f"unknown resource {kind!r}; known: {', '.join(sorted({t.qualified for t in types}))}")


def resource_type(kind: str) -> ResourceType:
    """`nodes`, `node`, `Node`, `pods`, `NodeFeature`, `daemonsets`, ... -> its built-in ResourceType."""
    return _find_type(BUILTIN_TYPES, kind)


# -- errors ----------------------------------------------------------------------------------------------

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_DEFAULT_MESSAGES = {
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected by the fake apiserver",
    503: "the server is currently unable to handle the request",
    504: "the server was unable to return a response in the time allotted",
}


def status_body(code: int, reason: str, message: str, details: JsonObj | None = None) -> JsonObj:
    """A failure `Status` as the apiserver writes it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


class ApiError(Exception):
    """An API failure: answered over HTTP as a Status, raised by the Python API as is."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JsonObj | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}
        self.headers = dict(headers or {})

    def status(self) -> JsonObj:
        return status_body(self.code, self.reason, self.message, self.details)


def _details(rt: ResourceType, name: str | None) -> JsonObj:
    details: JsonObj = {}
    if name:
        details["name"] = name
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    return details


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def _already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def _conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(rt, name))


_KEPT_ON_WRITE = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "resourceVersion",
)
_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _invalid(rt: ResourceType, name: str, message: str) -> ApiError:
    details: JsonObj = {"name": name, "kind": rt.kind}
    if rt.group:
        details["group"] = rt.group
    return ApiError(422, "Invalid", f'{rt.kind} "{name}" is invalid: {message}', details)


def _route_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def _method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def _unsupported_media(content_type: str, accepted: str) -> ApiError:
    message = f"the body of the request was in an unknown format - accepted media types include: {accepted}"
    if content_type:
        message = f"{message} (got {content_type})"
    return ApiError(415, "UnsupportedMediaType", message)


# -- records and internal state -----------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    status: int


@dataclass(frozen=True)
class WatchEvent:
    """One recorded write. `obj` and `old` are never mutated once recorded."""

    rv: int
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    resource: str
    obj: JsonObj
    old: JsonObj | None


@dataclass
class _FailRule:
    remaining: int
    status: int
    method: str | None
    path_contains: str | None
    reason: str | None
    message: str | None

    def matches(self, method: str, target: str) -> bool:
        if self.method is not None and self.method.upper() != method:
            return False
        return self.path_contains is None or self.path_contains in target


@dataclass
class _StallRule:
    remaining: int
    seconds: float
    path_contains: str | None


# What one node contributes to a DaemonSet's status: the indexes of _DaemonState.totals.
_DESIRED, _SCHEDULED, _READY, _UPDATED, _MISSCHEDULED, _OUTDATED = range(6)


@dataclass
class _DaemonState:
    """What the controller remembers of one DaemonSet beyond the object.

    `views` holds, per node, what it contributes to the status and the rollout (desired, scheduled,
    ready, updated, misscheduled, outdated pods) for the template whose hash is `view_hash`; `totals`
    their sums; `outdated` the nodes with outdated pods. A node's view is recomputed when the node or one
    of the DaemonSet's pods on it changes, every view when the template changes, so a write costs
    O(DaemonSets), not O(nodes x pods)."""

    recreate: bool = True  # False: a node gets a pod only the first time it matches
    plain: bool = False  # add_daemonset's: pods carry only the template's labels
    placed: set[str] = field(default_factory=set)
    hash_generation: int | None = None  # the generation `template_hash` was computed for
    template_hash: str = ""
    view_hash: str | None = None
    views: dict[str, tuple[int, ...]] = field(default_factory=dict)
    totals: list[int] = field(default_factory=lambda: [0] * 6)
    outdated: set[str] = field(default_factory=set)

    def set_view(self, node: str, view: tuple[int, ...] | None) -> None:
        old = self.views.pop(node, None)
        if old is not None:
            for i, n in enumerate(old):
                self.totals[i] -= n
        if view is not None and any(view):
            self.views[node] = view
            for i, n in enumerate(view):
                self.totals[i] += n
        if view is not None and view[_OUTDATED]:
            self.outdated.add(node)
        else:
            self.outdated.discard(node)


@dataclass
class _Watch:
    rt: ResourceType
    namespace: str | None
    labels: LabelSelector
    fields: tuple[FieldRequirement, ...]
    conn: socket.socket | None
    pending: deque[WatchEvent] = field(default_factory=deque)
    dropped: bool = False

    def visible(self, obj: JsonObj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and all(f.matches(obj) for f in self.fields)

    def translate(self, event: WatchEvent) -> JsonObj | None:
        """The wire event this watch sends for a recorded write, or None."""
        now = self.visible(event.obj)
        if event.type != "MODIFIED":
            return {"type": event.type, "object": _as_version(self.rt, event.obj)} if now else None
        before = event.old is not None and self.visible(event.old)
        if now:
            return {"type": "MODIFIED" if before else "ADDED", "object": _as_version(self.rt, event.obj)}
        if before and event.old is not None:
            gone = copy.deepcopy(_as_version(self.rt, event.old))
            gone["metadata"]["resourceVersion"] = str(event.rv)
            return {"type": "DELETED", "object": gone}
        return None


@dataclass(frozen=True)
class _Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


@dataclass
class _Reply:
    status: int
    body: JsonObj | str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _WatchReply:
    watch: _Watch | None
    timeout: float
    bookmarks: bool
    error: JsonObj | None = None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _suffix() -> str:
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))


def _key(obj: JsonObj) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def _rv_of(obj: JsonObj) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


def _object(body: Any) -> JsonObj:
    if not isinstance(body, dict):
        raise _bad_request("the body of the request must be a JSON object")
    if not isinstance(body.get("metadata", {}), dict):
        raise _bad_request("metadata must be a JSON object")
    return body


def _parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise _bad_request("the request has no body")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise _bad_request(f"the request body is not valid JSON: {exc}") from None


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _as_version(rt: ResourceType, obj: JsonObj) -> JsonObj:
    """An object as served through one version of its resource (custom resources: no conversion beyond
    apiVersion, as with the real server's `None` conversion strategy)."""
    if obj.get("apiVersion") == rt.api_version:
        return obj
    return {**obj, "apiVersion": rt.api_version}


def _spec_part(obj: Mapping[str, Any]) -> JsonObj:
    """What bumps metadata.generation when it changes: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}


def _controller_ref(owner: JsonObj) -> JsonObj:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _max_unavailable(value: Any, desired: int) -> int:
    """A rolling update's maxUnavailable (a count or a percentage of desired, rounded down), at least 1."""
    if isinstance(value, str) and value.endswith("%"):
        try:
            return max(1, desired * int(value[:-1]) // 100)
        except ValueError:
            return 1
    return max(1, int(value)) if isinstance(value, int) else 1


def _budget(value: Any, total: int) -> int:
    """A PodDisruptionBudget's minAvailable / maxUnavailable as a count (a percentage of ``total``
    rounded up, as the disruption controller does)."""
    if isinstance(value, str) and value.endswith("%"):
        try:
            return math.ceil(total * int(value[:-1]) / 100)
        except ValueError:
            return 0
    return int(value) if isinstance(value, int) else 0


_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter."
)


def _list_options(query: Mapping[str, str]) -> tuple[int, str]:
    """`limit` (0: none) and `continue` of a list request; 400 for what the apiserver refuses."""
    raw = query.get("limit", "")
    try:
        limit = int(raw) if raw else 0
    except ValueError:
        raise _bad_request(f'limit: Invalid value: "{raw}": not an integer') from None
    token = query.get("continue", "")
    if token and query.get("resourceVersion", "") not in ("", "0"):
        raise _bad_request("specifying resource version is not allowed when using continue")
    return max(0, limit), token


def _encode_continue(rv: int, last: tuple[str, str]) -> str:
    """The apiserver's token: unpadded URL-safe base64 of {"v", "rv", "start"}, start being the key
    after the last object read."""
    key = f"{last[0]}/{last[1]}" if last[0] else last[1]
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": key + "\x00"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str, rt: ResourceType) -> tuple[int, tuple[str, str]]:
    """(resourceVersion, the last key read) of a continue token; 400 when it is not one."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, TypeError):
        raise _bad_request("continue key is not valid: illegal base64 data or JSON") from None
    if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
        raise _bad_request("continue key is not valid: server does not recognize this encoded key")
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or rv <= 0:
        raise _bad_request("continue key is not valid: incorrect encoded start resourceVersion")
    if not isinstance(start, str) or not start.endswith("\x00"):
        raise _bad_request("continue key is not valid: incorrect encoded start key")
    namespace, _, name = start[:-1].rpartition("/")
    if rt.namespaced != bool(namespace):
        raise _bad_request(
            "continue key is not valid: the start key does not name an object of this resource"
        )
    return rv, (namespace, name)


def _field_manager(query: Mapping[str, str], user_agent: str | None) -> str:
    """?fieldManager=, else the User-Agent up to its first `/` (what the real server infers)."""
    return query.get("fieldManager") or (user_agent or "").split("/")[0].strip() or "unknown"


# -- the server ------------------------------------------------------------------------------------------


class FakeApiServer:
    """See the module docstring. Every public method is thread-safe and returns deep copies."""

    def __init__(
        self, *, token: str | None = None, history: int = 1000, port: int = 0, poll_interval: float = 0.01
    ) -> None:
        self.token = token
        self.requested_port = port  # 0: any free port
        self.poll_interval = poll_interval  # how often the accept loop looks for stop(); bounds its latency
        self.history = history
        self.pod_deletion_delay = 0.0  # seconds a deleted or evicted pod stays terminating
        # The phase daemon pods start in: "Pending" leaves them unready until a test (or the kubelet
        # emulator) patches their status, to rehearse a rollout that waits for readiness.
        self.daemon_pod_phase = "Running"
        # Called (under the server's lock) with each new daemon pod, before it is stored: the status it
        # starts with instead (a crash-looping driver, a validator not Ready yet), or None for the default.
        self.daemon_pod_status: Callable[[JsonObj], JsonObj | None] | None = None
        # Called (under the server's lock, in order) with every recorded write: checkers that must see
        # every state the cluster passes through (the upgrade limits), not only what a watch delivers.
        self.observers: list[Callable[[WatchEvent], None]] = []
        self._pdb_expected: dict[tuple[str, str], int] = {}  # PodDisruptionBudget -> pods it expects
        self.bookmark_interval: float | None = None  # seconds between BOOKMARKs where a watch allows them
        self.max_watch_timeout = 1800.0  # watches without timeoutSeconds end after this long
        self.forbidden_user = DEFAULT_USER  # the user named in 403 messages
        # The real apiserver answers 415 to strategic merge patches of custom resources; set True to accept.
        self.strategic_merge_for_crds = False
        self.requests: list[RequestRecord] = []
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._store: dict[str, dict[tuple[str, str], JsonObj]] = {rt.key: {} for rt in BUILTIN_TYPES}
        self._types: dict[tuple[str, str, str], ResourceType] = {
            (rt.group, rt.version, rt.plural): rt for rt in BUILTIN_TYPES
        }
        self._rv = 1
        self._events: deque[WatchEvent] = deque()
        self._horizon = 1  # every event with rv > horizon is still in _events
        self._changes = 0
        self._watches: list[_Watch] = []
        self.watches_opened = 0  # watch requests accepted so far (stalled ones included)
        self._watches_stalled = False
        self._fail_rules: list[_FailRule] = []
        self._stall_rules: list[_StallRule] = []
        self._forbidden: set[tuple[str, str]] = set()
        self._ds_state: dict[str, _DaemonState] = {}  # by DaemonSet uid
        self._ds_presets: dict[tuple[str, str], _DaemonState] = {}  # add_daemonset's, until first sync
        self._ds_dirty = False  # another round of the DaemonSet controller is due
        self._ds_dirty_nodes: set[str] = set()  # nodes whose daemon pods that round looks at
        self._ds_everywhere = False  # ... or every node
        # pods by owner uid, then node name, then key: what the DaemonSet controller looks up
        self._owned_pods: dict[str, dict[str, dict[tuple[str, str], JsonObj]]] = {}
        self._pod_hashes: dict[str, str] = {}  # daemon pod uid -> its template hash
        self._referenced: Counter[str] = Counter()  # uid -> how many ownerReferences name it
        self._crd_registered: dict[str, list[tuple[str, str, str]]] = {}
        # Paginated lists: (resource, namespace, resourceVersion) -> the objects then, in key order. A
        # continue token reads the rest of its list from here; one evicted (or compacted) gets 410.
        self._snapshots: OrderedDict[tuple[str, str | None, int], list[tuple[tuple[str, str], JsonObj]]] = (
            OrderedDict()
        )
        self.list_snapshots = 16  # how many paginated lists can be continued at once
        # counters
        self.request_counts: Counter[tuple[str, str]] = Counter()  # (verb, resource) -> requests served
        self.apply_conflicts = 0  # server-side applies refused with 409 (a field owned by another manager)
        self.gc_deletions = 0  # dependents the garbage collector deleted
        self._pending_deletions: dict[tuple[str, str], float] = {}
        self._reconciling = False
        self._connections: set[socket.socket] = set()
        self._stopping = False
        self._stop_event = threading.Event()
        self._httpd: _HttpServer | None = None
        self._port = 0
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        if self._httpd is not None or self._stopping:
            raise RuntimeError("a FakeApiServer starts once")
        self._httpd = _HttpServer(self)
        self._port = int(self._httpd.server_address[1])
        self._threads = [
            threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": self.poll_interval},  # stop() waits up to this long
                name="fake-apiserver",
                daemon=True,
            ),
            threading.Thread(target=self._reap, name="fake-apiserver-reaper", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._stop_event.set()
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it listens (or, once stopped, listened) on."""
        if not self._port:
            raise RuntimeError("the FakeApiServer is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(
        self, path: Path, *, namespace: str = "default", user_token: str | None = None
    ) -> Path:
        """A kubeconfig whose current context points at this server (with the token, if any)."""
        token = user_token if user_token is not None else self.token
        quote = json.dumps  # a JSON string is a valid YAML double-quoted scalar
        lines = [
            "apiVersion: v1",
            "kind: Config",
            "preferences: {}",
            "clusters:",
            "- name: gpunode-fake",
            "  cluster:",
            f"    server: {quote(self.url)}",
            "contexts:",
            "- name: gpunode-fake",
            "  context:",
            "    cluster: gpunode-fake",
            "    user: gpunode-fake",
            f"    namespace: {quote(namespace)}",
            "current-context: gpunode-fake",
            "users:",
            "- name: gpunode-fake",
            "  user:" + (f"\n    token: {quote(token)}" if token else " {}"),
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path

    # -- state, as an outside actor ----------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._watches)

    def add_node(
        self, name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
    ) -> JsonObj:
        meta: JsonObj = {"name": name, "labels": dict(labels or {})}
        if annotations:
            meta["annotations"] = dict(annotations)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": meta,
            "spec": {},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                    }
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"boot.{name}")),
                    "containerRuntimeVersion": "containerd://1.7.20",
                    "kernelVersion": "6.8.0-gpunode",
                    "kubeProxyVersion": "v1.31.0",
                    "kubeletVersion": "v1.31.0",
                    "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, f"machine.{name}").hex,
                    "operatingSystem": "linux",
                    "osImage": "Ubuntu 24.04 LTS",
                    "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"system.{name}")),
                },
            },
        }
        return copy.deepcopy(self._create(NODES, None, node))

    def node(self, name: str) -> JsonObj:
        with self._lock:
            return copy.deepcopy(self._get(NODES, None, name))

    def patch_node(self, name: str, patch: JsonObj) -> JsonObj:
        """A JSON merge patch, as an outside actor (a user relabelling the node)."""
        return copy.deepcopy(self._patch(NODES, None, name, patch, "merge"))

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        labels: dict[str, str] | None = None,
        node_selector: dict[str, str] | None = None,
        requests: dict[str, str] | None = None,
        owner_kind: str | None = None,
        owner_name: str | None = None,
        phase: str = "Running",
    ) -> JsonObj:
        meta: JsonObj = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        if owner_kind is not None:
            api_version = {"DaemonSet": "apps/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1"}.get(
                owner_kind, "batch/v1" if owner_kind == "Job" else "v1"
            )
            meta["ownerReferences"] = [
                {
                    "apiVersion": api_version,
                    "kind": owner_kind,
                    "name": owner_name or name,
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        container: JsonObj = {"name": "main", "image": "registry.k8s.io/pause:3.9"}
        if requests:
            container["resources"] = {"requests": dict(requests), "limits": dict(requests)}
        spec: JsonObj = {"nodeName": node, "containers": [container]}
        if node_selector:
            spec["nodeSelector"] = dict(node_selector)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}
        return copy.deepcopy(self._create(PODS, namespace, pod))

    def pods(self, node: str | None = None) -> list[JsonObj]:
        with self._lock:
            found = [
                pod
                for _, pod in sorted(self._store["pods"].items())
                if node is None or (pod.get("spec") or {}).get("nodeName") == node
            ]
            return copy.deepcopy(found)

    def resource_type(self, kind: str) -> ResourceType:
        """A built-in or (once its CRD exists) custom resource by plural, singular, kind or plural.group."""
        with self._lock:
            return _find_type(list(self._types.values()), kind)

    def objects(self, kind: str, namespace: str | None = None) -> list[JsonObj]:
        rt = self.resource_type(kind)
        with self._lock:
            found = [o for k, o in sorted(self._bucket(rt).items()) if namespace in (None, k[0])]
            return copy.deepcopy(found)

    def get(self, kind: str, name: str, namespace: str | None = None) -> JsonObj | None:
        rt = self.resource_type(kind)
        key = ((namespace or "default") if rt.namespaced else "", name)
        with self._lock:
            obj = self._bucket(rt).get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def create(self, kind: str, obj: JsonObj) -> JsonObj:
        return copy.deepcopy(self._create(self.resource_type(kind), None, obj))

    def patch(
        self,
        kind: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: Literal["merge", "strategic", "json"] = "merge",
        subresource: str | None = None,
        manager: str = SIM_MANAGER,
    ) -> JsonObj:
        """Patch as an outside actor; subresource "status" writes only status (types that have one)."""
        rt = self.resource_type(kind)
        ns = (namespace or "default") if rt.namespaced else None
        return copy.deepcopy(
            self._patch(rt, ns, name, patch, patch_type, subresource=subresource, manager=manager)
        )

    def apply(
        self, kind: str, obj: JsonObj, *, manager: str, force: bool = False, subresource: str | None = None
    ) -> JsonObj:
        """Server-side apply as `manager` (ApiError 409 on a conflict without force)."""
        rt = self.resource_type(kind)
        meta = obj.get("metadata") or {}
        ns = (meta.get("namespace") or "default") if rt.namespaced else None
        name = str(meta.get("name", ""))
        with self._lock:
            _, result = self._apply(rt, ns, name, obj, manager=manager, force=force, subresource=subresource)
            return copy.deepcopy(
                self._bucket(rt).get((ns or "", name), result)
            )  # with what controllers wrote

    def delete(
        self, kind: str, name: str, namespace: str | None = None, *, propagation: str | None = None
    ) -> None:
        """Delete as a client would (pods honour `pod_deletion_delay`, dependents are collected unless
        propagation is "Orphan"); ApiError 404 when absent."""
        rt = self.resource_type(kind)
        self._delete(rt, (namespace or "default") if rt.namespaced else None, name, propagation=propagation)

    def add_daemonset(
        self,
        namespace: str,
        name: str,
        node_selector: dict[str, str],
        pod_labels: dict[str, str],
        *,
        recreate: bool = True,
    ) -> JsonObj:
        """Create a DaemonSet (apps/v1) that the controller in miniature plays for.

        A node whose labels hold every node_selector pair (and whose NoSchedule/NoExecute taints the
        template tolerates) gets one pod `<name>-<5 chars>` once no pod of this DaemonSet (terminating
        ones included) is on it; a node that stops matching loses its pods (honouring
        `pod_deletion_delay`). With recreate=False a node gets a pod only the first time it matches: a
        pod deleted or evicted later is not replaced. Its pods carry exactly pod_labels (DaemonSets
        created through the API also get controller-revision-hash and pod-template-generation)."""
        body = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "selector": {"matchLabels": dict(pod_labels)},
                "template": {
                    "metadata": {"labels": dict(pod_labels)},
                    "spec": {
                        "nodeSelector": dict(node_selector),
                        "containers": [{"name": name, "image": "registry.k8s.io/pause:3.9"}],
                    },
                },
            },
        }
        with self._lock:
            if (namespace, name) in self._bucket(DAEMONSETS):
                raise _already_exists(DAEMONSETS, name)
            self._ds_presets[(namespace, name)] = _DaemonState(recreate=recreate, plain=True)
            try:
                self._create(DAEMONSETS, namespace, body)
            finally:
                self._ds_presets.pop((namespace, name), None)
            return copy.deepcopy(self._get(DAEMONSETS, namespace, name))

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Poll predicate (outside the lock) until it holds or timeout passes; wakes on every change."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                seen = self._changes
            if predicate():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._cond:
                if self._changes == seen:
                    self._cond.wait(min(remaining, 0.05))

    # -- fault injection -----------------------------------------------------------------------------

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 500,
        method: str | None = None,
        path_contains: str | None = None,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        """The next `count` requests matching method and a substring of the request target (path and
        query) get `status` with a Status body; 429 comes with `Retry-After: 1`."""
        with self._lock:
            self._fail_rules.append(_FailRule(count, status, method, path_contains, reason, message))

    def forbid(self, verb: str, resource: str) -> None:
        """403 for verb (get, list, watch, create, update, patch, delete, or *) on resource (nodes, pods,
        pods/eviction, nodefeatures, or *)."""
        with self._lock:
            self._forbidden.add((verb, resource))

    def allow_all(self) -> None:
        with self._lock:
            self._forbidden.clear()

    def drop_watches(self) -> None:
        """Close every open watch connection abruptly: no terminating chunk."""
        with self._cond:
            watches = list(self._watches)
            for w in watches:
                w.dropped = True
            self._cond.notify_all()
        for w in watches:
            if w.conn is not None:
                with contextlib.suppress(OSError):
                    w.conn.shutdown(socket.SHUT_RDWR)

    def stall_watches(self, stalled: bool = True) -> None:
        """While stalled, watch streams send nothing (new ones not even headers); events are buffered."""
        with self._cond:
            self._watches_stalled = stalled
            self._cond.notify_all()

    def stall(self, seconds: float, *, path_contains: str | None = None, count: int = 1) -> None:
        """The next `count` matching non-watch requests wait `seconds` before they are handled."""
        with self._lock:
            self._stall_rules.append(_StallRule(count, seconds, path_contains))

    def compact(self) -> None:
        """Forget the event history: watches resuming from an older resourceVersion get 410 Expired."""
        with self._lock:
            self._events.clear()
            self._horizon = self._rv
            self._snapshots.clear()

    # -- store primitives (callers hold the lock) --------------------------------------------------------

    def _bucket(self, rt: ResourceType) -> dict[tuple[str, str], JsonObj]:
        return self._store.setdefault(rt.key, {})

    def _type_for_key(self, key: str) -> ResourceType | None:
        for rt in self._types.values():
            if rt.key == key:
                return rt
        return None

    def _emit(
        self,
        kind: Literal["ADDED", "MODIFIED", "DELETED"],
        rt: ResourceType,
        obj: JsonObj,
        old: JsonObj | None,
    ) -> None:
        event = WatchEvent(self._rv, kind, rt.key, obj, old)
        if self.history > 0:
            if len(self._events) >= self.history:
                self._horizon = self._events.popleft().rv
            self._events.append(event)
        else:
            self._horizon = event.rv
        for w in self._watches:
            if w.rt.key == rt.key:
                w.pending.append(event)
        for observe in self.observers:
            observe(event)
        self._changed()

    def _changed(self) -> None:
        self._changes += 1
        self._cond.notify_all()

    def _count_refs(self, obj: JsonObj | None, sign: int) -> None:
        if obj is None:
            return
        for ref in obj["metadata"].get("ownerReferences") or []:
            if isinstance(ref, dict) and isinstance(ref.get("uid"), str):
                self._referenced[ref["uid"]] += sign
                if self._referenced[ref["uid"]] <= 0:
                    del self._referenced[ref["uid"]]

    def _store_object(self, rt: ResourceType, obj: JsonObj, old: JsonObj | None) -> JsonObj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._bucket(rt)[_key(obj)] = obj
        self._count_refs(old, -1)
        self._count_refs(obj, +1)
        self._emit("ADDED" if old is None else "MODIFIED", rt, obj, old)
        if rt.key == CRDS.key:
            self._register_crd(obj)
        elif rt is NODES:
            self._reconcile_daemonsets((obj["metadata"]["name"],))
        elif rt is PODS:
            self._index_pod(old, -1)
            self._index_pod(obj, +1)
            if self._ds_owner(obj) is not None:
                node = (obj.get("spec") or {}).get("nodeName")
                self._reconcile_daemonsets((node,) if isinstance(node, str) and node else ())
        elif rt is DAEMONSETS:
            # a spec change (the template) re-examines every node; a status or metadata write only the status
            everywhere = (
                old is None
                or _spec_part(obj) != _spec_part(old)
                or ("deletionTimestamp" in obj["metadata"]) != ("deletionTimestamp" in old["metadata"])
            )
            self._reconcile_daemonsets(everywhere=everywhere)
        elif rt is DEPLOYMENTS:
            self._deployment_status(obj)
        return obj

    def _remove_object(self, rt: ResourceType, key: tuple[str, str], *, orphan: bool = False) -> JsonObj:
        old = self._bucket(rt).pop(key)
        self._rv += 1
        final = copy.deepcopy(old)
        final["metadata"]["resourceVersion"] = str(self._rv)
        self._count_refs(old, -1)
        self._emit("DELETED", rt, final, old)
        uid = str(final["metadata"].get("uid", ""))
        if rt is PODS:
            self._pending_deletions.pop(key, None)
            self._pod_hashes.pop(uid, None)
            self._index_pod(old, -1)
            if self._ds_owner(final) is not None:
                node = (final.get("spec") or {}).get("nodeName")
                self._reconcile_daemonsets((node,) if isinstance(node, str) and node else ())
        elif rt is NODES:
            self._reconcile_daemonsets((key[1],))
        elif rt is DAEMONSETS:
            self._ds_state.pop(uid, None)
        elif rt.key == CRDS.key:
            self._unregister_crd(final, delete_objects=True)
        elif rt is NAMESPACES:
            self._empty_namespace(key[1])
        self._collect_garbage(final, orphan=orphan)
        return final

    def _get(self, rt: ResourceType, namespace: str | None, name: str) -> JsonObj:
        obj = self._bucket(rt).get((namespace or "", name))
        if obj is None:
            raise _not_found(rt, name)
        return obj

    # -- garbage collection --------------------------------------------------------------------------

    def _collect_garbage(self, owner: JsonObj, *, orphan: bool) -> None:
        """Background propagation: once an owner is gone, a dependent none of whose owners exists any
        more is deleted (as a client would, so pods honour the deletion delay); one that still has a live
        owner loses its dangling reference. With orphan, dependents only lose the reference."""
        uid = owner["metadata"].get("uid")
        if not uid or uid not in self._referenced:
            return
        live_uids: set[str] | None = None
        for bucket_key, bucket in list(self._store.items()):
            rt = self._type_for_key(bucket_key)
            if rt is None:
                continue
            for key, obj in sorted(bucket.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if not any(isinstance(r, dict) and r.get("uid") == uid for r in refs):
                    continue
                if bucket.get(key) is not obj:
                    continue  # already gone through an earlier deletion
                if orphan:
                    remaining = [r for r in refs if not (isinstance(r, dict) and r.get("uid") == uid)]
                else:
                    if live_uids is None:
                        live_uids = {
                            str(o["metadata"].get("uid")) for b in self._store.values() for o in b.values()
                        }
                    remaining = [r for r in refs if isinstance(r, dict) and r.get("uid") in live_uids]
                    if not remaining:
                        self.gc_deletions += 1
                        self._delete(rt, key[0] or None, key[1])
                        continue
                new = copy.deepcopy(obj)
                if remaining:
                    new["metadata"]["ownerReferences"] = remaining
                else:
                    new["metadata"].pop("ownerReferences", None)
                self._commit(rt, obj, new, dry_run=False, manager=GC_MANAGER)

    def _empty_namespace(self, namespace: str) -> None:
        for bucket_key, bucket in list(self._store.items()):
            rt = self._type_for_key(bucket_key)
            if rt is None or not rt.namespaced:
                continue
            for key in sorted(k for k in bucket if k[0] == namespace):
                if key in bucket:
                    self._remove_object(rt, key)

    # -- custom resource definitions -----------------------------------------------------------------

    def _crd_types(self, crd: JsonObj) -> list[ResourceType]:
        name = str(crd["metadata"].get("name", ""))
        spec = crd.get("spec")
        if not isinstance(spec, dict):
            raise _invalid(CRDS, name, "spec: Required value")
        raw_names = spec.get("names")
        names: JsonObj = raw_names if isinstance(raw_names, dict) else {}
        group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
        for label, value in (("spec.group", group), ("spec.names.plural", plural), ("spec.names.kind", kind)):
            if not isinstance(value, str) or not value:
                raise _invalid(CRDS, name, f"{label}: Required value")
        assert isinstance(group, str)
        assert isinstance(plural, str)
        assert isinstance(kind, str)
        if name != f"{plural}.{group}":
            raise _invalid(
                CRDS,
                name,
                f'metadata.name: Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
            )
        scope = spec.get("scope")
        if scope not in ("Namespaced", "Cluster"):
            raise _invalid(
                CRDS,
                name,
                f'spec.scope: Unsupported value: "{scope}": supported values: "Cluster", "Namespaced"',
            )
        versions = spec.get("versions")
        if not isinstance(versions, list) or not versions:
            raise _invalid(
                CRDS,
                name,
                "spec.versions: Invalid value: must have exactly one version marked as storage version",
            )
        storage = [v for v in versions if isinstance(v, dict) and v.get("storage")]
        if len(storage) != 1:
            raise _invalid(
                CRDS,
                name,
                "spec.versions: Invalid value: must have exactly one version marked as storage version",
            )
        singular = names.get("singular") or kind.lower()
        short = tuple(str(s) for s in names.get("shortNames") or [])
        categories = tuple(str(c) for c in names.get("categories") or [])
        found: list[ResourceType] = []
        for version in versions:
            if not isinstance(version, dict) or not isinstance(version.get("name"), str):
                raise _invalid(CRDS, name, "spec.versions[].name: Required value")
            if not version.get("served", True):
                continue
            raw_sub = version.get("subresources")
            subresources: JsonObj = raw_sub if isinstance(raw_sub, dict) else {}
            found.append(
                ResourceType(
                    plural,
                    str(singular),
                    kind,
                    group,
                    version["name"],
                    scope == "Namespaced",
                    _META_FIELDS,
                    short,
                    custom=True,
                    status="status" in subresources,
                    generation=True,
                    categories=categories,
                )
            )
        return found

    def _crd_status(self, crd: JsonObj) -> JsonObj:
        now = _now()
        spec = crd.get("spec") or {}
        names = dict(spec.get("names") or {})
        names.setdefault("singular", str(names.get("kind", "")).lower())
        names.setdefault("listKind", f"{names.get('kind', '')}List")
        storage = [v["name"] for v in spec.get("versions") or [] if isinstance(v, dict) and v.get("storage")]
        return {
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "lastTransitionTime": now,
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                },
                {
                    "type": "Established",
                    "status": "True",
                    "lastTransitionTime": now,
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                },
            ],
            "acceptedNames": names,
            "storedVersions": storage,
        }

    def _register_crd(self, crd: JsonObj) -> None:
        self._unregister_crd(crd, delete_objects=False)
        registered = []
        for rt in self._crd_types(crd):
            ident = (rt.group, rt.version, rt.plural)
            self._types[ident] = rt
            registered.append(ident)
        self._crd_registered[crd["metadata"]["name"]] = registered

    def _unregister_crd(self, crd: JsonObj, *, delete_objects: bool) -> None:
        idents = self._crd_registered.pop(crd["metadata"]["name"], [])
        types = [self._types.pop(ident) for ident in idents if ident in self._types]
        for ident in idents:
            builtin = next((b for b in BUILTIN_TYPES if (b.group, b.version, b.plural) == ident), None)
            if builtin is not None:
                self._types[ident] = builtin
        if delete_objects and types:
            rt = types[0]
            for key in sorted(self._bucket(rt)):
                if key in self._bucket(rt):
                    self._remove_object(rt, key)

    # -- verbs ---------------------------------------------------------------------------------------

    def _scope(self, rt: ResourceType, subresource: str | None) -> str | None:
        if not rt.status:
            return None
        return "status" if subresource == "status" else "main"

    def _create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        manager: str = SIM_MANAGER,
        managed: bool = False,
    ) -> JsonObj:
        obj = copy.deepcopy(_object(body))
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            given = meta.get("namespace")
            if namespace is None:
                namespace = given or "default"
            elif given and given != namespace:
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        name = meta.get("name")
        if not name:
            if not meta.get("generateName"):
                raise _invalid(rt, "", "metadata.name: Required value: name or generateName is required")
            name = f"{meta['generateName']}{_suffix()}"
        if not isinstance(name, str) or len(name) > 253 or not _NAME_RE.match(name):
            raise _invalid(
                rt, str(name), f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain'
            )
        meta["name"] = name
        for transient in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            meta.pop(transient, None)
        if not managed:
            meta.pop("managedFields", None)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        if rt.status:
            obj.pop("status", None)  # a status subresource: what a create says about status is dropped
        if rt.generation:
            meta["generation"] = 1
        if rt is PODS:
            status = obj.get("status")
            if not isinstance(status, dict):
                obj["status"] = status = {}
            status.setdefault("phase", "Pending")
        if rt.key == CRDS.key:
            self._crd_types(obj)  # validates
        with self._lock:
            if (meta.get("namespace") or "", name) in self._bucket(rt):
                raise _already_exists(rt, name)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            if not managed:
                record_update(
                    None,
                    obj,
                    manager=manager,
                    api_version=rt.api_version,
                    subresource=None,
                    scope=self._scope(rt, None),
                    now=_now(),
                )
            if rt.key == CRDS.key:
                obj["status"] = self._crd_status(obj)
            if dry_run:
                return obj
            return self._store_object(rt, obj, None)

    def _update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        dry_run: bool = False,
        subresource: str | None = None,
        manager: str = SIM_MANAGER,
    ) -> JsonObj:
        new = copy.deepcopy(_object(body))
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise _bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace", namespace) != namespace:
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        with self._lock:
            old = self._get(rt, namespace, name)
            wanted = meta.get("resourceVersion")
            if wanted not in (None, "") and str(wanted) != _rv_of(old):
                raise _conflict(rt, name, _MODIFIED)
            return self._commit(rt, old, new, dry_run=dry_run, subresource=subresource, manager=manager)

    def _commit(
        self,
        rt: ResourceType,
        old: JsonObj,
        new: JsonObj,
        *,
        dry_run: bool,
        subresource: str | None = None,
        manager: str = SIM_MANAGER,
        managed: bool = False,
    ) -> JsonObj:
        """Store `new` in place of `old`, keeping what a client cannot change; a no-op writes nothing.

        Through /status only status changes; through the main resource of a type with a status
        subresource, status keeps its old value. `managed`: new's managedFields are already right."""
        applied_fields = copy.deepcopy(new.get("metadata", {}).get("managedFields")) if managed else None
        if rt.status and subresource == "status":
            status = new.get("status")
            # stored objects are never mutated: the new one shares all but its metadata's top level
            new = {**old, "metadata": dict(old["metadata"])}
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = copy.deepcopy(status)
        elif rt.status:
            new.pop("status", None)
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        meta = new.setdefault("metadata", {})
        for kept in (*_KEPT_ON_WRITE, "generation", "managedFields"):
            if kept in old["metadata"]:
                meta[kept] = copy.deepcopy(old["metadata"][kept])
            else:
                meta.pop(kept, None)
        if rt.generation and _spec_part(new) != _spec_part(old):
            meta["generation"] = int(old["metadata"].get("generation") or 0) + 1
        if managed:
            if applied_fields:
                meta["managedFields"] = applied_fields
            else:
                meta.pop("managedFields", None)
        else:
            record_update(
                old,
                new,
                manager=manager,
                api_version=rt.api_version,
                subresource=subresource if rt.status else None,
                scope=self._scope(rt, subresource),
                now=_now(),
            )
        if rt.key == CRDS.key:
            self._crd_types(new)  # validates
        if same_ignoring_time(new, old):
            return old
        if dry_run:
            return new
        return self._store_object(rt, new, old)

    def _patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        patch_type: Literal["merge", "strategic", "json"],
        *,
        dry_run: bool = False,
        subresource: str | None = None,
        manager: str = SIM_MANAGER,
    ) -> JsonObj:
        if patch_type != "json" and not isinstance(patch, dict):
            raise _bad_request("the body of the request must be a JSON object")
        with self._lock:
            old = self._get(rt, namespace, name)
            try:
                if patch_type == "json":
                    new = json_patch(old, patch)
                elif patch_type == "strategic":
                    new = strategic_merge_patch(old, patch)
                else:
                    new = merge_patch(old, patch)
            except PatchError as exc:
                raise _invalid(rt, name, str(exc)) from None
            if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
                raise _invalid(rt, name, "metadata: Required value")
            meta = new["metadata"]
            if meta.get("name") != name:
                raise _bad_request(
                    f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
                )
            if rt.namespaced and meta.get("namespace") != namespace:
                raise _bad_request("the namespace of the object does not match the namespace on the URL")
            wanted = meta.get("resourceVersion")
            if wanted not in (None, "") and str(wanted) != _rv_of(old):
                raise _conflict(rt, name, _MODIFIED)
            return self._commit(rt, old, new, dry_run=dry_run, subresource=subresource, manager=manager)

    def _apply(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        manager: str | None,
        force: bool,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> tuple[int, JsonObj]:
        """Server-side apply: (201, created) or (200, updated); see fieldmanager for the model."""
        if not manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: '
                "fieldManager: Required value: is required for apply patch",
                {
                    "group": "meta.k8s.io",
                    "kind": "PatchOptions",
                    "causes": [
                        {
                            "reason": "FieldValueRequired",
                            "message": "Required value: is required for apply patch",
                            "field": "fieldManager",
                        }
                    ],
                },
            )
        applied = _object(body)
        if applied.get("apiVersion") != rt.api_version:
            raise _bad_request(
                "Incorrect version specified in apply patch. "
                f"Specified patch version: {applied.get('apiVersion', '')}, expected: {rt.api_version}"
            )
        if applied.get("kind") != rt.kind:
            raise _bad_request(
                "Incorrect kind specified in apply patch. "
                f"Specified patch kind: {applied.get('kind', '')}, expected: {rt.kind}"
            )
        meta = applied.get("metadata") or {}
        if meta.get("name", name) != name:
            raise _bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace", namespace) != namespace:
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        scope = self._scope(rt, subresource)
        with self._lock:
            old = self._bucket(rt).get((namespace or "", name))
            if old is None:
                if subresource:
                    raise _not_found(rt, name)
                skeleton_meta: JsonObj = {"name": name}
                if rt.namespaced:
                    skeleton_meta["namespace"] = namespace
                skeleton = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": skeleton_meta}
                created = fieldmanager_apply(
                    skeleton,
                    applied,
                    manager=manager,
                    force=force,
                    api_version=rt.api_version,
                    subresource=None,
                    scope=scope,
                    now=_now(),
                )
                return 201, self._create(rt, namespace, created, dry_run=dry_run, managed=True)
            wanted = meta.get("resourceVersion")
            if wanted not in (None, "") and str(wanted) != _rv_of(old):
                raise _conflict(rt, name, _MODIFIED)  # an apply may carry a resourceVersion precondition
            try:
                result = fieldmanager_apply(
                    old,
                    applied,
                    manager=manager,
                    force=force,
                    api_version=rt.api_version,
                    subresource=subresource if rt.status else None,
                    scope=scope,
                    now=_now(),
                )
            except ApplyConflict as exc:
                self.apply_conflicts += 1
                raise ApiError(
                    409, "Conflict", str(exc), {"causes": conflict_causes(exc.conflicts)}
                ) from None
            committed = self._commit(
                rt, old, result, dry_run=dry_run, subresource=subresource, manager=manager, managed=True
            )
            return 200, committed

    def _delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        grace: float | None = None,
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
        propagation: str | None = None,
    ) -> JsonObj:
        with self._lock:
            old = self._get(rt, namespace, name)
            meta = old["metadata"]
            for field_name, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = (preconditions or {}).get(field_name)
                if wanted and str(wanted) != str(meta.get(field_name)):
                    raise _conflict(
                        rt,
                        name,
                        f"Precondition failed: {label} in precondition: {wanted}, "
                        f"{label} in object meta: {meta.get(field_name)}",
                    )
            if dry_run:
                return old
            delay = self.pod_deletion_delay if rt is PODS and grace != 0 else 0.0
            if delay > 0:
                if "deletionTimestamp" in meta:
                    return old  # already terminating
                new = copy.deepcopy(old)
                when = datetime.now(UTC) + timedelta(seconds=delay)
                new["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
                new["metadata"]["deletionGracePeriodSeconds"] = math.ceil(delay)
                self._pending_deletions[_key(old)] = time.monotonic() + delay
                return self._store_object(rt, new, old)
            return self._remove_object(rt, _key(old), orphan=propagation == "Orphan")

    def _list(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: tuple[FieldRequirement, ...],
        *,
        limit: int = 0,
        token: str = "",
    ) -> JsonObj:
        """A list, or with `limit` one page of it: at most `limit` matching items, then
        metadata.continue (and, without selectors, remainingItemCount) while objects remain; `token`
        (a continue token) reads on from the page before, as of that page's resourceVersion."""
        probe = _Watch(rt, namespace, labels, fields, None)
        with self._lock:
            if token:
                rv, start = _decode_continue(token, rt)
                snapshot = self._snapshots.get((rt.key, namespace, rv))
                if snapshot is None:
                    raise ApiError(410, "Expired", _CONTINUE_EXPIRED)
                self._snapshots.move_to_end((rt.key, namespace, rv))
                position = bisect.bisect_right(snapshot, start, key=lambda item: item[0])
            else:
                rv = self._rv
                snapshot = [
                    (key, obj)
                    for key, obj in sorted(self._bucket(rt).items())
                    if namespace is None or key[0] == namespace
                ]
                position = 0
            items: list[JsonObj] = []
            while position < len(snapshot) and (limit <= 0 or len(items) < limit):
                obj = snapshot[position][1]
                position += 1
                if probe.visible(obj):
                    items.append(_as_version(rt, obj))
            meta: JsonObj = {"resourceVersion": str(rv)}
            if limit > 0 and position < len(snapshot):
                meta["continue"] = _encode_continue(rv, snapshot[position - 1][0])
                if not labels.terms and not fields:
                    meta["remainingItemCount"] = len(snapshot) - position
                self._snapshots[(rt.key, namespace, rv)] = snapshot
                self._snapshots.move_to_end((rt.key, namespace, rv))
                while len(self._snapshots) > max(1, self.list_snapshots):
                    self._snapshots.popitem(last=False)
            return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}

    # -- controllers ---------------------------------------------------------------------------------

    def _reap(self) -> None:
        """Remove terminating pods whose deletion delay has passed."""
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                for key in [k for k, due in self._pending_deletions.items() if due <= now]:
                    del self._pending_deletions[key]
                    if key in self._store["pods"]:
                        self._remove_object(PODS, key)
                upcoming = min(self._pending_deletions.values(), default=now + 1.0)
                self._cond.wait(max(0.001, min(upcoming - time.monotonic(), 1.0)))

    def _ds_owner(self, pod: JsonObj) -> JsonObj | None:
        daemonsets = self._bucket(DAEMONSETS)
        if not daemonsets:
            return None
        namespace = pod["metadata"].get("namespace") or ""
        for ref in pod["metadata"].get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("kind") == "DaemonSet":
                ds = daemonsets.get((namespace, str(ref.get("name"))))
                if ds is not None and ds["metadata"].get("uid") == ref.get("uid"):
                    return ds
        return None

    def _index_pod(self, pod: JsonObj | None, sign: int) -> None:
        """Add (+1) or remove (-1) a pod in the by-owner-and-node index."""
        if pod is None:
            return
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        key = _key(pod)
        for ref in pod["metadata"].get("ownerReferences") or []:
            if not isinstance(ref, dict) or not isinstance(ref.get("uid"), str):
                continue
            by_node = self._owned_pods.setdefault(ref["uid"], {})
            if sign > 0:
                by_node.setdefault(node, {})[key] = pod
                continue
            pods = by_node.get(node)
            if pods is not None and pods.get(key) is pod:
                del pods[key]
                if not pods:
                    del by_node[node]
            if not by_node:
                del self._owned_pods[ref["uid"]]

    def _pods_of(self, ds: JsonObj, node: str) -> list[JsonObj]:
        """The DaemonSet's pods (by ownerReference) bound to one node, in key order."""
        namespace = ds["metadata"].get("namespace") or ""
        pods = self._owned_pods.get(str(ds["metadata"].get("uid")), {}).get(node, {})
        return [pod for key, pod in sorted(pods.items()) if key[0] == namespace]

    def _reconcile_daemonsets(self, nodes: Iterable[str] = (), *, everywhere: bool = False) -> None:
        """Run the DaemonSet controller until nothing changes: place and remove pods (node selector,
        taints vs tolerations), roll out template changes, record ControllerRevisions, write status.

        `nodes`: the nodes whose node object or daemon pods changed (only they are examined);
        `everywhere`: every node. Writes made meanwhile (the controller's own included) add theirs and
        bring another round."""
        self._ds_dirty_nodes.update(nodes)
        self._ds_everywhere = self._ds_everywhere or everywhere
        self._ds_dirty = True
        if self._reconciling:
            return
        if not self._bucket(DAEMONSETS):
            self._ds_dirty, self._ds_everywhere = False, False
            self._ds_dirty_nodes.clear()
            return
        self._reconciling = True
        try:
            for _ in range(10_000):
                if not self._ds_dirty:
                    break
                names = None if self._ds_everywhere else sorted(self._ds_dirty_nodes)
                self._ds_dirty, self._ds_everywhere = False, False
                self._ds_dirty_nodes = set()
                for key in sorted(self._bucket(DAEMONSETS)):
                    ds = self._bucket(DAEMONSETS).get(key)
                    if ds is not None:
                        self._sync_daemonset(ds, names)
                for key in sorted(self._bucket(DAEMONSETS)):
                    ds = self._bucket(DAEMONSETS).get(key)
                    if ds is not None:
                        self._daemonset_status(ds)
        finally:
            self._reconciling = False

    def _pod_hash(self, pod: JsonObj) -> str | None:
        uid = str(pod["metadata"].get("uid"))
        return self._pod_hashes.get(uid) or (pod["metadata"].get("labels") or {}).get(
            "controller-revision-hash"
        )

    def _ds_state_of(self, ds: JsonObj) -> _DaemonState:
        meta = ds["metadata"]
        uid = str(meta.get("uid"))
        state = self._ds_state.get(uid)
        if state is None:
            state = self._ds_presets.pop((meta.get("namespace") or "", meta["name"]), None) or _DaemonState()
            self._ds_state[uid] = state
        generation = int(meta.get("generation") or 1)
        if state.hash_generation != generation:  # the template changes only with the generation
            state.template_hash = template_hash((ds.get("spec") or {}).get("template") or {})
            state.hash_generation = generation
        return state

    def _ds_revision(self, ds: JsonObj, template: JsonObj, current: str) -> None:
        """The current template's ControllerRevision, created (or renumbered) as needed."""
        meta = ds["metadata"]
        namespace, uid = meta.get("namespace") or "", meta.get("uid")
        bucket = self._bucket(CONTROLLER_REVISIONS)
        owned = [
            cr
            for (cr_namespace, _), cr in bucket.items()
            if cr_namespace == namespace
            and any(ref.get("uid") == uid for ref in cr["metadata"].get("ownerReferences") or [])
        ]
        top = max((int(cr.get("revision") or 0) for cr in owned), default=0)
        name = f"{meta['name']}-{current}"
        existing = bucket.get((namespace, name))
        if existing is None:
            labels = dict((template.get("metadata") or {}).get("labels") or {})
            labels["controller-revision-hash"] = current
            revision = {
                "apiVersion": "apps/v1",
                "kind": "ControllerRevision",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": labels,
                    "ownerReferences": [_controller_ref(ds)],
                },
                "data": {"spec": {"template": {**copy.deepcopy(template), "$patch": "replace"}}},
                "revision": top + 1,
            }
            self._create(CONTROLLER_REVISIONS, namespace, revision, manager=CONTROLLER_MANAGER)
        elif int(existing.get("revision") or 0) < top:
            renumbered = copy.deepcopy(existing)
            renumbered["revision"] = top + 1
            self._commit(
                CONTROLLER_REVISIONS, existing, renumbered, dry_run=False, manager=CONTROLLER_MANAGER
            )

    def _sync_daemonset(self, ds: JsonObj, names: list[str] | None) -> None:
        """One DaemonSet on `names` (None: every node): place and remove pods, refresh the nodes' views,
        then roll out outdated pods within maxUnavailable."""
        meta = ds["metadata"]
        state = self._ds_state_of(ds)
        current = state.template_hash
        spec = ds.get("spec") or {}
        template = spec.get("template") or {}
        pod_spec = template.get("spec") or {}
        nodes = self._store["nodes"]
        if state.view_hash != current:  # a new template (or a new DaemonSet): every node anew
            state.view_hash, state.views, state.totals, state.outdated = current, {}, [0] * 6, set()
            names = None
        if names is None:
            names = [key[1] for key in sorted(nodes)]
            for gone in [n for n in state.views if ("", n) not in nodes]:
                state.set_view(gone, None)
        terminating = "deletionTimestamp" in meta
        if not terminating:
            self._ds_revision(ds, template, current)
        for name in names:
            node = nodes.get(("", name))
            if not terminating:
                self._place_or_remove(ds, state, template, current, name, node)
            state.set_view(name, self._node_view(ds, pod_spec, current, name, node))
        strategy = spec.get("updateStrategy") or {}
        if terminating or (strategy.get("type") or "RollingUpdate") != "RollingUpdate" or not state.outdated:
            return
        outdated = [
            pod
            for name in sorted(state.outdated)
            for pod in self._pods_of(ds, name)
            if "deletionTimestamp" not in pod["metadata"] and self._pod_hash(pod) != current
        ]
        desired = state.totals[_DESIRED]
        rolling = strategy.get("rollingUpdate") or {}
        unavailable = desired - state.totals[_READY]
        budget = _max_unavailable(rolling.get("maxUnavailable", 1), desired) - unavailable
        outdated.sort(key=pod_ready)  # the not-ready ones first: replacing them costs nothing
        for pod in outdated:
            if budget <= 0 and pod_ready(pod):
                break
            if pod_ready(pod):
                budget -= 1
            self._delete(PODS, meta["namespace"], pod["metadata"]["name"])

    def _place_or_remove(
        self,
        ds: JsonObj,
        state: _DaemonState,
        template: JsonObj,
        current: str,
        name: str,
        node: JsonObj | None,
    ) -> None:
        pods = self._pods_of(ds, name)
        pod_spec = template.get("spec") or {}
        place, keep = should_run(pod_spec, node) if node is not None else (False, False)
        if not keep:
            for pod in pods:
                if "deletionTimestamp" not in pod["metadata"]:
                    self._delete(PODS, ds["metadata"]["namespace"], pod["metadata"]["name"])
            return
        if pods or not place or (not state.recreate and name in state.placed):
            return
        state.placed.add(name)
        self._place_pod(ds, state, template, current, name)

    def _node_view(
        self, ds: JsonObj, pod_spec: JsonObj, current: str, name: str, node: JsonObj | None
    ) -> tuple[int, ...] | None:
        """What one node contributes to the DaemonSet's status (see _DaemonState); None: no node."""
        if node is None:
            return None
        place, keep = should_run(pod_spec, node)
        live = [p for p in self._pods_of(ds, name) if "deletionTimestamp" not in p["metadata"]]
        view = [0] * 6
        if place or (keep and live):
            view[_DESIRED] = 1
            view[_SCHEDULED] = int(bool(live))
            view[_READY] = int(any(pod_ready(p) for p in live))
            view[_UPDATED] = int(any(self._pod_hash(p) == current for p in live))
            view[_OUTDATED] = sum(self._pod_hash(p) != current for p in live)
        elif live:
            view[_MISSCHEDULED] = 1
        return tuple(view)

    def _place_pod(
        self, ds: JsonObj, state: _DaemonState, template: JsonObj, current: str, node: str
    ) -> None:
        meta = ds["metadata"]
        namespace = meta["namespace"]
        while True:
            pod_name = f"{meta['name']}-{_suffix()}"
            if (namespace, pod_name) not in self._store["pods"]:
                break
        template_meta = template.get("metadata") or {}
        labels = dict(template_meta.get("labels") or {})
        if not state.plain:
            labels["controller-revision-hash"] = current
            labels["pod-template-generation"] = str(meta.get("generation") or 1)
        pod_meta: JsonObj = {
            "name": pod_name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [_controller_ref(ds)],
        }
        if template_meta.get("annotations"):
            pod_meta["annotations"] = copy.deepcopy(template_meta["annotations"])
        spec = copy.deepcopy(template.get("spec") or {})
        spec["nodeName"] = node
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": pod_meta,
            "spec": spec,
            "status": {"phase": self.daemon_pod_phase},
        }
        if self.daemon_pod_status is not None:
            status = self.daemon_pod_status(copy.deepcopy(pod))
            if status is not None:
                pod["status"] = copy.deepcopy(status)
        created = self._create(PODS, namespace, pod, manager=CONTROLLER_MANAGER)
        self._pod_hashes[str(created["metadata"]["uid"])] = current

    def _deployment_status(self, deployment: JsonObj) -> None:
        """Deployments get no pods (no ReplicaSets here): their status says every replica is there."""
        spec = deployment.get("spec") or {}
        replicas = spec.get("replicas", 1) if isinstance(spec.get("replicas", 1), int) else 1
        status: JsonObj = {"observedGeneration": int(deployment["metadata"].get("generation") or 1)}
        if replicas:
            status.update(
                replicas=replicas,
                updatedReplicas=replicas,
                readyReplicas=replicas,
                availableReplicas=replicas,
            )
        old_conditions = (deployment.get("status") or {}).get("conditions")
        status["conditions"] = old_conditions or [
            {
                "type": "Available",
                "status": "True",
                "lastUpdateTime": _now(),
                "lastTransitionTime": _now(),
                "reason": "MinimumReplicasAvailable",
                "message": "Deployment has minimum availability.",
            }
        ]
        if deployment.get("status") == status:
            return
        new = {**deployment, "status": status}  # through /status: _commit takes only the status
        self._commit(
            DEPLOYMENTS, deployment, new, dry_run=False, subresource="status", manager=CONTROLLER_MANAGER
        )

    def _daemonset_status(self, ds: JsonObj) -> None:
        state = self._ds_state_of(ds)
        if state.view_hash != state.template_hash:  # not synced since its template changed
            self._sync_daemonset(ds, None)
        desired, scheduled, ready, updated, misscheduled, _ = state.totals
        status: JsonObj = {
            "currentNumberScheduled": scheduled,
            "desiredNumberScheduled": desired,
            "numberAvailable": ready,
            "numberMisscheduled": misscheduled,
            "numberReady": ready,
            "observedGeneration": int(ds["metadata"].get("generation") or 1),
            "updatedNumberScheduled": updated,
        }
        if desired > ready:
            status["numberUnavailable"] = desired - ready
        if ds.get("status") == status:
            return
        new = {**ds, "status": status}  # through /status: _commit takes only the status
        self._commit(DAEMONSETS, ds, new, dry_run=False, subresource="status", manager=CONTROLLER_MANAGER)

    # -- HTTP ----------------------------------------------------------------------------------------

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append(record)
            self._changed()

    def _register_connection(self, conn: socket.socket, present: bool) -> None:
        with self._lock:
            if present:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _apply_faults(self, method: str, target: str, is_watch: bool) -> None:
        error: ApiError | None = None
        stall = 0.0
        with self._lock:
            for rule in self._fail_rules:
                if rule.matches(method, target):
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._fail_rules.remove(rule)
                    reason = rule.reason or _REASONS.get(rule.status, "InternalError")
                    message = rule.message or _DEFAULT_MESSAGES.get(rule.status, f"injected {reason}")
                    details: JsonObj = {}
                    headers: dict[str, str] = {}
                    if rule.status == 429:
                        details["retryAfterSeconds"] = 1
                        headers["Retry-After"] = "1"
                    error = ApiError(rule.status, reason, message, details, headers)
                    break
            if error is None and not is_watch:
                for stall_rule in self._stall_rules:
                    if stall_rule.path_contains is None or stall_rule.path_contains in target:
                        stall_rule.remaining -= 1
                        if stall_rule.remaining <= 0:
                            self._stall_rules.remove(stall_rule)
                        stall = stall_rule.seconds
                        break
        if error is not None:
            raise error
        if stall > 0:
            self._stop_event.wait(stall)

    def _check_forbidden(self, verb: str, resource: str, target: _Target) -> None:
        with self._lock:
            rules = self._forbidden
            hit = any(rule in rules for rule in ((verb, resource), ("*", resource), (verb, "*"), ("*", "*")))
        if not hit:
            return
        rt = target.rt
        subject = f'{rt.qualified} "{target.name}"' if target.name else rt.qualified
        scope = f'in the namespace "{target.namespace}"' if target.namespace else "at the cluster scope"
        message = (
            f'{subject} is forbidden: User "{self.forbidden_user}" cannot {verb} resource "{resource}" '
            f'in API group "{rt.group}" {scope}'
        )
        raise ApiError(403, "Forbidden", message, _details(rt, target.name))

    def _dispatch(
        self,
        method: str,
        target: str,
        content_type: str | None,
        body: bytes,
        authorization: str | None,
        conn: socket.socket | None,
        user_agent: str | None = None,
    ) -> _Reply | _WatchReply:
        split = urlsplit(target)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        segments = [unquote(s) for s in split.path.split("/") if s]
        if self.token is not None and authorization != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")
        is_watch = method == "GET" and query.get("watch", "").lower() in ("true", "1")
        self._apply_faults(method, target, is_watch)
        if segments in (["healthz"], ["livez"], ["readyz"]):
            return _Reply(200, "ok")
        discovery = self._discovery(segments)
        if discovery is not None:
            if method != "GET":
                raise _method_not_allowed()
            return _Reply(200, discovery)
        parsed = self._parse_target(segments)
        if parsed is None:
            raise _route_not_found()
        return self._serve_resource(method, parsed, query, content_type, body, conn, is_watch, user_agent)

    def _serve_resource(
        self,
        method: str,
        t: _Target,
        query: dict[str, str],
        content_type: str | None,
        body: bytes,
        conn: socket.socket | None,
        is_watch: bool,
        user_agent: str | None = None,
    ) -> _Reply | _WatchReply:
        rt = t.rt
        dry_run = "dryRun" in query
        if t.subresource == "status":
            verb = {"GET": "get", "PUT": "update", "PATCH": "patch"}.get(method)
        elif t.subresource:
            verb = {"POST": "create"}.get(method)
        elif t.name is None:  # a collection; deletecollection is not served
            verb = {"GET": "watch" if is_watch else "list", "POST": "create"}.get(method)
        else:
            verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if verb is None or (verb == "create" and rt.namespaced and t.namespace is None):
            raise _method_not_allowed()
        resource = f"{rt.plural}/{t.subresource}" if t.subresource else rt.plural
        self._check_forbidden(verb, resource, t)
        with self._lock:
            self.request_counts[
                (verb, f"{rt.qualified}/{t.subresource}" if t.subresource else rt.qualified)
            ] += 1
        manager = _field_manager(query, user_agent)
        status_sub = "status" if t.subresource == "status" else None

        if verb in ("list", "watch"):
            try:
                labels = LabelSelector.parse(query.get("labelSelector", ""))
                fields = parse_field_selector(query.get("fieldSelector", ""))
            except ValueError as exc:
                raise _bad_request(f"unable to parse requirement: {exc}") from None
            for requirement in fields:
                if requirement.path not in rt.field_labels:
                    raise _bad_request(f"field label not supported: {requirement.path}")
            if verb == "list":
                limit, token = _list_options(query)
                return _Reply(200, self._list(rt, t.namespace, labels, fields, limit=limit, token=token))
            return self._open_watch(rt, t.namespace, labels, fields, query, conn)
        if verb == "get":
            assert t.name is not None
            with self._lock:
                return _Reply(200, _as_version(rt, self._get(rt, t.namespace, t.name)))
        if verb in ("create", "update"):
            if _media_type(content_type) not in ("", "application/json", "*/*"):
                raise _unsupported_media(content_type or "", "application/json")
            parsed = _parse_json(body)
            if t.subresource == "eviction":
                assert t.name is not None
                return self._evict(t, parsed)
            if verb == "create":
                return _Reply(201, self._create(rt, t.namespace, parsed, dry_run=dry_run, manager=manager))
            assert t.name is not None
            updated = self._update(
                rt, t.namespace, t.name, parsed, dry_run=dry_run, subresource=status_sub, manager=manager
            )
            return _Reply(200, updated)
        assert t.name is not None
        if verb == "patch":
            patch_type = self._patch_type(rt, content_type)
            if patch_type == "apply":
                force = query.get("force", "").lower() in ("true", "1")
                code, applied = self._apply(
                    rt,
                    t.namespace,
                    t.name,
                    _parse_json(body),
                    manager=query.get("fieldManager"),
                    force=force,
                    subresource=status_sub,
                    dry_run=dry_run,
                )
                return _Reply(code, applied)
            patched = self._patch(
                rt,
                t.namespace,
                t.name,
                _parse_json(body),
                patch_type,
                dry_run=dry_run,
                subresource=status_sub,
                manager=manager,
            )
            return _Reply(200, patched)
        options = _parse_json(body) if body.strip() else {}
        if not isinstance(options, dict):
            raise _bad_request("DeleteOptions must be a JSON object")
        grace_text = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        try:
            grace = None if grace_text in (None, "") else float(grace_text)
        except (TypeError, ValueError):
            raise _bad_request(f"invalid gracePeriodSeconds {grace_text!r}") from None
        propagation = query.get("propagationPolicy") or options.get("propagationPolicy")
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise _bad_request(f'invalid propagationPolicy "{propagation}"')
        deleted = self._delete(
            rt,
            t.namespace,
            t.name,
            grace=grace,
            preconditions=options.get("preconditions"),
            dry_run=dry_run,
            propagation=propagation,
        )
        return _Reply(200, deleted)

    def _patch_type(
        self, rt: ResourceType, content_type: str | None
    ) -> Literal["merge", "strategic", "json", "apply"]:
        media = _media_type(content_type)
        accepted = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        types: dict[str, Literal["merge", "strategic", "json", "apply"]] = {
            "application/json-patch+json": "json",
            "application/merge-patch+json": "merge",
            "application/apply-patch+yaml": "apply",
        }
        if not rt.custom or self.strategic_merge_for_crds:
            types["application/strategic-merge-patch+json"] = "strategic"
            accepted = f"{accepted}, application/strategic-merge-patch+json"
        if media not in types:
            raise _unsupported_media(media, accepted)
        return types[media]

    def _evict(self, t: _Target, body: Any) -> _Reply:
        assert t.name is not None
        eviction = _object(body)
        meta = eviction.get("metadata") or {}
        if meta.get("name", t.name) != t.name:
            raise _bad_request("name in URL does not match name in Eviction object")
        if meta.get("namespace", t.namespace) != t.namespace:
            raise _bad_request("namespace in URL does not match namespace in Eviction object")
        options = eviction.get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise _bad_request("deleteOptions must be a JSON object")
        grace = options.get("gracePeriodSeconds")
        with self._lock:
            self._check_disruption_budgets(t.namespace or "", t.name)
            self._delete(
                PODS,
                t.namespace,
                t.name,
                grace=float(grace) if isinstance(grace, int | float) else None,
                preconditions=options.get("preconditions"),
            )
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        return _Reply(201, success)

    def _check_disruption_budgets(self, namespace: str, name: str) -> None:
        """429 when evicting the pod would break a PodDisruptionBudget of its namespace whose selector
        (matchLabels) selects it: the budget's healthy pods (Ready, not terminating) minus one must stay
        at or above minAvailable, or its unhealthy ones plus one at or below maxUnavailable (integers;
        a percentage of the pods it expects, rounded up: as many as it ever selected, so an evicted pod
        counts as disrupted until its replacement is there)."""
        pod = self._get(PODS, namespace, name)
        if "deletionTimestamp" in pod["metadata"]:
            return
        labels = pod["metadata"].get("labels") or {}
        for (pdb_namespace, pdb_name), pdb in sorted(self._bucket(POD_DISRUPTION_BUDGETS).items()):
            spec = pdb.get("spec") or {}
            match = ((spec.get("selector") or {}).get("matchLabels")) or {}
            if pdb_namespace != namespace or not match or any(labels.get(k) != v for k, v in match.items()):
                continue
            selected = [
                p
                for (ns, _), p in self._bucket(PODS).items()
                if ns == namespace
                and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in match.items())
            ]
            # the pods it expects: as many as it ever selected (an evicted pod's replacement is due)
            expected = max(len(selected), self._pdb_expected.get((pdb_namespace, pdb_name), 0))
            self._pdb_expected[(pdb_namespace, pdb_name)] = expected
            healthy = sum(1 for p in selected if pod_ready(p))
            if "minAvailable" in spec:
                allowed = healthy - _budget(spec["minAvailable"], expected)
            else:
                allowed = _budget(spec.get("maxUnavailable", 0), expected) - (expected - healthy)
            if allowed < 1:
                raise ApiError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb_name} needs "
                                f"{healthy - allowed} healthy pods and has {healthy} currently",
                            }
                        ]
                    },
                )

    def _open_watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: tuple[FieldRequirement, ...],
        query: dict[str, str],
        conn: socket.socket | None,
    ) -> _WatchReply:
        timeout = self.max_watch_timeout
        if query.get("timeoutSeconds"):
            try:
                asked = int(query["timeoutSeconds"])
            except ValueError:
                raise _bad_request(f"invalid timeoutSeconds {query['timeoutSeconds']!r}") from None
            if asked > 0:
                timeout = min(float(asked), timeout)
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        since = query.get("resourceVersion", "")
        w = _Watch(rt, namespace, labels, fields, conn)
        with self._lock:
            if since in ("", "0"):
                for _, obj in sorted(self._bucket(rt).items()):
                    w.pending.append(WatchEvent(int(_rv_of(obj)), "ADDED", rt.key, obj, None))
            else:
                try:
                    start = int(since)
                except ValueError:
                    raise _bad_request(f"invalid resourceVersion {since!r}") from None
                if start < self._horizon:
                    expired = status_body(
                        410, "Expired", f"too old resource version: {start} ({self._horizon})"
                    )
                    return _WatchReply(None, timeout, bookmarks, {"type": "ERROR", "object": expired})
                w.pending.extend(e for e in self._events if e.rv > start and e.resource == rt.key)
            self._watches.append(w)
            self.watches_opened += 1
            self._changed()
        return _WatchReply(w, timeout, bookmarks)

    def _serve_watch(self, h: _Handler, reply: _WatchReply) -> None:
        if reply.watch is None:
            h.start_chunked()
            h.write_chunk(reply.error)
            h.end_chunked()
            return
        w = reply.watch
        now = time.monotonic()
        deadline = now + reply.timeout
        interval = self.bookmark_interval if reply.bookmarks else None
        next_bookmark = now + interval if interval else math.inf
        started = False
        try:
            while True:
                end: str | None = None
                bookmark: int | None = None
                with self._cond:
                    while True:
                        if self._stopping:
                            end = "stop"
                            break
                        if w.dropped:
                            end = "drop"
                            break
                        now = time.monotonic()
                        if not self._watches_stalled:
                            if not started or w.pending:
                                break
                            if now >= deadline:
                                end = "timeout"
                                break
                            if now >= next_bookmark and interval:
                                bookmark = self._rv
                                next_bookmark = now + interval
                                break
                            self._cond.wait(max(0.001, min(deadline - now, next_bookmark - now, 1.0)))
                        else:
                            self._cond.wait(1.0)  # stall_watches(False) and stop() notify
                    batch = list(w.pending)
                    w.pending.clear()
                if end == "drop":
                    h.close_connection = True
                    if w.conn is not None:
                        with contextlib.suppress(OSError):
                            w.conn.shutdown(socket.SHUT_RDWR)
                    return
                if not started:
                    h.start_chunked()
                    started = True
                if end is not None:
                    h.end_chunked()
                    if end == "stop":
                        h.close_connection = True
                    return
                for event in batch:
                    out = w.translate(event)
                    if out is not None:
                        h.write_chunk(out)
                if bookmark is not None:
                    marker = {"kind": w.rt.kind, "apiVersion": w.rt.api_version}
                    h.write_chunk(
                        {
                            "type": "BOOKMARK",
                            "object": {**marker, "metadata": {"resourceVersion": str(bookmark)}},
                        }
                    )
        except OSError:
            h.close_connection = True
        finally:
            with self._cond:
                if w in self._watches:
                    self._watches.remove(w)
                self._changed()

    def _groups(self) -> dict[str, list[str]]:
        """Every API group (not the core one) and its versions, the preferred first."""
        versions: dict[str, set[str]] = {"policy": {"v1"}}
        for group, version, _ in self._types:
            if group:
                versions.setdefault(group, set()).add(version)
        return {g: sorted(v, key=_version_priority) for g, v in sorted(versions.items())}

    def _discovery(self, segments: list[str]) -> JsonObj | None:
        def group_version(group: str, version: str) -> JsonObj:
            return {"groupVersion": f"{group}/{version}", "version": version}

        with self._lock:
            groups = self._groups()
            types = list(self._types.values())

        def api_group(name: str) -> JsonObj:
            listed = [group_version(name, v) for v in groups[name]]
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": name,
                "versions": listed,
                "preferredVersion": listed[0],
            }

        def resource(rt: ResourceType, verbs: list[str]) -> JsonObj:
            entry: JsonObj = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": verbs,
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            return entry

        def resources(group: str, version: str) -> list[JsonObj]:
            found: list[JsonObj] = []
            for rt in sorted(types, key=lambda r: r.plural):
                if (rt.group, rt.version) != (group, version):
                    continue
                found.append(resource(rt, crud))
                if rt.status:
                    found.append(
                        {
                            "name": f"{rt.plural}/status",
                            "singularName": "",
                            "namespaced": rt.namespaced,
                            "kind": rt.kind,
                            "verbs": ["get", "patch", "update"],
                        }
                    )
            return found

        crud = ["create", "delete", "get", "list", "patch", "update", "watch"]
        match segments:
            case ["version"]:
                return {
                    "major": "1",
                    "minor": "31",
                    "gitVersion": GIT_VERSION,
                    "gitCommit": "0" * 40,
                    "gitTreeState": "clean",
                    "buildDate": "2024-08-13T00:00:00Z",
                    "goVersion": "go1.22.5",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                }
            case ["api"]:
                address = f"127.0.0.1:{self.port}" if self._httpd is not None else ""
                return {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
                }
            case ["api", "v1"]:
                eviction = {
                    "name": "pods/eviction",
                    "singularName": "",
                    "namespaced": True,
                    "group": "policy",
                    "version": "v1",
                    "kind": "Eviction",
                    "verbs": ["create"],
                }
                return {
                    "kind": "APIResourceList",
                    "groupVersion": "v1",
                    "resources": [*resources("", "v1"), eviction],
                }
            case ["apis"]:
                return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(g) for g in groups]}
            case ["apis", group] if group in groups:
                return api_group(group)
            case ["apis", group, version] if version in groups.get(group, []):
                return {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": f"{group}/{version}",
                    "resources": resources(group, version),
                }
        return None

    def _parse_target(self, segments: list[str]) -> _Target | None:
        if segments[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segments[2:]
        elif len(segments) >= 3 and segments[0] == "apis":
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            return None
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            return None
        with self._lock:
            rt = self._types.get((group, version, rest[0]))
        if rt is None:
            return None
        if namespace is not None and not rt.namespaced:
            return None  # a cluster-scoped resource under a namespace
        if namespace is None and rt.namespaced and len(rest) > 1:
            return None  # a namespaced object needs its namespace
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource is not None and not (
            (rt is PODS and subresource == "eviction") or (rt.status and subresource == "status")
        ):
            return None
        return _Target(rt, namespace, name, subresource)


def _version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order: GA before beta before alpha, higher numbers first, others last."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), version)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        super().__init__(("127.0.0.1", api.requested_port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away is no news; never print tracebacks to stderr


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpunode-fake-apiserver"
    sys_version = ""
    _record_for: tuple[str, str, dict[str, str], str | None] | None = None

    @property
    def api(self) -> FakeApiServer:
        return cast(_HttpServer, self.server).api

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle meets delayed ACKs (40 ms each).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.api._register_connection(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.api._register_connection(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_response(self, code: int, message: str | None = None) -> None:
        method, path, query, content_type = self._record_for or (
            getattr(self, "command", "") or "",
            "",
            {},
            None,
        )
        self.api._record(RequestRecord(method, path, query, content_type, code))
        super().send_response(code, message)

    def _handle(self) -> None:
        split = urlsplit(self.path)
        content_type = self.headers.get("Content-Type")
        self._record_for = (
            self.command,
            unquote(split.path),
            dict(parse_qsl(split.query, keep_blank_values=True)),
            content_type,
        )
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        try:
            reply = self.api._dispatch(
                self.command,
                self.path,
                content_type,
                body,
                self.headers.get("Authorization"),
                self.connection,
                self.headers.get("User-Agent"),
            )
        except ApiError as err:
            reply = _Reply(err.code, err.status(), err.headers)
        except Exception as exc:  # a bug in the fake must not kill the connection silently
            reply = _Reply(500, status_body(500, "InternalError", f"fake apiserver: {exc!r}"))
        try:
            if isinstance(reply, _WatchReply):
                self.api._serve_watch(self, reply)
            else:
                self._send(reply)
        except OSError:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length))
        if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            return b""
        parts: list[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _send(self, reply: _Reply) -> None:
        if isinstance(reply.body, str):
            data, content_type = reply.body.encode(), "text/plain; charset=utf-8"
        else:
            data, content_type = json.dumps(reply.body, separators=(",", ":")).encode(), "application/json"
        self.send_response(reply.status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def start_chunked(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

    def write_chunk(self, event: JsonObj | None) -> None:
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

"""A fake Kubernetes API server: the real REST and watch wire protocol over HTTP/1.1 on 127.0.0.1.

Tests, the demo and benchmarks start one (`with FakeApiServer() as api:`), write a kubeconfig pointing at
it (`api.write_kubeconfig(path)`) and run real clients against it: the agents as separate processes,
lightkube's AsyncClient, plain urllib. It serves what our agents touch: Nodes, Pods (with the eviction
subresource) and NFD NodeFeatures, plus just enough discovery (`/version`, `/api`, `/apis`, ...) for
clients that look before they leap.

What it does the way the real apiserver does:
- GET, LIST (label and field selectors), POST (201, 409 AlreadyExists), PUT (409 Conflict on a stale
  resourceVersion), PATCH (merge, strategic merge, JSON patch; a patch that changes nothing writes
  nothing), DELETE, and eviction; every error body is a `Status` with the real reason, code and message.
- One global resourceVersion; every write bumps it and is recorded for watchers. Watches send the
  current objects as ADDED (no resourceVersion or "0") or replay history after a resourceVersion, then
  stream live changes as newline-delimited JSON in HTTP chunks. A resourceVersion older than the
  retained history (or than `compact()`) gets one ERROR event with a 410 Expired Status. An object that
  starts or stops matching a watch's selectors arrives as ADDED or DELETED.
- A DaemonSet controller in miniature (`add_daemonset`) that places and removes pods as node labels
  change, and an optional pod deletion delay (`pod_deletion_delay`) during which a deleted pod is
  terminating (metadata.deletionTimestamp set) before it goes.
- Fault injection: failing or stalling the next requests, 403 for chosen verbs, dropping or stalling
  watch streams, forgetting history.

What it deliberately does not do: admission (no defaulting beyond uid/timestamps/resourceVersion and a
Pending phase for new pods, no validation beyond names), authentication or authorization beyond one
optional bearer token and `forbid()`, server-side apply (415), pagination (`limit`/`continue` are
ignored: every list is complete), Namespace objects (any namespace exists), finalizers, status as a
separate subresource (writes to the main resource may change status), list merging by key in strategic
merge patches (lists are replaced whole), protobuf, and resources other than the ones above.

Standard library only (and `gpunode.kube.selectors`, the label-selector parser the agents use, itself
standard library only): a `ThreadingHTTPServer` whose handler threads share one lock and condition.
"""

from __future__ import annotations

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
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from gpunode.kube.selectors import LabelSelector

JsonObj = dict[str, Any]

GIT_VERSION = "v1.31.0-gpunode-fake"
DEFAULT_USER = "system:serviceaccount:gpu-operator:gpunode"
NFD_GROUP = "nfd.k8s-sigs.io"
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses for generateName
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


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
)
RESOURCES: dict[str, ResourceType] = {r.plural: r for r in (NODES, PODS, NODE_FEATURES)}


def resource_type(kind: str) -> ResourceType:
    """`nodes`, `node`, `Node`, `pods`, `NodeFeature`, ... -> its ResourceType."""
    wanted = kind.lower()
    for rt in RESOURCES.values():
        if wanted in (rt.plural, rt.singular, rt.kind.lower()):
            return rt
    raise ValueError(f"unknown resource {kind!r}; known: {', '.join(RESOURCES)}")


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


# -- selectors -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    op: Literal["=", "!="]
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = _field_value(obj, self.path)
        return (actual == self.value) == (self.op == "=")


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    current: Any = obj
    for part in path.split("."):
        current = current.get(part) if isinstance(current, Mapping) else None
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def parse_field_selector(text: str) -> tuple[FieldRequirement, ...]:
    """Parse a field selector (`metadata.name=n1,spec.nodeName!=n2`); raise ValueError when malformed."""
    if not text.strip():
        return ()
    requirements: list[FieldRequirement] = []
    for term in text.split(","):
        m = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*([^=!]*?)\s*", term)
        if not m:
            raise ValueError(f"invalid field selector term {term!r}")
        op: Literal["=", "!="] = "!=" if m.group(2) == "!=" else "="
        requirements.append(FieldRequirement(m.group(1), op, m.group(3)))
    return tuple(requirements)


# -- patches ---------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: null deletes a key, objects merge recursively, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_DELETE = object()


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch as far as maps go: a merge patch that also honours `$patch: delete` and
    `$patch: replace` and ignores the other `$` directives. Lists are replaced whole (the real one merges
    some lists by key)."""
    result = _strategic(target, patch)
    return {} if result is _DELETE else result


def _strategic(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    plain = {k: v for k, v in patch.items() if not k.startswith("$")}
    if directive == "replace":
        return copy.deepcopy(plain)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in plain.items():
        merged = None if value is None else _strategic(result.get(key), value)
        if merged is None or merged is _DELETE:
            result.pop(key, None)
        else:
            result[key] = merged
    return result


class PatchError(ValueError):
    pass


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _index(token: str, length: int, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not re.fullmatch(r"0|[1-9][0-9]*", token):
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > length or (index == length and not allow_end):
        raise PatchError(f"array index {index} out of range")
    return index


def _walk(doc: Any, tokens: list[str]) -> Any:
    current = doc
    for token in tokens:
        if isinstance(current, dict):
            if token not in current:
                raise PatchError(f"missing key {token!r}")
            current = current[token]
        elif isinstance(current, list):
            current = current[_index(token, len(current), allow_end=False)]
        else:
            raise PatchError(f"cannot descend into {token!r}")
    return current


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), allow_end=True), value)
    else:
        raise PatchError(f"cannot add at {last!r}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"missing key {last!r}")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(last, len(parent), allow_end=False))
    raise PatchError(f"cannot remove {last!r}")


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); raise PatchError when one fails."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    result = copy.deepcopy(doc)
    for operation in operations:
        if not isinstance(operation, dict):
            raise PatchError(f"invalid operation {operation!r}")
        op = operation.get("op")
        tokens = _pointer(operation.get("path"))
        if op in ("add", "replace", "test") and "value" not in operation:
            raise PatchError(f"{op} needs a value")
        if op == "add":
            result = _add(result, tokens, copy.deepcopy(operation["value"]))
        elif op == "remove":
            _remove(result, tokens)
        elif op == "replace":
            if tokens:
                _remove(result, tokens)
            result = _add(result, tokens, copy.deepcopy(operation["value"]))
        elif op == "test":
            if _walk(result, tokens) != operation["value"]:
                raise PatchError(f"test failed at {operation.get('path')!r}")
        elif op in ("move", "copy"):
            source = _pointer(operation.get("from"))
            value = _remove(result, source) if op == "move" else copy.deepcopy(_walk(result, source))
            result = _add(result, tokens, value)
        else:
            raise PatchError(f"unknown operation {op!r}")
    return result


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


@dataclass
class _DaemonSet:
    namespace: str
    name: str
    uid: str
    node_selector: dict[str, str]
    pod_labels: dict[str, str]
    recreate: bool
    created: str
    placed: set[str] = field(default_factory=set)


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
            return {"type": event.type, "object": event.obj} if now else None
        before = event.old is not None and self.visible(event.old)
        if now:
            return {"type": "MODIFIED" if before else "ADDED", "object": event.obj}
        if before and event.old is not None:
            gone = copy.deepcopy(event.old)
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
        self.bookmark_interval: float | None = None  # seconds between BOOKMARKs where a watch allows them
        self.max_watch_timeout = 1800.0  # watches without timeoutSeconds end after this long
        self.forbidden_user = DEFAULT_USER  # the user named in 403 messages
        # The real apiserver answers 415 to strategic merge patches of custom resources; set True to accept.
        self.strategic_merge_for_crds = False
        self.requests: list[RequestRecord] = []
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._store: dict[str, dict[tuple[str, str], JsonObj]] = {plural: {} for plural in RESOURCES}
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
        self._daemonsets: dict[tuple[str, str], _DaemonSet] = {}
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

    def objects(self, kind: str, namespace: str | None = None) -> list[JsonObj]:
        rt = resource_type(kind)
        with self._lock:
            found = [o for k, o in sorted(self._store[rt.plural].items()) if namespace in (None, k[0])]
            return copy.deepcopy(found)

    def get(self, kind: str, name: str, namespace: str | None = None) -> JsonObj | None:
        rt = resource_type(kind)
        key = ((namespace or "default") if rt.namespaced else "", name)
        with self._lock:
            obj = self._store[rt.plural].get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def create(self, kind: str, obj: JsonObj) -> JsonObj:
        return copy.deepcopy(self._create(resource_type(kind), None, obj))

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete as a client would (pods honour `pod_deletion_delay`); ApiError 404 when absent."""
        rt = resource_type(kind)
        self._delete(rt, (namespace or "default") if rt.namespaced else None, name)

    def add_daemonset(
        self,
        namespace: str,
        name: str,
        node_selector: dict[str, str],
        pod_labels: dict[str, str],
        *,
        recreate: bool = True,
    ) -> JsonObj:
        """Play the DaemonSet controller for one DaemonSet.

        A node whose labels hold every node_selector pair gets one pod `<name>-<5 chars>` once no pod of
        this DaemonSet (terminating ones included) is on it; a node that stops matching loses its pods
        (honouring `pod_deletion_delay`). With recreate=False a node gets a pod only the first time it
        matches: a pod deleted or evicted later is not replaced."""
        with self._lock:
            if (namespace, name) in self._daemonsets:
                raise ApiError(409, "AlreadyExists", f'daemonsets.apps "{name}" already exists')
            ds = _DaemonSet(
                namespace, name, str(uuid.uuid4()), dict(node_selector), dict(pod_labels), recreate, _now()
            )
            self._daemonsets[(namespace, name)] = ds
            self._reconcile_daemonsets()
            return self._daemonset_object(ds)

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

    # -- store primitives (callers hold the lock) --------------------------------------------------------

    def _emit(
        self,
        kind: Literal["ADDED", "MODIFIED", "DELETED"],
        rt: ResourceType,
        obj: JsonObj,
        old: JsonObj | None,
    ) -> None:
        event = WatchEvent(self._rv, kind, rt.plural, obj, old)
        if self.history > 0:
            if len(self._events) >= self.history:
                self._horizon = self._events.popleft().rv
            self._events.append(event)
        else:
            self._horizon = event.rv
        for w in self._watches:
            if w.rt is rt:
                w.pending.append(event)
        self._changed()

    def _changed(self) -> None:
        self._changes += 1
        self._cond.notify_all()

    def _store_object(self, rt: ResourceType, obj: JsonObj, old: JsonObj | None) -> JsonObj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._store[rt.plural][_key(obj)] = obj
        self._emit("ADDED" if old is None else "MODIFIED", rt, obj, old)
        return obj

    def _remove_object(self, rt: ResourceType, key: tuple[str, str]) -> JsonObj:
        old = self._store[rt.plural].pop(key)
        self._rv += 1
        final = copy.deepcopy(old)
        final["metadata"]["resourceVersion"] = str(self._rv)
        self._emit("DELETED", rt, final, old)
        if rt is PODS:
            self._pending_deletions.pop(key, None)
            owners = {ref.get("uid") for ref in final["metadata"].get("ownerReferences") or []}
            if any(ds.uid in owners for ds in self._daemonsets.values()):
                self._reconcile_daemonsets((final.get("spec") or {}).get("nodeName"))
        elif rt is NODES:
            self._reconcile_daemonsets(key[1])
        return final

    def _get(self, rt: ResourceType, namespace: str | None, name: str) -> JsonObj:
        obj = self._store[rt.plural].get((namespace or "", name))
        if obj is None:
            raise _not_found(rt, name)
        return obj

    # -- verbs ---------------------------------------------------------------------------------------

    def _create(
        self, rt: ResourceType, namespace: str | None, body: Any, *, dry_run: bool = False
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
        for transient in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(transient, None)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        if rt is PODS:
            status = obj.get("status")
            if not isinstance(status, dict):
                obj["status"] = status = {}
            status.setdefault("phase", "Pending")
        with self._lock:
            if (meta.get("namespace") or "", name) in self._store[rt.plural]:
                raise _already_exists(rt, name)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            if dry_run:
                return obj
            self._store_object(rt, obj, None)
            if rt is NODES:
                self._reconcile_daemonsets(name)
            return obj

    def _update(
        self, rt: ResourceType, namespace: str | None, name: str, body: Any, *, dry_run: bool = False
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
            return self._commit(rt, old, new, dry_run=dry_run)

    def _commit(self, rt: ResourceType, old: JsonObj, new: JsonObj, *, dry_run: bool) -> JsonObj:
        """Store `new` in place of `old`, keeping what a client cannot change; a no-op writes nothing."""
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        meta = new.setdefault("metadata", {})
        for kept in _KEPT_ON_WRITE:
            if kept in old["metadata"]:
                meta[kept] = old["metadata"][kept]
            else:
                meta.pop(kept, None)
        if new == old or dry_run:
            return new
        self._store_object(rt, new, old)
        if rt is NODES:
            self._reconcile_daemonsets(meta["name"])
        return new

    def _patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        patch_type: Literal["merge", "strategic", "json"],
        *,
        dry_run: bool = False,
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
            return self._commit(rt, old, new, dry_run=dry_run)

    def _delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        grace: float | None = None,
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
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
            return self._remove_object(rt, _key(old))

    def _list(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: tuple[FieldRequirement, ...],
    ) -> JsonObj:
        probe = _Watch(rt, namespace, labels, fields, None)
        with self._lock:
            items = [obj for _, obj in sorted(self._store[rt.plural].items()) if probe.visible(obj)]
            return {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }

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

    def _reconcile_daemonsets(self, node_name: str | None = None) -> None:
        if self._reconciling or not self._daemonsets:
            return
        self._reconciling = True
        try:
            names = [node_name] if node_name else [key[1] for key in sorted(self._store["nodes"])]
            for ds in list(self._daemonsets.values()):
                for name in names:
                    self._reconcile_node(ds, name)
        finally:
            self._reconciling = False

    def _daemon_pods(self, ds: _DaemonSet, node_name: str) -> list[JsonObj]:
        return [
            pod
            for (namespace, _), pod in sorted(self._store["pods"].items())
            if namespace == ds.namespace
            and (pod.get("spec") or {}).get("nodeName") == node_name
            and any(ref.get("uid") == ds.uid for ref in pod["metadata"].get("ownerReferences") or [])
        ]

    def _reconcile_node(self, ds: _DaemonSet, node_name: str) -> None:
        node = self._store["nodes"].get(("", node_name))
        labels = (node or {}).get("metadata", {}).get("labels") or {}
        matches = node is not None and all(labels.get(k) == v for k, v in ds.node_selector.items())
        pods = self._daemon_pods(ds, node_name)
        if not matches:
            for pod in pods:
                if "deletionTimestamp" not in pod["metadata"]:
                    self._delete(PODS, ds.namespace, pod["metadata"]["name"])
            return
        if pods or (not ds.recreate and node_name in ds.placed):
            return
        ds.placed.add(node_name)
        while True:
            pod_name = f"{ds.name}-{_suffix()}"
            if (ds.namespace, pod_name) not in self._store["pods"]:
                break
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ds.namespace,
                "labels": dict(ds.pod_labels),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": ds.name,
                        "uid": ds.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node_name,
                "nodeSelector": dict(ds.node_selector),
                "containers": [{"name": ds.name, "image": "registry.k8s.io/pause:3.9"}],
            },
            "status": {"phase": "Running"},
        }
        self._create(PODS, ds.namespace, pod)

    def _daemonset_object(self, ds: _DaemonSet) -> JsonObj:
        matching = [
            name
            for (_, name), node in sorted(self._store["nodes"].items())
            if all((node["metadata"].get("labels") or {}).get(k) == v for k, v in ds.node_selector.items())
        ]
        scheduled = [name for name in matching if self._daemon_pods(ds, name)]
        ready = sum(
            1
            for name in matching
            for pod in self._daemon_pods(ds, name)
            if "deletionTimestamp" not in pod["metadata"]
            and (pod.get("status") or {}).get("phase") == "Running"
        )
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {
                "name": ds.name,
                "namespace": ds.namespace,
                "uid": ds.uid,
                "generation": 1,
                "creationTimestamp": ds.created,
                "resourceVersion": str(self._rv),
            },
            "spec": {
                "selector": {"matchLabels": dict(ds.pod_labels)},
                "template": {
                    "metadata": {"labels": dict(ds.pod_labels)},
                    "spec": {
                        "nodeSelector": dict(ds.node_selector),
                        "containers": [{"name": ds.name, "image": "registry.k8s.io/pause:3.9"}],
                    },
                },
            },
            "status": {
                "desiredNumberScheduled": len(matching),
                "currentNumberScheduled": len(scheduled),
                "updatedNumberScheduled": len(scheduled),
                "numberReady": ready,
                "numberAvailable": ready,
                "numberMisscheduled": 0,
                "observedGeneration": 1,
            },
        }

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
        if (
            len(segments) == 7
            and segments[:4] == ["apis", "apps", "v1", "namespaces"]
            and segments[5] == "daemonsets"
        ):
            if method != "GET":
                raise _method_not_allowed()
            with self._lock:
                ds = self._daemonsets.get((segments[4], segments[6]))
                if ds is None:
                    raise ApiError(
                        404,
                        "NotFound",
                        f'daemonsets.apps "{segments[6]}" not found',
                        {"name": segments[6], "group": "apps", "kind": "daemonsets"},
                    )
                return _Reply(200, self._daemonset_object(ds))
        parsed = _parse_target(segments)
        if parsed is None:
            raise _route_not_found()
        return self._serve_resource(method, parsed, query, content_type, body, conn, is_watch)

    def _serve_resource(
        self,
        method: str,
        t: _Target,
        query: dict[str, str],
        content_type: str | None,
        body: bytes,
        conn: socket.socket | None,
        is_watch: bool,
    ) -> _Reply | _WatchReply:
        rt = t.rt
        dry_run = "dryRun" in query
        if t.subresource:
            verb = {"POST": "create"}.get(method)
        elif t.name is None:  # a collection; deletecollection is not served
            verb = {"GET": "watch" if is_watch else "list", "POST": "create"}.get(method)
        else:
            verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if verb is None or (verb == "create" and rt.namespaced and t.namespace is None):
            raise _method_not_allowed()
        resource = f"{rt.plural}/{t.subresource}" if t.subresource else rt.plural
        self._check_forbidden(verb, resource, t)

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
                return _Reply(200, self._list(rt, t.namespace, labels, fields))
            return self._open_watch(rt, t.namespace, labels, fields, query, conn)
        if verb == "get":
            assert t.name is not None
            with self._lock:
                return _Reply(200, self._get(rt, t.namespace, t.name))
        if verb in ("create", "update"):
            if _media_type(content_type) not in ("", "application/json", "*/*"):
                raise _unsupported_media(content_type or "", "application/json")
            parsed = _parse_json(body)
            if t.subresource == "eviction":
                assert t.name is not None
                return self._evict(t, parsed)
            if verb == "create":
                return _Reply(201, self._create(rt, t.namespace, parsed, dry_run=dry_run))
            assert t.name is not None
            return _Reply(200, self._update(rt, t.namespace, t.name, parsed, dry_run=dry_run))
        assert t.name is not None
        if verb == "patch":
            patch_type = self._patch_type(rt, content_type)
            return _Reply(
                200, self._patch(rt, t.namespace, t.name, _parse_json(body), patch_type, dry_run=dry_run)
            )
        options = _parse_json(body) if body.strip() else {}
        if not isinstance(options, dict):
            raise _bad_request("DeleteOptions must be a JSON object")
        grace_text = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        try:
            grace = None if grace_text in (None, "") else float(grace_text)
        except (TypeError, ValueError):
            raise _bad_request(f"invalid gracePeriodSeconds {grace_text!r}") from None
        deleted = self._delete(
            rt, t.namespace, t.name, grace=grace, preconditions=options.get("preconditions"), dry_run=dry_run
        )
        return _Reply(200, deleted)

    def _patch_type(
        self, rt: ResourceType, content_type: str | None
    ) -> Literal["merge", "strategic", "json"]:
        media = _media_type(content_type)
        accepted = "application/json-patch+json, application/merge-patch+json"
        if rt.group and not self.strategic_merge_for_crds:
            if media == "application/json-patch+json":
                return "json"
            if media == "application/merge-patch+json":
                return "merge"
            raise _unsupported_media(media, accepted)
        types: dict[str, Literal["merge", "strategic", "json"]] = {
            "application/merge-patch+json": "merge",
            "application/strategic-merge-patch+json": "strategic",
            "application/json-patch+json": "json",
        }
        if media not in types:
            raise _unsupported_media(media, f"{accepted}, application/strategic-merge-patch+json")
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
        self._delete(
            PODS,
            t.namespace,
            t.name,
            grace=float(grace) if isinstance(grace, int | float) else None,
            preconditions=options.get("preconditions"),
        )
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        return _Reply(201, success)

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
                for _, obj in sorted(self._store[rt.plural].items()):
                    w.pending.append(WatchEvent(int(_rv_of(obj)), "ADDED", rt.plural, obj, None))
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
                w.pending.extend(e for e in self._events if e.rv > start and e.resource == rt.plural)
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

    def _discovery(self, segments: list[str]) -> JsonObj | None:
        def group_version(group: str, version: str) -> JsonObj:
            return {"groupVersion": f"{group}/{version}", "version": version}

        groups = {"apps": "v1", "policy": "v1", NFD_GROUP: "v1alpha1"}

        def api_group(name: str) -> JsonObj:
            gv = group_version(name, groups[name])
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": name,
                "versions": [gv],
                "preferredVersion": gv,
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
            return entry

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
                    "resources": [resource(NODES, crud), resource(PODS, crud), eviction],
                }
            case ["apis"]:
                return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(g) for g in groups]}
            case ["apis", group] if group in groups:
                return api_group(group)
            case ["apis", group, version] if groups.get(group) == version:
                resources: list[JsonObj] = []
                if group == NFD_GROUP:
                    resources = [resource(NODE_FEATURES, crud)]
                elif group == "apps":
                    resources = [
                        {
                            "name": "daemonsets",
                            "singularName": "daemonset",
                            "namespaced": True,
                            "kind": "DaemonSet",
                            "verbs": ["get"],
                            "shortNames": ["ds"],
                        }
                    ]
                return {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": f"{group}/{version}",
                    "resources": resources,
                }
        return None


def _parse_target(segments: list[str]) -> _Target | None:
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
    rt = RESOURCES.get(rest[0])
    if rt is None or (rt.group, rt.version) != (group, version):
        return None
    if namespace is not None and not rt.namespaced:
        return None  # a cluster-scoped resource under a namespace
    if namespace is None and rt.namespaced and len(rest) > 1:
        return None  # a namespaced object needs its namespace
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if subresource is not None and (rt is not PODS or subresource != "eviction"):
        return None
    return _Target(rt, namespace, name, subresource)


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

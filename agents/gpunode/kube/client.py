"""The Kubernetes API for every agent: the only module that imports the client (lightkube, httpx2).

Agents talk to the API server about their own node and little else: read and merge-patch its labels and
annotations, watch it, cordon it, list / delete / evict the pods on it, and keep one NodeFeature object.
Cluster-wide callers (the operator) also list and watch every node as a slim
:class:`~gpunode.kube.cluster.NodeSummary` (decoded straight into a few fields, the rest of each Node skipped
unread, a page of ``NODE_PAGE`` nodes a request, label keys and values interned so thousands of cached nodes
share them) and merge-patch any node's labels and annotations with optimistic locking; for the objects it
owns, any kind of :func:`~gpunode.kube.cluster.resource_kind` as plain JSON: server-side apply (field manager
``gpunode-operator``), get / list / watch / delete, the ``status`` subresource, a DaemonSet with its pods
(slim: what readiness reads) and ControllerRevisions, and Leases for leader election
(:meth:`Kube.connect_cluster`: no own node).
:class:`Kube` does exactly that and hands back the small frozen dataclasses of :mod:`gpunode.kube.api`
(:class:`~gpunode.kube.api.NodeInfo`, :class:`~gpunode.kube.api.PodInfo`), so no other module sees a
lightkube type and swapping the client stays a one-file change (DESIGN.md, library choices).

Every call has a timeout, and calls that fail for transient reasons (connection refused or reset, a
timeout, HTTP 429 / 5xx) are retried with exponential backoff and full jitter. What still fails becomes
a :class:`~gpunode.kube.api.KubeError` carrying the HTTP status; 403 becomes
:class:`~gpunode.kube.api.KubeForbidden`, whose message names the verb and resource to grant.
:attr:`Kube.available` tells readiness checks whether the API server answered the last call.

Import this module only where the API is used: lightkube costs start-up time and memory that an agent
running without Kubernetes should not pay. Types and errors come from :mod:`gpunode.kube.api`, which
costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, cast

# lightkube asks for httpx2[http2], and httpcore then imports the HTTP/2 stack (about 1.5 MB) although
# we never speak HTTP/2 to the API server (AsyncClient(http2=False)); keep it out unless already loaded.
sys.modules.setdefault("h2", None)  # type: ignore[arg-type]

import httpx2
import msgspec
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError, NotReadyError
from lightkube.core.exceptions import ConfigError as LightkubeConfigError
from lightkube.core.resource import ApiInfo, GlobalResource, NamespacedResource, ResourceDef
from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericGlobalStatus,
    GenericNamespacedResource,
    GenericNamespacedStatus,
    create_namespaced_resource,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import CascadeType, PatchType

from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.logging import get_logger
from gpunode.common.safeyaml import parse_yaml, read_config_text
from gpunode.kube.api import (
    NODE_FEATURE_GROUP,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubeUnavailable,
    NodeInfo,
    OwnerRef,
    PodInfo,
    require_node_name,
)
from gpunode.kube.cluster import (
    CONTROLLER_REVISION,
    DAEMON_SET,
    LEASE,
    OPERATOR_FIELD_MANAGER,
    POD,
    LeaseRecord,
    NodeEvent,
    NodeSummary,
    ObjectEvent,
    ResourceKind,
    resource_kind,
)

__all__ = ["SERVICE_ACCOUNT_DIR", "Kube", "NodeFeature", "load_kubeconfig"]

T = TypeVar("T")
_Change = Literal["ADDED", "MODIFIED", "DELETED"]

NodeFeature = create_namespaced_resource(NODE_FEATURE_GROUP, "v1alpha1", "NodeFeature", "nodefeatures")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
# Nodes a list request asks for: real nodes are 10-50 KB of JSON (images, conditions, labels), so a page
# of 100 is a few MB in memory at once; 5,000 nodes of 15 KB read in pages of 500 left about 7 MB more
# resident than pages of 100 (the allocator keeps what the bigger answers fragmented).
NODE_PAGE = 100


# -- the slim Node: only these fields are decoded, the rest of each object is skipped ---------------------
class _SlimMeta(msgspec.Struct):
    name: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    resourceVersion: str | None = None


class _SlimSpec(msgspec.Struct):
    unschedulable: bool | None = None


class _SlimCondition(msgspec.Struct):
    type: str = ""
    status: str = ""


class _SlimStatus(msgspec.Struct):
    conditions: list[_SlimCondition] | None = None


class _SlimNode(GlobalResource, msgspec.Struct):
    """``/api/v1/nodes`` decoded into :class:`NodeSummary`'s fields only (lightkube decodes msgspec
    structs directly from the response bytes, skipping unknown fields)."""

    _api_info: ClassVar[ApiInfo] = Node._api_info  # type: ignore[misc]
    metadata: _SlimMeta | None = None
    spec: _SlimSpec | None = None
    status: _SlimStatus | None = None


# -- the slim Pod: what DaemonSet readiness reads of each pod (a DaemonSet on every node of a large cluster
# has thousands, each a few KB of JSON, most of it the pod spec) ------------------------------------------
class _SlimOwnerRef(msgspec.Struct, omit_defaults=True):
    apiVersion: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class _SlimPodMeta(msgspec.Struct, omit_defaults=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] | None = None
    ownerReferences: list[_SlimOwnerRef] | None = None
    deletionTimestamp: str | None = None


class _SlimPodSpec(msgspec.Struct, omit_defaults=True):
    nodeName: str | None = None


class _SlimContainerStatus(msgspec.Struct, omit_defaults=True):
    name: str = ""
    ready: bool | None = None


class _SlimPodCondition(msgspec.Struct, omit_defaults=True):
    type: str = ""
    status: str = ""


class _SlimPodStatus(msgspec.Struct, omit_defaults=True):
    phase: str | None = None
    conditions: list[_SlimPodCondition] | None = None
    containerStatuses: list[_SlimContainerStatus] | None = None


class _SlimPod(NamespacedResource, msgspec.Struct, omit_defaults=True):
    """``/api/v1/.../pods`` decoded into the fields above only; handed on as JSON of that shape."""

    _api_info: ClassVar[ApiInfo] = Pod._api_info  # type: ignore[misc]
    metadata: _SlimPodMeta | None = None
    spec: _SlimPodSpec | None = None
    status: _SlimPodStatus | None = None


# Pods a list request asks for when only their slim form is kept (a few KB of JSON each).
POD_PAGE = 250


# -- configuration ---------------------------------------------------------------------------------------
def load_kubeconfig(path: str | None, *, service_account: str = SERVICE_ACCOUNT_DIR) -> KubeConfig:
    """``--kubeconfig`` / ``KUBECONFIG`` when given (the first existing file of a ``:``-separated list),
    otherwise the pod's service account; a :class:`UsageError` (exit 2) naming what is missing."""
    if path:
        candidates = [p for p in path.split(os.pathsep) if p]
        for candidate in candidates:
            if Path(candidate).expanduser().is_file():
                try:
                    return _kubeconfig_from_file(candidate)
                except (LightkubeConfigError, KeyError, TypeError, ValueError) as exc:
                    raise UsageError(f"kubeconfig {candidate} is not usable: {exc}") from None
        raise UsageError(f"kubeconfig {path} not found (from --kubeconfig or KUBECONFIG)")
    try:
        return KubeConfig.from_service_account(service_account)
    except (LightkubeConfigError, KeyError) as exc:
        raise UsageError(
            "no Kubernetes credentials: not in a pod with a service account "
            f"({exc}) and neither --kubeconfig nor KUBECONFIG is set"
        ) from None


def _kubeconfig_from_file(candidate: str) -> KubeConfig:
    """``KubeConfig.from_file`` through the one safe YAML loader (size, depth and alias limits); a bad
    file is a :class:`UsageError` giving the position and kind of error only: a kubeconfig holds tokens,
    and PyYAML's own message quotes the lines around the error."""
    path = Path(candidate).expanduser()
    try:
        data = parse_yaml(read_config_text(path), candidate, redact=True)
    except ConfigError as exc:
        raise UsageError(f"kubeconfig {candidate} is not usable: {'; '.join(exc.problems)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"kubeconfig {candidate} is not usable: not a mapping of keys to values")
    return KubeConfig.from_dict(data, fname=path)


# -- the client ------------------------------------------------------------------------------------------
class Kube:
    """The own node, its pods and its NodeFeature, through one lightkube ``AsyncClient``."""

    def __init__(
        self,
        node_name: str | None,
        config: KubeConfig,
        *,
        namespace: str = "default",
        timeout: float = 10.0,
        attempts: int = 5,
        backoff: tuple[float, float] = (0.2, 5.0),
        field_manager: str = "gpunode",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        cluster_wide: bool = False,
    ) -> None:
        # Agents name their node; a cluster-wide caller (the operator) may not, and then the own-node
        # calls (get_node, watch_node, list_pods, ...) are not for it.
        self.node_name = (node_name or "") if cluster_wide else require_node_name(node_name)
        self.namespace = namespace
        self.field_manager = field_manager
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.timeout = timeout
        self._sleep = sleep
        self._client = AsyncClient(
            _plain_http_without_tls(config),
            namespace=namespace,
            timeout=httpx2.Timeout(timeout),
            field_manager=field_manager,
        )
        self.available: bool | None = None  # None until the first call; then whether the last one got through
        self.last_error = ""
        self.log = get_logger("gpunode.kube")
        # httpx logs every request at INFO; our own events say what matters (retries, failures).
        logging.getLogger("httpx2").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)

    @classmethod
    def connect(
        cls, node_name: str | None, kubeconfig: str | None, *, namespace: str = "default", **kw: Any
    ) -> Kube:
        """Validate the node name and credentials (exit-2 errors) and build the client (no I/O yet)."""
        name = require_node_name(node_name)
        return cls(name, load_kubeconfig(kubeconfig), namespace=namespace, **kw)

    @classmethod
    def connect_cluster(
        cls,
        kubeconfig: str | None,
        *,
        namespace: str = "default",
        field_manager: str = OPERATOR_FIELD_MANAGER,
        **kw: Any,
    ) -> Kube:
        """A cluster-wide client (no own node): credentials validated (exit-2 errors), no I/O yet."""
        return cls(
            None,
            load_kubeconfig(kubeconfig),
            namespace=namespace,
            field_manager=field_manager,
            cluster_wide=True,
            **kw,
        )

    async def aclose(self) -> None:
        await self._client.close()

    # -- the retry loop every call goes through ----------------------------------------------------------
    async def _call(
        self,
        verb: str,
        resource: str,
        fn: Callable[[], Awaitable[T]],
        *,
        group: str = "",
        namespace: str = "",
    ) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout(self.timeout * 1.5):  # belt and braces over httpx's own
                    result = await fn()
            except (ApiError, httpx2.HTTPStatusError, httpx2.TransportError, TimeoutError) as exc:
                err = _translate(exc, verb, resource, group=group, namespace=namespace)
                if isinstance(err, KubeUnavailable):
                    self.available = False
                    self.last_error = str(err)
                    if attempt < self.attempts:
                        delay = self._delay(attempt, exc)
                        self.log.warning(
                            "kube_retry",
                            verb=verb,
                            resource=resource,
                            status=err.status,
                            error=err.message,
                            attempt=attempt,
                            retry_in_s=round(delay, 2),
                        )
                        await self._sleep(delay)
                        continue
                else:
                    self.available = True  # it answered, just not what we wanted
                raise err from None
            except (ValueError, TypeError, KeyError) as exc:  # an answer we cannot decode: not retried
                self.available = True
                raise KubeError(verb, resource, f"unreadable answer: {exc}", reason="BadResponse") from None
            self.available = True
            self.last_error = ""
            return result

    def _delay(self, attempt: int, exc: BaseException) -> float:
        initial, cap = self.backoff
        retry_after = _retry_after(exc)
        if retry_after is not None:
            return min(cap, retry_after)
        return random.uniform(0, min(cap, initial * 2 ** (attempt - 1)))  # full jitter

    # -- node ------------------------------------------------------------------------------------------
    async def get_node(self) -> NodeInfo:
        node = await self._call("get", "nodes", lambda: self._client.get(Node, self.node_name))
        return _node_info(node)

    async def patch_node(
        self,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        unschedulable: bool | None = None,
    ) -> NodeInfo:
        """Merge-patch the own node's labels / annotations (and, with ``unschedulable``, cordon or
        uncordon it) in one request; a None label or annotation value removes the key.

        With ``resource_version`` the patch applies only to that version of the node (optimistic
        locking): if anyone changed the node since, :class:`KubeConflict` is raised and nothing changes.
        """
        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body: dict[str, Any] = {"metadata": meta}
        if unschedulable is not None:
            body["spec"] = {"unschedulable": True if unschedulable else None}
        if not meta.keys() - {"resourceVersion"} and unschedulable is None:
            return await self.get_node()
        return await self._patch_node(body)

    async def set_unschedulable(self, unschedulable: bool) -> NodeInfo:
        """Cordon (True) or uncordon (False) the own node."""
        return await self._patch_node({"spec": {"unschedulable": True if unschedulable else None}})

    async def _patch_node(self, body: dict[str, Any]) -> NodeInfo:
        node = await self._call(
            "patch",
            "nodes",
            lambda: self._client.patch(Node, self.node_name, body, patch_type=PatchType.MERGE),
        )
        return _node_info(node)

    async def watch_node(
        self, *, server_timeout: int = 300, idle_timeout: float | None = None
    ) -> AsyncIterator[NodeInfo]:
        """The own node now, then after every change, forever.

        A watch that ends or breaks resumes from the last resourceVersion seen; one the server has
        forgotten (410 Gone) starts over with a fresh read; one that stays silent longer than
        ``idle_timeout`` (default ``server_timeout`` + 30 s: the server should have closed it by then)
        is abandoned and resumed. An unreachable API server is retried with backoff, never raised;
        403 / 404 are raised.
        """
        idle = idle_timeout if idle_timeout is not None else server_timeout + 30.0
        version: str | None = None
        failures = 0
        while True:
            if version is None:
                try:
                    node = await self.get_node()
                except KubeUnavailable:
                    failures += 1
                    await self._sleep(self._delay(min(failures, 8), Exception()))
                    continue
                version = node.resource_version
                yield node
            stream = self._client.watch(
                Node,
                fields={"metadata.name": self.node_name},
                resource_version=version,
                server_timeout=server_timeout,
            )
            iterator = aiter(stream)
            try:
                while True:
                    try:
                        async with asyncio.timeout(idle):
                            kind, obj = await anext(iterator)
                    except StopAsyncIteration:
                        break
                    failures = 0
                    self.available = True
                    if kind == "DELETED":
                        self.log.warning("kube_node_deleted", node=self.node_name)
                        version = None
                        break
                    node = _node_info(obj)
                    version = node.resource_version or version
                    if kind in ("ADDED", "MODIFIED"):
                        yield node
            except TimeoutError:
                self.log.warning("kube_watch_stalled", node=self.node_name, idle_s=idle, action="resuming")
            except (ValueError, TypeError, KeyError) as exc:  # an event we cannot decode
                failures += 1
                self.log.warning("kube_watch_bad_event", error=str(exc)[:300], action="reading the node anew")
                await self._sleep(self._delay(min(failures, 8), exc))
                version = None
            except (ApiError, httpx2.HTTPStatusError, httpx2.TransportError) as exc:
                err = _translate(exc, "watch", "nodes")
                if err.status == 410:
                    self.log.info("kube_watch_expired", node=self.node_name, action="reading the node anew")
                    version = None
                    continue
                failures = await self._watch_outage(err, exc, failures)
            finally:
                with contextlib.suppress(Exception):
                    await stream.aclose()  # type: ignore[attr-defined]

    async def _watch_outage(self, err: KubeError, exc: BaseException, failures: int) -> int:
        """A watch that failed: raise what is not an outage; otherwise mark the API unavailable, wait the
        backoff and return the failure count (the caller resumes the watch)."""
        if not isinstance(err, KubeUnavailable):
            raise err from None
        self.available = False
        self.last_error = str(err)
        failures += 1
        delay = self._delay(min(failures, 8), exc)
        self.log.warning("kube_watch_failed", error=str(err), retry_in_s=round(delay, 2))
        await self._sleep(delay)
        return failures

    # -- every node (cluster-wide callers) -------------------------------------------------------------
    async def list_nodes(
        self, *, labels: Mapping[str, str] | None = None, chunk_size: int = NODE_PAGE
    ) -> tuple[list[NodeSummary], str]:
        """Every node (or those matching ``labels``), slim, and the list's resourceVersion to watch from.
        Read ``chunk_size`` nodes a request (``limit`` and ``continue``): a large cluster is never one
        huge answer in memory, only a page of it at a time."""

        async def fetch() -> tuple[list[NodeSummary], str]:
            listing = self._client.list(
                _SlimNode, chunk_size=chunk_size, labels=dict(labels) if labels else None
            )
            nodes = [_node_summary(n) async for n in listing]
            try:
                version = listing.resourceVersion
            except NotReadyError:
                version = ""
            return nodes, version

        return await self._call("list", "nodes", fetch)

    async def read_node(self, name: str) -> NodeSummary:
        """Any node by name, slim; :class:`KubeNotFound` when there is none."""
        node = await self._call("get", "nodes", lambda: self._client.get(_SlimNode, name))
        return _node_summary(node)

    async def patch_node_labels(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        unschedulable: bool | None = None,
    ) -> NodeSummary:
        """Merge-patch any node's labels and annotations in one request (a None value removes the key);
        with ``unschedulable`` it cordons (True) or uncordons (False) the node in the same request.

        With ``resource_version`` the patch applies only to that version of the node (optimistic
        locking): if anyone changed the node since, :class:`KubeConflict` is raised and nothing changes.
        Nothing to change reads the node instead of writing.
        """
        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if not meta and unschedulable is None:
            return await self.read_node(name)
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body: dict[str, Any] = {"metadata": meta}
        if unschedulable is not None:
            body["spec"] = {"unschedulable": True if unschedulable else None}
        node = await self._call(
            "patch",
            "nodes",
            lambda: self._client.patch(_SlimNode, name, body, patch_type=PatchType.MERGE),
        )
        return _node_summary(node)

    async def watch_nodes(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        server_timeout: int = 300,
        idle_timeout: float | None = None,
        chunk_size: int = NODE_PAGE,
    ) -> AsyncIterator[NodeEvent]:
        """Every node (or those matching ``labels``): a ``SYNC`` event with the complete list, then each
        change as ``ADDED`` / ``MODIFIED`` / ``DELETED``, forever.

        A watch that ends or breaks resumes from the last resourceVersion seen; one the server has
        forgotten (410 Gone) or that sends an event we cannot decode lists again and yields a fresh
        ``SYNC``; one silent longer than ``idle_timeout`` (default ``server_timeout`` + 30 s) is abandoned
        and resumed. An unreachable API server is retried with backoff, never raised; 403 is raised
        (:class:`KubeForbidden` naming ``list`` or ``watch`` on ``nodes``).
        """
        selector: dict[str, Any] | None = dict(labels) if labels else None

        async def list_all() -> tuple[Sequence[NodeSummary], str]:
            return await self.list_nodes(labels=labels, chunk_size=chunk_size)

        def open_watch(version: str | None) -> Any:
            return self._client.watch(
                _SlimNode, labels=selector, resource_version=version, server_timeout=server_timeout
            )

        def decode(obj: Any) -> tuple[NodeSummary, str]:
            node = _node_summary(obj)
            return node, node.resource_version

        async for kind, nodes in self._list_watch(
            "nodes",
            list_all,
            open_watch,
            decode,
            lambda e: _translate(e, "watch", "nodes"),
            server_timeout,
            idle_timeout,
        ):
            if kind == "SYNC":
                yield NodeEvent("SYNC", nodes=tuple(nodes))
            else:
                yield NodeEvent(kind, nodes[0])

    async def _list_watch(
        self,
        resource: str,
        list_all: Callable[[], Awaitable[tuple[Sequence[T], str]]],
        open_watch: Callable[[str | None], Any],
        decode: Callable[[Any], tuple[T, str]],
        translate: Callable[[BaseException], KubeError],
        server_timeout: int,
        idle_timeout: float | None,
    ) -> AsyncIterator[tuple[Literal["SYNC"] | _Change, Sequence[T]]]:
        """List, then watch from the list's resourceVersion, forever: ``("SYNC", every item)`` after each
        list, ``(change, [item])`` for each change. A watch that ends or breaks resumes from the last
        version seen; 410 Gone or an undecodable event lists again; one silent past ``idle_timeout``
        (default ``server_timeout`` + 30 s) is abandoned and resumed; an unreachable server is retried
        with backoff; anything else (403) is raised."""
        idle = idle_timeout if idle_timeout is not None else server_timeout + 30.0
        version: str | None = None
        failures = 0
        while True:
            if version is None:
                try:
                    items, version = await list_all()
                except KubeUnavailable:
                    failures += 1
                    await self._sleep(self._delay(min(failures, 8), Exception()))
                    continue
                yield "SYNC", items
            stream = open_watch(version or None)
            iterator = aiter(stream)
            try:
                while True:
                    try:
                        async with asyncio.timeout(idle):
                            change, obj = await anext(iterator)
                    except StopAsyncIteration:
                        break
                    failures = 0
                    self.available = True
                    item, seen = decode(obj)
                    version = seen or version
                    if change in ("ADDED", "MODIFIED", "DELETED"):  # BOOKMARK: only the version moves on
                        yield cast(_Change, change), (item,)
            except TimeoutError:
                self.log.warning("kube_watch_stalled", resource=resource, idle_s=idle, action="resuming")
            except (ValueError, TypeError, KeyError) as exc:  # an event we cannot decode
                failures += 1
                self.log.warning(
                    "kube_watch_bad_event", resource=resource, error=str(exc)[:300], action="listing anew"
                )
                await self._sleep(self._delay(min(failures, 8), exc))
                version = None
            except (ApiError, httpx2.HTTPStatusError, httpx2.TransportError) as exc:
                err = translate(exc)
                if err.status == 410:
                    self.log.info("kube_watch_expired", resource=resource, action="listing anew")
                    version = None
                    continue
                failures = await self._watch_outage(err, exc, failures)
            finally:
                with contextlib.suppress(Exception):
                    await stream.aclose()

    # -- pods ------------------------------------------------------------------------------------------
    async def list_pods(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        namespace: str | None = None,
        requesting: str | None = None,
    ) -> list[PodInfo]:
        """Pods on the own node, by label (``labels``), in one namespace or all (None), optionally only
        those requesting an extended resource whose name starts with ``requesting`` (``nvidia.com/``)."""

        async def fetch() -> list[Any]:
            pods = self._client.list(
                Pod,
                namespace=namespace if namespace is not None else "*",
                labels=dict(labels) if labels else None,
                fields={"spec.nodeName": self.node_name},
            )
            return [p async for p in pods]

        where = namespace or ""
        found = [_pod_info(p) for p in await self._call("list", "pods", fetch, namespace=where)]
        if requesting is not None:
            found = [p for p in found if any(r.startswith(requesting) for r in p.requests)]
        return found

    async def list_node_pods(self, node: str, *, namespace: str | None = None) -> list[PodInfo]:
        """Pods bound to any node (cluster-wide callers: the operator's upgrade controller drains nodes),
        in one namespace or all (None)."""

        async def fetch() -> list[Any]:
            pods = self._client.list(
                Pod, namespace=namespace if namespace is not None else "*", fields={"spec.nodeName": node}
            )
            return [p async for p in pods]

        return [_pod_info(p) for p in await self._call("list", "pods", fetch, namespace=namespace or "")]

    async def get_pod(self, namespace: str, name: str) -> PodInfo:
        pod = await self._call(
            "get", "pods", lambda: self._client.get(Pod, name, namespace=namespace), namespace=namespace
        )
        return _pod_info(pod)

    async def delete_pod(self, namespace: str, name: str, *, grace_period: int | None = None) -> bool:
        """Delete a pod; False when it was already gone."""
        try:
            await self._call(
                "delete",
                "pods",
                lambda: self._client.delete(Pod, name, namespace=namespace, grace_period=grace_period),
                namespace=namespace,
            )
        except KubeNotFound:
            return False
        return True

    async def evict_pod(self, namespace: str, name: str) -> bool:
        """Evict a pod (honours PodDisruptionBudgets: a 429 from a budget is a :class:`KubeError`);
        False when it was already gone."""
        body = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))

        async def evict() -> None:
            await self._client.create(body, name=name, namespace=namespace)

        try:
            await self._call("create", "pods/eviction", evict, namespace=namespace)
        except KubeNotFound:
            return False
        return True

    # -- NodeFeature -----------------------------------------------------------------------------------
    async def get_node_feature(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj = await self._call(
                "get",
                "nodefeatures",
                lambda: self._client.get(NodeFeature, name, namespace=namespace),
                group=NODE_FEATURE_GROUP,
                namespace=namespace,
            )
        except KubeNotFound:
            return None
        return dict(obj.to_dict())  # type: ignore[no-untyped-call]

    async def put_node_feature(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str],
        object_labels: Mapping[str, str],
        owners: Sequence[OwnerRef] = (),
    ) -> Literal["created", "updated", "unchanged"]:
        """Create the NodeFeature, or update it only when its labels, spec or owners differ."""
        spec = {"features": {"flags": {}, "attributes": {}, "instances": {}}, "labels": dict(labels)}
        owner_refs = [
            {
                "apiVersion": o.api_version,
                "kind": o.kind,
                "name": o.name,
                "uid": o.uid,
                **({"controller": True} if o.controller else {}),
            }
            for o in owners
        ]
        for _ in range(3):  # a concurrent writer makes our update conflict: read again and retry
            current = await self.get_node_feature(namespace, name)
            if current is None:
                meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(object_labels)}
                if owner_refs:
                    meta["ownerReferences"] = owner_refs
                obj = NodeFeature.from_dict(
                    {
                        "apiVersion": f"{NODE_FEATURE_GROUP}/v1alpha1",
                        "kind": "NodeFeature",
                        "metadata": meta,
                        "spec": spec,
                    }
                )
                try:
                    await self._call(
                        "create",
                        "nodefeatures",
                        lambda obj=obj: self._client.create(obj),  # type: ignore[misc]
                        group=NODE_FEATURE_GROUP,
                        namespace=namespace,
                    )
                except KubeConflict:
                    continue  # someone created it meanwhile
                return "created"
            meta = dict(current.get("metadata") or {})
            want_labels = {**(meta.get("labels") or {}), **object_labels}
            same = (
                _norm_spec(current.get("spec")) == _norm_spec(spec)
                and (meta.get("labels") or {}) == want_labels
                and (not owner_refs or _owner_keys(meta.get("ownerReferences")) == _owner_keys(owner_refs))
            )
            if same:
                return "unchanged"
            meta["labels"] = want_labels
            if owner_refs:
                meta["ownerReferences"] = owner_refs
            obj = NodeFeature.from_dict({**current, "metadata": meta, "spec": spec})
            try:
                await self._call(
                    "update",
                    "nodefeatures",
                    lambda obj=obj: self._client.replace(obj, name=name, namespace=namespace),  # type: ignore[misc]
                    group=NODE_FEATURE_GROUP,
                    namespace=namespace,
                )
            except KubeConflict:
                continue
            return "updated"
        raise KubeConflict("update", "nodefeatures", f"{namespace}/{name} kept changing under us", status=409)

    # -- any kind, as JSON (cluster-wide callers: the operator) ----------------------------------------
    def _ns(self, kind: ResourceKind, namespace: str | None) -> str | None:
        return (namespace or self.namespace) if kind.namespaced else None

    async def apply(
        self, obj: Mapping[str, Any], *, force: bool = False, field_manager: str | None = None
    ) -> dict[str, Any]:
        """Server-side apply of any object of a known kind (``PATCH`` ``application/apply-patch+yaml`` with
        this client's field manager, or ``field_manager``); ``force`` takes over fields another manager
        owns (without it such a conflict is :class:`KubeConflict`). The stored object comes back."""
        kind = resource_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        namespace = self._ns(kind, meta.get("namespace"))
        body = dict(obj)
        if namespace is not None:
            body["metadata"] = {**meta, "namespace": namespace}
        res = _generic(kind)
        manager = field_manager or self.field_manager
        stored = await self._call(
            "patch",
            kind.plural,
            lambda: self._client.patch(
                res,
                name,
                body,
                namespace=namespace,
                patch_type=PatchType.APPLY,
                field_manager=manager,
                force=force,
            ),
            group=kind.group,
            namespace=namespace or "",
        )
        return _plain(stored)

    async def get_object(
        self, kind: ResourceKind, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """One object as JSON; ``None`` when it is not there."""
        where = self._ns(kind, namespace)
        res = _generic(kind)
        try:
            found = await self._call(
                "get",
                kind.plural,
                lambda: self._client.get(res, name, namespace=where),
                group=kind.group,
                namespace=where or "",
            )
        except KubeNotFound:
            return None
        return _plain(found)

    async def list_objects(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        chunk_size: int = 500,
    ) -> tuple[list[dict[str, Any]], str]:
        """Objects of a kind as JSON (namespaced kinds: in ``namespace``, this client's by default, ``"*"``
        for all) and the list's resourceVersion to watch from."""
        where = self._ns(kind, namespace)
        res = _generic(kind)

        async def fetch() -> tuple[list[dict[str, Any]], str]:
            kw: dict[str, Any] = {"namespace": where} if where is not None else {}
            listing = self._client.list(
                res, chunk_size=chunk_size, labels=dict(labels) if labels else None, **kw
            )
            items = [_plain(o) async for o in listing]
            try:
                version = listing.resourceVersion
            except NotReadyError:
                version = ""
            return items, version or ""

        return await self._call("list", kind.plural, fetch, group=kind.group, namespace=where or "")

    async def delete_object(
        self,
        kind: ResourceKind,
        name: str,
        namespace: str | None = None,
        *,
        propagation: Literal["Background", "Foreground", "Orphan"] = "Background",
    ) -> bool:
        """Delete an object (its dependents by ``propagation``); False when it was already gone."""
        where = self._ns(kind, namespace)
        res = _generic(kind)
        cascade = CascadeType[propagation.upper()]
        try:
            await self._call(
                "delete",
                kind.plural,
                lambda: self._client.delete(res, name, namespace=where, cascade=cascade),
                group=kind.group,
                namespace=where or "",
            )
        except KubeNotFound:
            return False
        return True

    async def patch_status(
        self,
        kind: ResourceKind,
        name: str,
        status: Mapping[str, Any],
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch the ``status`` subresource (a ClusterPolicy's, say): a None value removes a key, a
        list is replaced whole. With ``resource_version``: only that version (409 otherwise)."""
        where = self._ns(kind, namespace)
        res = _generic(kind, status=True)
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        stored = await self._call(
            "patch",
            f"{kind.plural}/status",
            lambda: self._client.patch(res, name, body, namespace=where, patch_type=PatchType.MERGE),
            group=kind.group,
            namespace=where or "",
        )
        return _plain(stored)

    async def watch_objects(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        server_timeout: int = 300,
        idle_timeout: float | None = None,
    ) -> AsyncIterator[ObjectEvent]:
        """Objects of a kind (ClusterPolicies, the operator's DaemonSets) as :meth:`watch_nodes` gives
        nodes: ``SYNC`` with the complete list, then every change, forever; resumed after a drop, listed
        anew after 410 Gone or an undecodable event, unreachable servers retried, 403 raised."""
        where = self._ns(kind, namespace)
        res = _generic(kind)

        async def list_all() -> tuple[Sequence[Mapping[str, Any]], str]:
            return await self.list_objects(kind, namespace=namespace, labels=labels)

        def open_watch(version: str | None) -> Any:
            kw: dict[str, Any] = {"namespace": where} if where is not None else {}
            return self._client.watch(
                res,
                labels=dict(labels) if labels else None,
                resource_version=version,
                server_timeout=server_timeout,
                **kw,
            )

        def decode(obj: Any) -> tuple[Mapping[str, Any], str]:
            item = _plain(obj)
            return item, str((item.get("metadata") or {}).get("resourceVersion") or "")

        def translate(exc: BaseException) -> KubeError:
            return _translate(exc, "watch", kind.plural, group=kind.group, namespace=where or "")

        async for change, items in self._list_watch(
            kind.plural, list_all, open_watch, decode, translate, server_timeout, idle_timeout
        ):
            if change == "SYNC":
                yield ObjectEvent("SYNC", objects=tuple(items))
            else:
                yield ObjectEvent(change, obj=items[0])

    async def daemonset_rollout(
        self, name: str, namespace: str | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]] | None:
        """A DaemonSet, its pods and its ControllerRevisions (those it controls, by ownerReference), as
        JSON, for readiness; ``None`` when the DaemonSet is not there. The pods are slim: of each only
        metadata (name, namespace, uid, labels, ownerReferences, deletionTimestamp), spec.nodeName and
        status (phase, conditions' type and status, containerStatuses' name and ready), decoded straight
        from the answer a page at a time, so a DaemonSet with a pod on each of thousands of nodes costs
        a few MB, not the pods' full JSON."""
        ds = await self.get_object(DAEMON_SET, name, namespace)
        if ds is None:
            return None
        uid = (ds.get("metadata") or {}).get("uid")
        selector = ((ds.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        where = self._ns(DAEMON_SET, namespace)

        def owned(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [
                o
                for o in items
                if any(
                    r.get("uid") == uid and r.get("controller")
                    for r in (o.get("metadata") or {}).get("ownerReferences") or []
                )
            ]

        async def slim_pods() -> list[dict[str, Any]]:
            kw: dict[str, Any] = {"namespace": where} if where is not None else {}
            listing = self._client.list(_SlimPod, chunk_size=POD_PAGE, labels=dict(selector) or None, **kw)
            return [
                msgspec.to_builtins(pod)
                async for pod in listing
                if pod.metadata is not None
                and any(r.uid == uid and r.controller for r in pod.metadata.ownerReferences or ())
            ]

        pods = await self._call("list", POD.plural, slim_pods, namespace=where or "")
        revisions, _ = await self.list_objects(CONTROLLER_REVISION, namespace=where, labels=selector)
        return ds, pods, owned(revisions)

    # -- leases (leader election) ----------------------------------------------------------------------
    async def get_lease(self, name: str, namespace: str | None = None) -> LeaseRecord | None:
        found = await self.get_object(LEASE, name, namespace)
        return None if found is None else _lease_record(found)

    async def create_lease(self, lease: LeaseRecord) -> LeaseRecord:
        """Create the Lease; :class:`KubeConflict` when another candidate created it first."""
        obj = _generic(LEASE)(_lease_object(lease, self.namespace))
        created = await self._call(
            "create",
            "leases",
            lambda: self._client.create(obj),
            group=LEASE.group,
            namespace=lease.namespace or self.namespace,
        )
        return _lease_record(_plain(created))

    async def update_lease(self, lease: LeaseRecord) -> LeaseRecord:
        """Replace the Lease as of ``lease.resource_version``; :class:`KubeConflict` when it changed since
        (another candidate renewed or took it)."""
        obj = _generic(LEASE)(_lease_object(lease, self.namespace))
        updated = await self._call(
            "update",
            "leases",
            lambda: self._client.replace(obj),
            group=LEASE.group,
            namespace=lease.namespace or self.namespace,
        )
        return _lease_record(_plain(updated))


def _plain_http_without_tls(config: KubeConfig) -> Any:
    """The config to connect with. An ``http://`` API server (a local test server) uses no TLS, so
    building a verifying TLS context, which loads the whole CA bundle (about 3 MB of memory), is skipped;
    ``https://`` servers are verified exactly as configured."""
    single = config.get()
    if single is not None and single.cluster.server.startswith("http://") and not single.cluster.insecure:
        return single._replace(cluster=msgspec.structs.replace(single.cluster, insecure=True))
    return config


# -- any kind: lightkube's generic resources, built here and never registered globally -------------------
_GENERIC_VERBS = [
    "delete",
    "deletecollection",
    "get",
    "global_list",
    "global_watch",
    "list",
    "patch",
    "post",
    "put",
    "watch",
]
_GENERIC: dict[tuple[ResourceKind, bool], Any] = {}


def _generic(kind: ResourceKind, *, status: bool = False) -> Any:
    """A lightkube resource class for ``kind`` (or its ``/status`` subresource) whose objects are plain
    dicts; kept out of lightkube's registry, so it never clashes with the typed models."""
    key = (kind, status)
    found = _GENERIC.get(key)
    if found is not None:
        return found
    resource = ResourceDef(kind.group, kind.version, kind.kind)
    base: type[Any]
    if status:
        info = ApiInfo(
            resource=resource,
            parent=resource,
            plural=kind.plural,
            verbs=["get", "patch", "put"],
            action="status",
        )
        base = GenericNamespacedStatus if kind.namespaced else GenericGlobalStatus
    else:
        info = ApiInfo(resource=resource, plural=kind.plural, verbs=list(_GENERIC_VERBS))
        base = GenericNamespacedResource if kind.namespaced else GenericGlobalResource
    made = type(f"{kind.kind}{'Status' if status else ''}", (base,), {"_api_info": info})
    _GENERIC[key] = made
    return made


def _plain(obj: Any) -> dict[str, Any]:
    if hasattr(obj, "to_dict"):
        return dict(obj.to_dict())
    return dict(obj)


def _lease_record(obj: Mapping[str, Any]) -> LeaseRecord:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return LeaseRecord(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=duration if isinstance(duration, int) else 0,
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
        transitions=transitions if isinstance(transitions, int) else 0,
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def _lease_object(lease: LeaseRecord, default_namespace: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": lease.name, "namespace": lease.namespace or default_namespace}
    if lease.resource_version:
        meta["resourceVersion"] = lease.resource_version
    spec: dict[str, Any] = {
        "holderIdentity": lease.holder,
        "leaseDurationSeconds": lease.duration_s,
        "leaseTransitions": lease.transitions,
    }
    if lease.acquire_time is not None:
        spec["acquireTime"] = lease.acquire_time
    if lease.renew_time is not None:
        spec["renewTime"] = lease.renew_time
    return {"apiVersion": LEASE.api_version, "kind": LEASE.kind, "metadata": meta, "spec": spec}


# -- translation -----------------------------------------------------------------------------------------
def _translate(
    exc: BaseException, verb: str, resource: str, *, group: str = "", namespace: str = ""
) -> KubeError:
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        return KubeUnavailable(verb, resource, "timed out")
    if isinstance(exc, httpx2.TransportError):
        return KubeUnavailable(verb, resource, f"{type(exc).__name__}: {exc}")
    status: int | None = None
    reason = ""
    message = str(exc)
    if isinstance(exc, ApiError):
        status = exc.status.code
        reason = exc.status.reason or ""
        message = exc.status.message or message
    elif isinstance(exc, httpx2.HTTPStatusError):
        status = exc.response.status_code
        with contextlib.suppress(Exception):
            body = exc.response.json()
            reason = str(body.get("reason") or "")
            message = str(body.get("message") or message)
    if status == 403:
        return KubeForbidden(verb, resource, message, group=group, namespace=namespace)
    if status == 404:
        return KubeNotFound(verb, resource, message, status=status, reason=reason)
    if status == 409:
        return KubeConflict(verb, resource, message, status=status, reason=reason)
    if status == 429 and resource == "pods/eviction":  # a disruption budget says no: not an outage
        return KubeError(verb, resource, message, status=status, reason=reason or "TooManyRequests")
    if status is None or status in RETRYABLE_STATUS:
        return KubeUnavailable(verb, resource, message, status=status, reason=reason)
    return KubeError(verb, resource, message, status=status, reason=reason)


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    if response is None:
        return None
    with contextlib.suppress(Exception):
        value = response.headers.get("Retry-After")
        if value is not None:
            return float(value)
    return None


def _node_info(node: Any) -> NodeInfo:
    meta = node.metadata
    spec = node.spec
    return NodeInfo(
        name=meta.name or "",
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        unschedulable=bool(spec and spec.unschedulable),
        resource_version=meta.resourceVersion or "",
    )


def _interned(pairs: Mapping[str, str] | None) -> dict[str, str]:
    """Labels or annotations with their keys and values interned: thousands of nodes carry the same
    few hundred label keys (NFD's alone are dozens a node) and mostly the same values, and a cached node
    then holds references instead of copies (5,000 nodes of 60 labels: about 50 MB -> 11 MB)."""
    intern = sys.intern
    return {intern(k): intern(v) for k, v in (pairs or {}).items()}


def _node_summary(node: Any) -> NodeSummary:
    meta = node.metadata
    conditions = (node.status.conditions if node.status else None) or []
    return NodeSummary(
        name=sys.intern((meta.name if meta else None) or ""),
        labels=_interned(meta.labels if meta else None),
        annotations=_interned(meta.annotations if meta else None),
        unschedulable=bool(node.spec and node.spec.unschedulable),
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
        resource_version=(meta.resourceVersion if meta else None) or "",
    )


def _pod_info(pod: Any) -> PodInfo:
    meta = pod.metadata
    spec = pod.spec
    requests: set[str] = set()
    for container in [*(spec.containers or []), *(spec.initContainers or [])] if spec else []:
        res = container.resources
        if res is not None:
            requests.update(k for k in (res.requests or {}) if "/" in k)
            requests.update(k for k in (res.limits or {}) if "/" in k)
    owners = tuple(
        OwnerRef(o.apiVersion, o.kind, o.name, o.uid, bool(o.controller))
        for o in (meta.ownerReferences or [])
    )
    return PodInfo(
        namespace=meta.namespace or "",
        name=meta.name or "",
        uid=meta.uid or "",
        node_name=(spec.nodeName if spec else None) or "",
        labels=dict(meta.labels or {}),
        phase=(pod.status.phase if pod.status else None) or "",
        deleting=meta.deletionTimestamp is not None,
        node_selector=dict((spec.nodeSelector if spec else None) or {}),
        owners=owners,
        requests=frozenset(requests),
        empty_dirs=tuple(v.name for v in ((spec.volumes if spec else None) or []) if v.emptyDir is not None),
        ready=any(
            c.type == "Ready" and c.status == "True"
            for c in ((pod.status.conditions if pod.status else None) or [])
        ),
    )


def _norm_spec(spec: Any) -> Any:
    """Compare specs the way the API server stores them: empty maps and absent keys are the same."""
    if isinstance(spec, Mapping):
        return {k: _norm_spec(v) for k, v in spec.items() if v not in (None, {}, [])}
    return spec


def _owner_keys(refs: Any) -> list[tuple[str, str, bool]]:
    return sorted((str(r.get("kind")), str(r.get("uid")), bool(r.get("controller"))) for r in refs or [])

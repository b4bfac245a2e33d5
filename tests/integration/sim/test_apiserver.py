"""gpunode.sim.apiserver: the Kubernetes REST and watch wire protocol, checked with http.client."""

from __future__ import annotations

import http.client
import json
import select
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode.sim.apiserver import (
    FakeApiServer,
    merge_patch,
    parse_field_selector,
)

NFD = "/apis/nfd.k8s-sigs.io/v1alpha1"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def call(
    api: FakeApiServer,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        sent = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            sent["Content-Type"] = content_type
        conn.request(method, path, body=data, headers=sent)
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None, dict(response.getheaders())
    finally:
        conn.close()


class Watch:
    """One watch stream, read line by line."""

    def __init__(self, api: FakeApiServer, path: str, timeout: float = 5.0) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=timeout)
        self.conn.request("GET", path)
        self.response = self.conn.getresponse()

    def next(self) -> dict[str, Any] | None:
        """The next event, or None when the stream ended cleanly."""
        line = self.response.readline()
        return json.loads(line) if line else None

    def take(self, count: int) -> list[tuple[str, str]]:
        events = [self.next() for _ in range(count)]
        return [(e["type"], e["object"]["metadata"]["name"]) for e in events if e is not None]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def watches() -> Iterator[list[Watch]]:
    opened: list[Watch] = []
    yield opened
    for w in opened:
        w.close()


def open_watch(watches: list[Watch], api: FakeApiServer, path: str) -> Watch:
    w = Watch(api, path)
    watches.append(w)
    return w


# -- pure functions ------------------------------------------------------------------------------------


def test_field_selector_parses() -> None:
    parsed = parse_field_selector("metadata.name=n1,spec.nodeName!=n2,metadata.namespace==ns")
    assert [(r.path, r.op, r.value) for r in parsed] == [
        ("metadata.name", "=", "n1"),
        ("spec.nodeName", "!=", "n2"),
        ("metadata.namespace", "=", "ns"),
    ]
    assert parsed[0].matches({"metadata": {"name": "n1"}})
    assert parsed[1].matches({"spec": {}})


MERGE_CASES = [
    ("add key", {"a": 1}, {"b": 2}, {"a": 1, "b": 2}),
    ("null deletes", {"a": 1, "b": 2}, {"b": None}, {"a": 1}),
    ("null on absent", {"a": 1}, {"z": None}, {"a": 1}),
    ("nested merge", {"m": {"x": 1, "y": 2}}, {"m": {"y": None, "z": 3}}, {"m": {"x": 1, "z": 3}}),
    ("list replaced", {"l": [1, 2]}, {"l": [3]}, {"l": [3]}),
    ("object replaces scalar", {"a": 1}, {"a": {"b": None, "c": 1}}, {"a": {"c": 1}}),
]


@pytest.mark.parametrize(
    ("target", "patch", "expected"), [c[1:] for c in MERGE_CASES], ids=[c[0] for c in MERGE_CASES]
)
def test_merge_patch(target: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]) -> None:
    before = json.dumps(target)
    assert merge_patch(target, patch) == expected
    assert json.dumps(target) == before  # the target is not modified


# -- discovery, reads ----------------------------------------------------------------------------------

DISCOVERY = [
    ("/version", None),
    ("/api", "APIVersions"),
    ("/api/", "APIVersions"),
    ("/apis", "APIGroupList"),
    ("/api/v1", "APIResourceList"),
    ("/api/v1/", "APIResourceList"),
    (NFD, "APIResourceList"),
    (f"{NFD}/", "APIResourceList"),
]


@pytest.mark.parametrize(("path", "kind"), DISCOVERY)
def test_discovery(api: FakeApiServer, path: str, kind: str | None) -> None:
    status, body, _ = call(api, "GET", path)
    assert status == 200
    assert body.get("kind") == kind
    if path == "/version":
        assert body["gitVersion"] == "v1.31.0-gpunode-fake"
    if path.startswith("/api/v1"):
        assert {r["name"] for r in body["resources"]} == {
            "nodes",
            "pods",
            "pods/eviction",
            "namespaces",
            "serviceaccounts",
            "configmaps",
            "services",
            "events",
        }
    if path == "/apis":
        assert {g["name"] for g in body["groups"]} >= {"nfd.k8s-sigs.io", "policy"}


def test_get_list_and_selectors(api: FakeApiServer) -> None:
    api.add_node("n1", {"gpu": "true", "zone": "a"})
    api.add_node("n2", {"gpu": "false"})
    api.add_pod("ns1", "p1", node="n1", labels={"app": "x"})
    api.add_pod("ns2", "p2", node="n2", labels={"app": "y"})

    status, node, _ = call(api, "GET", "/api/v1/nodes/n1")
    assert status == 200
    assert (node["kind"], node["apiVersion"], node["metadata"]["labels"]["zone"]) == ("Node", "v1", "a")
    assert node["metadata"]["uid"]
    assert node["metadata"]["creationTimestamp"].endswith("Z")

    status, nodes, _ = call(api, "GET", "/api/v1/nodes")
    assert (status, nodes["kind"], nodes["apiVersion"]) == (200, "NodeList", "v1")
    assert nodes["metadata"]["resourceVersion"] == str(api.resource_version)
    assert [(n["metadata"]["name"], n["kind"]) for n in nodes["items"]] == [("n1", "Node"), ("n2", "Node")]

    def names(path: str) -> list[str]:
        status, body, _ = call(api, "GET", path)
        assert status == 200, body
        return [i["metadata"]["name"] for i in body["items"]]

    assert names("/api/v1/nodes?labelSelector=gpu%3Dtrue") == ["n1"]
    assert names("/api/v1/nodes?labelSelector=gpu%20in%20(true,maybe),!absent") == ["n1"]
    assert names("/api/v1/nodes?fieldSelector=metadata.name%21%3Dn1") == ["n2"]
    assert names("/api/v1/pods") == ["p1", "p2"]
    assert names("/api/v1/namespaces/ns2/pods") == ["p2"]
    assert names("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1") == ["p1"]
    assert names("/api/v1/pods?fieldSelector=metadata.namespace%3Dns2&labelSelector=app") == ["p2"]

    status, body, _ = call(api, "GET", "/api/v1/nodes?labelSelector=a%20in%20(b")
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body, _ = call(api, "GET", "/api/v1/nodes?fieldSelector=spec.nodeName%3Dx")
    assert (status, body["message"]) == (400, "field label not supported: spec.nodeName")


def test_not_found_is_a_status(api: FakeApiServer) -> None:
    status, body, headers = call(api, "GET", "/api/v1/nodes/missing")
    assert status == 404
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'nodes "missing" not found',
        "reason": "NotFound",
        "details": {"name": "missing", "kind": "nodes"},
        "code": 404,
    }
    status, body, _ = call(api, "GET", f"{NFD}/namespaces/x/nodefeatures/nf")
    assert body["message"] == 'nodefeatures.nfd.k8s-sigs.io "nf" not found'
    assert body["details"] == {"name": "nf", "group": "nfd.k8s-sigs.io", "kind": "nodefeatures"}
    for path in ("/api/v1/secrets", "/api/v1/nodes/n/status", "/api/v1/pods/p", "/nope"):
        status, body, _ = call(api, "GET", path)
        assert (status, body["kind"], body["reason"]) == (404, "Status", "NotFound"), path
    status, body, _ = call(api, "POST", "/api/v1/nodes/n1", {})
    assert (status, body["reason"]) == (405, "MethodNotAllowed")


def test_keep_alive_and_request_records(api: FakeApiServer) -> None:
    api.add_node("n1")
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        for _ in range(3):
            conn.request("GET", "/api/v1/nodes/n1?pretty=true")
            response = conn.getresponse()
            assert response.status == 200
            assert int(response.headers["Content-Length"]) == len(response.read())
    finally:
        conn.close()
    record = api.requests[-1]
    assert (record.method, record.path, record.query, record.status) == (
        "GET",
        "/api/v1/nodes/n1",
        {"pretty": "true"},
        200,
    )


# -- writes --------------------------------------------------------------------------------------------


def nodefeature(
    name: str, namespace: str | None = "gpu", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
        "kind": "NodeFeature",
        "metadata": meta,
        "spec": {"labels": labels or {"nvidia.com/gpu.count": "8"}},
    }


def test_create_then_already_exists(api: FakeApiServer) -> None:
    path = f"{NFD}/namespaces/gpu/nodefeatures"
    before = api.resource_version
    status, created, _ = call(api, "POST", path, nodefeature("n1-gpunode", namespace=None))
    assert status == 201
    assert created["metadata"]["namespace"] == "gpu"
    assert created["metadata"]["resourceVersion"] == str(before + 1)
    assert len(created["metadata"]["uid"]) == 36
    assert api.get("nodefeatures", "n1-gpunode", "gpu") == created

    status, body, _ = call(api, "POST", path, nodefeature("n1-gpunode"))
    assert (status, body["reason"], body["code"]) == (409, "AlreadyExists", 409)
    assert body["message"] == 'nodefeatures.nfd.k8s-sigs.io "n1-gpunode" already exists'

    status, body, _ = call(api, "POST", path, nodefeature("other", namespace="elsewhere"))
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body, _ = call(api, "POST", path, b"{not json")
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body, _ = call(api, "POST", path, {"metadata": {"generateName": "nf-"}, "spec": {}})
    assert status == 201
    assert body["metadata"]["name"].startswith("nf-")
    assert len(body["metadata"]["name"]) == 8
    rv = api.resource_version
    status, body, _ = call(api, "POST", f"{path}?dryRun=All", nodefeature("dry"))
    assert (status, api.resource_version, api.get("nodefeatures", "dry", "gpu")) == (201, rv, None)
    status, listed, _ = call(api, "GET", f"{NFD}/nodefeatures")
    assert (listed["kind"], len(listed["items"])) == ("NodeFeatureList", 2)
    status, body, _ = call(api, "POST", f"{NFD}/nodefeatures", nodefeature("x"))
    assert (status, body["reason"]) == (405, "MethodNotAllowed")  # create needs a namespace


def test_put_conflict_and_replace(api: FakeApiServer) -> None:
    created = api.create("nodefeatures", nodefeature("nf"))
    path = f"{NFD}/namespaces/gpu/nodefeatures/nf"
    stale = {**created, "metadata": {**created["metadata"], "resourceVersion": "1"}}
    status, body, _ = call(api, "PUT", path, stale)
    assert (status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Operation cannot be fulfilled on nodefeatures.nfd.k8s-sigs.io "nf": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    fresh = {**created, "spec": {"labels": {"a": "b"}}}
    status, body, _ = call(api, "PUT", path, fresh)
    assert status == 200
    assert body["spec"] == {"labels": {"a": "b"}}
    assert int(body["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert body["metadata"]["uid"] == created["metadata"]["uid"]

    rv = api.resource_version
    status, same, _ = call(api, "PUT", path, body)  # an update that changes nothing writes nothing
    assert (status, api.resource_version, same["metadata"]["resourceVersion"]) == (200, rv, str(rv))
    status, body, _ = call(api, "PUT", f"{NFD}/namespaces/gpu/nodefeatures/absent", nodefeature("absent"))
    assert (status, body["reason"]) == (404, "NotFound")


def test_merge_patch_deletes_with_null_and_skips_no_ops(api: FakeApiServer) -> None:
    api.add_node("n1", {"keep": "1", "drop": "2"})
    patch = {"metadata": {"labels": {"drop": None, "new": "3"}, "annotations": {"a": "b"}}}
    status, node, _ = call(
        api, "PATCH", "/api/v1/nodes/n1", patch, content_type="application/merge-patch+json"
    )
    assert status == 200
    assert node["metadata"]["labels"] == {"keep": "1", "new": "3"}
    assert node["metadata"]["annotations"] == {"a": "b"}
    assert api.node("n1") == node

    rv = api.resource_version
    status, again, _ = call(
        api, "PATCH", "/api/v1/nodes/n1", patch, content_type="application/merge-patch+json"
    )
    assert (status, api.resource_version, again["metadata"]["resourceVersion"]) == (200, rv, str(rv))

    stale = {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}}
    status, body, _ = call(
        api, "PATCH", "/api/v1/nodes/n1", stale, content_type="application/merge-patch+json"
    )
    assert (status, body["reason"]) == (409, "Conflict")
    status, body, _ = call(
        api, "PATCH", "/api/v1/nodes/gone", patch, content_type="application/merge-patch+json"
    )
    assert (status, body["reason"]) == (404, "NotFound")


def test_patch_content_types(api: FakeApiServer) -> None:
    api.add_node("n1", {"a": "1"})
    api.create("nodefeatures", nodefeature("nf"))
    smp = "application/strategic-merge-patch+json"
    status, node, _ = call(
        api, "PATCH", "/api/v1/nodes/n1", {"spec": {"unschedulable": True}}, content_type=smp
    )
    assert (status, node["spec"]) == (200, {"unschedulable": True})

    ops = [
        {"op": "add", "path": "/metadata/labels/nvidia.com~1gpu", "value": "x"},
        {"op": "remove", "path": "/metadata/labels/a"},
    ]
    status, node, _ = call(api, "PATCH", "/api/v1/nodes/n1", ops, content_type="application/json-patch+json")
    assert (status, node["metadata"]["labels"]) == (200, {"nvidia.com/gpu": "x"})
    status, body, _ = call(
        api,
        "PATCH",
        "/api/v1/nodes/n1",
        [{"op": "test", "path": "/spec/x", "value": 1}],
        content_type="application/json-patch+json",
    )
    assert (status, body["reason"]) == (422, "Invalid")

    nf = f"{NFD}/namespaces/gpu/nodefeatures/nf"
    status, body, _ = call(api, "PATCH", nf, {"spec": {"labels": None}}, content_type=smp)
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")  # as for any custom resource
    status, body, _ = call(
        api, "PATCH", nf, {"spec": {"labels": None}}, content_type="application/merge-patch+json"
    )
    assert (status, body["spec"]) == (200, {})
    for content_type in ("application/json", "text/plain"):
        status, body, _ = call(api, "PATCH", "/api/v1/nodes/n1", {}, content_type=content_type)
        assert (status, body["reason"]) == (415, "UnsupportedMediaType"), content_type
    # server-side apply is served (tests/integration/sim/test_apiserver_apply.py); without fieldManager: 422
    status, body, _ = call(api, "PATCH", "/api/v1/nodes/n1", {}, content_type="application/apply-patch+yaml")
    assert (status, body["reason"]) == (422, "Invalid")


def test_delete(api: FakeApiServer) -> None:
    api.add_node("n1")
    status, body, _ = call(api, "DELETE", "/api/v1/nodes/n1")
    assert (status, body["metadata"]["name"]) == (200, "n1")
    assert api.get("nodes", "n1") is None
    status, body, _ = call(api, "DELETE", "/api/v1/nodes/n1")
    assert (status, body["reason"]) == (404, "NotFound")


# -- watches -------------------------------------------------------------------------------------------


def test_watch_lists_then_streams(api: FakeApiServer, watches: list[Watch]) -> None:
    api.add_node("n1")
    api.add_node("n2")
    w = open_watch(watches, api, "/api/v1/nodes?watch=true")
    assert w.response.status == 200
    assert w.response.headers["Content-Type"] == "application/json"
    assert w.response.headers["Transfer-Encoding"] == "chunked"
    assert w.take(2) == [("ADDED", "n1"), ("ADDED", "n2")]
    assert api.wait_for(lambda: api.open_watches == 1)

    api.patch_node("n1", {"metadata": {"labels": {"x": "y"}}})
    event = w.next()
    assert event is not None
    assert (event["type"], event["object"]["metadata"]["labels"]) == ("MODIFIED", {"x": "y"})
    assert event["object"]["metadata"]["resourceVersion"] == str(api.resource_version)
    api.delete("nodes", "n2")
    assert w.take(1) == [("DELETED", "n2")]


def test_watch_resumes_from_a_resource_version(api: FakeApiServer, watches: list[Watch]) -> None:
    api.add_node("n1")
    since = api.resource_version
    api.patch_node("n1", {"metadata": {"labels": {"step": "1"}}})
    api.add_node("n2")
    api.add_pod("default", "p", node="n1")  # other resources are not replayed
    api.delete("nodes", "n2")
    w = open_watch(watches, api, f"/api/v1/nodes?watch=1&resourceVersion={since}")
    assert w.take(3) == [("MODIFIED", "n1"), ("ADDED", "n2"), ("DELETED", "n2")]
    api.add_node("n3")
    assert w.take(1) == [("ADDED", "n3")]


def test_watch_too_old_after_compact(api: FakeApiServer, watches: list[Watch]) -> None:
    api.add_node("n1")
    since = api.resource_version
    api.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    api.compact()
    w = open_watch(watches, api, f"/api/v1/nodes?watch=true&resourceVersion={since}")
    assert w.response.status == 200
    event = w.next()
    assert event == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {since} ({api.resource_version})",
            "reason": "Expired",
            "details": {},
            "code": 410,
        },
    }
    assert w.next() is None  # and the stream ends
    current = open_watch(watches, api, f"/api/v1/nodes?watch=true&resourceVersion={api.resource_version}")
    api.add_node("n2")
    assert current.take(1) == [("ADDED", "n2")]


def test_watch_history_is_bounded(watches: list[Watch]) -> None:
    with FakeApiServer(history=2) as api:
        api.add_node("n1")
        since = api.resource_version
        for i in range(3):
            api.patch_node("n1", {"metadata": {"labels": {"i": str(i)}}})
        w = open_watch(watches, api, f"/api/v1/nodes?watch=true&resourceVersion={since}")
        event = w.next()
        assert event is not None
        assert (event["type"], event["object"]["code"]) == ("ERROR", 410)


def test_watch_timeout_ends_the_stream_cleanly(api: FakeApiServer, watches: list[Watch]) -> None:
    started = time.monotonic()
    w = open_watch(watches, api, "/api/v1/nodes?watch=true&timeoutSeconds=1")
    assert w.response.read() == b""  # the terminating chunk came: no IncompleteRead
    assert 0.9 < time.monotonic() - started < 3
    assert api.wait_for(lambda: api.open_watches == 0, timeout=2)


def test_watch_selectors_turn_changes_into_added_and_deleted(
    api: FakeApiServer, watches: list[Watch]
) -> None:
    api.add_node("n1", {"gpu": "true"})
    api.add_node("n2", {"gpu": "false"})
    w = open_watch(watches, api, "/api/v1/nodes?watch=true&labelSelector=gpu%3Dtrue")
    assert w.take(1) == [("ADDED", "n1")]
    api.patch_node("n2", {"metadata": {"labels": {"gpu": "true"}}})
    assert w.take(1) == [("ADDED", "n2")]
    api.patch_node("n1", {"metadata": {"labels": {"gpu": None}}})
    event = w.next()
    assert event is not None
    assert (event["type"], event["object"]["metadata"]["name"]) == ("DELETED", "n1")
    assert event["object"]["metadata"]["resourceVersion"] == str(api.resource_version)
    api.patch_node("n1", {"metadata": {"labels": {"other": "x"}}})  # still outside: nothing
    api.patch_node("n2", {"metadata": {"labels": {"more": "y"}}})
    assert w.take(1) == [("MODIFIED", "n2")]

    pods = open_watch(watches, api, "/api/v1/namespaces/ns/pods?watch=true&fieldSelector=spec.nodeName%3Dn1")
    api.add_pod("ns", "elsewhere", node="n2")
    api.add_pod("other", "other-ns", node="n1")
    api.add_pod("ns", "here", node="n1")
    assert pods.take(1) == [("ADDED", "here")]


def test_drop_watches_closes_without_a_terminating_chunk(api: FakeApiServer, watches: list[Watch]) -> None:
    api.add_node("n1")
    w = open_watch(watches, api, "/api/v1/nodes?watch=true")
    assert w.take(1) == [("ADDED", "n1")]
    assert api.wait_for(lambda: api.open_watches == 1)
    api.drop_watches()
    with pytest.raises(http.client.IncompleteRead):  # read() insists on the terminating chunk
        w.response.read()
    assert api.wait_for(lambda: api.open_watches == 0, timeout=2)


def test_stalled_watches_deliver_after_unstall(api: FakeApiServer, watches: list[Watch]) -> None:
    api.add_node("n1")
    w = open_watch(watches, api, "/api/v1/nodes?watch=true")
    assert w.take(1) == [("ADDED", "n1")]
    api.stall_watches()
    api.add_node("n2")
    assert select.select([w.conn.sock], [], [], 0.2)[0] == []  # nothing arrives
    late = http.client.HTTPConnection("127.0.0.1", api.port, timeout=0.2)
    late.request("GET", "/api/v1/nodes?watch=true")
    with pytest.raises(TimeoutError):  # a new watch gets not even its headers
        late.getresponse()
    late.close()
    api.stall_watches(False)
    assert w.take(1) == [("ADDED", "n2")]


def test_bookmarks(api: FakeApiServer, watches: list[Watch]) -> None:
    api.bookmark_interval = 0.05
    api.add_node("n1")
    w = open_watch(watches, api, "/api/v1/nodes?watch=true&allowWatchBookmarks=true")
    assert w.take(1) == [("ADDED", "n1")]
    event = w.next()
    assert event == {
        "type": "BOOKMARK",
        "object": {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(api.resource_version)},
        },
    }


def test_stop_ends_streams_promptly(watches: list[Watch]) -> None:
    api = FakeApiServer().start()
    w = open_watch(watches, api, "/api/v1/nodes?watch=true")
    assert api.wait_for(lambda: api.open_watches == 1)
    started = time.monotonic()
    api.stop()
    try:
        assert w.next() is None
    except (http.client.HTTPException, OSError):
        pass
    assert time.monotonic() - started < 1.5


# -- faults and auth -----------------------------------------------------------------------------------


def test_fail_next_then_recover(api: FakeApiServer) -> None:
    api.add_node("n1")
    api.fail_next(2, status=500, method="GET", path_contains="/nodes/n1")
    status, body, _ = call(api, "PATCH", "/api/v1/nodes/n1", {}, content_type="application/merge-patch+json")
    assert status == 200  # another method
    for _ in range(2):
        status, body, _ = call(api, "GET", "/api/v1/nodes/n1")
        assert (status, body["kind"], body["reason"]) == (500, "Status", "InternalError")
    assert call(api, "GET", "/api/v1/nodes/n1")[0] == 200

    api.fail_next(status=429)
    status, body, headers = call(api, "GET", "/api/v1/nodes")
    assert (status, body["reason"], headers["Retry-After"]) == (429, "TooManyRequests", "1")
    assert body["details"] == {"retryAfterSeconds": 1}
    api.fail_next(status=503, reason="ServiceUnavailable")
    assert call(api, "GET", "/api/v1/nodes")[0] == 503
    assert call(api, "GET", "/api/v1/nodes")[0] == 200


def test_stall_delays_one_request(api: FakeApiServer) -> None:
    api.stall(0.3, path_contains="/nodes")
    started = time.monotonic()
    assert call(api, "GET", "/api/v1/nodes")[0] == 200
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    assert call(api, "GET", "/api/v1/nodes")[0] == 200
    assert time.monotonic() - started < 0.3


def test_forbid_answers_like_rbac(api: FakeApiServer) -> None:
    api.add_node("n1")
    api.add_pod("ns", "p", node="n1")
    api.forbid("patch", "nodes")
    api.forbid("list", "pods")
    api.forbid("create", "pods/eviction")
    status, body, _ = call(api, "PATCH", "/api/v1/nodes/n1", {}, content_type="application/merge-patch+json")
    assert (status, body["reason"], body["details"]) == (403, "Forbidden", {"name": "n1", "kind": "nodes"})
    user = 'User "system:serviceaccount:gpu-operator:gpunode"'
    assert body["message"] == (
        f'nodes "n1" is forbidden: {user} cannot patch resource "nodes" in API group "" at the cluster scope'
    )
    status, body, _ = call(api, "GET", "/api/v1/namespaces/ns/pods")
    assert (
        body["message"]
        == f'pods is forbidden: {user} cannot list resource "pods" in API group "" in the namespace "ns"'
    )
    status, body, _ = call(api, "POST", "/api/v1/namespaces/ns/pods/p/eviction", {"metadata": {"name": "p"}})
    assert body["message"] == (
        f'pods "p" is forbidden: {user} cannot create resource "pods/eviction" in API group "" '
        'in the namespace "ns"'
    )
    assert call(api, "GET", "/api/v1/nodes/n1")[0] == 200
    api.allow_all()
    assert call(api, "GET", "/api/v1/namespaces/ns/pods")[0] == 200


def test_bearer_token(tmp_path: Path) -> None:
    with FakeApiServer(token="s3cret") as api:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{api.url}/api/v1/nodes", timeout=5)
        assert caught.value.code == 401
        assert json.loads(caught.value.read())["reason"] == "Unauthorized"
        caught.value.close()
        request = urllib.request.Request(
            f"{api.url}/api/v1/nodes", headers={"Authorization": "Bearer s3cret"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.loads(response.read())["kind"] == "NodeList"
        assert [r.status for r in api.requests] == [401, 200]

        config = yaml.safe_load(api.write_kubeconfig(tmp_path / "kubeconfig").read_text())
        assert config["users"][0]["user"] == {"token": "s3cret"}


def test_kubeconfig(api: FakeApiServer, tmp_path: Path) -> None:
    path = api.write_kubeconfig(tmp_path / "kube" / "config", namespace="gpu-operator")
    config = yaml.safe_load(path.read_text())
    assert config["current-context"] == "gpunode-fake"
    assert config["clusters"][0]["cluster"]["server"] == api.url
    assert config["contexts"][0]["context"] == {
        "cluster": "gpunode-fake",
        "user": "gpunode-fake",
        "namespace": "gpu-operator",
    }
    assert config["users"][0]["user"] == {}
    assert api.url.startswith("http://127.0.0.1:")


# -- pods: eviction, deletion delay, the DaemonSet controller ---------------------------------------------


def test_eviction_deletes_the_pod(api: FakeApiServer) -> None:
    api.add_node("n1")
    api.add_pod("ns", "p", node="n1", requests={"nvidia.com/gpu": "1"})
    assert api.pods("n1")[0]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p", "namespace": "ns"}}
    status, body, _ = call(api, "POST", "/api/v1/namespaces/ns/pods/p/eviction", eviction)
    assert (status, body["kind"], body["status"]) == (201, "Status", "Success")
    assert api.pods() == []
    status, body, _ = call(api, "POST", "/api/v1/namespaces/ns/pods/p/eviction", eviction)
    assert (status, body["message"]) == (404, 'pods "p" not found')
    status, body, _ = call(api, "POST", "/api/v1/namespaces/ns/pods/q/eviction", eviction)
    assert (status, body["reason"]) == (400, "BadRequest")


@pytest.mark.parametrize(
    ("budget", "evictable"),
    [
        ({"minAvailable": 2}, 0),  # two healthy, two required
        ({"minAvailable": 1}, 1),
        ({"maxUnavailable": 0}, 0),
        ({"maxUnavailable": 1}, 1),
        ({"minAvailable": "50%"}, 1),
    ],
)
def test_eviction_honours_pod_disruption_budgets(
    api: FakeApiServer, budget: dict[str, Any], evictable: int
) -> None:
    api.add_node("n1")
    for name in ("a", "b"):
        api.add_pod("ns", name, node="n1", labels={"app": "guarded"})
    api.add_pod("ns", "other", node="n1", labels={"app": "free"})
    api.create(
        "PodDisruptionBudget",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "pdb", "namespace": "ns"},
            "spec": {**budget, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    evicted = 0
    for name in ("a", "b"):
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": "ns"},
        }
        status, body, _ = call(api, "POST", f"/api/v1/namespaces/ns/pods/{name}/eviction", eviction)
        if status == 201:
            evicted += 1
        else:
            assert (status, body["reason"]) == (429, "TooManyRequests")
            assert "disruption budget" in body["message"]
    assert evicted == evictable
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "other", "namespace": "ns"},
    }
    assert call(api, "POST", "/api/v1/namespaces/ns/pods/other/eviction", eviction)[0] == 201


def test_observers_see_every_write_and_daemon_pods_start_with_the_hooks_status(api: FakeApiServer) -> None:
    seen: list[tuple[str, str]] = []
    api.observers.append(lambda e: seen.append((e.type, e.resource)))
    api.daemon_pod_status = lambda pod: {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
    }
    api.add_node("n1", {"gpu": "true"})
    api.add_daemonset("ns", "ds", {"gpu": "true"}, {"app": "ds"})
    assert ("ADDED", "nodes") in seen
    assert ("ADDED", "pods") in seen
    assert api.pods("n1")[0]["status"]["conditions"] == [{"type": "Ready", "status": "False"}]


def test_pod_deletion_delay(api: FakeApiServer, watches: list[Watch]) -> None:
    api.pod_deletion_delay = 0.3
    api.add_node("n1")
    api.add_pod("ns", "p", node="n1")
    w = open_watch(watches, api, f"/api/v1/pods?watch=true&resourceVersion={api.resource_version}")
    status, body, _ = call(api, "DELETE", "/api/v1/namespaces/ns/pods/p")
    assert status == 200
    assert body["metadata"]["deletionTimestamp"].endswith("Z")
    assert api.pods()[0]["metadata"]["deletionGracePeriodSeconds"] == 1
    event = w.next()
    assert event is not None
    assert event["type"] == "MODIFIED"
    assert "deletionTimestamp" in event["object"]["metadata"]
    started = time.monotonic()
    assert w.take(1) == [("DELETED", "p")]
    assert 0.1 < time.monotonic() - started < 2
    assert api.pods() == []

    api.add_pod("ns", "q", node="n1")
    assert call(api, "DELETE", "/api/v1/namespaces/ns/pods/q?gracePeriodSeconds=0")[0] == 200
    assert api.pods() == []  # grace period 0 deletes at once


def test_daemonset_follows_node_labels(api: FakeApiServer) -> None:
    api.pod_deletion_delay = 0.1
    api.add_node("n1", {"nvidia.com/gpu.deploy.operands": "true"})
    api.add_node("n2", {})
    api.add_daemonset("gpu", "exporter", {"nvidia.com/gpu.deploy.operands": "true"}, {"app": "exporter"})
    (pod,) = api.pods()
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["metadata"]["name"].startswith("exporter-")
    assert pod["metadata"]["labels"] == {"app": "exporter"}
    assert pod["status"]["phase"] == "Running"
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("DaemonSet", "exporter", True)

    status, ds, _ = call(api, "GET", "/apis/apps/v1/namespaces/gpu/daemonsets/exporter")
    assert (status, ds["kind"], ds["metadata"]["uid"]) == (200, "DaemonSet", owner["uid"])
    assert call(api, "GET", "/apis/apps/v1/namespaces/gpu/daemonsets/other")[0] == 404

    api.patch_node("n1", {"metadata": {"labels": {"nvidia.com/gpu.deploy.operands": "false"}}})
    assert "deletionTimestamp" in api.pods("n1")[0]["metadata"]
    assert api.wait_for(lambda: api.pods() == [], timeout=3)

    api.patch_node("n1", {"metadata": {"labels": {"nvidia.com/gpu.deploy.operands": "true"}}})
    api.patch_node("n2", {"metadata": {"labels": {"nvidia.com/gpu.deploy.operands": "true"}}})
    assert sorted(p["spec"]["nodeName"] for p in api.pods()) == ["n1", "n2"]
    assert api.pods("n1")[0]["metadata"]["name"] != pod["metadata"]["name"]

    api.delete("pods", api.pods("n2")[0]["metadata"]["name"], "gpu")  # the controller replaces it
    assert api.wait_for(
        lambda: len([p for p in api.pods("n2") if "deletionTimestamp" not in p["metadata"]]) == 1
    )

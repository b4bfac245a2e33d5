"""gpunode.sim.apiserver: server-side apply and managedFields over HTTP (the simplified leaf-path model)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode.sim.apiserver import ApiError, FakeApiServer

APPLY = "application/apply-patch+yaml"
CM = "/api/v1/namespaces/ns/configmaps"
GOLDEN = Path(__file__).parents[2] / "golden" / "render"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def call(
    api: FakeApiServer, method: str, path: str, body: Any = None, *, content_type: str = APPLY
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        headers = {"User-Agent": "kubectl/v1.31.0 (linux/amd64)"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def cm(data: dict[str, str], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", **meta}, "data": data}


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {(m["manager"], m["operation"]): m["fieldsV1"] for m in obj["metadata"]["managedFields"]}


def test_apply_creates_then_updates(api: FakeApiServer) -> None:
    status, created = call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({"a": "1", "b": "2"}))
    assert status == 201
    assert created["data"] == {"a": "1", "b": "2"}
    entry = created["metadata"]["managedFields"][0]
    assert (entry["manager"], entry["operation"], entry["fieldsType"], entry["apiVersion"]) == (
        "op",
        "Apply",
        "FieldsV1",
        "v1",
    )
    assert entry["fieldsV1"] == {"f:data": {"f:a": {}, "f:b": {}}}
    rv = created["metadata"]["resourceVersion"]
    status, same = call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({"a": "1", "b": "2"}))
    assert (status, same["metadata"]["resourceVersion"]) == (200, rv)  # nothing changed, nothing written
    # a field left out of the next apply, owned by nobody else, is removed
    status, updated = call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({"a": "3"}))
    assert (status, updated["data"]) == (200, {"a": "3"})
    assert managers(updated) == {("op", "Apply"): {"f:data": {"f:a": {}}}}


def test_apply_conflict_and_force(api: FakeApiServer) -> None:
    call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({"a": "1", "b": "2"}))
    # another applier setting a field to a different value conflicts: the real Status shape
    status, body = call(api, "PATCH", f"{CM}/c?fieldManager=other", cm({"a": "9"}))
    assert status == 409
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Apply failed with 1 conflict: conflict with "op" using v1: .data.a',
        "reason": "Conflict",
        "details": {
            "causes": [
                {
                    "reason": "FieldManagerConflict",
                    "message": 'conflict with "op" using v1',
                    "field": ".data.a",
                }
            ]
        },
        "code": 409,
    }
    assert api.apply_conflicts == 1
    status, body = call(api, "PATCH", f"{CM}/c?fieldManager=other", cm({"a": "9", "b": "8"}))
    assert (
        body["message"]
        == 'Apply failed with 2 conflicts: conflicts with "op" using v1:\n- .data.a\n- .data.b'
    )
    assert [c["field"] for c in body["details"]["causes"]] == [".data.a", ".data.b"]
    # the same value is shared ownership, no conflict
    status, shared = call(api, "PATCH", f"{CM}/c?fieldManager=other", cm({"b": "2"}))
    assert status == 200
    assert managers(shared)[("other", "Apply")] == {"f:data": {"f:b": {}}}
    # force takes the field
    status, forced = call(api, "PATCH", f"{CM}/c?fieldManager=other&force=true", cm({"a": "9", "b": "2"}))
    assert (status, forced["data"]) == (200, {"a": "9", "b": "2"})
    assert managers(forced)[("op", "Apply")] == {"f:data": {"f:b": {}}}
    # op drops b: other still owns it, so it stays
    status, kept = call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({}))
    assert (status, kept["data"]) == (200, {"a": "9", "b": "2"})


def test_an_update_takes_fields_from_appliers(api: FakeApiServer) -> None:
    call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({"a": "1"}))
    status, edited = call(
        api, "PATCH", f"{CM}/c", {"data": {"a": "2"}}, content_type="application/merge-patch+json"
    )
    assert status == 200
    assert managers(edited) == {("kubectl", "Update"): {"f:data": {"f:a": {}}}}  # User-Agent's first word
    status, body = call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({"a": "1"}))
    assert (status, body["details"]["causes"][0]["message"]) == (409, 'conflict with "kubectl" using v1')


def test_apply_errors(api: FakeApiServer) -> None:
    status, body = call(api, "PATCH", f"{CM}/c", cm({"a": "1"}))
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'
    )
    status, body = call(api, "PATCH", f"{CM}/c?fieldManager=op", {**cm({}), "apiVersion": "v2"})
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"] == (
        "Incorrect version specified in apply patch. Specified patch version: v2, expected: v1"
    )
    status, body = call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({}, name="d"))
    assert (status, body["reason"]) == (400, "BadRequest")
    call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({"a": "1"}))
    status, body = call(api, "PATCH", f"{CM}/c?fieldManager=op", cm({"a": "2"}, resourceVersion="1"))
    assert (status, body["reason"]) == (409, "Conflict")  # a stale resourceVersion precondition
    status, body = call(api, "PATCH", f"{CM}/c?fieldManager=op&dryRun=All", cm({"a": "2"}))
    assert (status, body["data"]) == (200, {"a": "2"})
    assert api.get("configmaps", "c", "ns") is not None
    assert api.get("configmaps", "c", "ns")["data"] == {"a": "1"}  # dry run: nothing stored


def test_apply_status_subresource_and_python_api(api: FakeApiServer) -> None:
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}},
        },
        "status": {"numberReady": 7},
    }
    created = api.apply("daemonsets", ds, manager="op")
    assert created["metadata"]["generation"] == 1
    assert created["status"]["numberReady"] == 0  # status through the main resource is ignored
    with pytest.raises(ApiError) as err:
        api.apply("daemonsets", {**ds, "spec": {"selector": {"matchLabels": {"app": "e"}}}}, manager="x")
    assert err.value.code == 409
    forced = api.apply(
        "daemonsets", {**ds, "spec": {"selector": {"matchLabels": {"app": "e"}}}}, manager="x", force=True
    )
    assert forced["spec"]["selector"] == {"matchLabels": {"app": "e"}}
    assert forced["metadata"]["generation"] == 2
    status, body = call(api, "PATCH", "/apis/apps/v1/namespaces/ns/daemonsets/d/status?fieldManager=s", ds)
    assert (status, body["details"]["causes"][0]["message"]) == (
        409,
        'conflict with "kube-controller-manager" using apps/v1',  # the controller wrote the status
    )
    path = "/apis/apps/v1/namespaces/ns/daemonsets/d/status?fieldManager=s&force=true"
    status, body = call(api, "PATCH", path, ds)
    assert status == 200
    assert body["spec"]["selector"] == {"matchLabels": {"app": "e"}}  # /status changes only status
    entry = next(m for m in body["metadata"]["managedFields"] if m["manager"] == "s")
    assert (entry["subresource"], entry["fieldsV1"]) == ("status", {"f:status": {"f:numberReady": {}}})


@pytest.mark.parametrize("golden", ["operator-default.yaml", "default.yaml", "exporter-servicemonitor.yaml"])
def test_rendered_manifests_apply_as_kubectl_would(api: FakeApiServer, golden: str) -> None:
    """Every object `gpunode render` writes is served: found through discovery (as kubectl finds it),
    applied server-side (201), applied again unchanged (200, nothing written). ServiceMonitors
    need the Prometheus operator's CRD, which the fake (like a bare cluster) does not have: 404."""
    docs = [d for d in yaml.safe_load_all((GOLDEN / golden).read_text()) if d]
    first = {"Namespace": 0, "CustomResourceDefinition": 1}
    docs.sort(key=lambda d: first.get(d["kind"], 2))
    for doc in docs:
        group_version = doc["apiVersion"]
        listing = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        status, discovered = call(api, "GET", listing)
        resources = discovered.get("resources", []) if status == 200 else []
        found = [r for r in resources if r["kind"] == doc["kind"] and "/" not in r["name"]]
        if doc["apiVersion"] == "monitoring.coreos.com/v1":  # ServiceMonitor, PodMonitor, PrometheusRule
            assert (status, found) == (404, []), doc["metadata"]["name"]
            continue
        assert len(found) == 1, (doc["kind"], group_version)
        plural, namespaced = found[0]["name"], found[0]["namespaced"]
        meta = doc["metadata"]
        scope = f"/namespaces/{meta.get('namespace', 'default')}" if namespaced else ""
        path = f"{listing}{scope}/{plural}/{meta['name']}?fieldManager=gpunode-operator&force=true"
        status, created = call(api, "PATCH", path, doc)
        assert status == 201, (doc["kind"], meta["name"], created)
        status, current = call(api, "GET", path.split("?")[0])
        assert status == 200  # (the controllers may have written status since)
        status, again = call(api, "PATCH", path, doc)
        assert status == 200
        assert again["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]

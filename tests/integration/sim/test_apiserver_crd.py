"""gpunode.sim.apiserver: CustomResourceDefinitions and their resources, the /status subresource,
generation, and the generic built-in kinds (Leases, RBAC, RuntimeClasses, ...), over HTTP."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpunode.sim.apiserver import FakeApiServer

GROUP = "nvidia.com"
CP = f"/apis/{GROUP}/v1/clusterpolicies"
WIDGETS = "/apis/example.com/v1beta1/namespaces/ns/widgets"


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
    user_agent: str = "gpunode-test/1.0",
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        headers = {"User-Agent": user_agent}
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


def crd(
    plural: str,
    kind: str,
    group: str,
    scope: str,
    versions: tuple[str, ...] = ("v1",),
    *,
    status: bool = True,
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": v,
                    "served": True,
                    "storage": i == 0,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                    **({"subresources": {"status": {}}} if status else {}),
                }
                for i, v in enumerate(versions)
            ],
        },
    }


def test_crd_creates_a_served_cluster_scoped_resource(api: FakeApiServer) -> None:
    assert call(api, "GET", CP)[0] == 404
    status, body = call(
        api,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        crd("clusterpolicies", "ClusterPolicy", GROUP, "Cluster"),
    )
    assert status == 201
    conditions = {c["type"]: c["status"] for c in body["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert body["status"]["acceptedNames"]["kind"] == "ClusterPolicy"
    assert body["status"]["storedVersions"] == ["v1"]

    # discovery
    status, groups = call(api, "GET", "/apis")
    group = next(g for g in groups["groups"] if g["name"] == GROUP)
    assert group["preferredVersion"] == {"groupVersion": f"{GROUP}/v1", "version": "v1"}
    status, resources = call(api, "GET", f"/apis/{GROUP}/v1")
    assert (status, resources["kind"], resources["groupVersion"]) == (200, "APIResourceList", f"{GROUP}/v1")
    by_name = {r["name"]: r for r in resources["resources"]}
    assert by_name["clusterpolicies"]["namespaced"] is False
    assert by_name["clusterpolicies"]["kind"] == "ClusterPolicy"
    assert by_name["clusterpolicies/status"]["verbs"] == ["get", "patch", "update"]

    obj = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"enabled": True}},
        "status": {"state": "ready"},
    }
    status, created = call(api, "POST", CP, obj)
    assert status == 201
    assert created["metadata"]["generation"] == 1
    assert "status" not in created  # a create says nothing about status
    assert created["metadata"]["managedFields"][0]["manager"] == "gpunode-test"
    assert call(api, "POST", CP, obj)[0] == 409
    status, listed = call(api, "GET", CP)
    assert (status, listed["kind"], len(listed["items"])) == (200, "ClusterPolicyList", 1)
    assert call(api, "GET", f"/apis/{GROUP}/v1/namespaces/x/clusterpolicies/cluster-policy")[0] == 404

    # status through /status only
    created["status"] = {"state": "notReady"}
    created["spec"]["driver"]["enabled"] = False
    status, updated = call(api, "PUT", f"{CP}/cluster-policy/status", created)
    assert status == 200
    assert updated["status"] == {"state": "notReady"}
    assert updated["spec"]["driver"]["enabled"] is True  # /status changes only status
    assert updated["metadata"]["generation"] == 1
    # the main resource ignores status; a spec change bumps generation
    updated["status"] = {"state": "ignored"}
    updated["spec"]["driver"]["enabled"] = False
    status, main = call(api, "PUT", f"{CP}/cluster-policy", updated)
    assert (status, main["status"], main["spec"]["driver"]["enabled"]) == (200, {"state": "notReady"}, False)
    assert main["metadata"]["generation"] == 2
    # a stale resourceVersion conflicts
    status, body = call(api, "PUT", f"{CP}/cluster-policy", updated)
    assert (status, body["reason"]) == (409, "Conflict")
    assert body["message"].startswith(
        'Operation cannot be fulfilled on clusterpolicies.nvidia.com "cluster-policy"'
    )
    # status patches keep generation; metadata-only patches too
    merge = "application/merge-patch+json"
    status, patched = call(
        api, "PATCH", f"{CP}/cluster-policy/status", {"status": {"state": "ready"}}, content_type=merge
    )
    assert (status, patched["status"], patched["metadata"]["generation"]) == (200, {"state": "ready"}, 2)
    status, patched = call(
        api, "PATCH", f"{CP}/cluster-policy", {"metadata": {"labels": {"a": "b"}}}, content_type=merge
    )
    assert (status, patched["metadata"]["generation"]) == (200, 2)
    status, body = call(
        api,
        "PATCH",
        f"{CP}/cluster-policy",
        {"spec": {}},
        content_type="application/strategic-merge-patch+json",
    )
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    status, got = call(api, "GET", f"{CP}/cluster-policy/status")
    assert (status, got["status"]) == (200, {"state": "ready"})

    # deleting the CRD deletes its objects and stops serving it
    status, _ = call(
        api, "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clusterpolicies.nvidia.com"
    )
    assert status == 200
    assert call(api, "GET", CP)[0] == 404
    assert all(g["name"] != GROUP for g in call(api, "GET", "/apis")[1]["groups"])


def test_namespaced_crd_with_two_versions_and_watch(api: FakeApiServer) -> None:
    api.create(
        "customresourcedefinitions",
        crd("widgets", "Widget", "example.com", "Namespaced", ("v1beta1", "v1alpha1"), status=False),
    )
    status, group = call(api, "GET", "/apis/example.com")
    assert [v["version"] for v in group["versions"]] == ["v1beta1", "v1alpha1"]
    w = {
        "apiVersion": "example.com/v1beta1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 1},
        "status": {"ok": True},
    }
    status, created = call(api, "POST", WIDGETS, w)
    assert (status, created["metadata"]["namespace"], created["status"]) == (
        201,
        "ns",
        {"ok": True},
    )  # no status subresource
    status, other = call(api, "GET", "/apis/example.com/v1alpha1/namespaces/ns/widgets/w1")
    assert (status, other["apiVersion"]) == (200, "example.com/v1alpha1")
    assert call(api, "GET", f"{WIDGETS}/w1/status")[0] == 404
    assert api.objects("widgets")[0]["metadata"]["name"] == "w1"

    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    conn.request(
        "GET",
        f"/apis/example.com/v1beta1/widgets?watch=true&resourceVersion={api.resource_version}&timeoutSeconds=5",
    )
    response = conn.getresponse()
    call(api, "PATCH", f"{WIDGETS}/w1", {"spec": {"size": 2}}, content_type="application/merge-patch+json")
    event = json.loads(response.readline())
    assert (event["type"], event["object"]["spec"], event["object"]["metadata"]["generation"]) == (
        "MODIFIED",
        {"size": 2},
        2,
    )
    conn.close()


def test_crd_validation(api: FakeApiServer) -> None:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    bad = crd("widgets", "Widget", "example.com", "Namespaced")
    bad["metadata"]["name"] = "gadgets.example.com"
    status, body = call(api, "POST", path, bad)
    assert (status, body["reason"]) == (422, "Invalid")
    assert 'must be spec.names.plural+"."+spec.group' in body["message"]
    bad = crd("widgets", "Widget", "example.com", "Everywhere")
    assert call(api, "POST", path, bad)[0] == 422


@pytest.mark.parametrize(
    ("path", "kind", "body_extra"),
    [
        ("/apis/coordination.k8s.io/v1/namespaces/ns/leases", "Lease", {"spec": {"holderIdentity": "a"}}),
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", "ClusterRole", {"rules": []}),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", "ClusterRoleBinding", {"subjects": []}),
        ("/apis/node.k8s.io/v1/runtimeclasses", "RuntimeClass", {"handler": "nvidia"}),
        ("/api/v1/namespaces/ns/serviceaccounts", "ServiceAccount", {}),
        ("/api/v1/namespaces/ns/configmaps", "ConfigMap", {"data": {"a": "b"}}),
        ("/api/v1/namespaces/ns/services", "Service", {"spec": {"ports": [{"port": 80}]}}),
        ("/api/v1/namespaces", "Namespace", {}),
        ("/apis/apps/v1/namespaces/ns/deployments", "Deployment", {"spec": {"replicas": 1}}),
    ],
)
def test_generic_kinds(api: FakeApiServer, path: str, kind: str, body_extra: dict[str, Any]) -> None:
    obj = {"metadata": {"name": "x"}, **body_extra}
    status, created = call(api, "POST", path, obj)
    assert (status, created["kind"]) == (201, kind)
    status, got = call(api, "GET", f"{path}/x")
    assert (status, got["metadata"]["uid"]) == (200, created["metadata"]["uid"])
    status, listed = call(api, "GET", path)
    assert (status, listed["kind"], len(listed["items"])) == (200, f"{kind}List", 1)
    status, patched = call(
        api,
        "PATCH",
        f"{path}/x",
        {"metadata": {"labels": {"k": "v"}}},
        content_type="application/merge-patch+json",
    )
    assert (status, patched["metadata"]["labels"]) == (200, {"k": "v"})
    assert call(api, "DELETE", f"{path}/x")[0] == 200
    assert call(api, "GET", f"{path}/x")[0] == 404


def test_lease_optimistic_concurrency(api: FakeApiServer) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/gpu/leases"
    lease = {
        "metadata": {"name": "gpunode-operator"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    status, first = call(api, "POST", path, lease)
    assert status == 201
    mine = json.loads(json.dumps(first))
    mine["spec"]["holderIdentity"] = "b"
    status, taken = call(api, "PUT", f"{path}/gpunode-operator", mine)
    assert (status, taken["spec"]["holderIdentity"]) == (200, "b")
    first["spec"]["holderIdentity"] = "c"  # a stale resourceVersion
    status, body = call(api, "PUT", f"{path}/gpunode-operator", first)
    assert (status, body["reason"], body["details"]) == (
        409,
        "Conflict",
        {"name": "gpunode-operator", "group": "coordination.k8s.io", "kind": "leases"},
    )
    assert body["message"] == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "gpunode-operator": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )
    assert api.request_counts[("update", "leases.coordination.k8s.io")] == 2

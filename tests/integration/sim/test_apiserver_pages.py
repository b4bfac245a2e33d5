"""gpunode.sim.apiserver: paginated lists (`limit`, `continue`) with the real apiserver's shapes: one page
at a time, a consistent snapshot across pages, remainingItemCount without selectors, 400 for a token that
is not one, 410 Expired for one whose snapshot is gone; and lightkube reading a list page by page."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gpunode.kube.client import Kube, load_kubeconfig
from gpunode.sim.apiserver import FakeApiServer

NODES = "/api/v1/nodes"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def get(api: FakeApiServer, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def names(listing: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in listing["items"]]


def test_pages_continue_and_remaining_item_count(api: FakeApiServer) -> None:
    for i in range(7):
        api.add_node(f"n{i}", labels={"even": str(i % 2 == 0).lower()})
    status, page = get(api, f"{NODES}?limit=3")
    assert (status, page["kind"], names(page)) == (200, "NodeList", ["n0", "n1", "n2"])
    meta = page["metadata"]
    assert meta["remainingItemCount"] == 4
    token = json.loads(base64.urlsafe_b64decode(meta["continue"] + "=" * (-len(meta["continue"]) % 4)))
    assert token == {"v": "meta.k8s.io/v1", "rv": int(meta["resourceVersion"]), "start": "n2\x00"}
    seen = names(page)
    while "continue" in page["metadata"]:
        status, page = get(api, f"{NODES}?limit=3&continue={quote(page['metadata']['continue'])}")
        assert status == 200
        assert page["metadata"]["resourceVersion"] == meta["resourceVersion"]
        seen += names(page)
    assert seen == [f"n{i}" for i in range(7)]
    assert "remainingItemCount" not in page["metadata"]  # the last page: nothing remains
    # no limit (or 0): everything at once, no continue
    for path in (NODES, f"{NODES}?limit=0"):
        status, whole = get(api, path)
        assert (status, len(whole["items"]), "continue" in whole["metadata"]) == (200, 7, False)


def test_continue_reads_the_first_pages_snapshot(api: FakeApiServer) -> None:
    for i in range(5):
        api.add_node(f"n{i}")
    _, first = get(api, f"{NODES}?limit=2")
    api.delete("nodes", "n3")
    api.add_node("n9")
    api.patch_node("n4", {"metadata": {"labels": {"changed": "yes"}}})
    _, rest = get(api, f"{NODES}?continue={quote(first['metadata']['continue'])}&limit=10")
    assert names(rest) == ["n2", "n3", "n4"]  # as of the first page: n3 still there, n9 not yet
    assert "changed" not in (rest["items"][2]["metadata"].get("labels") or {})
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    _, fresh = get(api, NODES)
    assert names(fresh) == ["n0", "n1", "n2", "n4", "n9"]


def test_selectors_and_namespaces_with_limit(api: FakeApiServer) -> None:
    for i in range(6):
        api.add_node(f"n{i}", labels={"even": str(i % 2 == 0).lower()})
    _, page = get(api, f"{NODES}?limit=2&labelSelector=even%3Dtrue")
    assert names(page) == ["n0", "n2"]
    assert "remainingItemCount" not in page["metadata"]  # unknown with a selector, as the real server
    _, rest = get(
        api, f"{NODES}?limit=2&labelSelector=even%3Dtrue&continue={quote(page['metadata']['continue'])}"
    )
    assert names(rest) == ["n4"]
    assert "continue" not in rest["metadata"]

    for namespace, count in (("a", 3), ("b", 2)):
        for i in range(count):
            api.create("configmaps", {"metadata": {"name": f"cm{i}", "namespace": namespace}})
    _, page = get(api, "/api/v1/namespaces/b/configmaps?limit=1")
    assert ([i["metadata"]["namespace"] for i in page["items"]], page["metadata"]["remainingItemCount"]) == (
        ["b"],
        1,
    )
    _, rest = get(
        api, f"/api/v1/namespaces/b/configmaps?limit=1&continue={quote(page['metadata']['continue'])}"
    )
    assert (names(rest), "continue" in rest["metadata"]) == (["cm1"], False)
    _, every = get(api, "/api/v1/configmaps?limit=4")
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in every["items"]] == [
        ("a", "cm0"),
        ("a", "cm1"),
        ("a", "cm2"),
        ("b", "cm0"),
    ]
    assert every["metadata"]["remainingItemCount"] == 1


def test_bad_and_stale_tokens(api: FakeApiServer) -> None:
    for i in range(3):
        api.add_node(f"n{i}")
    _, page = get(api, f"{NODES}?limit=1")
    token = quote(page["metadata"]["continue"])

    def failure(path: str) -> tuple[int, str, str]:
        status, body = get(api, path)
        assert (body["kind"], body["status"], body["code"]) == ("Status", "Failure", status)
        return status, body["reason"], body["message"]

    status, reason, message = failure(f"{NODES}?limit=1&continue=not-a-token")
    assert (status, reason) == (400, "BadRequest")
    assert message.startswith("continue key is not valid")
    wrong = base64.urlsafe_b64encode(json.dumps({"v": "other", "rv": 3, "start": "n0\x00"}).encode()).decode()
    assert failure(f"{NODES}?continue={quote(wrong)}")[:2] == (400, "BadRequest")
    assert failure(f"{NODES}?continue={token}&resourceVersion=5") == (
        400,
        "BadRequest",
        "specifying resource version is not allowed when using continue",
    )
    assert failure(f"{NODES}?limit=x")[:2] == (400, "BadRequest")
    # a cluster-scoped token does not continue a namespaced list
    assert failure(f"/api/v1/pods?continue={token}")[:2] == (400, "BadRequest")

    api.compact()  # etcd compaction: the snapshot is gone
    status, reason, message = failure(f"{NODES}?limit=1&continue={token}")
    assert (status, reason) == (410, "Expired")
    assert "too old to display a consistent list result" in message

    # only the most recent list_snapshots lists can be continued
    api.list_snapshots = 2
    tokens = []
    for i in range(3):
        api.add_node(f"later-{i}")  # a new resourceVersion: a new snapshot
        tokens.append(quote(get(api, f"{NODES}?limit=1")[1]["metadata"]["continue"]))
    assert failure(f"{NODES}?limit=1&continue={tokens[0]}")[:2] == (410, "Expired")
    for kept in tokens[1:]:
        assert get(api, f"{NODES}?limit=1&continue={kept}")[0] == 200


def test_lightkube_reads_a_large_list_page_by_page(api: FakeApiServer, tmp_path: Path) -> None:
    for i in range(25):
        api.add_node(f"gpu-{i:02d}", labels={"feature.node.kubernetes.io/pci-10de.present": "true"})
    api.write_kubeconfig(tmp_path / "kubeconfig")

    async def listing() -> list[str]:
        kube = Kube(None, load_kubeconfig(str(tmp_path / "kubeconfig")), cluster_wide=True)
        try:
            nodes, version = await kube.list_nodes(chunk_size=10)
            assert version == str(api.resource_version)
            return [n.name for n in nodes]
        finally:
            await kube.aclose()

    before = len(api.requests)
    assert asyncio.run(listing()) == [f"gpu-{i:02d}" for i in range(25)]
    lists = [r for r in api.requests[before:] if r.method == "GET" and r.path == NODES]
    assert [r.query.get("limit") for r in lists] == ["10", "10", "10"]
    assert ["continue" in r.query for r in lists] == [False, True, True]

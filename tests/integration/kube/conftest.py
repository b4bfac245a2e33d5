"""Where the Kubernetes-layer tests point: the test API server, and a real cluster when configured.

Tests marked ``cluster`` take the ``target`` fixture and run twice: against the test API server and,
when ``GPUNODE_TEST_KUBECONFIG`` (a kubeconfig) and ``GPUNODE_TEST_NODE`` (a node the tests may label)
are set, against that cluster (skipped otherwise). They only add and remove keys under
``test.gpunode.io/`` and objects named ``gpunode-test-*``. Tests that inject faults take ``api`` (the
test API server) directly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpunode.sim.apiserver import FakeApiServer

NODE = "node-1"


@dataclass(frozen=True)
class Target:
    kubeconfig: Path
    node: str
    namespace: str
    api: FakeApiServer | None  # None on a real cluster


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node(NODE, labels={"kubernetes.io/hostname": NODE})
        server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


@pytest.fixture(params=["test-api-server", "cluster"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "cluster":
        kubeconfig, node = os.environ.get("GPUNODE_TEST_KUBECONFIG"), os.environ.get("GPUNODE_TEST_NODE")
        if not (kubeconfig and node):
            pytest.skip("no cluster configured (GPUNODE_TEST_KUBECONFIG, GPUNODE_TEST_NODE)")
        yield Target(Path(kubeconfig), node, os.environ.get("GPUNODE_TEST_NAMESPACE", "default"), None)
        return
    server = request.getfixturevalue("api")
    yield Target(tmp_path / "kubeconfig", NODE, "default", server)

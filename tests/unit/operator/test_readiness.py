"""gpunode.operator.readiness: NVIDIA's DaemonSet readiness rules in a table."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.operator.readiness import (
    DaemonSetView,
    PodView,
    daemonset_readiness,
    daemonset_view,
    newest_revision_hash,
    pod_view,
)


def ds(**kw: Any) -> DaemonSetView:
    base: dict[str, Any] = dict(
        name="ds", generation=2, observed_generation=2, desired=3, updated=3, available=3, ready=3
    )
    base.update(kw)
    return DaemonSetView(**base)


def pod(node: str, rev: str = "new", ready: bool = True) -> PodView:
    return PodView(f"p-{node}", node, rev, ready)


PODS = [pod("n1"), pod("n2"), pod("n3")]


@pytest.mark.parametrize(
    ("view", "pods", "newest", "ready", "nodes", "message"),
    [
        (ds(desired=0, updated=0, available=0, ready=0), [], None, True, (), ""),
        (ds(desired=0, updated=0, available=0, strategy="OnDelete"), [], None, True, (), ""),
        (ds(), PODS, "new", True, (), ""),
        (
            ds(unavailable=1, available=2),
            [*PODS[:2], pod("n3", ready=False)],
            "new",
            False,
            ("n3",),
            "1 of 3 pods unavailable",
        ),
        (ds(observed_generation=1), PODS, "new", False, (), "generation 2 not yet observed"),
        (
            ds(updated=2),
            [*PODS[:2], pod("n3", "old")],
            "new",
            False,
            ("n3",),
            "2 updated and 3 available of 3 desired pods",
        ),
        # OnDelete: observedGeneration and updated counts do not matter, revisions and readiness do
        (ds(strategy="OnDelete", updated=0, observed_generation=1), PODS, "new", True, (), ""),
        (
            ds(strategy="OnDelete"),
            [*PODS[:2], pod("n3", "old")],
            "new",
            False,
            ("n3",),
            "1 of 3 pods not on the newest revision",
        ),
        (
            ds(strategy="OnDelete"),
            [*PODS[:2], pod("n3", ready=False)],
            "new",
            False,
            ("n3",),
            "1 of 3 pods not ready",
        ),
        (ds(strategy="OnDelete"), PODS[:2], "new", False, (), "2 of 3 pods scheduled"),
        (ds(strategy="OnDelete"), PODS, None, False, (), "no ControllerRevision yet"),
    ],
)
def test_readiness(
    view: DaemonSetView,
    pods: list[PodView],
    newest: str | None,
    ready: bool,
    nodes: tuple[str, ...],
    message: str,
) -> None:
    got = daemonset_readiness(view, pods, newest)
    assert (got.ready, got.nodes, got.message) == (ready, nodes, message)
    assert got.desired == view.desired


def test_views_from_json() -> None:
    obj = {
        "metadata": {"name": "driver", "namespace": "gpunode", "generation": 4},
        "spec": {"updateStrategy": {"type": "OnDelete"}},
        "status": {
            "observedGeneration": 3,
            "desiredNumberScheduled": 2,
            "updatedNumberScheduled": 1,
            "numberAvailable": 2,
            "numberReady": 2,
            "numberUnavailable": 0,
        },
    }
    assert daemonset_view(obj) == DaemonSetView("driver", "gpunode", 4, 3, "OnDelete", 2, 1, 2, 2, 0)
    assert daemonset_view({"metadata": {"name": "x"}}).strategy == "RollingUpdate"
    p = {
        "metadata": {"name": "driver-abc", "labels": {"controller-revision-hash": "h1"}},
        "spec": {"nodeName": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert pod_view(p) == PodView("driver-abc", "n1", "h1", True)
    assert not pod_view({"metadata": {"name": "x"}, "status": {}}).ready
    assert pod_view({"metadata": {"name": "x"}, "status": {"phase": "Running"}}).ready
    not_ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
    assert not pod_view({"metadata": {"name": "x"}, "status": not_ready}).ready
    unready_container = {"phase": "Running", "containerStatuses": [{"ready": True}, {"ready": False}]}
    assert not pod_view({"metadata": {"name": "x"}, "status": unready_container}).ready


def test_newest_revision() -> None:
    revs = [
        {"metadata": {"name": "driver-aaa", "labels": {"controller-revision-hash": "aaa"}}, "revision": 1},
        {"metadata": {"name": "driver-ccc"}, "revision": 3},
        {"metadata": {"name": "driver-bbb", "labels": {"controller-revision-hash": "bbb"}}, "revision": 2},
    ]
    assert newest_revision_hash(revs) == "ccc"
    assert newest_revision_hash([]) is None

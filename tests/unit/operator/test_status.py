"""gpunode.operator.status: the ClusterPolicy status from the states' verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.operator.readiness import Readiness
from gpunode.operator.status import StateStatus, cluster_status, ignored_status, state_status

T0 = "2026-12-01T10:00:00Z"
T1 = "2026-12-01T10:05:00Z"
OK = Readiness(True, 3, 3, 0)


def bad(*nodes: str) -> Readiness:
    n = len(nodes)
    return Readiness(False, 10, 10 - n, n, tuple(sorted(nodes)), f"{n} of 10 pods unavailable")


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_state_status_sums_and_caps_nodes() -> None:
    s = state_status("state-driver", {"a": bad("n1", "n2", "n3", "n4"), "b": bad("n5", "n6", "n0")})
    assert s.state == "notReady"
    assert (s.desired, s.ready, s.unavailable) == (20, 13, 7)
    assert s.nodes == ("n0", "n1", "n2", "n3", "n4")
    assert s.message == "a: 4 of 10 pods unavailable; b: 3 of 10 pods unavailable; 2 more nodes"


@pytest.mark.parametrize(
    ("verdicts", "enabled", "state"),
    [
        ({}, True, "ready"),
        ({"a": OK}, True, "ready"),
        ({"a": OK, "b": bad("n1")}, True, "notReady"),
        ({}, False, "disabled"),
    ],
)
def test_state_status_state(verdicts: dict[str, Readiness], enabled: bool, state: str) -> None:
    assert state_status("s", verdicts, enabled=enabled).state == state


READY_STATE = StateStatus("state-driver", "ready", 3, 3, 0)
BLOCKED = StateStatus("state-device-plugin", "notReady", 3, 2, 1, ("n2",), "plugin: 1 of 3 pods unavailable")


@pytest.mark.parametrize(
    ("states", "nfd", "gpus", "error", "state", "ready", "reason", "error_status"),
    [
        ([READY_STATE], 3, 3, None, "ready", "True", "Reconciled", "False"),
        ([READY_STATE, BLOCKED], 3, 3, None, "notReady", "False", "OperandNotReady", "False"),
        ([READY_STATE], 0, 0, None, "notReady", "False", "NFDLabelsMissing", "True"),
        ([READY_STATE], 2, 0, None, "ready", "True", "NoGPUNodes", "False"),
        ([READY_STATE], 3, 3, "spec.driver.version: bad", "notReady", "False", "ReconcileFailed", "True"),
    ],
)
def test_cluster_status(
    states: list[StateStatus],
    nfd: int,
    gpus: int,
    error: str | None,
    state: str,
    ready: str,
    reason: str,
    error_status: str,
) -> None:
    s = cluster_status("gpunode", states, now=T0, nfd_nodes=nfd, gpu_nodes=gpus, error=error)
    assert s["state"] == state
    assert s["namespace"] == "gpunode"
    assert (cond(s, "Ready")["status"], cond(s, "Ready")["reason"]) == (ready, reason)
    assert cond(s, "Error")["status"] == error_status
    assert s["states"] == [x.as_json() for x in states]


def test_not_ready_says_where() -> None:
    s = cluster_status("gpunode", [READY_STATE, BLOCKED], now=T0, nfd_nodes=3, gpu_nodes=3)
    assert cond(s, "Ready")["message"] == "state-device-plugin not ready on n2"
    assert s["states"][1] == {
        "name": "state-device-plugin",
        "state": "notReady",
        "desired": 3,
        "ready": 2,
        "unavailable": 1,
        "nodes": ["n2"],
        "message": "plugin: 1 of 3 pods unavailable",
    }


def test_unchanged_status_is_equal_and_transition_time_moves_only_on_change() -> None:
    first = cluster_status("gpunode", [READY_STATE], now=T0, nfd_nodes=1, gpu_nodes=1)
    again = cluster_status("gpunode", [READY_STATE], now=T1, nfd_nodes=1, gpu_nodes=1, previous=first)
    assert again == first
    changed = cluster_status("gpunode", [BLOCKED], now=T1, nfd_nodes=1, gpu_nodes=1, previous=first)
    assert cond(changed, "Ready")["lastTransitionTime"] == T1
    assert cond(changed, "Error")["lastTransitionTime"] == T0  # still False


def test_ignored_names_the_active_policy() -> None:
    s = ignored_status("cluster-policy", now=T0)
    assert s["state"] == "ignored"
    assert "'cluster-policy'" in cond(s, "Ready")["message"]
    assert cond(s, "Ready")["reason"] == "Ignored"
    assert ignored_status("cluster-policy", now=T1, previous=s) == s

"""The driver upgrade's pure decisions: limits, need, admission within both limits, and each node's step."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpunode.operator.upgrade_plan import (
    ACTIVE_STATES,
    STATES,
    LimitError,
    Limits,
    NodeView,
    Observed,
    Steps,
    admit,
    max_unavailable,
    need,
    step,
    unavailable_now,
)


@pytest.mark.parametrize(
    ("value", "total", "expected"),
    [
        (0, 10, 0),
        (3, 10, 3),
        ("3", 10, 3),
        ("25%", 10, 3),  # 2.5 rounded up, as NVIDIA
        ("10%", 1000, 100),
        ("10%", 1001, 101),
        ("1%", 5, 1),
        ("0%", 50, 0),
        ("100%", 7, 7),
        (" 50% ", 3, 2),
    ],
)
def test_max_unavailable_counts_and_percentages(value: int | str, total: int, expected: int) -> None:
    assert max_unavailable(value, total) == expected


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("150%", "over 100%"),
        (-1, "negative"),
        ("ten", "not a count or a percentage"),
        ("10.5%", "not a count or a percentage"),
        ("%", "not a count or a percentage"),
        (True, "not a count or a percentage"),
    ],
)
def test_bad_max_unavailable_names_the_field(value: int | str, words: str) -> None:
    with pytest.raises(LimitError) as info:
        max_unavailable(value, 10)
    assert info.value.path == "spec.driver.upgradePolicy.maxUnavailable"
    assert words in str(info.value)


BASE = NodeView(name="n", pod_revision="r1", newest_revision="r1", pod_digest="d1", newest_digest="d1")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, "none"),
        ({"newest_revision": "r2", "newest_digest": "d2"}, "upgrade"),
        ({"newest_revision": "r2"}, "restart"),  # label-only change: same install digest
        ({"newest_revision": "r2", "pod_digest": None}, "upgrade"),  # unknown digest: be safe
        ({"newest_revision": "r2", "newest_digest": "d2", "daemonset_complete": False}, "held"),
        ({"newest_revision": "r2", "newest_digest": "d2", "skip": True}, "held"),
        ({"requested": True}, "upgrade"),
        ({"pod_revision": None}, "none"),
    ],
)
def test_need(changes: dict[str, object], expected: str) -> None:
    what, why = need(dataclasses.replace(BASE, **changes))  # type: ignore[arg-type]
    assert what == expected
    assert why


def _nodes(*specs: tuple[str, str, bool, bool]) -> list[NodeView]:
    return [NodeView(name=n, state=s, unschedulable=u, ready=r) for n, s, u, r in specs]  # type: ignore[arg-type]


def test_admit_respects_max_parallel() -> None:
    nodes = _nodes(*[(f"n{i}", "upgrade-required", False, True) for i in range(5)])
    nodes.append(NodeView(name="busy", state="drain-required", unschedulable=True))
    got = admit(nodes, Limits(max_parallel=3, max_unavailable=10))
    assert got.start == ("n0", "n1")
    assert got.holding == ("busy",)
    assert "maxParallelUpgrades 3" in got.waiting["n2"]


def test_admit_respects_max_unavailable_and_counts_not_ready_nodes() -> None:
    nodes = _nodes(
        ("a", "upgrade-required", False, True),
        ("b", "upgrade-required", False, True),
        ("down", "", False, False),  # NotReady: already unavailable
    )
    got = admit(nodes, Limits(max_parallel=0, max_unavailable=2))
    assert got.start == ("a",)
    assert "maxUnavailable 2" in got.waiting["b"]


def test_an_admin_cordoned_node_starts_without_an_unavailability_slot() -> None:
    nodes = _nodes(
        ("a", "upgrade-required", True, True),  # cordoned by an administrator
        ("b", "upgrade-required", False, True),
    )
    got = admit(nodes, Limits(max_parallel=0, max_unavailable=1))
    # a's cordon is not the upgrade's: a costs nothing, b takes the one slot
    assert got.start == ("a", "b")
    # with our own cordon on d taking the slot, b waits (a still goes)
    ours = NodeView(name="d", state="pod-restart-required", unschedulable=True, cordoned_by_us=True)
    assert admit([*nodes, ours], Limits(max_parallel=0, max_unavailable=1)).start == ("a",)


def test_a_node_admitted_but_not_cordoned_yet_holds_its_unavailability_slot() -> None:
    # a was admitted in the previous pass and is not cordoned yet: b must not take the only slot too
    nodes = _nodes(("a", "cordon-required", False, True), ("b", "upgrade-required", False, True))
    got = admit(nodes, Limits(max_parallel=0, max_unavailable=1))
    assert got.start == ()
    assert "1 nodes unavailable" in got.waiting["b"]


def test_zero_max_parallel_is_unlimited() -> None:
    nodes = _nodes(*[(f"n{i:02}", "upgrade-required", False, True) for i in range(20)])
    assert len(admit(nodes, Limits(max_parallel=0, max_unavailable=20)).start) == 20


@settings(max_examples=300, deadline=None)
@given(
    states=st.lists(st.sampled_from(STATES), min_size=1, max_size=40),
    down=st.lists(st.booleans(), min_size=40, max_size=40),
    max_parallel=st.integers(0, 8),
    max_unavail=st.integers(0, 12),
)
def test_admission_never_breaks_a_limit_that_held_before(
    states: list[str], down: list[bool], max_parallel: int, max_unavail: int
) -> None:
    nodes = [
        NodeView(name=f"n{i:02}", state=s, unschedulable=down[i])  # type: ignore[arg-type]
        for i, s in enumerate(states)
    ]
    limits = Limits(max_parallel, max_unavail)
    got = admit(nodes, limits)
    after = [
        dataclasses.replace(
            n, state="cordon-required", unschedulable=True, cordoned_by_us=not n.unschedulable
        )
        if n.name in got.start
        else n
        for n in nodes
    ]
    active_before = sum(n.state in ACTIVE_STATES for n in nodes)
    active_after = sum(n.state in ACTIVE_STATES for n in after)
    if max_parallel:
        assert active_after <= max(max_parallel, active_before)
    assert unavailable_now(after) <= max(max_unavail, unavailable_now(nodes))
    assert set(got.start) | set(got.waiting) == {n.name for n in nodes if n.state == "upgrade-required"}


STALE = dataclasses.replace(BASE, newest_revision="r2", newest_digest="d2")
STEPS = Steps(wait_for_jobs_selector="app=train", wait_for_jobs_timeout=60, drain_enable=True)


@pytest.mark.parametrize(
    ("node", "seen", "to", "action", "words"),
    [
        (STALE, Observed(), "upgrade-required", None, "driver changes"),
        (dataclasses.replace(STALE, state="upgrade-done"), Observed(), "upgrade-required", None, "r1 -> r2"),
        (BASE, Observed(), "", None, "newest revision"),
        (
            dataclasses.replace(STALE, state="cordon-required"),
            Observed(),
            "wait-for-jobs-required",
            "cordon",
            "",
        ),
        (
            dataclasses.replace(STALE, state="cordon-required", newest_digest="d1"),
            Observed(),
            "pod-restart-required",
            "cordon",
            "without eviction",
        ),
        (
            dataclasses.replace(STALE, state="cordon-required", unschedulable=True),
            Observed(),
            "wait-for-jobs-required",
            None,
            "",
        ),
        (
            dataclasses.replace(STALE, state="wait-for-jobs-required"),
            Observed(jobs_left=2),
            "wait-for-jobs-required",
            None,
            "2 jobs",
        ),
        (
            dataclasses.replace(STALE, state="wait-for-jobs-required"),
            Observed(jobs_left=2, in_state_s=61),
            "pod-deletion-required",
            None,
            "timeoutSeconds 60",
        ),
        (
            dataclasses.replace(STALE, state="pod-deletion-required"),
            Observed(gpu_pods_left=3),
            "pod-deletion-required",
            "evict-gpu-pods",
            "3 GPU pods",
        ),
        (
            dataclasses.replace(STALE, state="pod-deletion-required"),
            Observed(gpu_pods_left=0),
            "drain-required",
            None,
            "",
        ),
        (
            dataclasses.replace(STALE, state="drain-required"),
            Observed(drain_left=1, in_state_s=301, blocked=("ns/p (PodDisruptionBudget pdb)",)),
            "upgrade-failed",
            None,
            "drain-required: pods would not leave within drain.timeoutSeconds 300: ns/p (PodDisruptionBudget",
        ),
        (
            dataclasses.replace(STALE, state="pod-deletion-required"),
            Observed(gpu_pods_left=1, refused=("ml/solo (not managed by a controller)",)),
            "drain-required",
            None,
            "may not be evicted (ml/solo",
        ),
        (
            dataclasses.replace(STALE, state="drain-required"),
            Observed(drain_left=1, refused=("ml/solo (emptyDir)",)),
            "upgrade-failed",
            None,
            "drain-required: pods may not be evicted: ml/solo (emptyDir)",
        ),
        (
            dataclasses.replace(STALE, state="pod-restart-required"),
            Observed(),
            "pod-restart-required",
            "delete-driver-pod",
            "",
        ),
        (
            dataclasses.replace(STALE, state="pod-restart-required", pod_revision="r2"),
            Observed(driver_restarts=11),
            "upgrade-failed",
            None,
            "crash-looping (11 restarts)",
        ),
        (
            dataclasses.replace(STALE, state="pod-restart-required", pod_revision="r2"),
            Observed(driver_ready=True),
            "validation-required",
            None,
            "",
        ),
        (
            dataclasses.replace(STALE, state="validation-required", pod_revision="r2"),
            Observed(in_state_s=601),
            "upgrade-failed",
            None,
            "validator not Ready after 600 s",
        ),
        (
            dataclasses.replace(STALE, state="uncordon-required", unschedulable=True, cordoned_by_us=True),
            Observed(),
            "upgrade-done",
            "uncordon",
            "",
        ),
        (
            dataclasses.replace(STALE, state="uncordon-required", unschedulable=True, cordoned_by_us=False),
            Observed(),
            "upgrade-done",
            None,
            "left cordoned",
        ),
        (
            dataclasses.replace(STALE, state="upgrade-failed", failed_revision="r2"),
            Observed(driver_ready=True),
            "upgrade-failed",
            None,
            "retry",
        ),
        (
            dataclasses.replace(STALE, state="upgrade-failed", failed_revision="r2", retry=True),
            Observed(),
            "upgrade-required",
            None,
            "retry requested",
        ),
        (
            dataclasses.replace(STALE, state="upgrade-failed", failed_revision="r1"),
            Observed(),
            "upgrade-required",
            None,
            "new driver revision r2",
        ),
    ],
)
def test_step(node: NodeView, seen: Observed, to: str, action: str | None, words: str) -> None:
    got = step(node, seen, STEPS)
    assert (got.to, got.action) == (to, action)
    assert words in got.reason


def test_pod_deletion_without_drain_fails_naming_the_pods() -> None:
    node = dataclasses.replace(STALE, state="pod-deletion-required")
    got = step(node, Observed(gpu_pods_left=1, in_state_s=300, blocked=("ml/trainer",)), Steps())
    assert got.to == "upgrade-failed"
    assert got.reason == "pod-deletion-required: GPU pods would not leave: ml/trainer"

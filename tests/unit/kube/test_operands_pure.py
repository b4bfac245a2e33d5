"""Operand pausing, the pure parts: what to pause, what to restore, which pods are in the way."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpunode.kube.operands import (
    DEFAULT_OPERANDS,
    Operand,
    PauseRecord,
    paused_value,
    plan_pause,
    plan_restore,
    pods_in_the_way,
)

DP = "nvidia.com/gpu.deploy.device-plugin"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
EXP = "nvidia.com/gpu.deploy.dcgm-exporter"
OPS = [Operand("device-plugin"), Operand("gpu-feature-discovery"), Operand("dcgm-exporter")]


@pytest.mark.parametrize(
    ("labels", "changes", "previous"),
    [
        pytest.param(
            {DP: "true", GFD: "true", EXP: "true"},
            {DP: "paused-for-mig-change", GFD: "paused-for-mig-change", EXP: "paused-for-mig-change"},
            {DP: "true", GFD: "true", EXP: "true"},
            id="all-true",
        ),
        pytest.param(
            {DP: "false", GFD: "true"}, {GFD: "paused-for-mig-change"}, {GFD: "true"}, id="false-kept"
        ),
        pytest.param({GFD: "true"}, {GFD: "paused-for-mig-change"}, {GFD: "true"}, id="absent-not-created"),
        pytest.param({DP: "paused-for-mig-change"}, {}, {}, id="already-paused-by-us"),
        pytest.param(
            {DP: "paused-for-driver-upgrade"},
            {DP: "paused-for-mig-change"},
            {DP: "paused-for-driver-upgrade"},
            id="other-pause-remembered",
        ),
        pytest.param(
            {DP: "custom"}, {DP: "paused-for-mig-change"}, {DP: "custom"}, id="any-value-remembered"
        ),
        pytest.param({}, {}, {}, id="nothing"),
    ],
)
def test_plan_pause(labels: dict[str, str], changes: dict[str, str], previous: dict[str, str]) -> None:
    assert plan_pause(labels, OPS, "mig-change") == (changes, previous)


def record(previous: dict[str, str]) -> PauseRecord:
    return PauseRecord(owner="mig-manager", reason="mig-change", previous=previous)


@pytest.mark.parametrize(
    ("labels", "previous", "changes", "left"),
    [
        pytest.param(
            {DP: "paused-for-mig-change", GFD: "paused-for-mig-change"},
            {DP: "true", GFD: "true"},
            {DP: "true", GFD: "true"},
            {},
            id="restore-all",
        ),
        pytest.param(
            {DP: "false", GFD: "paused-for-mig-change"},
            {DP: "true", GFD: "true"},
            {GFD: "true"},
            {DP: "false"},
            id="admin-set-false-meanwhile",
        ),
        pytest.param(
            {GFD: "paused-for-mig-change"},
            {DP: "true", GFD: "true"},
            {GFD: "true"},
            {DP: "<absent>"},
            id="removed-meanwhile",
        ),
        pytest.param({DP: "true"}, {DP: "true"}, {}, {}, id="already-restored"),
        pytest.param(
            {DP: "paused-for-mig-change"}, {DP: "custom"}, {DP: "custom"}, {}, id="exact-previous-value"
        ),
    ],
)
def test_plan_restore(
    labels: dict[str, str], previous: dict[str, str], changes: dict[str, str], left: dict[str, str]
) -> None:
    assert plan_restore(labels, record(previous)) == (changes, left)


@pytest.mark.parametrize(
    ("reason", "value"),
    [
        ("mig-change", "paused-for-mig-change"),
        ("driver upgrade", "paused-for-driver-upgrade"),
        ("", "paused-for-change"),
        ("x" * 80, "paused-for-" + "x" * 52),
        ("a/b:c", "paused-for-a-b-c"),
    ],
)
def test_paused_value_is_a_valid_label_value(reason: str, value: str) -> None:
    assert paused_value(reason) == value
    assert len(value) <= 63


def test_record_round_trips_and_garbage_is_none() -> None:
    rec = PauseRecord("mig-manager", "mig-change", {DP: "true"}, "2026-11-30T12:00:00Z", 1234.5)
    assert PauseRecord.from_json(rec.to_json()) == rec
    for bad in ("", "{", "[]", '{"owner":"x"}', '{"owner":"x","reason":"y","previous":{"a":1}}'):
        assert PauseRecord.from_json(bad) is None


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param("[" * 5000 + "]" * 5000, id="deep-nesting"),  # json.loads: RecursionError
        pytest.param('{"owner":"' + "x" * 20000 + '"}', id="huge"),
        pytest.param(
            '{"owner":"x","reason":"y","previous":{},"leaseUntil":1' + "0" * 5000 + "}", id="huge-int"
        ),
    ],
)
def test_a_hostile_annotation_is_unreadable_not_a_crash(hostile: str) -> None:
    assert PauseRecord.from_json(hostile) is None


@dataclass(frozen=True)
class Pod:
    key: str
    labels: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)


def test_pods_in_the_way_by_label_or_node_selector() -> None:
    pods = [
        Pod("gpu-operator/nvidia-device-plugin-daemonset-x", {"app": "nvidia-device-plugin-daemonset"}),
        Pod("gpunode/gpunode-feature-discovery-y", {"app.kubernetes.io/name": "gpunode-feature-discovery"}),
        Pod("team/custom-agent", {"app": "custom"}, {DP: "true"}),
        Pod("team/training", {"app": "train"}),
        Pod("gpu-operator/nvidia-dcgm-z", {"app": "nvidia-dcgm"}),
    ]
    only_dp_gfd = [o for o in DEFAULT_OPERANDS if o.name in ("device-plugin", "gpu-feature-discovery")]
    assert pods_in_the_way(pods, only_dp_gfd) == [
        "gpu-operator/nvidia-device-plugin-daemonset-x",
        "gpunode/gpunode-feature-discovery-y",
        "team/custom-agent",
    ]
    assert "gpu-operator/nvidia-dcgm-z" in pods_in_the_way(pods, DEFAULT_OPERANDS)
    assert pods_in_the_way(pods, []) == []

"""The driver manager, the pure parts: which pods count as GPU pods, what a drain does with each pod,
durations, label selectors, the record, the operand set and the flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gpunode.common.cli import FlagSet, add_common_flags
from gpunode.common.errors import UsageError
from gpunode.common.kube import OwnerRef, PodInfo
from gpunode.common.operands import Operand
from gpunode.driver_loader.upgrade import (
    DRIVER_OPERAND_PODS,
    LabelSelector,
    UpgradeOptions,
    UpgradeRecord,
    add_upgrade_flags,
    decide_pod,
    driver_operands,
    is_gpu_pod,
    parse_duration,
    plan_drain,
)


@dataclass(frozen=True)
class PodWithVolumes(PodInfo):
    """A PodInfo that knows its emptyDir volumes (the attribute decide_pod reads when present)."""

    empty_dirs: tuple[str, ...] = ()


def pod(
    name: str = "p",
    *,
    requests: tuple[str, ...] = (),
    owner: str | None = "ReplicaSet",
    controller: bool = True,
    phase: str = "Running",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    empty_dirs: tuple[str, ...] | None = None,
) -> PodInfo:
    owners = (OwnerRef("apps/v1", owner, f"{name}-owner", "uid-o", controller),) if owner else ()
    fields: dict[str, Any] = {
        "namespace": "ns",
        "name": name,
        "uid": f"uid-{name}",
        "node_name": "node-1",
        "labels": labels or {},
        "phase": phase,
        "deleting": deleting,
        "owners": owners,
        "requests": frozenset(requests),
    }
    if empty_dirs is None:
        return PodInfo(**fields)
    return PodWithVolumes(**fields, empty_dirs=empty_dirs)


# -- GPU pods ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requests", "gpu"),
    [
        pytest.param(("nvidia.com/gpu",), True, id="whole-gpu"),
        pytest.param(("nvidia.com/gpu.shared",), True, id="time-sliced-renamed"),
        pytest.param(("nvidia.com/mig-1g.5gb",), True, id="mig-mixed"),
        pytest.param(("nvidia.com/mig-3g.20gb.shared",), True, id="mig-shared"),
        pytest.param(("example.com/fpga", "nvidia.com/gpu"), True, id="one-of-several"),
        pytest.param((), False, id="cpu-only"),
        pytest.param(("amd.com/gpu",), False, id="other-vendor"),
        pytest.param(("gpu.intel.com/i915",), False, id="intel"),
        pytest.param(("nvidia.com/GA100_A100_PCIE_40GB",), False, id="vfio-passthrough-name"),
        pytest.param(("nvidia.com/hostdev",), False, id="nvidia-non-gpu"),
        pytest.param(("example.com/nvidia.com/gpu",), False, id="prefix-only-at-start"),
    ],
)
def test_gpu_pods_are_those_requesting_gpus_or_mig_devices(requests: tuple[str, ...], gpu: bool) -> None:
    assert is_gpu_pod(pod(requests=requests)) is gpu


# -- what a drain does with a pod ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "force", "emptydir_ok", "action", "why"),
    [
        pytest.param({}, False, False, "evict", "ReplicaSet p-owner", id="replicaset"),
        pytest.param({"owner": "Job"}, False, False, "evict", "Job p-owner", id="job"),
        pytest.param({"owner": "DaemonSet"}, True, True, "ignore", "DaemonSet", id="daemonset-never"),
        pytest.param(
            {"owner": "DaemonSet", "deleting": True},
            False,
            False,
            "ignore",
            "DaemonSet",
            id="daemonset-deleting",
        ),
        pytest.param({"owner": "Node"}, True, True, "ignore", "static pod", id="static-pod"),
        pytest.param({"owner": None}, False, False, "block", "DRAIN_USE_FORCE=true", id="bare-pod"),
        pytest.param({"owner": None}, True, False, "evict", "not managed", id="bare-pod-force"),
        pytest.param(
            {"controller": False}, False, False, "block", "not managed", id="owner-but-no-controller"
        ),
        pytest.param(
            {"owner": None, "phase": "Succeeded"}, False, False, "evict", "finished", id="bare-finished"
        ),
        pytest.param({"owner": None, "phase": "Failed"}, False, False, "evict", "finished", id="bare-failed"),
        pytest.param({"deleting": True}, False, False, "wait", "terminating", id="terminating"),
        pytest.param(
            {"owner": None, "deleting": True}, False, False, "wait", "terminating", id="bare-terminating"
        ),
        pytest.param(
            {"empty_dirs": ("scratch",)}, False, False, "block", "DRAIN_DELETE_EMPTYDIR_DATA", id="emptydir"
        ),
        pytest.param({"empty_dirs": ("scratch",)}, False, True, "evict", "ReplicaSet", id="emptydir-allowed"),
        pytest.param(
            {"owner": None, "empty_dirs": ("a", "b")}, True, False, "block", "a, b", id="bare-emptydir-force"
        ),
        pytest.param(
            {"empty_dirs": ("scratch",), "phase": "Succeeded"},
            False,
            False,
            "evict",
            "finished",
            id="emptydir-done",
        ),
        pytest.param({"empty_dirs": ()}, False, False, "evict", "ReplicaSet", id="volumes-known-none"),
    ],
)
def test_a_drain_decides_each_pod_as_kubectl_drain(
    kwargs: dict[str, Any], force: bool, emptydir_ok: bool, action: str, why: str
) -> None:
    decision = decide_pod(pod(**kwargs), force=force, delete_emptydir_data=emptydir_ok)
    assert decision.action == action
    assert why in decision.why
    assert str(decision).startswith("ns/p (")


def test_a_plan_takes_only_the_selected_pods_sorted() -> None:
    pods = [
        pod("z-trainer", requests=("nvidia.com/gpu",)),
        pod("a-mig", requests=("nvidia.com/mig-1g.5gb",), owner="Job"),
        pod("web", requests=()),
        pod("monitor", requests=("nvidia.com/gpu",), owner="DaemonSet"),
        pod("notebook", requests=("nvidia.com/gpu",), owner=None),
        pod("leaving", requests=("nvidia.com/gpu",), deleting=True),
    ]
    plan = plan_drain(pods, select=is_gpu_pod, force=False, delete_emptydir_data=False)
    assert [p.name for p in plan.evict] == ["a-mig", "z-trainer"]
    assert [p.name for p in plan.wait] == ["leaving"]
    assert [d.pod.name for d in plan.blocked] == ["notebook"]
    assert [d.pod.name for d in plan.ignored] == ["monitor"]
    assert [p.name for p in plan.targets] == ["a-mig", "z-trainer", "leaving"]

    everything = plan_drain(pods, select=lambda p: True, force=True, delete_emptydir_data=False)
    assert [p.name for p in everything.evict] == ["a-mig", "notebook", "web", "z-trainer"]
    assert everything.blocked == ()


# -- durations (DRAIN_TIMEOUT_SECONDS) ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0s", 0.0),
        ("300", 300.0),
        ("2.5", 2.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1m30.5s", 90.5),
        ("500ms", 0.5),
        ("1h0m0s", 3600.0),
        ("+10s", 10.0),
        (" 45s ", 45.0),
        ("1500us", 0.0015),
    ],
)
def test_durations_are_seconds_or_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", " ", "-1", "-5s", "5x", "m", "1.5.3s", "inf", "nan", "10 s", "5m-1s"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


# -- label selectors (DRAIN_POD_SELECTOR_LABEL) ------------------------------------------------------------
@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {}, True),
        ("app=web", {"app": "web"}, True),
        ("app=web", {"app": "db"}, False),
        ("app=web", {}, False),
        ("app==web", {"app": "web"}, True),
        ("app!=web", {}, True),
        ("app!=web", {"app": "web"}, False),
        ("tier in (a, b)", {"tier": "b"}, True),
        ("tier in (a,b)", {}, False),
        ("tier notin (a,b)", {"tier": "c"}, True),
        ("tier notin (a,b)", {}, True),
        ("drainable", {"drainable": ""}, True),
        ("drainable", {}, False),
        ("!keep", {"keep": "x"}, False),
        ("!keep", {}, True),
        ("example.com/drain=yes,tier in (x,y),!keep", {"example.com/drain": "yes", "tier": "y"}, True),
        ("example.com/drain=yes,tier in (x,y),!keep", {"example.com/drain": "yes", "tier": "z"}, False),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert LabelSelector.parse(selector).matches(labels) is matches


@pytest.mark.parametrize("selector", ["a=b,", "a in (x", "a in ()", "=b", "a=b=c", "!", "bad key", "a)"])
def test_bad_label_selectors_are_refused(selector: str) -> None:
    with pytest.raises(ValueError, match="label selector"):
        LabelSelector.parse(selector)


# -- the record --------------------------------------------------------------------------------------------
def test_the_record_round_trips_and_garbage_is_none() -> None:
    record = UpgradeRecord(cordoned=True, started="2025-01-01T00:00:00Z", step="unload")
    assert UpgradeRecord.from_json(record.to_json()) == record
    assert record.to_json() == '{"cordoned":true,"started":"2025-01-01T00:00:00Z","step":"unload"}'
    for text in ("", "garbage", "[]", '{"cordoned":"yes"}', '{"step":"unload"}'):
        assert UpgradeRecord.from_json(text) is None


# -- operands ------------------------------------------------------------------------------------------------
def test_the_driver_operands_are_nvidias_list() -> None:
    names = [o.name for o in driver_operands()]
    assert names == [name for name, _ in DRIVER_OPERAND_PODS]
    assert {
        "operator-validator",
        "container-toolkit",
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm-exporter",
        "dcgm",
        "mig-manager",
        "nvsm",
        "sandbox-validator",
        "sandbox-device-plugin",
        "vgpu-device-manager",
        "client",
        "dra-driver",
    } <= set(names)
    assert "driver" not in names  # never pause ourselves
    by_name = {o.name: o for o in driver_operands()}
    assert {"app": "nvidia-operator-validator"} in by_name["operator-validator"].pod_labels
    assert {"app": "nvidia-container-toolkit-daemonset"} in by_name["container-toolkit"].pod_labels


@pytest.mark.parametrize(
    ("extra", "label", "count"),
    [
        pytest.param("example.com/gpu-workload", "example.com/gpu-workload", 17, id="any-key"),
        pytest.param("nvidia.com/gpu.deploy.custom", "nvidia.com/gpu.deploy.custom", 17, id="deploy-label"),
        pytest.param(
            "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.dcgm-exporter-dra", 16, id="dup"
        ),
        pytest.param("", "nvidia.com/gpu.deploy.dcgm-exporter-dra", 16, id="none"),
    ],
)
def test_the_eviction_label_is_one_more_operand(extra: str, label: str, count: int) -> None:
    operands = driver_operands(extra)
    assert len(operands) == count
    assert isinstance(operands[-1], Operand)
    assert operands[-1].label == label


# -- flags ---------------------------------------------------------------------------------------------------
def parse(environ: dict[str, str], argv: list[str] | None = None) -> dict[str, Any]:
    flags = FlagSet(prog="gpunode-driver-loader")
    add_common_flags(flags, config_file=False)
    add_upgrade_flags(flags)
    return flags.parse(argv or [], environ, exit_on_error=False).values


def test_defaults() -> None:
    options = UpgradeOptions.from_values(parse({}))
    assert options == UpgradeOptions()
    assert options.gpu_pod_eviction is True
    assert options.auto_drain is False
    assert options.drain_timeout == 300.0
    assert options.operator_namespace == "gpu-operator"


def test_the_operators_environment_is_accepted_unchanged() -> None:
    env = {
        "NODE_NAME": "node-1",
        "ENABLE_GPU_POD_EVICTION": "true",
        "ENABLE_AUTO_DRAIN": "true",
        "DRAIN_USE_FORCE": "false",
        "DRAIN_POD_SELECTOR_LABEL": "example.com/drain=yes",
        "DRAIN_TIMEOUT_SECONDS": "0s",
        "DRAIN_DELETE_EMPTYDIR_DATA": "true",
        "OPERATOR_NAMESPACE": "nvidia-gpu-operator",
        "NODE_LABEL_FOR_GPU_POD_EVICTION": "example.com/gpu-workload",
        "FORCE_REINSTALL": "true",
        "GPUNODE_OPERAND_TIMEOUT": "60",
    }
    values = parse(env)
    assert values["node_name"] == "node-1"
    options = UpgradeOptions.from_values(values)
    assert options == UpgradeOptions(
        gpu_pod_eviction=True,
        auto_drain=True,
        drain_use_force=False,
        drain_pod_selector="example.com/drain=yes",
        drain_timeout=0.0,
        drain_delete_emptydir_data=True,
        operator_namespace="nvidia-gpu-operator",
        eviction_label="example.com/gpu-workload",
        force_reinstall=True,
        operand_timeout=60.0,
    )


def test_flags_beat_the_environment() -> None:
    values = parse(
        {"ENABLE_GPU_POD_EVICTION": "true"}, ["--no-enable-gpu-pod-eviction", "--drain-timeout-seconds=5m"]
    )
    options = UpgradeOptions.from_values(values)
    assert options.gpu_pod_eviction is False
    assert options.drain_timeout == 300.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DRAIN_TIMEOUT_SECONDS": "-5s"}, "DRAIN_TIMEOUT_SECONDS"),
        ({"DRAIN_POD_SELECTOR_LABEL": "a in (x"}, "DRAIN_POD_SELECTOR_LABEL"),
        ({"NODE_LABEL_FOR_GPU_POD_EVICTION": "not a key!"}, "NODE_LABEL_FOR_GPU_POD_EVICTION"),
        ({"ENABLE_AUTO_DRAIN": "maybe"}, "ENABLE_AUTO_DRAIN"),
    ],
)
def test_bad_settings_are_usage_errors_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse(env)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operand_timeout": 0.0}, "operand-timeout"),
        ({"drain_timeout_seconds": "soon"}, "invalid duration"),
        ({"drain_pod_selector_label": "a in ("}, "label selector"),
        ({"enable_auto_drain": "maybe"}, "true/false"),
    ],
)
def test_options_from_other_values_are_checked_too(values: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        UpgradeOptions.from_values(values)

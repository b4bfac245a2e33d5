"""The driver manager, the pure parts: durations, the record, the operand set and the flags.
(The drain rules and label selectors are tested with gpunode.kube, in tests/unit/kube.)"""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.common.cli import parse_duration
from gpunode.common.errors import UsageError
from gpunode.common.settings import SettingsParser, flags_of, resolve
from gpunode.driver_loader.settings import UpgradeSettings
from gpunode.driver_loader.upgrade_state import (
    DRIVER_OPERAND_PODS,
    UpgradeOptions,
    UpgradeRecord,
    driver_operands,
)
from gpunode.kube.operands import Operand


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


# -- the record --------------------------------------------------------------------------------------------
def test_the_record_round_trips_and_garbage_is_none() -> None:
    record = UpgradeRecord(cordoned=True, started="2025-01-01T00:00:00Z", step="unload")
    assert UpgradeRecord.from_json(record.to_json()) == record
    assert record.to_json() == '{"cordoned":true,"started":"2025-01-01T00:00:00Z","step":"unload"}'
    for text in ("", "garbage", "[]", '{"cordoned":"yes"}', '{"step":"unload"}'):
        assert UpgradeRecord.from_json(text) is None
    # anyone who may patch the node writes this annotation: deep nesting and huge values are unreadable
    for hostile in ("[" * 5000 + "]" * 5000, '{"cordoned":true,"step":"' + "x" * 20000 + '"}'):
        assert UpgradeRecord.from_json(hostile) is None


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
def parse(environ: dict[str, str], argv: list[str] | None = None) -> UpgradeSettings:
    parser = SettingsParser(UpgradeSettings, prog="gpunode-driver-loader upgrade")
    return parser.parse(argv or [], environ, exit_on_error=False).settings


def settings_from(values: dict[str, Any]) -> UpgradeSettings:
    """Settings from values by field name: text goes through the flag's parser (as an env var would),
    anything else is taken as it is."""
    env = {f.envs[0]: v for f in flags_of(UpgradeSettings) if isinstance(v := values.get(f.dest), str)}
    typed = {k: v for k, v in values.items() if not isinstance(v, str)}
    return resolve(UpgradeSettings, typed, env)[0]


def test_defaults() -> None:
    options = UpgradeOptions.from_settings(parse({}))
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
    assert values.common.node_name == "node-1"
    options = UpgradeOptions.from_settings(values)
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
    options = UpgradeOptions.from_settings(values)
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
        UpgradeOptions.from_settings(settings_from(values))

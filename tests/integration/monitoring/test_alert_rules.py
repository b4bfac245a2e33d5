"""The alert rules under Prometheus' own tools: ``promtool check rules`` on the rule file and on the rendered
PrometheusRule, and ``promtool test rules`` for every alert, firing and not firing.

Every input series is a series the running agents really expose (``scrape``, conftest.py): picked by name
and labels from the scrape, only its values (and, where a test needs another state, the value of a label
the series already has) set here. So a misspelt metric or label, in a rule or in an agent, fails a test;
``test_a_typo_in_a_rule_fails_its_firing_test`` shows it for every alert.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode.deploy import alerts
from gpunode.nvml.xids import xid_message

from .conftest import Scrape, Series

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "containers" / "monitoring" / "gpunode-alerts.yaml"
PROMTOOL = shutil.which("promtool") or "promtool"
ALERTS = {a.name: a for a in alerts.ALERTS}
TEMPLATE = re.compile(r"\{\{\s*(\$labels\.([A-Za-z_][A-Za-z0-9_]*)|\$value)\s*\}\}")


@dataclass(frozen=True)
class Input:
    """A scraped series ``metric`` whose labels include ``match``, with ``values`` (promtool's notation);
    ``set`` changes the value of labels the series already has."""

    metric: str
    values: str
    match: dict[str, str] = field(default_factory=dict)
    set: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    id: str
    alert: str
    inputs: tuple[Input, ...]
    eval_time: str
    fires: bool
    value: float = 0.0  # the alert's $value (for its annotations)
    keep: tuple[str, ...] | None = None  # the alert's labels from inputs[0]; None: all of them
    extra: dict[str, str] = field(default_factory=dict)  # labels the expression adds


XID48 = {"err_code": "48", "err_msg": xid_message(48)}
EXP = {"job": "gpunode-exporter"}
T4 = {"job": "gpunode-exporter-t4"}
FD = {"agent": "feature-discovery", "loop": "labeling"}
UPGRADE = "gpunode_operator_driver_upgrade_nodes"
CASES = (
    Case("lost", "GPULost", (Input("gpunode_gpu_health", "1 0x10", EXP),), "5m", True),
    Case("lost-healthy", "GPULost", (Input("gpunode_gpu_health", "1x10", EXP),), "5m", False),
    Case(
        "lost-xid79",
        "GPULost",
        (Input("DCGM_FI_DEV_XID_ERRORS", "79x10", EXP, {"err_code": "79", "err_msg": xid_message(79)}),),
        "5m",
        True,
        value=79,
    ),
    Case(
        "xid48",
        "GPUFatalXid",
        (Input("DCGM_FI_DEV_XID_ERRORS", "0 48x10", EXP, XID48),),
        "5m",
        True,
        value=48,
        extra={"xid_meaning": "Double Bit ECC Error"},
    ),
    Case(
        "xid13-application",
        "GPUFatalXid",
        (Input("DCGM_FI_DEV_XID_ERRORS", "13x10", EXP, {"err_code": "13", "err_msg": xid_message(13)}),),
        "5m",
        False,
    ),
    Case("xid-none", "GPUFatalXid", (Input("DCGM_FI_DEV_XID_ERRORS", "0x10", EXP),), "5m", False),
    Case(
        "dbe",
        "GPUDoubleBitEccError",
        (Input("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0 0 1x10", EXP),),
        "5m",
        True,
        1,
    ),
    Case(
        "dbe-none",
        "GPUDoubleBitEccError",
        (Input("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x10", EXP),),
        "5m",
        False,
    ),
    Case(
        "remap-pending",
        "GPUMemoryRepairPending",
        (Input("DCGM_FI_DEV_ROW_REMAP_PENDING", "1x20", EXP),),
        "10m",
        True,
        1,
    ),
    Case(
        "retire-pending",
        "GPUMemoryRepairPending",
        (Input("DCGM_FI_DEV_RETIRED_PENDING", "2x20", T4),),
        "10m",
        True,
        2,
    ),
    Case(
        "repair-none",
        "GPUMemoryRepairPending",
        (
            Input("DCGM_FI_DEV_ROW_REMAP_PENDING", "0x20", EXP),
            Input("DCGM_FI_DEV_RETIRED_PENDING", "0x20", T4),
        ),
        "10m",
        False,
    ),
    Case(
        "repair-short",
        "GPUMemoryRepairPending",
        (Input("DCGM_FI_DEV_ROW_REMAP_PENDING", "0x6 1x4", EXP),),
        "10m",
        False,
    ),
    Case(
        "remap-failure",
        "GPURowRemapFailure",
        (Input("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1x10", EXP),),
        "5m",
        True,
        1,
    ),
    Case(
        "remap-ok", "GPURowRemapFailure", (Input("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0x10", EXP),), "5m", False
    ),
    Case(
        "hw-thermal",
        "GPUThermalSlowdown",
        (Input("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "64x20", EXP),),
        "10m",
        True,
        2,
    ),
    Case(
        "sw-thermal",
        "GPUThermalSlowdown",
        (Input("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "33x20", EXP),),
        "10m",
        True,
        1,
    ),
    Case(
        "power-cap-only",
        "GPUThermalSlowdown",
        (Input("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "132x20", EXP),),  # SW power cap and power brake
        "10m",
        False,
    ),
    Case(
        "brake",
        "GPUPowerBrakeSlowdown",
        (Input("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "129x20", EXP),),
        "10m",
        True,
        1,
    ),
    Case(
        "no-brake",
        "GPUPowerBrakeSlowdown",
        (Input("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "96x20", EXP),),
        "10m",
        False,
    ),
    Case(
        "unhealthy",
        "GPUDevicePluginUnhealthyDevices",
        (Input("gpunode_device_plugin_devices", "2x20", {"health": "Healthy"}, {"health": "Unhealthy"}),),
        "10m",
        True,
        2,
    ),
    Case(
        "all-healthy",
        "GPUDevicePluginUnhealthyDevices",
        (
            Input("gpunode_device_plugin_devices", "8x20", {"health": "Healthy"}),
            Input("gpunode_device_plugin_devices", "0x20", {"health": "Healthy"}, {"health": "Unhealthy"}),
        ),
        "10m",
        False,
    ),
    Case(
        "not-registered",
        "GPUDevicePluginNotRegistered",
        (Input("gpunode_device_plugin_devices", "8x20", {"health": "Healthy"}),),
        "15m",
        True,
        8,
        keep=("instance", "resource"),
    ),
    Case(
        "registered",
        "GPUDevicePluginNotRegistered",
        (
            Input("gpunode_device_plugin_devices", "8x20", {"health": "Healthy"}),
            Input("gpunode_device_plugin_registrations_total", "1x20"),
        ),
        "15m",
        False,
    ),
    Case(
        "gfd-stale",
        "GPUFeatureDiscoveryStale",
        (Input("gpunode_last_success_timestamp_seconds", "0x30", FD),),
        "20m",
        True,
        1200,
    ),
    Case(
        "gfd-fresh",
        "GPUFeatureDiscoveryStale",
        (Input("gpunode_last_success_timestamp_seconds", "0+60x30", FD),),
        "20m",
        False,
    ),
    Case(
        "mig-failed",
        "GPUMigConfigFailed",
        (Input("gpunode_mig_config_state", "1x10", {"state": "failed"}),),
        "5m",
        True,
        1,
    ),
    Case(
        "mig-success",
        "GPUMigConfigFailed",
        (
            Input("gpunode_mig_config_state", "0x10", {"state": "failed"}),
            Input("gpunode_mig_config_state", "1x10", {"state": "success"}),
        ),
        "5m",
        False,
    ),
    Case(
        "upgrade-failed",
        "GPUDriverUpgradeFailed",
        (Input(UPGRADE, "1x10", {"state": "upgrade-failed"}),),
        "5m",
        True,
        1,
    ),
    Case(
        "upgrade-done",
        "GPUDriverUpgradeFailed",
        (
            Input(UPGRADE, "0x10", {"state": "upgrade-failed"}),
            Input(UPGRADE, "3x10", {"state": "upgrade-done"}),
        ),
        "5m",
        False,
    ),
    Case(
        "upgrade-stuck",
        "GPUDriverUpgradeStuck",
        (Input(UPGRADE, "1x150", {"state": "drain-required"}),),
        "2h10m",
        True,
        1,
    ),
    Case(
        "upgrade-moving",
        "GPUDriverUpgradeStuck",
        (Input(UPGRADE, "1x60 0x90", {"state": "drain-required"}),),
        "2h10m",
        False,
    ),
    Case(
        "upgrade-waiting-for-a-slot",
        "GPUDriverUpgradeStuck",
        (Input(UPGRADE, "5x150", {"state": "upgrade-required"}),),
        "2h10m",
        False,
    ),
    Case(
        "policy-not-ready",
        "GPUClusterPolicyNotReady",
        (Input("gpunode_operator_clusterpolicy_ready", "0x40"),),
        "35m",
        True,
    ),
    Case(
        "policy-ready",
        "GPUClusterPolicyNotReady",
        (Input("gpunode_operator_clusterpolicy_ready", "0x20 1x20"),),
        "35m",
        False,
    ),
    Case(
        "errors-rising",
        "GPUAgentErrors",
        (Input("gpunode_errors_total", "0+1x40", {"agent": "operator"}),),
        "30m",
        True,
        keep=("instance", "agent", "reason"),
    ),
    Case(
        "errors-flat",
        "GPUAgentErrors",
        (Input("gpunode_errors_total", "5x40", {"agent": "operator"}),),
        "30m",
        False,
    ),
    Case(
        "errors-once",
        "GPUAgentErrors",
        (Input("gpunode_errors_total", "0x10 1x30", {"agent": "operator"}),),
        "30m",
        False,
    ),
)


def promql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def series_of(scrape: Scrape, given: Input) -> Series:
    picked = scrape.pick(given.metric, **given.match)
    unknown = sorted(set(given.set) - set(picked.labels))
    assert not unknown, f"{given.metric} has no label(s) {unknown}: {sorted(picked.labels)}"
    return Series(picked.name, {**picked.labels, **given.set})


def notation(series: Series) -> str:
    labels = ",".join(f"{k}={promql_string(v)}" for k, v in sorted(series.labels.items()))
    return f"{series.name}{{{labels}}}"


def go_value(value: float) -> str:
    """``{{ $value }}`` as Go's text/template prints a float64 (%v) for the values used here."""
    return str(int(value)) if math.isfinite(value) and value == int(value) else repr(value)


def expand(template: str, labels: dict[str, str], value: float) -> str:
    return TEMPLATE.sub(lambda m: go_value(value) if m[1] == "$value" else labels.get(m[2], ""), template)


def expected_alert(case: Case, first: Series) -> dict[str, Any]:
    labels = {k: v for k, v in first.labels.items() if case.keep is None or k in case.keep}
    labels = {k: v for k, v in labels.items() if v != ""}
    labels.update(case.extra)
    alert = ALERTS[case.alert]
    rule = alert.rule()
    return {
        "exp_labels": {**labels, **rule["labels"]},
        "exp_annotations": {k: expand(v, labels, case.value) for k, v in rule["annotations"].items()},
    }


def promtool_test_file(scrape: Scrape, case: Case, rules: Path) -> dict[str, Any]:
    inputs = [series_of(scrape, given) for given in case.inputs]
    return {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": notation(s), "values": given.values}
                    for s, given in zip(inputs, case.inputs, strict=True)
                ],
                "alert_rule_test": [
                    {
                        "eval_time": case.eval_time,
                        "alertname": case.alert,
                        "exp_alerts": [expected_alert(case, inputs[0])] if case.fires else [],
                    }
                ],
            }
        ],
    }


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60)


def run_case(scrape: Scrape, case: Case, rules: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / f"test-{case.id}.yaml"
    spec.write_text(yaml.safe_dump(promtool_test_file(scrape, case, rules), sort_keys=False))
    return promtool("test", "rules", spec)


# -- the tests ------------------------------------------------------------------------------------------
def test_rule_file_is_up_to_date() -> None:
    assert RULES.read_text() == alerts.rule_file_text(), "run: python -m gpunode.deploy.alerts " + str(RULES)


def test_promtool_checks_the_rule_file_and_the_rendered_prometheus_rule(tmp_path: Path) -> None:
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts.ALERTS)} rules found" in done.stdout
    spec = alerts.prometheus_rule("gpunode", {"release": "prometheus"})["spec"]
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump(spec))
    done = promtool("check", "rules", rendered)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_quiet_case_and_a_runbook() -> None:
    firing = {c.alert for c in CASES if c.fires}
    quiet = {c.alert for c in CASES if not c.fires}
    assert firing == set(ALERTS), set(ALERTS) - firing
    assert quiet == set(ALERTS), set(ALERTS) - quiet
    runbook = (ROOT / "docs" / "alerts.md").read_text()
    for name in ALERTS:
        assert f"\n## {name}\n" in runbook, f"docs/alerts.md has no section for {name}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_promtool_unit_test(scrape: Scrape, case: Case, tmp_path: Path) -> None:
    done = run_case(scrape, case, RULES, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _misspell(expr: str) -> str:
    """The expression with its first metric name misspelt."""
    m = re.search(r"\b(DCGM_FI_[A-Z0-9_]+|gpunode_[a-z0-9_]+)\b", expr)
    assert m, expr
    return expr[: m.start()] + m[1] + "_TYPO" + expr[m.end() :]


@pytest.mark.parametrize("name", list(ALERTS))
def test_a_typo_in_a_rule_fails_its_firing_test(scrape: Scrape, name: str, tmp_path: Path) -> None:
    doc = alerts.rule_file()
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == name:
                rule["expr"] = _misspell(rule["expr"])
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(doc))
    case = next(c for c in CASES if c.alert == name and c.fires)
    done = run_case(scrape, case, broken, tmp_path)
    assert done.returncode != 0, f"{name}: a misspelt metric went unnoticed\n{done.stdout}"

"""gpunode render --values: the GPU Operator chart's values file instead of a ClusterPolicy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpunode.api.clusterpolicy import parse_policy_text
from gpunode.deploy.render import dump_yaml, render
from gpunode.deploy.render_cli import main

ROOT = Path(__file__).resolve().parents[3]
POLICIES = ROOT / "containers" / "policies"
PRODUCTION = POLICIES / "production-values.yaml"
K8S_VERSION = "1.33"

# What the chart makes of production-values.yaml, written by hand as a ClusterPolicy (the fields gpunode
# acts on; the ones it ignores change nothing in the render).
PRODUCTION_POLICY = """
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: cluster-policy}
spec:
  operator: {defaultRuntime: containerd}
  nfd: {enabled: true}
  daemonsets:
    priorityClassName: system-node-critical
    tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
    - {key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}
  validator: {}
  mig: {strategy: mixed}
  driver:
    enabled: true
    version: "550.127.05"
    kernelModuleType: open
    manager:
      env:
      - {name: ENABLE_GPU_POD_EVICTION, value: "true"}
      - {name: ENABLE_AUTO_DRAIN, value: "false"}
      - {name: DRAIN_USE_FORCE, value: "false"}
  toolkit:
    enabled: true
    env:
    - {name: CONTAINERD_RUNTIME_CLASS, value: nvidia}
    - {name: CONTAINERD_SET_AS_DEFAULT, value: "false"}
  devicePlugin:
    enabled: true
    config: {name: time-slicing-config, default: any}
    env:
    - {name: PASS_DEVICE_SPECS, value: "true"}
  dcgmExporter:
    enabled: true
    serviceMonitor:
      enabled: true
      interval: 15s
      honorLabels: false
      additionalLabels: {release: kube-prometheus-stack}
  gfd: {enabled: true}
  migManager:
    enabled: true
    config: {name: custom-mig-config, default: all-disabled}
    env:
    - {name: WITH_REBOOT, value: "false"}
"""


def _render_values(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[list[dict[str, Any]], str]:
    assert main(["--values", str(PRODUCTION), *args]) == 0
    out, err = capsys.readouterr()
    return list(yaml.safe_load_all(out)), err


def test_production_values_render_and_validate(capsys: pytest.CaptureFixture[str]) -> None:
    objs, err = _render_values(capsys)
    assert objs
    for obj in objs:
        if obj["apiVersion"] == "monitoring.coreos.com/v1":  # CRDs: not in the bundled schemas
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert "not a value of the GPU Operator chart" not in err
    assert f"gpunode render: note: {PRODUCTION}: not part of the ClusterPolicy, not used: " in err
    assert "operator.resources" in err


def test_production_values_render_as_the_equivalent_policy(capsys: pytest.CaptureFixture[str]) -> None:
    objs, _ = _render_values(capsys)
    want = render(parse_policy_text(PRODUCTION_POLICY, "production-policy").policy)
    assert dump_yaml(objs) == dump_yaml(want)


def test_production_values_strict(capsys: pytest.CaptureFixture[str]) -> None:
    """Every key of the file is the chart's: --strict refuses none of them."""
    assert main(["--values", str(PRODUCTION), "--strict", "--images"]) == 0
    assert capsys.readouterr().out.startswith("ghcr.io/gpunode/gpunode:")


def test_unknown_chart_key_warns_and_strict_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("driver:\n  verison: '550.1'\n", encoding="utf-8")
    assert main(["--values", str(path), "--images"]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"gpunode render: warning: {path}: driver.verison: not a value of the GPU Operator chart (ignored); "
        "did you mean version?\n"
    )
    assert main(["--values", str(path), "--strict"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"gpunode render: error: {path}: driver.verison: not a value of the GPU Operator chart (ignored); "
        "did you mean version? (--strict)\n"
    )


def test_bad_value_names_the_values_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("devicePlugin:\n  enabled: 'no'\n", encoding="utf-8")
    assert main(["--values", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"gpunode render: error: {path}: devicePlugin.enabled: "
        "must be a boolean (true or false), not a string\n"
    )


def test_aliases_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("x: &a {enabled: false}\ndriver: *a\n", encoding="utf-8")
    assert main(["--values", str(path)]) == 2
    assert "alias" in capsys.readouterr().err


def test_a_cluster_policy_given_as_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--values", str(POLICIES / "default.yaml")]) == 2
    assert "a ClusterPolicy, not Helm chart values: use --policy" in capsys.readouterr().err


def test_values_and_policy_together_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--values", str(PRODUCTION), "--policy", str(POLICIES / "default.yaml")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "gpunode render: error: argument --values: not allowed with argument --policy\n"


def test_neither_values_nor_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert (
        capsys.readouterr().err
        == "gpunode render: error: one of the arguments --policy --values is required\n"
    )


def test_values_to_a_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["--values", str(PRODUCTION), "-o", str(out)]) == 0
    assert (out / "common.yaml").is_file()

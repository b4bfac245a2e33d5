"""What `gpunode render` adds for monitoring: with the exporter's ServiceMonitor, a PodMonitor for the
other agents and the PrometheusRule (unless ``spec.gpunode.alerts.enabled: false``); with
``spec.gpunode.dashboard.enabled``, the Grafana dashboard ConfigMap for the sidecar."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate

from gpunode.api.clusterpolicy import parse_policy_text
from gpunode.deploy import alerts
from gpunode.deploy.operator_install import operator_rules
from gpunode.deploy.render import render

K8S_VERSION = "1.33"
DURATION = r"(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)"  # the Prometheus Operator's Duration


def rendered(gpunode: str = "", monitor: bool = True) -> list[dict[str, Any]]:
    text = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nspec:\n  nfd: {enabled: true}\n"
    if gpunode:
        text += f"  gpunode: {gpunode}\n"
    if monitor:
        text += "  dcgmExporter:\n    serviceMonitor: {enabled: true, additionalLabels: {release: prom}}\n"
    return render(parse_policy_text(text, "policy.yaml").policy, namespace="gpu")


def kinds(objs: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objs}


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_service_monitor_brings_the_pod_monitor_and_the_rules_with_its_labels() -> None:
    objs = rendered()
    rule = one(objs, "PrometheusRule", "gpunode-alerts")
    pods = one(objs, "PodMonitor", "gpunode-agents")
    for obj in (rule, pods):
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert obj["metadata"]["namespace"] == "gpu"
        assert (
            obj["metadata"]["labels"]["release"] == "prom"
        )  # the Prometheus' ruleSelector / podMonitorSelector
    assert rule["spec"] == {"groups": alerts.rule_groups()}
    assert {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]} == set(alerts.alert_names())
    assert pods["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/part-of": "gpunode"}}
    [endpoint] = pods["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http"
    assert re.fullmatch(DURATION, endpoint["interval"])
    # every agent pod it selects serves /metrics on a port named http (the exporter: its ServiceMonitor)
    for ds in (o for o in objs if o["kind"] == "DaemonSet"):
        template = ds["spec"]["template"]
        assert template["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpunode"
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        assert ports & {"http", "metrics"} or not ports, ds["metadata"]["name"]


def test_alerts_can_be_turned_off_and_nothing_without_the_service_monitor() -> None:
    assert "PrometheusRule" not in kinds(rendered("{alerts: {enabled: false}}"))
    assert "PodMonitor" in kinds(rendered("{alerts: {enabled: false}}"))
    plain = kinds(rendered(monitor=False))
    assert not plain & {"PrometheusRule", "PodMonitor", "ServiceMonitor"}


def test_dashboard_config_map_only_when_asked() -> None:
    assert not [o for o in rendered() if o["metadata"]["name"] == "gpunode-dashboard"]
    objs = rendered("{dashboard: {enabled: true}}", monitor=False)
    cm = one(objs, "ConfigMap", "gpunode-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    kubernetes_validate.validate(cm, K8S_VERSION, strict=True)
    [(key, text)] = cm["data"].items()
    assert key.endswith(".json")
    board = json.loads(text)
    assert board["uid"] == "gpunode-gpus"
    assert len(text) < 1024 * 1024  # a ConfigMap holds at most 1 MiB


def test_the_operator_may_write_what_monitoring_renders() -> None:
    _, namespaced = operator_rules("gpu")
    granted = {
        r for rule in namespaced if "monitoring.coreos.com" in rule["apiGroups"] for r in rule["resources"]
    }
    assert {"servicemonitors", "podmonitors", "prometheusrules"} <= granted

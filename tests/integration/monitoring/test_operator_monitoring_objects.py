"""The operator applies the monitoring objects a policy asks for, and deletes the alert rules and the
dashboard ConfigMap when the policy turns them off (the test API server with stand-ins of the
Prometheus operator's CRDs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpunode.api.clusterpolicy_crd import crd
from gpunode.deploy.render import render_by_agent
from gpunode.kube.client import Kube
from gpunode.operator.controller import ClusterPolicyController
from gpunode.sim.apiserver import FakeApiServer
from gpunode.sim.cluster_cli import MONITORING_CRDS

NS = "gpunode"
NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}


def policy(gpunode: dict[str, Any]) -> dict[str, Any]:
    spec = {"gpunode": gpunode, "dcgmExporter": {"serviceMonitor": {"enabled": True}}}
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cp"}, "spec": spec}


def render(p: Any, namespace: str) -> Any:
    return render_by_agent(p, namespace=namespace)


async def test_alerts_and_dashboard_applied_then_deleted_when_turned_off(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        api.add_node("gpu-0", labels=NFD)
        api.apply("CustomResourceDefinition", crd(), manager="test")
        for monitoring in MONITORING_CRDS:
            api.apply("CustomResourceDefinition", monitoring, manager="test")
        api.apply("ClusterPolicy", policy({"dashboard": {"enabled": True}}), manager="test")
        api.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Kube.connect_cluster(str(tmp_path / "kubeconfig"), namespace=NS)
        try:
            controller = ClusterPolicyController(kube, render, namespace=NS)
            await controller.reconcile()
            assert api.get("PrometheusRule", "gpunode-alerts", NS) is not None
            assert api.get("PodMonitor", "gpunode-agents", NS) is not None
            dashboard = api.get("ConfigMap", "gpunode-dashboard", NS)
            assert dashboard is not None
            assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"

            off = {"alerts": {"enabled": False}, "dashboard": {"enabled": False}}
            api.apply("ClusterPolicy", policy(off), manager="test")
            result = await controller.reconcile()
            assert f"PrometheusRule {NS}/gpunode-alerts" in result.deleted
            assert f"ConfigMap {NS}/gpunode-dashboard" in result.deleted
            assert api.get("PrometheusRule", "gpunode-alerts", NS) is None
            assert api.get("ConfigMap", "gpunode-dashboard", NS) is None
            assert api.get("PodMonitor", "gpunode-agents", NS) is not None  # the ServiceMonitor is still on
        finally:
            await kube.aclose()

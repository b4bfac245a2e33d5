"""gpunode's Prometheus alert rules, as data: the rule file ``containers/monitoring/gpunode-alerts.yaml``
and the ``PrometheusRule`` that ``gpunode render`` adds when the exporter's ServiceMonitor is on and
``spec.gpunode.alerts.enabled`` (default true).

Every rule reads series exactly as gpunode's agents expose them (dcgm-exporter's ``DCGM_FI_*`` names
from ``gpunode-exporter``, ``gpunode_*`` from the others); the promtool unit tests in
``tests/integration/monitoring`` feed each rule series taken from a scrape of the running agents, firing
and not firing. ``docs/alerts.md`` has a runbook section per alert (the ``runbook_url`` anchors).

Regenerate the file with ``python -m gpunode.deploy.alerts containers/monitoring/gpunode-alerts.yaml``
(a test fails while it is out of date).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpunode.nvml.xids import RESET_REQUIRED_XIDS, XIDS
from gpunode.operator.upgrade_plan import IN_FLIGHT_STATES

__all__ = [
    "ALERTS",
    "DASHBOARD_FILE",
    "FATAL_XIDS",
    "Alert",
    "alert_names",
    "prometheus_rule",
    "rule_file",
    "rule_file_text",
]

# The Grafana dashboard's file name: package data beside this module (what `gpunode render` puts into the
# grafana_dashboard ConfigMap) and containers/monitoring/; written by gpunode.deploy.dashboard.
DASHBOARD_FILE = "gpunode-dashboard.json"
RUNBOOK = "https://github.com/gpunode/gpunode/blob/main/docs/alerts.md#"
# NVIDIA's XIDs after which the GPU must be reset before it is trusted again (gpunode.nvml.xids); 79
# (fallen off the bus) has an alert of its own, GPULost.
FATAL_XIDS = tuple(sorted(code for code in RESET_REQUIRED_XIDS if code != 79))
UPGRADE_IN_FLIGHT = IN_FLIGHT_STATES
CLOCK_REASONS = '{__name__=~"DCGM_FI_DEV_CLOCKS_EVENT_REASONS|DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}'
ON_GPU = "GPU {{ $labels.gpu }} ({{ $labels.modelName }}, {{ $labels.UUID }}) on {{ $labels.Hostname }}"


# Reset-required XIDs whose message gpunode.nvml.xids leaves out (not shown as the exporter's err_msg).
_MORE_MEANINGS = {
    123: "SPI PMU RPC failure",
    140: "Unrecovered ECC error",
    154: "GPU recovery action changed",
}


def _xid_meaning(code: int) -> str:
    return XIDS[code].message or _MORE_MEANINGS.get(code, "see NVIDIA's XID catalog")


def _fatal_xid_expr() -> str:
    """One ``label_replace`` per fatal XID: the alert carries NVIDIA's meaning as ``xid_meaning`` whatever
    exporter it reads (dcgm-exporter before 3.3 has no ``err_msg`` label)."""
    parts = [
        f'label_replace(DCGM_FI_DEV_XID_ERRORS == {code}, "xid_meaning", "{_xid_meaning(code)}", "", "")'
        for code in FATAL_XIDS
    ]
    return "\n  or ".join(parts)


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    severity: str  # critical: a GPU or the node's GPU software is broken; warning: look soon
    summary: str
    description: str
    for_: str = "0m"
    group: str = "gpunode-gpu"
    labels: Mapping[str, str] = field(default_factory=dict)

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity, **self.labels}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": RUNBOOK + self.name.lower(),
        }
        return rule


ALERTS: tuple[Alert, ...] = (
    Alert(
        "GPULost",
        "gpunode_gpu_health == 0 or DCGM_FI_DEV_XID_ERRORS == 79",
        "critical",
        "A GPU fell off the bus",
        f"{ON_GPU} no longer answers NVML (XID 79, GPU has fallen off the bus). Its workloads are "
        "failing; the GPU needs a reset or the node a reboot.",
        for_="1m",
    ),
    Alert(
        "GPUFatalXid",
        _fatal_xid_expr(),
        "critical",
        "A GPU reported XID {{ $value }}",
        f"{ON_GPU} reported XID {{{{ $value }}}} ({{{{ $labels.xid_meaning }}}}): the GPU must be "
        "reset before it can be trusted again.",
    ),
    Alert(
        "GPUDoubleBitEccError",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0",
        "critical",
        "Uncorrectable (double-bit) ECC errors on a GPU",
        f"{ON_GPU} counted {{{{ $value }}}} double-bit ECC error(s) since the driver loaded; the data "
        "of the applications on it may be corrupt.",
    ),
    Alert(
        "GPUMemoryRepairPending",
        "DCGM_FI_DEV_ROW_REMAP_PENDING > 0 or DCGM_FI_DEV_RETIRED_PENDING > 0",
        "warning",
        "A GPU has memory rows to remap or pages to retire",
        f"{ON_GPU} has a row remapping or page retirement pending: it takes effect at the next GPU "
        "reset. Drain the node and reset the GPU.",
        for_="5m",
    ),
    Alert(
        "GPURowRemapFailure",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
        "critical",
        "A GPU could not remap a failing memory row",
        f"{ON_GPU} ran out of spare rows (row remapping failed): the GPU should be replaced.",
    ),
    Alert(
        "GPUThermalSlowdown",
        f"floor({CLOCK_REASONS} / 32) % 4 > 0",
        "warning",
        "A GPU is over its temperature limit",
        f"{ON_GPU} is slowing its clocks because it is over the product's temperature limit "
        "(clock event reasons: SW or HW thermal slowdown).",
        for_="5m",
    ),
    Alert(
        "GPUPowerBrakeSlowdown",
        f"floor({CLOCK_REASONS} / 128) % 2 == 1",
        "warning",
        "A GPU's power brake is engaged",
        f"{ON_GPU} is held at low clocks by the hardware power brake: the board or system drew more "
        "power than its limit allows.",
        for_="5m",
    ),
    Alert(
        "GPUDevicePluginUnhealthyDevices",
        'gpunode_device_plugin_devices{health="Unhealthy"} > 0',
        "warning",
        "The device plugin advertises Unhealthy devices",
        "{{ $value }} {{ $labels.resource }} device(s) on {{ $labels.instance }} are Unhealthy: the "
        "kubelet schedules nothing on them.",
        for_="5m",
        group="gpunode-agents",
    ),
    Alert(
        "GPUDevicePluginNotRegistered",
        "sum by (namespace, pod, instance, resource) (gpunode_device_plugin_devices)\n"
        "unless on (namespace, pod, instance, resource)\n"
        "(gpunode_device_plugin_registrations_total > 0)",
        "critical",
        "The device plugin has not registered with the kubelet",
        "The device plugin on {{ $labels.instance }} has devices for {{ $labels.resource }} but never "
        "registered them with the kubelet: pods cannot ask for them.",
        for_="10m",
        group="gpunode-agents",
    ),
    Alert(
        "GPUFeatureDiscoveryStale",
        'time() - gpunode_last_success_timestamp_seconds{agent="feature-discovery", loop="labeling"} > 600',
        "warning",
        "GPU feature discovery's labels are stale",
        "gpunode-feature-discovery on {{ $labels.instance }} has not rewritten its labels for more "
        "than 10 minutes: the node's nvidia.com/* labels may be out of date.",
        for_="5m",
        group="gpunode-agents",
    ),
    Alert(
        "GPUMigConfigFailed",
        'gpunode_mig_config_state{state="failed"} == 1',
        "critical",
        "A MIG layout failed to apply (nvidia.com/mig.config.state=failed)",
        "The MIG manager on {{ $labels.instance }} failed to apply the requested MIG layout; the "
        "node's nvidia.com/mig.config.state is failed.",
        for_="1m",
        group="gpunode-agents",
    ),
    Alert(
        "GPUDriverUpgradeFailed",
        'gpunode_operator_driver_upgrade_nodes{state="upgrade-failed"} > 0',
        "critical",
        "A driver upgrade failed",
        "{{ $value }} node(s) carry nvidia.com/gpu-driver-upgrade-state=upgrade-failed.",
        for_="1m",
        group="gpunode-operator",
    ),
    Alert(
        "GPUDriverUpgradeStuck",
        f'gpunode_operator_driver_upgrade_nodes{{state=~"{"|".join(UPGRADE_IN_FLIGHT)}"}} > 0',
        "warning",
        "A driver upgrade has been blocked for 2 hours",
        "{{ $value }} node(s) have been in driver upgrade state {{ $labels.state }} for 2 hours.",
        for_="2h",
        group="gpunode-operator",
    ),
    Alert(
        "GPUClusterPolicyNotReady",
        "gpunode_operator_clusterpolicy_ready == 0",
        "warning",
        "The ClusterPolicy has not been ready for 30 minutes",
        "ClusterPolicy {{ $labels.clusterpolicy }} has been notReady for 30 minutes; its status says "
        "which state and which nodes hold it back.",
        for_="30m",
        group="gpunode-operator",
    ),
    Alert(
        "GPUAgentErrors",
        "sum by (namespace, pod, instance, agent, reason) (increase(gpunode_errors_total[10m])) > 0",
        "warning",
        "A gpunode agent keeps failing",
        "{{ $labels.agent }} on {{ $labels.instance }} has counted {{ $labels.reason }} errors for 15 "
        "minutes without a pause.",
        for_="15m",
        group="gpunode-agents",
    ),
)


def alert_names() -> list[str]:
    return [a.name for a in ALERTS]


def rule_groups(alerts: Sequence[Alert] = ALERTS) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for alert in alerts:
        groups.setdefault(alert.group, []).append(alert.rule())
    return [{"name": name, "rules": rules} for name, rules in groups.items()]


def rule_file() -> dict[str, Any]:
    """The Prometheus rule file (``rule_files:``, ``promtool check rules``)."""
    return {"groups": rule_groups()}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def rule_file_text() -> str:
    head = "# Generated by `python -m gpunode.deploy.alerts` from gpunode/deploy/alerts.py: do not edit.\n"
    return head + yaml.dump(rule_file(), Dumper=_Dumper, sort_keys=False, width=120)


def prometheus_rule(namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """The rules as a prometheus-operator ``PrometheusRule`` (``labels``: the ServiceMonitor's, so the
    same Prometheus ``ruleSelector`` picks it up)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "gpunode-alerts", "namespace": namespace, "labels": dict(labels)},
        "spec": {"groups": rule_groups()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m gpunode.deploy.alerts OUTPUT.yaml (or - for standard output)"
    if args in (["-h"], ["--help"]):
        print(usage)
        return 0
    if len(args) != 1 or (args[0].startswith("-") and args[0] != "-"):
        print(usage, file=sys.stderr)  # an option is never taken for a file name
        return 2
    if args[0] == "-":
        sys.stdout.write(rule_file_text())
        return 0
    from gpunode.common.atomic import atomic_write

    atomic_write(args[0], rule_file_text().encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Grafana dashboard, built with Grafana's own Python SDK (``grafana-foundation-sdk``).

Per node, per GPU and per MIG device: utilisation, memory, temperature, power, energy, clocks, XIDs,
ECC and row remapping, NVLink; the device plugin's devices and allocations; the MIG layout state; the
operator's states, driver upgrades and errors. The GPU panels read dcgm-exporter's names and labels
(``DCGM_FI_*``; ``Hostname``, ``gpu``, ``UUID``, ``GPU_I_PROFILE``, ``GPU_I_ID``), so they serve NVIDIA's
exporter too; the ``gpunode_*`` panels stay empty there.

The SDK is a development dependency (the ``test`` extra): this module is run at build time only,
``python -m gpunode.deploy.dashboard``, which writes ``containers/monitoring/gpunode-dashboard.json`` and
the copy that ``gpunode render`` puts into the ``grafana_dashboard`` ConfigMap
(``gpunode/deploy/gpunode-dashboard.json``, package data). A test fails while either is out of date.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as gcommon
from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

from gpunode.deploy.alerts import DASHBOARD_FILE  # beside this module (package data), containers/monitoring

__all__ = ["DASHBOARD_FILE", "UID", "build", "dashboard_json", "main"]

UID = "gpunode-gpus"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
GPU = 'Hostname=~"$node", gpu=~"$gpu"'
WHOLE_GPU = f'{GPU}, GPU_I_ID=""'  # whole-GPU series (a MIG-enabled GPU also has per-instance ones)
MIG = f'{GPU}, GPU_I_ID!=""'
GPU_LEGEND = "{{Hostname}} GPU {{gpu}}"
MIG_LEGEND = "{{Hostname}} GPU {{gpu}} {{GPU_I_PROFILE}} #{{GPU_I_ID}}"


def _query(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    if instant:
        from grafana_foundation_sdk.models.prometheus import PromQueryFormat

        q = q.instant().format(PromQueryFormat.TABLE)
    return q


def _series(
    title: str,
    unit: str,
    queries: Sequence[tuple[str, str]],
    *,
    description: str,
    width: int = 12,
    height: int = 8,
    stack: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(height)
        .fill_opacity(10)
        .line_width(1)
        .legend(
            gcommon.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    if stack:
        panel = panel.stacking(gcommon.StackingConfig().mode(common.StackingMode.NORMAL))
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, ref=chr(ord("A") + i)))
    return panel


def _stat(title: str, expr: str, unit: str, *, description: str, width: int = 4) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(4)
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.VALUE)
        .with_target(_query(expr))
    )


def _table(title: str, expr: str, *, description: str, width: int = 12) -> table.Panel:
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(width)
        .height(8)
        .with_target(_query(expr, instant=True))
    )


def _variables(board: gdash.Dashboard) -> gdash.Dashboard:
    datasource = gdash.DatasourceVariable("datasource").label("Data source").type("prometheus")
    node = (
        gdash.QueryVariable("node")
        .label("Node")
        .datasource(DS)
        .query("label_values(DCGM_FI_DEV_GPU_TEMP, Hostname)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    gpu = (
        gdash.QueryVariable("gpu")
        .label("GPU")
        .datasource(DS)
        .query('label_values(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$node"}, gpu)')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NUMERICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    return board.with_variable(datasource).with_variable(node).with_variable(gpu)


def build() -> Any:
    """The dashboard model (the SDK's ``Dashboard``)."""
    board = (
        gdash.Dashboard("gpunode: GPUs, agents and operator")
        .uid(UID)
        .description("GPU telemetry (dcgm-exporter names) and gpunode's agents; see docs/alerts.md")
        .tags(["gpunode", "gpu", "nvidia", "dcgm"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .editable()
    )
    board = _variables(board)

    board = board.with_row(gdash.Row("Overview"))
    board = (
        board.with_panel(
            _stat(
                "GPUs", f"count(DCGM_FI_DEV_GPU_TEMP{{{WHOLE_GPU}}})", "none", description="GPUs reporting."
            )
        )
        .with_panel(
            _stat(
                "GPUs lost",
                "count(gpunode_gpu_health == 0) or vector(0)",
                "none",
                description="GPUs that no longer answer NVML (gpunode-exporter's gpunode_gpu_health).",
            )
        )
        .with_panel(
            _stat(
                "Mean utilisation",
                f"avg(DCGM_FI_DEV_GPU_UTIL{{{WHOLE_GPU}}})",
                "percent",
                description="Mean GPU utilisation of the selected GPUs.",
            )
        )
        .with_panel(
            _stat(
                "Power draw",
                f"sum(DCGM_FI_DEV_POWER_USAGE{{{WHOLE_GPU}}})",
                "watt",
                description="Power drawn by the selected GPUs.",
            )
        )
        .with_panel(
            _stat(
                "Energy (range)",
                f"sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{WHOLE_GPU}}}[$__range])) / 3.6e9",
                "kwatth",
                description="Energy the selected GPUs used over the dashboard's time range (mJ counter).",
            )
        )
        .with_panel(
            _stat(
                "Unhealthy devices",
                'sum(gpunode_device_plugin_devices{health="Unhealthy"}) or vector(0)',
                "none",
                description="Devices the device plugin advertises as Unhealthy.",
            )
        )
    )

    board = board.with_row(gdash.Row("Per GPU"))
    board = (
        board.with_panel(
            _series(
                "Utilisation",
                "percent",
                [(f"DCGM_FI_DEV_GPU_UTIL{{{WHOLE_GPU}}}", GPU_LEGEND)],
                description="DCGM_FI_DEV_GPU_UTIL: percent of time a kernel ran.",
            )
        )
        .with_panel(
            _series(
                "Memory used",
                "mbytes",
                [(f"DCGM_FI_DEV_FB_USED{{{GPU}}}", GPU_LEGEND + " {{GPU_I_PROFILE}}")],
                description="DCGM_FI_DEV_FB_USED (MiB); a MIG-enabled GPU has one series per instance.",
            )
        )
        .with_panel(
            _series(
                "Temperature",
                "celsius",
                [
                    (f"DCGM_FI_DEV_GPU_TEMP{{{WHOLE_GPU}}}", GPU_LEGEND),
                    (f"DCGM_FI_DEV_MEMORY_TEMP{{{WHOLE_GPU}}}", GPU_LEGEND + " memory"),
                ],
                description="GPU and memory temperature (GPUThermalSlowdown: NVML slows the clocks).",
            )
        )
        .with_panel(
            _series(
                "Power",
                "watt",
                [(f"DCGM_FI_DEV_POWER_USAGE{{{WHOLE_GPU}}}", GPU_LEGEND)],
                description="DCGM_FI_DEV_POWER_USAGE (W).",
            )
        )
        .with_panel(
            _series(
                "Energy per hour",
                "kwatth",
                [(f"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{WHOLE_GPU}}}[1h]) / 3.6e9", GPU_LEGEND)],
                description="Energy used in the last hour (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ).",
            )
        )
        .with_panel(
            _series(
                "SM clock",
                "MHz",
                [(f"DCGM_FI_DEV_SM_CLOCK{{{WHOLE_GPU}}}", GPU_LEGEND)],
                description="DCGM_FI_DEV_SM_CLOCK (MHz).",
            )
        )
    )

    board = board.with_row(gdash.Row("Errors"))
    board = (
        board.with_panel(
            _table(
                "Last XID per GPU",
                f"DCGM_FI_DEV_XID_ERRORS{{{WHOLE_GPU}}} > 0",
                description="GPUs whose last XID is not 0 (err_code, err_msg: NVIDIA's meaning).",
            )
        )
        .with_panel(
            _series(
                "ECC errors (per 5 min)",
                "none",
                [
                    (
                        f"increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{WHOLE_GPU}}}[5m])",
                        GPU_LEGEND + " single-bit",
                    ),
                    (
                        f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{WHOLE_GPU}}}[5m])",
                        GPU_LEGEND + " double-bit",
                    ),
                ],
                description="Volatile ECC error counts; any double-bit error fires GPUDoubleBitEccError.",
            )
        )
        .with_panel(
            _series(
                "Memory repair",
                "none",
                [
                    (f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{WHOLE_GPU}}}", GPU_LEGEND + " remap pending"),
                    (f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{WHOLE_GPU}}}", GPU_LEGEND + " remap failure"),
                    (
                        f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{WHOLE_GPU}}}",
                        GPU_LEGEND + " rows remapped",
                    ),
                    (f"DCGM_FI_DEV_RETIRED_PENDING{{{WHOLE_GPU}}}", GPU_LEGEND + " pages pending"),
                ],
                description="Row remapping (Ampere and later) and page retirement (before).",
            )
        )
        .with_panel(
            _series(
                "PCIe replays (per second)",
                "ops",
                [(f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{WHOLE_GPU}}}[5m])", GPU_LEGEND)],
                description="PCIe retries: a rising rate points at the slot, riser or cable.",
            )
        )
    )

    board = board.with_row(gdash.Row("NVLink"))
    board = board.with_panel(
        _series(
            "NVLink traffic",
            "KiBs",
            [(f"rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{WHOLE_GPU}}}[5m])", GPU_LEGEND)],
            description="DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (KiB counter) over all links.",
        )
    ).with_panel(
        _series(
            "NVLink errors (per second)",
            "ops",
            [
                (
                    f"rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{WHOLE_GPU}}}[5m])",
                    GPU_LEGEND + " CRC flit",
                ),
                (
                    f"rate(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{{WHOLE_GPU}}}[5m])",
                    GPU_LEGEND + " replay",
                ),
            ],
            description="NVLink CRC and replay errors over all links.",
        )
    )

    board = board.with_row(gdash.Row("MIG devices"))
    board = (
        board.with_panel(
            _series(
                "MIG memory used",
                "mbytes",
                [(f"DCGM_FI_DEV_FB_USED{{{MIG}}}", MIG_LEGEND)],
                description="Framebuffer used per MIG instance.",
            )
        )
        .with_panel(
            _series(
                "MIG graphics engine active",
                "percentunit",
                [(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{MIG}}}", MIG_LEGEND)],
                description="DCGM_FI_PROF_GR_ENGINE_ACTIVE per MIG instance (GPUs with profiling metrics).",
            )
        )
        .with_panel(
            _series(
                "MIG share of SMs",
                "percentunit",
                [(f"gpunode_mig_instance_sm_share{{{GPU}}}", MIG_LEGEND)],
                description="Each MIG instance's share of its GPU's SMs (gpunode-exporter).",
            )
        )
        .with_panel(
            _table(
                "MIG layout state",
                "gpunode_mig_config_state == 1",
                description="The MIG manager's last state per node (success, pending, rebooting, failed).",
            )
        )
    )

    board = board.with_row(gdash.Row("Device plugin"))
    board = board.with_panel(
        _series(
            "Devices by health",
            "none",
            [
                (
                    "sum by (instance, resource, health) (gpunode_device_plugin_devices)",
                    "{{instance}} {{resource}} {{health}}",
                )
            ],
            description="Devices advertised to the kubelet.",
            stack=True,
        )
    ).with_panel(
        _series(
            "Allocations (per minute)",
            "none",
            [("sum by (resource) (rate(gpunode_device_plugin_allocations_total[5m])) * 60", "{{resource}}")],
            description="Container allocations the device plugin answered.",
        )
    )

    board = board.with_row(gdash.Row("Operator"))
    board = (
        board.with_panel(
            _stat(
                "ClusterPolicy ready",
                "max(gpunode_operator_clusterpolicy_ready)",
                "bool_yes_no",
                description="1 while the active ClusterPolicy is ready.",
                width=6,
            )
        )
        .with_panel(
            _stat(
                "GPU nodes",
                'max(gpunode_operator_nodes{kind="gpu"})',
                "none",
                description="Nodes NFD labelled as GPU nodes.",
                width=6,
            )
        )
        .with_panel(
            _stat(
                "Upgrade failed",
                'max(gpunode_operator_driver_upgrade_nodes{state="upgrade-failed"}) or vector(0)',
                "none",
                description="Nodes in driver upgrade state upgrade-failed.",
                width=6,
            )
        )
        .with_panel(
            _stat(
                "Reconcile p95",
                "histogram_quantile(0.95, sum by (le) "
                "(rate(gpunode_operator_reconcile_duration_seconds_bucket[5m])))",
                "s",
                description="95th percentile of the reconcile passes' duration.",
                width=6,
            )
        )
        .with_panel(
            _series(
                "State pods ready / desired",
                "none",
                [
                    ("max by (state) (gpunode_operator_state_ready_pods)", "{{state}} ready"),
                    ("max by (state) (gpunode_operator_state_desired_pods)", "{{state}} desired"),
                ],
                description="Per ClusterPolicy state: pods of its DaemonSets ready and desired.",
            )
        )
        .with_panel(
            _series(
                "Driver upgrade states",
                "none",
                [("max by (state) (gpunode_operator_driver_upgrade_nodes) > 0", "{{state}}")],
                description="Nodes per nvidia.com/gpu-driver-upgrade-state value.",
                stack=True,
            )
        )
        .with_panel(
            _series(
                "Reconciles and API errors (per minute)",
                "none",
                [
                    (
                        "sum by (result) (rate(gpunode_operator_reconciles_total[5m])) * 60",
                        "reconcile {{result}}",
                    ),
                    (
                        "sum by (verb, code) (rate(gpunode_operator_api_errors_total[5m])) * 60",
                        "{{verb}} {{code}}",
                    ),
                ],
                description="Reconcile passes by result, Kubernetes API errors by verb and status.",
            )
        )
        .with_panel(
            _series(
                "Agent errors (per minute)",
                "none",
                [("sum by (agent, reason) (rate(gpunode_errors_total[5m])) * 60", "{{agent}} {{reason}}")],
                description="gpunode_errors_total of every agent by reason (GPUAgentErrors: a steady rise).",
            )
        )
    )
    model = board.build()
    for number, panel in enumerate(model.panels or [], start=1):  # Grafana wants unique panel ids
        panel.id_val = number
    return model


def dashboard_json() -> str:
    """The dashboard as Grafana's JSON model, stable (sorted keys), with a trailing newline."""
    encoded = json.loads(json.dumps(build(), cls=JSONEncoder))
    return json.dumps(encoded, indent=2, sort_keys=True) + "\n"


def targets(root: Path) -> list[Path]:
    """Where the generated JSON lives: ``containers/monitoring/`` under ``root``, and beside this module."""
    return [root / "containers" / "monitoring" / DASHBOARD_FILE, Path(__file__).with_name(DASHBOARD_FILE)]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpunode.deploy.dashboard [REPO_ROOT]`` (default: the current directory)."""
    from gpunode.common.atomic import atomic_write

    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        print("usage: python -m gpunode.deploy.dashboard [REPO_ROOT]  (writes the dashboard JSON files)")
        return 0
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m gpunode.deploy.dashboard [REPO_ROOT]", file=sys.stderr)
        return 2
    root = Path(args[0] if args else ".")
    if not (root / "containers").is_dir():
        print(f"{root}: not the repository's root (no containers/ directory)", file=sys.stderr)
        return 2
    text = dashboard_json()
    for path in targets(root):
        atomic_write(path, text)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

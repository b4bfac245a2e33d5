"""The Grafana dashboard: generated with Grafana's SDK and committed up to date, every query valid PromQL
(``promtool check rules`` parses each one) and reading only metrics and labels the running agents expose
(``scrape``, conftest.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpunode.deploy import dashboard

from .conftest import Scrape

ROOT = Path(__file__).resolve().parents[3]
PROMTOOL = shutil.which("promtool") or "promtool"
NAME = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+|gpunode_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+|gpunode_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
GRAFANA_VARS = {"$__range": "1h", "$__rate_interval": "5m", "$node": ".*", "$gpu": ".*"}
# Labels only NVIDIA's dcgm-exporter sets on a metric (profiling metrics per MIG instance): the panel
# serves it, and stays empty on gpunode-exporter.
DCGM_EXPORTER_ONLY = {("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "GPU_I_ID")}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels") or []


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) of every target, plus the template variables' queries."""
    out = [(p["title"], t["expr"]) for p in panels(board) for t in p.get("targets") or []]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*), *[A-Za-z_]+\)", var["query"])
            assert m, var["query"]
            out.append((f"variable {var['name']}", m[1]))
    return out


def concrete(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def test_committed_dashboards_are_up_to_date() -> None:
    want = dashboard.dashboard_json()
    for path in dashboard.targets(ROOT):
        assert path.read_text() == want, f"{path} is stale: run python -m gpunode.deploy.dashboard ."


def test_every_panel_has_a_unique_id_and_a_prometheus_query() -> None:
    board = json.loads(dashboard.dashboard_json())
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    for p in panels(board):
        if p["type"] != "row":
            assert p.get("targets"), p["title"]
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_every_query_parses(tmp_path: Path) -> None:
    board = json.loads(dashboard.dashboard_json())
    rules = [
        {"record": f"dashboard:query_{i}", "expr": concrete(expr)}
        for i, (_, expr) in enumerate(queries(board))
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_query_reads_what_the_agents_expose(scrape: Scrape) -> None:
    board = json.loads(dashboard.dashboard_json())
    problems = []
    for title, expr in queries(board):
        for name in NAME.findall(expr):
            if not scrape.known(name):
                problems.append(f"{title}: no agent exposes {name}")
        for m in SELECTOR.finditer(expr):
            name, body = m[1], m[2]
            series = scrape.by_name.get(name, [])
            if not series:
                continue  # declared, never sampled here (allocations): its labels cannot be checked
            have = {k for s in series for k in s.labels}
            for label, _, value in MATCHER.findall(body):
                if value == "" or (name, label) in DCGM_EXPORTER_ONLY:
                    continue  # label="" selects series without it
                if label not in have:
                    problems.append(f"{title}: {name} has no label {label} (has {sorted(have)})")
    assert not problems, "\n".join(problems)


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    exprs = " ".join(e for _, e in queries(json.loads(dashboard.dashboard_json())))
    for name in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "gpunode_device_plugin_devices",
        "gpunode_device_plugin_allocations_total",
        "gpunode_mig_config_state",
        "gpunode_operator_state_ready_pods",
        "gpunode_operator_driver_upgrade_nodes",
    ):
        assert name in exprs, name
    assert 'GPU_I_ID!=""' in exprs  # per MIG device

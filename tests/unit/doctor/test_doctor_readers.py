"""The doctor's readers and output: XID lines, durations, the table and the JSON."""

from __future__ import annotations

import json

import pytest

from gpunode import doctor


def test_exporter_xids() -> None:
    body = (
        'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a"} 0\n'
        'DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-b",Hostname="n"} 79\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="3"} 13\n'
    )
    assert doctor._exporter_xids(body) == [("3", 79)]


@pytest.mark.parametrize(
    ("text", "seconds"), [("60s", 60.0), ("5m", 300.0), ("90", 90.0), ("500ms", 0.5), ("infinite", None)]
)
def test_interval(text: str, seconds: float | None) -> None:
    assert doctor._interval(text) == seconds


def test_render_table_shows_fixes_for_failures_only() -> None:
    results = [
        doctor.Check("nvml", "ok", "driver 1", "never shown"),
        doctor.Check("cdi", "fail", "no spec", "generate it"),
        doctor.Check("labels", "skip", "not a node"),
    ]
    table = doctor.render_table(results)
    assert "fix: generate it" in table
    assert "never shown" not in table
    assert table.splitlines()[-1] == "1 ok, 0 warn, 1 fail, 1 skip"
    assert json.loads(doctor.render_json(results))["ok"] is False

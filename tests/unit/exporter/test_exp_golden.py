"""The exporter's series per simulated node, compared with golden files in tests/golden/exporter/.

Path: ``sim.install(preset)`` -> ``RealNvml.open()`` (pynvml over the simulated library) -> an optional
default MIG layout applied by the MIG manager's Applier and optional fabric faults -> two Sampler passes
(GPM needs a window) -> :class:`ExporterCollector` with the default counters plus the NVLink fabric fields
-> the text format. One line per series: the metric name and its labels, sorted. Values are left out
(telemetry moves with time) except for the ones that state facts: the fabric fields, the last XID, GPU
health and the MIG SM shares. The GPU UUID label is masked.

To change them on purpose: ``GPUNODE_UPDATE_GOLDEN=1 pytest tests/unit/exporter/test_exp_golden.py``, then
review the diff.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpunode.exporter.collector import ExporterCollector, Options
from gpunode.exporter.counters import default_counters_text, parse_counters
from gpunode.exporter.sampler import Sampler
from gpunode.mig.apply import Applier
from gpunode.mig.layouts import default_spec
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim
from gpunode.sim.mig_reset import SimResetter

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "exporter"
UPDATE_ENV = "GPUNODE_UPDATE_GOLDEN"
FABRIC_FIELDS = "# DCGM_FI_DEV_FABRIC_"
WITH_VALUES = ("DCGM_FI_DEV_FABRIC_", "DCGM_FI_DEV_XID_ERRORS", "gpunode_gpu_health", "gpunode_mig_instance")


@dataclass(frozen=True)
class Case:
    preset: str
    layout: str | None = None  # a default MIG config applied to every GPU
    faults: dict[int, str] = field(default_factory=dict)  # GPU -> fabric fault


CASES = {
    "dgx-b200": Case("dgx-b200"),
    "dgx-b200-all-balanced": Case("dgx-b200", "all-balanced"),
    "gb200-nvl4": Case("gb200-nvl4"),
    "gb200-nvl4-fabric-faults": Case("gb200-nvl4", faults={1: "degraded", 2: "not-trained", 3: "failed"}),
    "h100-nvl": Case("h100-nvl"),
    "l4x8": Case("l4x8"),
    "l40sx4": Case("l40sx4"),
    "a10x4": Case("a10x4"),
    "a2x2": Case("a2x2"),
    "mixed-ada-ampere": Case("mixed-ada-ampere"),
}


async def series_for(case: Case) -> list[str]:
    lib = sim.install(case.preset)
    with lib.node.mutate() as state:
        for gpu, fault in case.faults.items():
            state.set_fabric_fault(gpu, fault)
    nvml = await RealNvml.open()
    try:
        if case.layout is not None:
            await Applier(nvml, SimResetter(lib.node)).apply(case.layout, default_spec().select(case.layout))
        sampler = Sampler(nvml, interval=1.0, clock=lambda: 0.0)
        await sampler.sample()
        snap = await sampler.sample()
    finally:
        await nvml.close()
        sim.uninstall()
    text = default_counters_text().replace(FABRIC_FIELDS, FABRIC_FIELDS[2:])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(parse_counters(text, "<test>"), Options("node-a"), lambda: snap))
    lines = []
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = {**sample.labels, "UUID": "*"} if "UUID" in sample.labels else sample.labels
            line = sample.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            if sample.name.startswith(WITH_VALUES):
                line += f" {sample.value:g}"
            lines.append(line)
    return sorted(lines)


def check_golden(path: Path, lines: list[str]) -> None:
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    want = path.read_text(encoding="utf-8").splitlines()
    missing, unexpected = sorted(set(want) - set(lines)), sorted(set(lines) - set(want))
    assert lines == want, f"{path.name}: missing {missing}, unexpected {unexpected}"


@pytest.mark.parametrize("name", sorted(CASES))
async def test_golden(name: str) -> None:
    check_golden(GOLDEN_DIR / f"{name}.txt", await series_for(CASES[name]))


def test_golden_files_are_the_cases() -> None:
    assert {p.stem for p in GOLDEN_DIR.glob("*.txt")} == set(CASES)


def test_fabric_series_say_what_nvml_says() -> None:
    """The golden fabric values, checked against DCGM's meanings rather than read back."""
    lines = (GOLDEN_DIR / "gb200-nvl4-fabric-faults.txt").read_text(encoding="utf-8").splitlines()

    def value(metric: str, gpu: int) -> str | None:
        for line in lines:
            if line.startswith(metric + "{") and f'gpu="{gpu}"' in line:
                return line.rsplit(" ", 1)[1]
        return None

    status = "DCGM_FI_DEV_FABRIC_MANAGER_STATUS"
    assert [value(status, g) for g in range(4)] == [
        "3",
        "3",
        "1",
        "4",
    ]  # success, success, not started, failure
    summary = "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"
    assert [value(summary, g) for g in range(4)] == ["1", "3", "0", "2"]  # healthy, limited, n/a, unhealthy
    clique = "DCGM_FI_DEV_FABRIC_CLIQUE_ID"
    assert [value(clique, g) for g in range(4)] == ["32766", "32766", None, None]
    healthy = (GOLDEN_DIR / "dgx-b200.txt").read_text(encoding="utf-8")
    assert "DCGM_FI_DEV_FABRIC" not in healthy  # no NVLink fabric: no fabric series

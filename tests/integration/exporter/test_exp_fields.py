"""Issue 18: every field of dcgm-exporter's default and dcp-metrics-included files that NVML provides, on
a simulated dgx-h100 (HBM, NVLink, GPM), with dcgm-exporter's names and types; `promtool check metrics`
on that scrape; counters typed `counter` with their exact names in the text format and `unknown` in
OpenMetrics; dcgm-exporter 1.x names from a 1.x-style counters file."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.exporter.catalog import CATALOG
from gpunode.nvml import mig
from gpunode.sim import nvml as sim

EXPORTER = str(Path(sys.executable).parent / "gpunode-exporter")
PROMTOOL = shutil.which("promtool")
OPENMETRICS = "application/openmetrics-text; version=1.0.0"

# dcgm-exporter's names are a compatibility contract that Prometheus' style lint dislikes: camelCase
# labels, "counter" in a name, and counters without the `_total` suffix are the only complaints allowed.
ALLOWED_LINT = (
    re.compile(r"label names should be written in 'snake_case' not 'camelCase'$"),
    re.compile(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'$"),
    re.compile(r'^DCGM_FI_[A-Z0-9_]+ counter metrics should have "_total" suffix$'),
)
# not on this node: no vGPU licensing on bare metal; retired pages are pre-Ampere (Hopper remaps rows);
# one link's bandwidth counter is not sampled (NVML cannot give it without a per-link query)
ABSENT = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
    # no multi-node NVLink fabric on a DGX H100 (tests/unit/exporter/test_exp_golden.py: gb200-nvl4 has them)
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
    "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE",
    "DCGM_FI_DEV_FABRIC_CLIQUE_ID",
    "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
    "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY",
}
# the simulated H100 reports no power InfoROM object, and is on no NVLink fabric
ABSENT_LABELS = {"DCGM_FI_DEV_POWER_INFOROM_VER", "DCGM_FI_DEV_FABRIC_CLUSTER_UUID"}


def every_field_file() -> str:
    """A counters file enabling every field the catalog knows (the throttle-reasons alias once)."""
    lines = ["# every field, written for this test", ""]
    for spec in CATALOG.values():
        if spec.name == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":
            continue  # the same DCGM field as DCGM_FI_DEV_CLOCKS_EVENT_REASONS
        lines.append(f"{spec.name}, {spec.kind}, {spec.help}")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, accept: str | None = None) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return str(resp.read().decode())


def start(state: Path, counters: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [
            EXPORTER,
            "--sim-state",
            str(state),
            "-a",
            f"127.0.0.1:{port}",
            "-c",
            "300",
            "-f",
            str(counters),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).read()
            return proc, port
        except OSError:
            assert proc.poll() is None, "exporter exited"
            assert time.monotonic() < deadline, "exporter did not start"
            time.sleep(0.1)


def families(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp = tmp_path_factory.mktemp("h100")
    state = tmp / "node.json"
    sim.init_state_file(state, "dgx-h100")
    with sim.SimNode.open(state).mutate() as st:  # GPU 0 in MIG mode: per-MIG framebuffer series too
        st.set_mig_mode(0, 1)
        st.reset_gpu(0)
        for _ in range(7):
            ret, gi = st.create_gi(0, mig.GI_1_SLICE, None)
            assert ret == 0
            assert st.create_ci(0, gi, mig.CI_1_SLICE, None)[0] == 0
    counters = tmp / "every-field.csv"
    counters.write_text(every_field_file())
    proc, port = start(state, counters)
    deadline = time.monotonic() + 15
    while "DCGM_FI_PROF_SM_ACTIVE{" not in get(port):  # GPM needs two samples
        assert time.monotonic() < deadline, "no GPM series"
        time.sleep(0.2)
    yield port
    proc.terminate()
    proc.wait(10)


def test_every_nvml_field_has_series_with_dcgm_exporters_type(h100: int) -> None:
    text = get(h100)
    types = families(text)
    for spec in CATALOG.values():
        if spec.name == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" or spec.is_string or spec.name in ABSENT:
            continue
        assert series(text, spec.name), spec.name
        assert types[spec.name] == spec.kind, spec.name
    for name in ABSENT:
        assert not series(text, name), name
    assert "untyped" not in types.values()


def test_counters_keep_their_exact_names(h100: int) -> None:
    text = get(h100)
    for name in (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    ):
        assert f"# TYPE {name} counter\n" in text
        assert series(text, name), name
        assert not series(text, name + "_total"), name
        assert f"# TYPE {name}_total" not in text


def test_versions_are_labels_on_every_series(h100: int) -> None:
    text = get(h100)
    temp = series(text, "DCGM_FI_DEV_GPU_TEMP")
    assert len(temp) == 8
    for line in temp:
        for label in (
            "DCGM_FI_DEV_VBIOS_VERSION",
            "DCGM_FI_DEV_OEM_INFOROM_VER",
            "DCGM_FI_DEV_INFOROM_IMAGE_VER",
        ):
            assert re.search(label + r'="[^"]+"', line), (label, line)
        for label in ABSENT_LABELS:
            assert label not in line


def test_values_are_in_dcgm_units(h100: int) -> None:
    text = get(h100)

    def value(name: str, gpu: str = "1") -> float:
        line = next(s for s in series(text, name) if f'gpu="{gpu}"' in s)
        return float(line.rsplit(" ", 1)[1])

    assert 20 <= value("DCGM_FI_DEV_MEMORY_TEMP") <= 110  # C
    assert value("DCGM_FI_DEV_FB_RESERVED") > 0  # MiB
    for ratio in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_FP64_ACTIVE"):
        assert 0.0 <= value(ratio) <= 1.0, ratio
    assert value("DCGM_FI_DEV_POWER_VIOLATION") >= 0
    assert value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") > 0


@pytest.mark.skipif(PROMTOOL is None and not os.environ.get("CI"), reason="promtool not installed")
def test_promtool_accepts_every_field(h100: int) -> None:
    assert PROMTOOL is not None, "CI must have promtool"
    body = get(h100).encode()
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=30)
    problems = (result.stdout + result.stderr).decode().splitlines()
    assert result.returncode in (0, 3), problems  # 1 would be a parse error
    unexpected = [p for p in problems if p.strip() and not any(rx.search(p) for rx in ALLOWED_LINT)]
    assert unexpected == []


def test_openmetrics_keeps_the_names_as_unknown(h100: int) -> None:
    text = get(h100, OPENMETRICS)
    assert text.rstrip().endswith("# EOF")
    types = families(text)
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "unknown"
    assert types["DCGM_FI_DEV_GPU_TEMP"] == "gauge"
    assert series(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert not series(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total")


# A counters file in the style of dcgm-exporter's 1.x-compatibility file, written for this test.
ONE_X = """\
# 1.x names
dcgm_sm_clock,                 gauge,   SM clock (MHz).
dcgm_memory_temp,              gauge,   HBM temperature (C).
dcgm_total_energy_consumption, counter, Energy since boot (mJ).
dcgm_pcie_tx_throughput,       counter, PCIe TX (KB) via NVML.
dcgm_gpu_utilization,          gauge,   GPU busy (%).
dcgm_xid_errors,               gauge,   Last XID.
dcgm_fb_used,                  gauge,   Framebuffer used (MiB).
dcgm_ecc_sbe_volatile_total,   counter, Volatile single-bit ECC errors.
dcgm_power_violation,          counter, Time held back by power (ns).
dcgm_nvlink_bandwidth_total,   counter, NVLink traffic.
dcgm_fi_prof_gr_engine_active, gauge,   Graphics engine active.
# dcgm_fi_prof_sm_active,      gauge,   SM active.
"""


def test_a_1x_counters_file_exports_its_names(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-h100")
    counters = tmp_path / "1x.csv"
    counters.write_text(ONE_X)
    proc, port = start(state, counters, "--use-old-namespace")  # DCGM_EXPORTER_USE_OLD_NAMESPACE
    try:
        deadline = time.monotonic() + 15
        while "dcgm_fi_prof_gr_engine_active{" not in (text := get(port)):
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(10)
    types = families(text)
    assert types["dcgm_sm_clock"] == "gauge"
    assert types["dcgm_total_energy_consumption"] == "counter"
    assert types["dcgm_ecc_sbe_volatile_total"] == "counter"
    for name in (
        "dcgm_sm_clock",
        "dcgm_memory_temp",
        "dcgm_total_energy_consumption",
        "dcgm_gpu_utilization",
    ):
        assert len(series(text, name)) == 8, name
    assert len(series(text, "dcgm_ecc_sbe_volatile_total")) == 8
    assert "# HELP dcgm_sm_clock SM clock (MHz).\n" in text
    assert "DCGM_FI_DEV_SM_CLOCK" not in text
    assert "dcgm_fi_prof_sm_active" not in text
    assert all('uuid="GPU-' in line and "UUID=" not in line for line in series(text, "dcgm_sm_clock"))

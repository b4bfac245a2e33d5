"""Counters files: the packaged default is dcgm-exporter's default set; malformed files name file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.exporter.catalog import CATALOG
from gpunode.exporter.counters import (
    DEFAULT_COUNTERS,
    Counter,
    CountersError,
    default_counters_text,
    load_counters,
    parse_counters,
    unavailable,
)

# shared/reference §4.2: the enabled lines of dcgm-exporter's etc/default-counters.csv, in order.
DEFAULT_SET: list[tuple[str, str, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
    ),
]

UNAVAILABLE_DEFAULTS: list[str] = []  # issue 18: NVML supplies every default field


def triples(counters: list[Counter]) -> list[tuple[str, str, str]]:
    return [(c.name, c.kind, c.help) for c in counters]


def one(text: str) -> Counter:
    (counter,) = parse_counters(text, "t.csv")
    return counter


def error(text: str) -> CountersError:
    with pytest.raises(CountersError) as info:
        parse_counters(text, "counters.csv")
    return info.value


# --- the packaged default ---


def test_default_file_is_dcgm_exporters_default_set() -> None:
    counters = load_counters(None)
    assert triples(counters) == DEFAULT_SET
    assert len([c for c in counters if c.kind != "label"]) == 25
    assert [c.name for c in counters if c.kind == "label"] == ["DCGM_FI_DRIVER_VERSION"]


def test_default_file_is_package_data() -> None:
    text = default_counters_text()
    assert text == (Path(__file__).parents[3] / "agents/gpunode/exporter" / DEFAULT_COUNTERS).read_text()
    assert triples(parse_counters(text, DEFAULT_COUNTERS)) == DEFAULT_SET


def test_default_lines_point_at_the_file() -> None:
    lines = default_counters_text().splitlines()
    for counter in load_counters(None):
        assert lines[counter.line - 1].startswith(counter.name)


def test_unavailable_in_the_default_set() -> None:
    assert unavailable(load_counters(None)) == UNAVAILABLE_DEFAULTS


def test_unavailable_keeps_file_order_and_skips_available() -> None:
    counters = parse_counters(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0, counter, x\n"
        "DCGM_FI_DEV_GPU_UTIL, gauge, y\n"
        "DCGM_FI_DEV_MEMORY_TEMP, gauge, z\n",
        "t.csv",
    )
    assert unavailable(counters) == ["DCGM_FI_DEV_NVLINK_BANDWIDTH_L0"]
    assert unavailable([]) == []


def _commented_metric_lines() -> list[str]:
    out = []
    for raw in default_counters_text().splitlines():
        body = raw.removeprefix("#").strip()
        if raw.startswith("#") and body.startswith("DCGM_") and body.count(",") >= 2:
            out.append(body)
    return out


COMMENTED = _commented_metric_lines()


def test_default_file_keeps_the_disabled_extras_as_comments() -> None:
    names = {line.split(",")[0].strip() for line in COMMENTED}
    assert {
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_DEV_POWER_VIOLATION",
    } <= names


@pytest.mark.parametrize("line", COMMENTED, ids=[line.split(",")[0].strip() for line in COMMENTED])
def test_each_commented_line_can_be_enabled(line: str) -> None:
    name = line.split(",")[0].strip()
    if name.startswith("DCGM_EXP_"):
        assert "not supported by gpunode" in str(error(line))
        return
    counter = one(line)
    assert counter.spec is CATALOG[name]
    if "via NVML" not in line:  # upstream's commented PCIe counters carry an older help text
        assert counter.help == counter.spec.help


# --- parsing rules ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).",
            ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
            id="plain",
        ),
        pytest.param(
            "  DCGM_FI_DEV_DEC_UTIL ,     gauge ,   Decoder utilization (in %).   ",
            ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
            id="spaces-around-columns",
        ),
        pytest.param(
            "DCGM_FI_DEV_GPU_UTIL,gauge,GPU busy, sampled by the driver, in %",
            ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU busy, sampled by the driver, in %"),
            id="help-with-commas",
        ),
        pytest.param(
            'DCGM_FI_DEV_GPU_UTIL, gauge, "GPU busy, ""sampled"", in %"',
            ("DCGM_FI_DEV_GPU_UTIL", "gauge", 'GPU busy, "sampled", in %'),
            id="quoted-help",
        ),
        pytest.param(
            "DCGM_FI_DEV_GPU_UTIL, counter, as a counter",
            ("DCGM_FI_DEV_GPU_UTIL", "counter", "as a counter"),
            id="numeric-field-either-type",
        ),
        pytest.param(
            "DCGM_FI_DEV_GPU_UTIL, gauge,",
            ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
            id="empty-help-uses-catalog",
        ),
        pytest.param(
            "\ufeffDCGM_FI_DRIVER_VERSION, label, Driver Version",
            ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
            id="byte-order-mark",
        ),
        pytest.param(
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, reasons",
            ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "reasons"),
            id="old-alias-name-kept",
        ),
    ],
)
def test_parse_line(text: str, expected: tuple[str, str, str]) -> None:
    counter = one(text)
    assert (counter.name, counter.kind, counter.help) == expected
    assert counter.line == 1


def test_comments_and_blank_lines_are_skipped_but_counted() -> None:
    text = (
        "# Format\n"
        "# DCGM_FI_DEV_FOO, gauge, commented out: never checked\n"
        "\n"
        "   \n"
        "  # indented comment\n"
        "# Clocks,,\n"
        "DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\r\n"
        "\n"
        "DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).\n"
    )
    counters = parse_counters(text, "t.csv")
    assert [(c.name, c.line) for c in counters] == [("DCGM_FI_DEV_SM_CLOCK", 7), ("DCGM_FI_DEV_GPU_TEMP", 9)]
    assert counters[0].help == "SM clock frequency (in MHz)."


GOOD = "DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).\n"


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        pytest.param("DCGM_FI_DEV_GPU_UTIL, gauge", "expected 3 comma-separated columns", id="two-columns"),
        pytest.param("DCGM_FI_DEV_GPU_UTIL", "expected 3 comma-separated columns", id="one-column"),
        pytest.param(
            "DCGM_FI_DEV_GPU_UTIL, histogram, x", "type must be one of gauge, counter, label", id="bad-type"
        ),
        pytest.param("DCGM_FI_DEV_GPU_UTIL, Gauge, x", "type must be one of", id="type-is-case-sensitive"),
        pytest.param("DCGM_FI_DEV_GPU_UTIL, , x", "type must be one of", id="empty-type"),
        pytest.param("DCGM_FI_DEV_FOO, gauge, x", "unknown field DCGM_FI_DEV_FOO", id="unknown-field"),
        pytest.param("dcgm_fi_dev_gpu_util, gauge, x", "unknown field dcgm_fi_dev_gpu_util", id="lower-case"),
        pytest.param(", gauge, x", "the field column is empty", id="empty-field"),
        pytest.param(
            "DCGM_EXP_XID_ERRORS_COUNT, gauge, x",
            "DCGM_EXP_XID_ERRORS_COUNT is a dcgm-exporter synthesised metric, not supported by gpunode",
            id="exporter-metric",
        ),
        pytest.param("DCGM_EXP_FOO, gauge, x", "not supported by gpunode", id="unknown-exporter-metric"),
        pytest.param(
            "DCGM_FI_DEV_GPU_UTIL, label, x", "type label is only for string fields", id="label-on-numeric"
        ),
        pytest.param(
            "DCGM_FI_DRIVER_VERSION, gauge, x", "a string field can only be a label", id="gauge-on-string"
        ),
        pytest.param(
            "DCGM_FI_DEV_SM_CLOCK, counter, again",
            "duplicate field DCGM_FI_DEV_SM_CLOCK (already on line 1)",
            id="duplicate",
        ),
    ],
)
def test_malformed_line_names_file_and_line(bad_line: str, reason: str) -> None:
    exc = error(GOOD + "# a comment\n" + bad_line + "\n")
    assert exc.source == "counters.csv"
    assert exc.line == 3
    assert reason in exc.reason
    assert str(exc).startswith("counters.csv:3: ")
    assert len(exc.problems) == 1


def test_duplicate_through_an_alias() -> None:
    exc = error(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, a\n\nDCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, b\n"
    )
    assert str(exc) == (
        "counters.csv:3: duplicate field DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
        " (already on line 1 as DCGM_FI_DEV_CLOCKS_EVENT_REASONS)"
    )


def test_every_problem_is_reported_at_once() -> None:
    exc = error("DCGM_FI_DEV_FOO, gauge, x\n" + GOOD + "DCGM_FI_DEV_GPU_UTIL, gauge\n" + GOOD)
    assert [line for line, _ in exc.problems] == [1, 3, 4]
    assert str(exc).splitlines() == [
        "counters.csv:1: unknown field DCGM_FI_DEV_FOO",
        "counters.csv:3: expected 3 comma-separated columns (field, type, help), found 2",
        "counters.csv:4: duplicate field DCGM_FI_DEV_SM_CLOCK (already on line 2)",
    ]
    assert (exc.line, exc.reason) == (1, "unknown field DCGM_FI_DEV_FOO")


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_line_numbers_follow_the_editor(ending: str) -> None:
    text = ending.join(
        ["# c", "DCGM_FI_DEV_SM_CLOCK, gauge, page\x0cbreak\u2028kept", "DCGM_FI_DEV_FOO, gauge, x"]
    )
    assert error(text).line == 3


@pytest.mark.parametrize("text", ["", "\n\n", "# only\n# comments\n"], ids=["empty", "blank", "comments"])
def test_nothing_enabled_is_an_error(text: str) -> None:
    exc = error(text)
    assert exc.line is None
    assert str(exc) == "counters.csv: no metrics enabled (every line is blank or a comment)"


# --- loading ---


def test_load_counters_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "counters.csv"
    path.write_text(
        "# mine\nDCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\nDCGM_FI_DRIVER_VERSION, label, v\n"
    )
    assert triples(load_counters(path)) == [
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
        ("DCGM_FI_DRIVER_VERSION", "label", "v"),
    ]


def test_load_counters_errors_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "counters.csv"
    path.write_text(GOOD + "DCGM_FI_DEV_FOO, gauge, x\n")
    with pytest.raises(CountersError) as info:
        load_counters(path)
    assert str(info.value) == f"{path}:2: unknown field DCGM_FI_DEV_FOO"


@pytest.mark.parametrize("case", ["missing", "directory", "binary"])
def test_unreadable_file(tmp_path: Path, case: str) -> None:
    path = tmp_path / "counters.csv"
    if case == "directory":
        path.mkdir()
    elif case == "binary":
        path.write_bytes(b"\xff\xfe\x00DCGM")
    with pytest.raises(CountersError) as info:
        load_counters(path)
    assert info.value.line is None
    assert str(info.value).startswith(f"{path}: ")


def test_many_problems_list_twenty_then_a_count(tmp_path: Path) -> None:
    path = tmp_path / "counters.csv"
    with path.open("w") as out:
        for k in range(100_000):
            out.write(f"DCGM_FI_BAD_{k}, gauge, x\n")
    with pytest.raises(CountersError) as info:
        load_counters(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 21
    assert lines[0] == f"{path}:1: unknown field DCGM_FI_BAD_0"
    assert lines[-1] == f"{path}: ... and 99980 more problems"
    assert info.value.count == 100_000
    assert len(info.value.problems) == 20


def test_a_huge_line_is_one_short_problem(tmp_path: Path) -> None:
    path = tmp_path / "counters.csv"
    path.write_text(
        "DCGM_FI_DEV_GPU_UTIL, gauge, ok\n" + "X" * 5_000_000 + "\nDCGM_FI_" + "Y" * 30_000 + ", gauge, x\n"
    )
    with pytest.raises(CountersError) as info:
        load_counters(path)
    assert [line for line, _ in info.value.problems] == [2, 3]
    assert info.value.problems[0][1] == "longer than 65536 characters"
    assert info.value.problems[1][1].endswith("... (29522 more characters)")
    assert len(str(info.value)) < 1200  # the 30 KB field name is cut at 500 characters


# --- dcgm-exporter 1.x names (issue 18) ---


def test_1x_names_keep_their_name_and_the_files_type_and_help() -> None:
    counters = parse_counters(
        "# a 1.x file\n"
        "dcgm_gpu_temp, gauge, GPU temperature (C).\n"
        "dcgm_pcie_tx_throughput, counter, PCIe TX via NVML.\n"
        "dcgm_nvlink_flit_crc_error_count_total, counter, Flit CRC errors.\n",
        "1x.csv",
    )
    assert triples(counters) == [
        ("dcgm_gpu_temp", "gauge", "GPU temperature (C)."),
        ("dcgm_pcie_tx_throughput", "counter", "PCIe TX via NVML."),
        ("dcgm_nvlink_flit_crc_error_count_total", "counter", "Flit CRC errors."),
    ]
    assert [c.spec.field_id for c in counters] == [150, 200, 409]
    assert [c.spec.source for c in counters] == ["temperature_c", "pcie_tx_kbs", "nvlink_crc_flit_errors"]


def test_a_1x_name_and_its_dcgm_name_are_one_field() -> None:
    exc = error("DCGM_FI_DEV_SM_CLOCK, gauge, a\ndcgm_sm_clock, gauge, b\n")
    assert (
        str(exc)
        == "counters.csv:2: duplicate field dcgm_sm_clock (already on line 1 as DCGM_FI_DEV_SM_CLOCK)"
    )

"""The metric catalog against dcgm-exporter's contract (shared/reference §4.2) and our NVML library."""

from __future__ import annotations

import dataclasses

import pytest

from gpunode.exporter.catalog import CATALOG, KINDS, SPECIAL_SOURCES, MetricSpec, by_name
from gpunode.nvml.api import GpuInfo, MigDevice, SystemInfo, Telemetry

TELEMETRY_FIELDS = {f.name for f in dataclasses.fields(Telemetry)}

# §4.2: dcgm-exporter's enabled default set, in file order: (name, DCGM field id, type, help).
REFERENCE_4_2: list[tuple[str, int, str, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", 100, "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", 101, "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", 140, "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", 150, "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", 155, "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 202, "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", 203, "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", 204, "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", 206, "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", 207, "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", 230, "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", 251, "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", 252, "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", 253, "gauge", "Framebuffer memory reserved (in MiB)."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        449,
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", 526, "gauge", "vGPU License status"),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        393,
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        394,
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 395, "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DRIVER_VERSION", 1, "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001, "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        1005,
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        1009,
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        1010,
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
    ),
]
PCIE_APPROXIMATED = {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"}

# Off by default upstream but NVML-available: (name, field id, type, Telemetry attribute or special source).
EXTRAS: list[tuple[str, int, str, str]] = [
    ("DCGM_FI_DEV_FB_TOTAL", 250, "gauge", "memory_total_mib"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 310, "counter", "ecc_sbe_volatile"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 311, "counter", "ecc_dbe_volatile"),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 312, "counter", "ecc_sbe_aggregate"),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 313, "counter", "ecc_dbe_aggregate"),
    ("DCGM_FI_DEV_RETIRED_SBE", 390, "counter", "retired_pages_sbe"),
    ("DCGM_FI_DEV_RETIRED_DBE", 391, "counter", "retired_pages_dbe"),
    ("DCGM_FI_DEV_RETIRED_PENDING", 392, "counter", "retired_pages_pending"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", 396, "gauge", "remapped_rows_pending"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 112, "gauge", "clock_event_reasons"),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 112, "gauge", "clock_event_reasons"),
    ("DCGM_FI_DEV_PSTATE", 190, "gauge", "pstate"),
    ("DCGM_FI_DEV_POWER_VIOLATION", 240, "counter", "violation_power_ns"),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", 241, "counter", "violation_thermal_ns"),
    ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", 242, "counter", "violation_sync_boost_ns"),
    ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", 243, "counter", "violation_board_limit_ns"),
    ("DCGM_FI_DEV_LOW_UTIL_VIOLATION", 244, "counter", "violation_low_util_ns"),
    ("DCGM_FI_DEV_RELIABILITY_VIOLATION", 245, "counter", "violation_reliability_ns"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 409, "counter", "nvlink_crc_flit_errors"),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 419, "counter", "nvlink_crc_data_errors"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 429, "counter", "nvlink_replay_errors"),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 439, "counter", "nvlink_recovery_errors"),
    ("DCGM_FI_DEV_OEM_INFOROM_VER", 56, "label", "inforom_oem"),
    ("DCGM_FI_DEV_ECC_INFOROM_VER", 80, "label", "inforom_ecc"),
    ("DCGM_FI_DEV_POWER_INFOROM_VER", 81, "label", "inforom_power"),
    ("DCGM_FI_DEV_INFOROM_IMAGE_VER", 82, "label", "inforom_image"),
    ("DCGM_FI_DEV_VBIOS_VERSION", 85, "label", "vbios_version"),
    ("DCGM_FI_PROF_SM_ACTIVE", 1002, "gauge", "gpm_sm_active"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", 1003, "gauge", "gpm_sm_occupancy"),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", 1006, "gauge", "gpm_fp64"),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 1007, "gauge", "gpm_fp32"),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 1008, "gauge", "gpm_fp16"),
]

# The NVML-library attribute behind each special source: (dataclass, attribute).
SPECIAL_ORIGINS: dict[str, list[tuple[type, str]]] = {
    "xid": [],
    "driver_version": [(SystemInfo, "driver_version")],
    "nvml_version": [(SystemInfo, "nvml_version")],
    "brand": [(GpuInfo, "brand")],
    "serial": [(GpuInfo, "serial")],
    "memory_total_mib": [(GpuInfo, "memory_total_mib"), (MigDevice, "memory_mib")],
    "pcie_tx_bytes": [(Telemetry, "pcie_tx_kbs")],
    "pcie_rx_bytes": [(Telemetry, "pcie_rx_kbs")],
    "gpm_graphics": [],  # RealNvml.gpm_utilization()["graphics"]
    "gpm_tensor": [],
    "gpm_dram": [],
    "gpm_sm_active": [],
    "gpm_sm_occupancy": [],
    "gpm_fp64": [],
    "gpm_fp32": [],
    "gpm_fp16": [],
    "vbios_version": [(GpuInfo, "vbios_version")],
    "inforom_oem": [(GpuInfo, "inforom_oem")],
    "inforom_ecc": [(GpuInfo, "inforom_ecc")],
    "inforom_power": [(GpuInfo, "inforom_power")],
    "inforom_image": [(GpuInfo, "inforom_image")],
}

# issue 18: every default field has an NVML source now (memory temperature, reserved framebuffer, NVLink
# bandwidth, vGPU licence status included; a GPU without the feature gets no series)
UNAVAILABLE_DEFAULTS: set[str] = set()
# what NVML cannot provide at all, in dcgm-exporter's default and dcp-metrics-included files
UNAVAILABLE_ANYWHERE = {"DCGM_FI_DEV_NVLINK_BANDWIDTH_L0"}

ALL_SPECS = list(CATALOG.values())


@pytest.mark.parametrize(
    ("name", "field_id", "kind", "help_"), REFERENCE_4_2, ids=[r[0] for r in REFERENCE_4_2]
)
def test_default_set_matches_dcgm_exporter(name: str, field_id: int, kind: str, help_: str) -> None:
    spec = by_name(name)
    assert spec is not None
    assert (spec.name, spec.field_id, spec.kind) == (name, field_id, kind)
    if name in PCIE_APPROXIMATED:
        assert spec.help.startswith(help_)
        assert "approximat" in spec.help
        assert "NVML's PCIe throughput sample" in spec.help
    else:
        assert spec.help == help_


@pytest.mark.parametrize(("name", "field_id", "kind", "source"), EXTRAS, ids=[r[0] for r in EXTRAS])
def test_nvml_available_extras(name: str, field_id: int, kind: str, source: str) -> None:
    spec = by_name(name)
    assert spec is not None
    assert (spec.field_id, spec.kind, spec.source) == (field_id, kind, source)
    assert spec.available


@pytest.mark.parametrize("spec", ALL_SPECS, ids=[s.name for s in ALL_SPECS])
def test_every_source_is_a_telemetry_attribute_or_special(spec: MetricSpec) -> None:
    if spec.source is None:
        assert spec.note, "an unavailable metric says why"
        return
    if spec.source in SPECIAL_SOURCES:
        for cls, attribute in SPECIAL_ORIGINS[spec.source]:
            assert attribute in {f.name for f in dataclasses.fields(cls)}, (cls.__name__, attribute)
    else:
        assert spec.source in TELEMETRY_FIELDS, f"{spec.name}: Telemetry has no attribute {spec.source!r}"


def test_special_sources_are_documented_and_never_shadow_telemetry() -> None:
    assert set(SPECIAL_ORIGINS) == set(SPECIAL_SOURCES)
    assert not set(SPECIAL_SOURCES) & TELEMETRY_FIELDS
    used = {s.source for s in ALL_SPECS if s.source in SPECIAL_SOURCES}
    assert used == set(SPECIAL_SOURCES)


@pytest.mark.parametrize("spec", ALL_SPECS, ids=[s.name for s in ALL_SPECS])
def test_spec_is_well_formed(spec: MetricSpec) -> None:
    assert CATALOG[spec.name] is spec
    assert spec.name.startswith(("DCGM_FI_DEV_", "DCGM_FI_PROF_", "DCGM_FI_DRIVER_", "DCGM_FI_NVML_"))
    assert spec.kind in KINDS
    assert spec.help
    assert spec.help == spec.help.strip()
    assert spec.field_id > 0
    if spec.is_string:
        assert spec.unit == ""
        assert not spec.per_mig


def test_field_ids_are_unique_except_the_clock_reasons_alias() -> None:
    by_id: dict[int, list[str]] = {}
    for spec in ALL_SPECS:
        by_id.setdefault(spec.field_id, []).append(spec.name)
    shared = {fid: names for fid, names in by_id.items() if len(names) > 1}
    assert shared == {112: ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]}


def test_unavailable_defaults_have_no_source() -> None:
    defaults = {r[0] for r in REFERENCE_4_2}
    assert {n for n in defaults if not CATALOG[n].available} == UNAVAILABLE_DEFAULTS
    assert {s.name for s in ALL_SPECS if not s.available} == UNAVAILABLE_ANYWHERE
    for name in ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"):
        assert CATALOG[name].source in TELEMETRY_FIELDS
    assert CATALOG["DCGM_FI_DEV_VGPU_LICENSE_STATUS"].source == "vgpu_license_status"


def test_profiling_ratios_come_from_gpm_or_nowhere() -> None:
    prof = [s for s in ALL_SPECS if s.name.startswith("DCGM_FI_PROF_") and "PCIE" not in s.name]
    assert prof
    from_gpm = {s.name: s.source for s in prof if s.source is not None}
    assert from_gpm == {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gpm_graphics",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gpm_tensor",
        "DCGM_FI_PROF_DRAM_ACTIVE": "gpm_dram",
        "DCGM_FI_PROF_SM_ACTIVE": "gpm_sm_active",
        "DCGM_FI_PROF_SM_OCCUPANCY": "gpm_sm_occupancy",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "gpm_fp64",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "gpm_fp32",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "gpm_fp16",
    }
    assert len(from_gpm) == len(prof)  # every DCP activity ratio of dcgm-exporter's files


def test_pcie_rates_come_from_the_nvml_throughput_sample() -> None:
    for direction in ("TX", "RX"):
        spec = CATALOG[f"DCGM_FI_PROF_PCIE_{direction}_BYTES"]
        assert spec.source == f"pcie_{direction.lower()}_bytes"
        assert spec.unit == "B/s"
        assert "1024" in spec.note


def test_per_mig_metrics_are_the_framebuffer_ones() -> None:
    assert {s.name for s in ALL_SPECS if s.per_mig} == {
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_TOTAL",
    }


def test_driver_version_is_the_label() -> None:
    spec = CATALOG["DCGM_FI_DRIVER_VERSION"]
    assert spec.is_string
    assert spec.source == "driver_version"


@pytest.mark.parametrize(
    "name",
    ["DCGM_FI_DEV_FOO", "dcgm_fi_dev_gpu_util", " DCGM_FI_DEV_GPU_UTIL", "DCGM_EXP_XID_ERRORS_COUNT", ""],
)
def test_by_name_unknown(name: str) -> None:
    assert by_name(name) is None


def test_spec_is_frozen() -> None:
    spec = CATALOG["DCGM_FI_DEV_GPU_UTIL"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.help = "x"  # type: ignore[misc]


# dcgm-exporter's etc/1.x-compatibility-metrics.csv names (go-dcgm's legacy table): (1.x name, field id)
LEGACY_1X = [
    ("dcgm_sm_clock", 100),
    ("dcgm_memory_clock", 101),
    ("dcgm_memory_temp", 140),
    ("dcgm_gpu_temp", 150),
    ("dcgm_power_usage", 155),
    ("dcgm_total_energy_consumption", 156),
    ("dcgm_pcie_tx_throughput", 200),
    ("dcgm_pcie_rx_throughput", 201),
    ("dcgm_pcie_replay_counter", 202),
    ("dcgm_gpu_utilization", 203),
    ("dcgm_mem_copy_utilization", 204),
    ("dcgm_enc_utilization", 206),
    ("dcgm_dec_utilization", 207),
    ("dcgm_xid_errors", 230),
    ("dcgm_power_violation", 240),
    ("dcgm_thermal_violation", 241),
    ("dcgm_sync_boost_violation", 242),
    ("dcgm_board_limit_violation", 243),
    ("dcgm_low_util_violation", 244),
    ("dcgm_reliability_violation", 245),
    ("dcgm_fb_free", 251),
    ("dcgm_fb_used", 252),
    ("dcgm_ecc_sbe_volatile_total", 310),
    ("dcgm_ecc_dbe_volatile_total", 311),
    ("dcgm_ecc_sbe_aggregate_total", 312),
    ("dcgm_ecc_dbe_aggregate_total", 313),
    ("dcgm_retired_pages_sbe", 390),
    ("dcgm_retired_pages_dbe", 391),
    ("dcgm_retired_pages_pending", 392),
    ("dcgm_nvlink_flit_crc_error_count_total", 409),
    ("dcgm_nvlink_data_crc_error_count_total", 419),
    ("dcgm_nvlink_replay_error_count_total", 429),
    ("dcgm_nvlink_recovery_error_count_total", 439),
    ("dcgm_nvlink_bandwidth_total", 449),
    ("dcgm_fi_prof_gr_engine_active", 1001),
    ("dcgm_fi_prof_sm_active", 1002),
    ("dcgm_fi_prof_sm_occupancy", 1003),
    ("dcgm_fi_prof_pipe_tensor_active", 1004),
    ("dcgm_fi_prof_dram_active", 1005),
    ("dcgm_fi_prof_pcie_tx_bytes", 1009),
    ("dcgm_fi_prof_pcie_rx_bytes", 1010),
]


@pytest.mark.parametrize(("name", "field_id"), LEGACY_1X, ids=[r[0] for r in LEGACY_1X])
def test_1x_names_map_to_their_dcgm_field_and_keep_their_name(name: str, field_id: int) -> None:
    spec = by_name(name)
    assert spec is not None
    assert (spec.name, spec.field_id) == (name, field_id)
    assert spec.available
    assert name not in CATALOG  # the catalog itself stays DCGM's names

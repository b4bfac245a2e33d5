"""Every metric the exporter knows: dcgm-exporter's name, DCGM field id, type and help, and where we get it.

This table is the single source of truth. Names, field ids, types and help strings are dcgm-exporter's
(its ``etc/default-counters.csv`` and DCGM's ``dcgm_fields.h``): dashboards and alert rules depend on
them, so they are copied exactly. ``source`` says what supplies the value:

* the name of a :class:`gpunode.nvml.api.Telemetry` attribute (sampled each interval; ``None`` there
  means the GPU does not support it, and no series is written);
* one of :data:`SPECIAL_SOURCES`, for values that are not a plain Telemetry attribute;
* ``None``: NVML (or our NVML library) cannot supply it. The exporter names these once at start and
  never fakes a value.

``per_mig`` marks values that have their own meaning for each MIG device (read from the MIG device
itself); every other value is a property of the whole GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "label"]
KINDS: tuple[Kind, ...] = ("gauge", "counter", "label")

SPECIAL_SOURCES: dict[str, str] = {
    "xid": "the last XID reported by NVML's event API for the GPU (there is no polled value)",
    "driver_version": "SystemInfo.driver_version",
    "nvml_version": "SystemInfo.nvml_version",
    "brand": "GpuInfo.brand",
    "serial": "GpuInfo.serial",
    "memory_total_mib": "GpuInfo.memory_total_mib; for a MIG device, MigDevice.memory_mib",
    "pcie_tx_bytes": "Telemetry.pcie_tx_kbs x 1024 (NVML's PCIe throughput sample, KB/s)",
    "pcie_rx_bytes": "Telemetry.pcie_rx_kbs x 1024 (NVML's PCIe throughput sample, KB/s)",
    "gpm_graphics": "NVML GPM GRAPHICS_UTIL / 100 (Hopper and later; skipped on GPUs without GPM)",
    "gpm_tensor": "NVML GPM ANY_TENSOR_UTIL / 100 (Hopper and later; skipped on GPUs without GPM)",
    "gpm_dram": "NVML GPM DRAM_BW_UTIL / 100 (Hopper and later; skipped on GPUs without GPM)",
}


@dataclass(frozen=True)
class MetricSpec:
    """One metric: dcgm-exporter's identity for it plus the NVML value that supplies it."""

    name: str  # the DCGM field name, also the exposed metric name
    field_id: int  # DCGM's field id
    kind: Kind  # the type dcgm-exporter gives it; "label" marks a string field
    help: str  # dcgm-exporter's help text
    unit: str
    source: str | None  # Telemetry attribute, SPECIAL_SOURCES key, or None (unavailable)
    per_mig: bool = False
    note: str = ""

    @property
    def available(self) -> bool:
        return self.source is not None

    @property
    def is_string(self) -> bool:
        """A string field: it can only be exported as a label on the other series."""
        return self.kind == "label"


_NO_DCGM_PROF = "needs DCGM's profiling module (Hopper+: NVML GPM); not sampled, never faked"
_GPM = "from NVML GPM on Hopper and later; GPUs without GPM get no series (logged once), never a fake value"
_PCIE_APPROX = (
    " gpunode approximates it from NVML's PCIe throughput sample (KB/s over about 20 ms, times 1024)."
)

_SPECS: tuple[MetricSpec, ...] = (
    # --- dcgm-exporter's default set (etc/default-counters.csv), in the file's order ---
    MetricSpec("DCGM_FI_DEV_SM_CLOCK", 100, "gauge", "SM clock frequency (in MHz).", "MHz", "sm_clock_mhz"),
    MetricSpec(
        "DCGM_FI_DEV_MEM_CLOCK", 101, "gauge", "Memory clock frequency (in MHz).", "MHz", "mem_clock_mhz"
    ),
    MetricSpec(
        "DCGM_FI_DEV_MEMORY_TEMP",
        140,
        "gauge",
        "Memory temperature (in C).",
        "C",
        None,
        note="NVML has it on HBM parts (field NVML_FI_DEV_MEMORY_TEMP); our Telemetry does not sample it",
    ),
    MetricSpec("DCGM_FI_DEV_GPU_TEMP", 150, "gauge", "GPU temperature (in C).", "C", "temperature_c"),
    MetricSpec("DCGM_FI_DEV_POWER_USAGE", 155, "gauge", "Power draw (in W).", "W", "power_w"),
    MetricSpec(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        156,
        "counter",
        "Total energy consumption since boot (in mJ).",
        "mJ",
        "energy_mj",
    ),
    MetricSpec(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        202,
        "counter",
        "Total number of PCIe retries.",
        "count",
        "pcie_replay",
    ),
    MetricSpec(
        "DCGM_FI_DEV_GPU_UTIL",
        203,
        "gauge",
        "GPU utilization (in %).",
        "%",
        "gpu_util",
        note="not defined for MIG devices (NVML reports it for the whole GPU only)",
    ),
    MetricSpec("DCGM_FI_DEV_MEM_COPY_UTIL", 204, "gauge", "Memory utilization (in %).", "%", "mem_copy_util"),
    MetricSpec("DCGM_FI_DEV_ENC_UTIL", 206, "gauge", "Encoder utilization (in %).", "%", "enc_util"),
    MetricSpec("DCGM_FI_DEV_DEC_UTIL", 207, "gauge", "Decoder utilization (in %).", "%", "dec_util"),
    MetricSpec(
        "DCGM_FI_DEV_XID_ERRORS",
        230,
        "gauge",
        "Value of the last XID error encountered.",
        "code",
        "xid",
        note="from NVML's event API; dcgm-exporter adds err_code and err_msg labels",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FB_FREE",
        251,
        "gauge",
        "Framebuffer memory free (in MiB).",
        "MiB",
        "memory_free_mib",
        per_mig=True,
        note="per MIG device: the MIG device's own memory info",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FB_USED",
        252,
        "gauge",
        "Framebuffer memory used (in MiB).",
        "MiB",
        "memory_used_mib",
        per_mig=True,
        note="per MIG device: the MIG device's own memory info",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FB_RESERVED",
        253,
        "gauge",
        "Framebuffer memory reserved (in MiB).",
        "MiB",
        None,
        note="NVML has it (nvmlMemory_v2.reserved); our Telemetry does not sample it",
    ),
    MetricSpec(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        449,
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "count",
        None,
        note="alias of DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL; our Telemetry has no NVLink throughput",
    ),
    MetricSpec(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        526,
        "gauge",
        "vGPU License status",
        "bool",
        None,
        note="vGPU guest licensing is not part of our NVML library",
    ),
    MetricSpec(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        393,
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "count",
        "remapped_rows_uncorrectable",
    ),
    MetricSpec(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        394,
        "counter",
        "Number of remapped rows for correctable errors",
        "count",
        "remapped_rows_correctable",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        395,
        "gauge",
        "Whether remapping of rows has failed",
        "bool",
        "remapped_rows_failure",
    ),
    MetricSpec(
        "DCGM_FI_DRIVER_VERSION",
        1,
        "label",
        "Driver Version",
        "",
        "driver_version",
        note="copied as a label onto every series",
    ),
    MetricSpec(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        1001,
        "gauge",
        "Ratio of time the graphics engine is active.",
        "ratio",
        "gpm_graphics",
        note=_GPM,
    ),
    MetricSpec(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        1004,
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "ratio",
        "gpm_tensor",
        note=_GPM,
    ),
    MetricSpec(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        1005,
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "ratio",
        "gpm_dram",
        note=_GPM,
    ),
    MetricSpec(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        1009,
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second." + _PCIE_APPROX,
        "B/s",
        "pcie_tx_bytes",
        note="approximation: NVML's nvmlDeviceGetPcieThroughput(TX) in KB/s x 1024, not DCGM's counter",
    ),
    MetricSpec(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        1010,
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second." + _PCIE_APPROX,
        "B/s",
        "pcie_rx_bytes",
        note="approximation: NVML's nvmlDeviceGetPcieThroughput(RX) in KB/s x 1024, not DCGM's counter",
    ),
    # --- off by default (commented out upstream, or DCGM fields upstream does not list); NVML has them ---
    MetricSpec(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        112,
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        "bitmask",
        "clock_event_reasons",
    ),
    MetricSpec(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        112,
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        "bitmask",
        "clock_event_reasons",
        note="DCGM's older name for DCGM_FI_DEV_CLOCKS_EVENT_REASONS (same field)",
    ),
    MetricSpec(
        "DCGM_FI_DEV_PSTATE",
        190,
        "gauge",
        "Performance state (P-State) 0-15. 0=highest",
        "pstate",
        "pstate",
    ),
    MetricSpec(
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        200,
        "gauge",
        "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
        "KB/s",
        "pcie_tx_kbs",
        note="deprecated by DCGM in favour of DCGM_FI_PROF_PCIE_TX_BYTES; older counters files enable it",
    ),
    MetricSpec(
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        201,
        "gauge",
        "Total number of bytes received through PCIe RX (in KB) via NVML.",
        "KB/s",
        "pcie_rx_kbs",
        note="deprecated by DCGM in favour of DCGM_FI_PROF_PCIE_RX_BYTES; older counters files enable it",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FB_TOTAL",
        250,
        "gauge",
        "Framebuffer memory total (in MiB).",
        "MiB",
        "memory_total_mib",
        per_mig=True,
        note="per MIG device: the MIG device's memory size",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        310,
        "counter",
        "Total number of single-bit volatile ECC errors.",
        "count",
        "ecc_sbe_volatile",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        311,
        "counter",
        "Total number of double-bit volatile ECC errors.",
        "count",
        "ecc_dbe_volatile",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        312,
        "counter",
        "Total number of single-bit persistent ECC errors.",
        "count",
        "ecc_sbe_aggregate",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        313,
        "counter",
        "Total number of double-bit persistent ECC errors.",
        "count",
        "ecc_dbe_aggregate",
    ),
    MetricSpec(
        "DCGM_FI_DEV_RETIRED_SBE",
        390,
        "counter",
        "Total number of retired pages due to single-bit errors.",
        "count",
        "retired_pages_sbe",
    ),
    MetricSpec(
        "DCGM_FI_DEV_RETIRED_DBE",
        391,
        "counter",
        "Total number of retired pages due to double-bit errors.",
        "count",
        "retired_pages_dbe",
    ),
    MetricSpec(
        "DCGM_FI_DEV_RETIRED_PENDING",
        392,
        "counter",
        "Total number of pages pending retirement.",
        "count",
        "retired_pages_pending",
        note="NVML only says whether any page is pending: the value is 0 or 1, not a count",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        396,
        "gauge",
        "Whether remapping of rows is pending",
        "bool",
        "remapped_rows_pending",
    ),
    MetricSpec("DCGM_FI_NVML_VERSION", 2, "label", "NVML Version", "", "nvml_version"),
    MetricSpec("DCGM_FI_DEV_BRAND", 51, "label", "Device Brand", "", "brand"),
    MetricSpec("DCGM_FI_DEV_SERIAL", 53, "label", "Device Serial Number", "", "serial"),
    # --- off by default upstream, and not available through our NVML library ---
    *(
        MetricSpec(
            f"DCGM_FI_DEV_{name}_VIOLATION",
            field_id,
            "counter",
            f"Throttling duration due to {why} (in ns).",
            "ns",
            None,
            note="NVML has nvmlDeviceGetViolationStatus; our Telemetry does not sample it",
        )
        for name, field_id, why in (
            ("POWER", 240, "power constraints"),
            ("THERMAL", 241, "thermal constraints"),
            ("SYNC_BOOST", 242, "sync-boost constraints"),
            ("BOARD_LIMIT", 243, "board limit constraints"),
            ("LOW_UTIL", 244, "low utilization"),
            ("RELIABILITY", 245, "reliability constraints"),
        )
    ),
    *(
        MetricSpec(
            name, field_id, "counter", help_, "count", None, note="our Telemetry has no NVLink counters"
        )
        for name, field_id, help_ in (
            (
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                409,
                "Total number of NVLink flow-control CRC errors.",
            ),
            ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 419, "Total number of NVLink data CRC errors."),
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 429, "Total number of NVLink retries."),
            ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 439, "Total number of NVLink recovery errors."),
            (
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
                440,
                "The number of bytes of active NVLink rx or tx data including both header and payload.",
            ),
        )
    ),
    *(
        MetricSpec(name, field_id, "label", help_, "", None, note="not exposed by our NVML library")
        for name, field_id, help_ in (
            ("DCGM_FI_DEV_OEM_INFOROM_VER", 56, "OEM inforom version"),
            ("DCGM_FI_DEV_ECC_INFOROM_VER", 80, "ECC inforom version"),
            ("DCGM_FI_DEV_POWER_INFOROM_VER", 81, "Power management object inforom version"),
            ("DCGM_FI_DEV_INFOROM_IMAGE_VER", 82, "Inforom image version"),
            ("DCGM_FI_DEV_VBIOS_VERSION", 85, "VBIOS version of the device"),
        )
    ),
    *(
        MetricSpec(name, field_id, "gauge", help_, "ratio", None, note=_NO_DCGM_PROF)
        for name, field_id, help_ in (
            ("DCGM_FI_PROF_SM_ACTIVE", 1002, "The ratio of cycles an SM has at least 1 warp assigned."),
            ("DCGM_FI_PROF_SM_OCCUPANCY", 1003, "The ratio of number of warps resident on an SM."),
            ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", 1006, "Ratio of cycles the fp64 pipes are active."),
            ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 1007, "Ratio of cycles the fp32 pipes are active."),
            ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 1008, "Ratio of cycles the fp16 pipes are active."),
        )
    ),
)

CATALOG: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}


def by_name(name: str) -> MetricSpec | None:
    """The metric called `name` (a DCGM field name, case-sensitive as DCGM spells it), or None."""
    return CATALOG.get(name)

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

from dataclasses import dataclass, replace
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
    "gpm_sm_active": "NVML GPM SM_UTIL / 100 (Hopper and later; skipped on GPUs without GPM)",
    "gpm_sm_occupancy": "NVML GPM SM_OCCUPANCY / 100 (Hopper and later; skipped on GPUs without GPM)",
    "gpm_fp64": "NVML GPM FP64_UTIL / 100 (Hopper and later; skipped on GPUs without GPM)",
    "gpm_fp32": "NVML GPM FP32_UTIL / 100 (Hopper and later; skipped on GPUs without GPM)",
    "gpm_fp16": "NVML GPM FP16_UTIL / 100 (Hopper and later; skipped on GPUs without GPM)",
    "vbios_version": "GpuInfo.vbios_version (nvmlDeviceGetVbiosVersion)",
    "inforom_oem": "GpuInfo.inforom_oem (nvmlDeviceGetInforomVersion, NVML_INFOROM_OEM)",
    "inforom_ecc": "GpuInfo.inforom_ecc (nvmlDeviceGetInforomVersion, NVML_INFOROM_ECC)",
    "inforom_power": "GpuInfo.inforom_power (nvmlDeviceGetInforomVersion, NVML_INFOROM_POWER)",
    "inforom_image": "GpuInfo.inforom_image (nvmlDeviceGetInforomImageVersion)",
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
        "memory_temp_c",
        note="NVML field NVML_FI_DEV_MEMORY_TEMP: HBM parts only; other GPUs get no series",
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
        "memory_reserved_mib",
        note="nvmlMemory_v2.reserved",
    ),
    MetricSpec(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        449,
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "KiB",
        "nvlink_raw_kib",
        note="NVML fields NVLINK_THROUGHPUT_RAW_TX + _RAW_RX over all links (KiB since boot, data and"
        " protocol); GPUs without NVLink get no series",
    ),
    MetricSpec(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        526,
        "gauge",
        "vGPU License status",
        "bool",
        "vgpu_license_status",
        note="nvmlDeviceGetGridLicensableFeatures: 1 when a vGPU guest holds a licence, 0 when not;"
        " bare metal and passthrough GPUs (no vGPU licensing in NVML) get no series",
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
    # NVLink fabric (GB200 NVL and the like): nvmlDeviceGetGpuFabricInfoV; GPUs not on a fabric get no series
    MetricSpec(
        "DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
        170,
        "gauge",
        "The status of the fabric manager - a value from dcgmFabricManagerStatus_t.",
        "",
        "fabric_status",
        note="0 not supported, 1 not started, 2 in progress, 3 success, 4 failure: from the fabric info's"
        " state and status (a GPU whose fabric state is NOT_SUPPORTED gets no series)",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE",
        171,
        "gauge",
        "The error code of the fabric manager (populated once the fabric manager completed startup).",
        "",
        "fabric_error",
        note="the fabric info's NVML status, once its state is COMPLETED",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FABRIC_CLUSTER_UUID",
        172,
        "label",
        "The uuid of the cluster to which this GPU belongs",
        "",
        "fabric_cluster_uuid",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FABRIC_CLIQUE_ID",
        173,
        "gauge",
        "The ID of the fabric clique to which this GPU belongs",
        "",
        "fabric_clique_id",
        note="only while the GPU is fabric-attached (trained, success, a cluster UUID)",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
        174,
        "gauge",
        "The fabric health mask (NVML_GPU_FABRIC_HEALTH_MASK_*).",
        "",
        "fabric_health_mask",
    ),
    MetricSpec(
        "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY",
        175,
        "gauge",
        "The fabric health summary: 0 not supported, 1 healthy, 2 unhealthy, 3 limited capacity.",
        "",
        "fabric_health_summary",
        note="fabric info v3 (drivers that return only v2 give no series)",
    ),
    MetricSpec("DCGM_FI_NVML_VERSION", 2, "label", "NVML Version", "", "nvml_version"),
    MetricSpec("DCGM_FI_DEV_BRAND", 51, "label", "Device Brand", "", "brand"),
    MetricSpec("DCGM_FI_DEV_SERIAL", 53, "label", "Device Serial Number", "", "serial"),
    # clock-event (throttle) violation times: NVML's perf-policy fields, ns since boot
    *(
        MetricSpec(
            f"DCGM_FI_DEV_{name}_VIOLATION",
            field_id,
            "counter",
            f"Throttling duration due to {why} (in ns).",
            "ns",
            f"violation_{attribute}_ns",
            note=f"NVML field NVML_FI_DEV_PERF_POLICY_{policy} (the violation time that"
            " nvmlDeviceGetViolationStatus reports)",
        )
        for name, field_id, why, attribute, policy in (
            ("POWER", 240, "power constraints", "power", "POWER"),
            ("THERMAL", 241, "thermal constraints", "thermal", "THERMAL"),
            ("SYNC_BOOST", 242, "sync-boost constraints", "sync_boost", "SYNC_BOOST"),
            ("BOARD_LIMIT", 243, "board limit constraints", "board_limit", "BOARD_LIMIT"),
            ("LOW_UTIL", 244, "low utilization", "low_util", "LOW_UTILIZATION"),
            ("RELIABILITY", 245, "reliability constraints", "reliability", "RELIABILITY"),
        )
    ),
    # NVLink error counters, totals over every link (GPUs without NVLink get no series)
    *(
        MetricSpec(
            name,
            field_id,
            "counter",
            help_,
            "count",
            source,
            note=f"NVML field NVML_FI_DEV_NVLINK_{nvml}_COUNT_TOTAL",
        )
        for name, field_id, help_, source, nvml in (
            (
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                409,
                "Total number of NVLink flow-control CRC errors.",
                "nvlink_crc_flit_errors",
                "CRC_FLIT_ERROR",
            ),
            (
                "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                419,
                "Total number of NVLink data CRC errors.",
                "nvlink_crc_data_errors",
                "CRC_DATA_ERROR",
            ),
            (
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                429,
                "Total number of NVLink retries.",
                "nvlink_replay_errors",
                "REPLAY_ERROR",
            ),
            (
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                439,
                "Total number of NVLink recovery errors.",
                "nvlink_recovery_errors",
                "RECOVERY_ERROR",
            ),
        )
    ),
    MetricSpec(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
        440,
        "counter",
        "The number of bytes of active NVLink rx or tx data including both header and payload.",
        "count",
        None,
        note="one link's counter: NVML has it per link, gpunode samples only the total over all links"
        " (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL)",
    ),
    # versions, as labels on every series
    *(
        MetricSpec(name, field_id, "label", help_, "", source)
        for name, field_id, help_, source in (
            ("DCGM_FI_DEV_OEM_INFOROM_VER", 56, "OEM inforom version", "inforom_oem"),
            ("DCGM_FI_DEV_ECC_INFOROM_VER", 80, "ECC inforom version", "inforom_ecc"),
            ("DCGM_FI_DEV_POWER_INFOROM_VER", 81, "Power management object inforom version", "inforom_power"),
            ("DCGM_FI_DEV_INFOROM_IMAGE_VER", 82, "Inforom image version", "inforom_image"),
            ("DCGM_FI_DEV_VBIOS_VERSION", 85, "VBIOS version of the device", "vbios_version"),
        )
    ),
    # DCP activity ratios from NVML GPM (Hopper and later)
    *(
        MetricSpec(name, field_id, "gauge", help_, "ratio", source, note=_GPM)
        for name, field_id, help_, source in (
            (
                "DCGM_FI_PROF_SM_ACTIVE",
                1002,
                "The ratio of cycles an SM has at least 1 warp assigned.",
                "gpm_sm_active",
            ),
            (
                "DCGM_FI_PROF_SM_OCCUPANCY",
                1003,
                "The ratio of number of warps resident on an SM.",
                "gpm_sm_occupancy",
            ),
            ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", 1006, "Ratio of cycles the fp64 pipes are active.", "gpm_fp64"),
            ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 1007, "Ratio of cycles the fp32 pipes are active.", "gpm_fp32"),
            ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 1008, "Ratio of cycles the fp16 pipes are active.", "gpm_fp16"),
        )
    ),
)

CATALOG: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}

# dcgm-exporter 1.x names (its etc/1.x-compatibility-metrics.csv), mapped to DCGM fields as go-dcgm's
# legacy table maps them. A counters file may use them; the metric keeps the 1.x name.
LEGACY_NAMES: dict[str, str] = {
    "dcgm_sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "dcgm_memory_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "dcgm_memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm_total_energy_consumption": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "dcgm_pcie_tx_throughput": "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "dcgm_pcie_rx_throughput": "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "dcgm_pcie_replay_counter": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL",
    "dcgm_mem_copy_utilization": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "dcgm_enc_utilization": "DCGM_FI_DEV_ENC_UTIL",
    "dcgm_dec_utilization": "DCGM_FI_DEV_DEC_UTIL",
    "dcgm_xid_errors": "DCGM_FI_DEV_XID_ERRORS",
    "dcgm_power_violation": "DCGM_FI_DEV_POWER_VIOLATION",
    "dcgm_thermal_violation": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "dcgm_sync_boost_violation": "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "dcgm_board_limit_violation": "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "dcgm_low_util_violation": "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "dcgm_reliability_violation": "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE",
    "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_ecc_sbe_volatile_total": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "dcgm_ecc_dbe_volatile_total": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "dcgm_ecc_sbe_aggregate_total": "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "dcgm_ecc_dbe_aggregate_total": "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "dcgm_retired_pages_sbe": "DCGM_FI_DEV_RETIRED_SBE",
    "dcgm_retired_pages_dbe": "DCGM_FI_DEV_RETIRED_DBE",
    "dcgm_retired_pages_pending": "DCGM_FI_DEV_RETIRED_PENDING",
    "dcgm_nvlink_flit_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_data_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_replay_error_count_total": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_recovery_error_count_total": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_bandwidth_total": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "dcgm_fi_prof_gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "dcgm_fi_prof_sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "dcgm_fi_prof_sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "dcgm_fi_prof_pipe_tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dcgm_fi_prof_dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "dcgm_fi_prof_pcie_tx_bytes": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "dcgm_fi_prof_pcie_rx_bytes": "DCGM_FI_PROF_PCIE_RX_BYTES",
}
_LEGACY: dict[str, MetricSpec] = {
    old: replace(CATALOG[new], name=old, note=f"dcgm-exporter 1.x name of {new}")
    for old, new in LEGACY_NAMES.items()
}


def by_name(name: str) -> MetricSpec | None:
    """The metric called `name` (a DCGM field name, case-sensitive as DCGM spells it, or a dcgm-exporter
    1.x ``dcgm_*`` name, which keeps its name), or None."""
    return CATALOG.get(name) or _LEGACY.get(name)

"""What agents get from NVML: frozen dataclasses and the `Nvml` protocol they are served through."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncio

ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}

BRANDS = {
    0: "unknown",
    1: "quadro",
    2: "tesla",
    3: "nvs",
    4: "grid",
    5: "geforce",
    6: "titan",
    12: "quadro-rtx",
    13: "nvidia-rtx",
    14: "nvidia",
}


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str  # "550.54.15"
    nvml_version: str  # "12.550.54.15"
    cuda_driver_version: int  # 12040

    @property
    def cuda_version(self) -> tuple[int, int]:
        """The CUDA version the driver supports, e.g. (12, 4)."""
        return self.cuda_driver_version // 1000, (self.cuda_driver_version % 1000) // 10


@dataclass(frozen=True)
class PciInfo:
    bus_id: str  # "00000000:07:00.0", as NVML reports it
    domain: int
    bus: int
    device: int
    device_id: int  # device << 16 | vendor, e.g. 0x20B010DE
    subsystem_id: int

    @property
    def sysfs_bus_id(self) -> str:
        """The form sysfs uses: "0000:07:00.0" (lower-case, 4-digit domain)."""
        domain, rest = self.bus_id.split(":", 1)
        return f"{int(domain, 16):04x}:{rest.lower()}"


@dataclass(frozen=True)
class MigMode:
    current: bool
    pending: bool


@dataclass(frozen=True)
class GpuInfo:
    index: int
    minor: int
    uuid: str
    name: str
    serial: str | None
    pci: PciInfo
    numa_node: int | None
    memory_total_mib: int
    compute_capability: tuple[int, int]
    architecture: str
    brand: str
    sm_count: int | None
    mig: MigMode | None  # None: not MIG-capable
    # versions (None where the GPU or driver does not report them)
    vbios_version: str | None = None
    inforom_oem: str | None = None
    inforom_ecc: str | None = None
    inforom_power: str | None = None
    inforom_image: str | None = None

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None

    @property
    def mig_enabled(self) -> bool:
        """MIG mode is on now (a change still pending does not count)."""
        return self.mig is not None and self.mig.current


@dataclass(frozen=True)
class Placement:
    start: int
    size: int


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile as this GPU reports it."""

    enum: int  # what NVML takes as input (NVML_GPU_INSTANCE_PROFILE_*)
    id: int  # what nvidia-smi prints (e.g. 19 for 1g.5gb on A100)
    name: str  # "1g.5gb", "1g.10gb+me"
    slices: int
    instance_count: int
    sm_count: int
    memory_mib: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int
    placements: tuple[Placement, ...] = ()


@dataclass(frozen=True)
class CiProfile:
    enum: int
    gi_profile_enum: int
    name: str  # "1c.3g.20gb" or, when C == G, the GI name
    slices: int
    instance_count: int
    sm_count: int


@dataclass(frozen=True)
class GpuInstance:
    gpu_index: int
    id: int
    profile: GiProfile
    placement: Placement


@dataclass(frozen=True)
class ComputeInstance:
    gpu_index: int
    gi_id: int
    id: int
    profile_enum: int
    placement: Placement


@dataclass(frozen=True)
class MigDevice:
    parent_index: int
    parent_uuid: str
    index: int  # position under the parent, as nvmlDeviceGetMigDeviceHandleByIndex counts
    uuid: str
    name: str  # NVML's device name, e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    profile: str  # "1g.5gb", "1c.3g.20gb"
    gi_id: int
    ci_id: int
    memory_mib: int
    sm_count: int
    gi_slices: int
    ci_slices: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int
    memory_used_mib: int | None = None  # at enumeration time
    memory_free_mib: int | None = None


FABRIC_STATES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}
FABRIC_HEALTH = {0: "not-supported", 1: "healthy", 2: "unhealthy", 3: "limited-capacity"}


@dataclass(frozen=True)
class FabricInfo:
    """A GPU's place on an NVLink fabric (nvmlDeviceGetGpuFabricInfoV), as GB200 NVL systems report it."""

    state: str  # FABRIC_STATES: "completed" once the fabric manager has trained the GPU
    status: int  # the NVML return code of the registration (0: success)
    cluster_uuid: str | None  # canonical UUID text; None while zero (not trained, or not on a fabric)
    clique_id: int
    degraded_bandwidth: bool | None = None  # health mask bits 0-1; None: not reported
    health: str | None = None  # FABRIC_HEALTH (fabric info v3); None: not reported
    health_mask: int = 0  # the raw NVML_GPU_FABRIC_HEALTH_MASK_* word
    health_summary: int | None = None  # the raw NVML_GPU_FABRIC_HEALTH_SUMMARY_* value (v3)

    @property
    def attached(self) -> bool:
        """Fabric-attached the way GPU feature discovery counts it: trained, success, a cluster UUID."""
        return self.state == "completed" and self.status == 0 and self.cluster_uuid is not None

    @property
    def clique(self) -> str | None:
        """``<clusterUUID>.<cliqueId>`` (NVIDIA's ``nvidia.com/gpu.clique`` value) when attached."""
        return f"{self.cluster_uuid}.{self.clique_id}" if self.attached else None

    @property
    def dcgm_status(self) -> int:
        """DCGM's dcgmFabricManagerStatus_t for DCGM_FI_DEV_FABRIC_MANAGER_STATUS: 0 not supported,
        1 not started, 2 in progress, 3 success, 4 failure (trained with an error status)."""
        if self.state == "completed":
            return 3 if self.status == 0 else 4
        return {"not-supported": 0, "not-started": 1, "in-progress": 2}.get(self.state, 5)


class TopoLevel(enum.IntEnum):
    """NVML's common-ancestor levels; the names are the ones `nvidia-smi topo -m` prints."""

    X = -1
    INTERNAL = 0
    PIX = 10
    PXB = 20
    PHB = 30
    NODE = 40
    SYS = 50


@dataclass(frozen=True)
class Topology:
    """Pairwise GPU connectivity, indexed by GPU index."""

    indices: tuple[int, ...]
    levels: tuple[tuple[TopoLevel, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...]
    numa_nodes: tuple[int | None, ...] = ()

    def link_count(self, a: int, b: int) -> int:
        return self.nvlinks[self.indices.index(a)][self.indices.index(b)]

    def level(self, a: int, b: int) -> TopoLevel:
        return self.levels[self.indices.index(a)][self.indices.index(b)]

    def matrix(self) -> str:
        """A table like `nvidia-smi topo -m`."""
        names = [f"GPU{i}" for i in self.indices]
        header = ["", *names, "NUMA Affinity"]
        rows = [header]
        for r, i in enumerate(self.indices):
            cells = [f"GPU{i}"]
            for c, _ in enumerate(self.indices):
                if r == c:
                    cells.append("X")
                elif self.nvlinks[r][c]:
                    cells.append(f"NV{self.nvlinks[r][c]}")
                else:
                    cells.append(self.levels[r][c].name)
            numa = self.numa_nodes[r] if self.numa_nodes else None
            cells.append("N/A" if numa is None else str(numa))
            rows.append(cells)
        widths = [max(len(row[k]) for row in rows) for k in range(len(header))]
        return "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
        )


class ComputeMode(enum.IntEnum):
    """nvmlComputeMode_t: who may create contexts on a GPU (MPS wants ``EXCLUSIVE_PROCESS``)."""

    DEFAULT = 0
    EXCLUSIVE_THREAD = 1  # deprecated by NVIDIA
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


class EventKind(enum.Enum):
    XID = "xid"
    SINGLE_BIT_ECC = "sbe"
    DOUBLE_BIT_ECC = "dbe"
    MIG_CONFIG = "mig-config"
    OTHER = "other"


@dataclass(frozen=True)
class HealthEvent:
    gpu_index: int
    gpu_uuid: str
    kind: EventKind
    xid: int | None = None
    data: int = 0
    gi_id: int | None = None  # None: the whole GPU
    ci_id: int | None = None


@dataclass(frozen=True)
class Telemetry:
    """One sample of a GPU's counters; a field is None where the GPU does not support it."""

    gpu_index: int
    gpu_util: int | None = None
    mem_copy_util: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    pcie_tx_kbs: int | None = None
    pcie_rx_kbs: int | None = None
    pcie_replay: int | None = None
    enc_util: int | None = None
    dec_util: int | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    clock_event_reasons: int | None = None
    pstate: int | None = None
    memory_temp_c: int | None = None  # HBM parts (NVML field NVML_FI_DEV_MEMORY_TEMP)
    memory_reserved_mib: int | None = None  # nvmlMemory_v2.reserved
    nvlink_raw_kib: int | None = None  # NVLink TX + RX, data and protocol, all links, KiB since boot
    nvlink_crc_flit_errors: int | None = None  # totals over all links
    nvlink_crc_data_errors: int | None = None
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    # time the clocks were held back, per reason (NVML's perf policies), ns since boot
    violation_power_ns: int | None = None
    violation_thermal_ns: int | None = None
    violation_sync_boost_ns: int | None = None
    violation_board_limit_ns: int | None = None
    violation_low_util_ns: int | None = None
    violation_reliability_ns: int | None = None
    vgpu_license_status: int | None = None  # vGPU guests: 1 licensed, 0 not; None elsewhere
    # NVLink fabric (GB200 and the like; None on GPUs that are not on one): see FabricInfo
    fabric_status: int | None = None  # FabricInfo.dcgm_status
    fabric_error: int | None = None  # the NVML status of the fabric registration, once trained
    fabric_clique_id: int | None = None
    fabric_cluster_uuid: str | None = None
    fabric_health_mask: int | None = None
    fabric_health_summary: int | None = None
    processes: tuple[tuple[int, int], ...] = field(default=())  # (pid, used MiB)


@dataclass(frozen=True)
class SetMigModeResult:
    current: bool
    pending: bool
    activation: str  # "applied", "reset-required", "in-use", ...

    @property
    def needs_reset(self) -> bool:
        return self.current != self.pending


EVENT_XID = 0x8
EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_MIG_CONFIG = 0x100
HEALTH_EVENTS = EVENT_XID | EVENT_SBE | EVENT_DBE


class Nvml(Protocol):
    """The NVML library every agent uses (real hardware or the simulator beneath pynvml)."""

    async def system(self) -> SystemInfo: ...

    async def gpus(self) -> list[GpuInfo]: ...

    async def lost_gpus(self) -> list[int]: ...

    async def topology(self) -> Topology: ...

    async def mig_mode(self, index: int) -> MigMode | None: ...

    async def set_mig_mode(self, index: int, enabled: bool) -> SetMigModeResult: ...

    async def compute_mode(self, index: int) -> ComputeMode: ...

    async def set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        """Set the GPU's compute mode (root only: ``errors.NoPermission`` otherwise)."""
        ...

    async def gi_profiles(self, index: int) -> list[GiProfile]: ...

    async def ci_profiles(self, index: int, gi_profile_enum: int) -> list[CiProfile]: ...

    async def gpu_instances(self, index: int) -> list[GpuInstance]: ...

    async def create_gpu_instance(
        self, index: int, profile_enum: int, placement: Placement | None = None
    ) -> GpuInstance: ...

    async def destroy_gpu_instance(self, index: int, gi_id: int) -> None: ...

    async def compute_instances(self, index: int, gi_id: int) -> list[ComputeInstance]: ...

    async def create_compute_instance(
        self, index: int, gi_id: int, ci_profile_enum: int, placement: Placement | None = None
    ) -> ComputeInstance: ...

    async def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None: ...

    async def mig_devices(self, index: int) -> list[MigDevice]: ...

    async def telemetry(self, index: int) -> Telemetry: ...

    async def fabric_clique(self, index: int) -> str | None: ...

    async def fabric_info(self, index: int) -> FabricInfo | None:
        """The GPU's NVLink fabric registration; None where the GPU or driver does not report one."""
        ...

    async def mig_memory(self, index: int) -> dict[str, tuple[int, int]]: ...

    async def gpm_utilization(self, index: int) -> dict[str, float] | None:
        """GPM activity (Hopper and later) since the previous call for this GPU, in percent, keyed
        "graphics", "tensor", "dram", "sm_active", "sm_occupancy", "fp64", "fp32" and "fp16" (a metric
        the GPU cannot report is left out); None without GPM and on the first call (nothing to measure
        from)."""
        ...

    def events(
        self,
        mask: int = HEALTH_EVENTS,
        indices: Sequence[int] | None = None,
        ready: asyncio.Event | None = None,
    ) -> AsyncIterator[HealthEvent]:
        """Events from now on; `ready` (an asyncio.Event) is set once they are being watched."""
        ...

    async def close(self) -> None: ...

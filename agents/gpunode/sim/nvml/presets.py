"""Hardware facts of the simulated products and nodes.

Values follow what NVML reports on the real products: names, PCI device ids, memory in MiB, compute
capability, SM counts, MIG profile tables (ids, placements, maxima, engines), NVLink wiring.
Sources: NVIDIA's MIG user guide tables and `nvidia-smi mig -lgip/-lgipp` dumps summarised in
shared/reference/mig.md §5; product data sheets (memory, power, clocks, PCIe, engines) and pci.ids
(device and subsystem ids) for the Ada, Ampere and Blackwell products. A value that is not published
but derived (from a sibling product, the uniform MIG slice pattern or NVIDIA's profile-name arithmetic)
is named in the product's ``inferred`` field, with the reason in a comment. Nothing here is code from
elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpunode.nvml import mig

ARCH_TURING = 6
ARCH_AMPERE = 7
ARCH_ADA = 8
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10
BRAND_NVIDIA = 14


@dataclass(frozen=True)
class GiProfileSpec:
    enum: int
    profile_id: int
    memory_slices: int
    sm_count: int
    memory_mib: int
    max_count: int
    copy_engines: int
    decoders: int
    jpeg: int
    ofa: int
    starts: tuple[int, ...]
    encoders: int = 0

    @property
    def compute_slices(self) -> int:
        return mig.GI_ENUMS[self.enum][0]


@dataclass(frozen=True)
class Product:
    key: str
    name: str
    pci_device_id: int  # as NVML reports it: device << 16 | vendor
    pci_subsystem_id: int
    memory_mib: int
    cc: tuple[int, int]
    sm_count: int
    architecture: int
    tdp_w: int
    idle_w: int
    max_sm_clock: int
    max_mem_clock: int
    pcie_gen: int
    encoders: int = 0
    decoders: int = 0
    compute_slices: int = 0  # 0: not MIG-capable
    memory_slices: int = 0
    mig_needs_reset: bool = False  # Ampere: mode changes stay pending until a GPU reset
    gi_profiles: tuple[GiProfileSpec, ...] = ()
    brand: int = BRAND_NVIDIA
    min_power_w: int = 0  # lowest power limit (nvmlDeviceGetPowerManagementLimitConstraints); 0: = tdp_w
    pcie_width: int = 16
    # field names whose values are derived rather than published (see the comment at the product)
    inferred: tuple[str, ...] = ()

    @property
    def nvlink_version(self) -> int:
        """NVLink generation: 3 on Ampere, 4 on Hopper, 5 on Blackwell."""
        return {ARCH_HOPPER: 4, ARCH_BLACKWELL: 5}.get(self.architecture, 3)

    @property
    def mig_capable(self) -> bool:
        return bool(self.gi_profiles)

    @property
    def max_mig_devices(self) -> int:
        return self.compute_slices

    def gi_profile(self, enum: int) -> GiProfileSpec | None:
        for p in self.gi_profiles:
            if p.enum == enum:
                return p
        return None


def _ga100(memory: dict[str, int]) -> tuple[GiProfileSpec, ...]:
    m = memory
    return (
        GiProfileSpec(mig.GI_1_SLICE, 19, 1, 14, m["1g"], 7, 1, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6)),
        GiProfileSpec(mig.GI_1_SLICE_REV1, 20, 1, 14, m["1g"], 1, 1, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        GiProfileSpec(mig.GI_1_SLICE_REV2, 15, 2, 14, m["2g"], 4, 1, 1, 0, 0, (0, 2, 4, 6)),
        GiProfileSpec(mig.GI_2_SLICE, 14, 2, 28, m["2g"], 3, 2, 1, 0, 0, (0, 2, 4)),
        GiProfileSpec(mig.GI_3_SLICE, 9, 4, 42, m["4g"], 2, 3, 2, 0, 0, (0, 4)),
        GiProfileSpec(mig.GI_4_SLICE, 5, 4, 56, m["4g"], 1, 4, 2, 0, 0, (0,)),
        GiProfileSpec(mig.GI_7_SLICE, 0, 8, 98, m["7g"], 1, 7, 5, 1, 1, (0,)),
    )


def _gh100(memory: dict[str, int]) -> tuple[GiProfileSpec, ...]:
    m = memory
    return (
        GiProfileSpec(mig.GI_1_SLICE, 19, 1, 16, m["1g"], 7, 1, 1, 1, 0, (0, 1, 2, 3, 4, 5, 6)),
        GiProfileSpec(mig.GI_1_SLICE_REV1, 20, 1, 16, m["1g"], 1, 1, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        GiProfileSpec(mig.GI_1_SLICE_REV2, 15, 2, 26, m["2g"], 4, 1, 1, 1, 0, (0, 2, 4, 6)),
        GiProfileSpec(mig.GI_2_SLICE, 14, 2, 32, m["2g"], 3, 2, 2, 2, 0, (0, 2, 4)),
        GiProfileSpec(mig.GI_3_SLICE, 9, 4, 60, m["4g"], 2, 3, 3, 3, 0, (0, 4)),
        GiProfileSpec(mig.GI_4_SLICE, 5, 4, 64, m["4g"], 1, 4, 4, 4, 0, (0,)),
        GiProfileSpec(mig.GI_7_SLICE, 0, 8, 132, m["7g"], 1, 8, 7, 7, 1, (0,)),
    )


A100_SXM4_40GB = Product(
    key="a100-sxm4-40gb",
    name="NVIDIA A100-SXM4-40GB",
    pci_device_id=0x20B010DE,
    pci_subsystem_id=0x134F10DE,
    memory_mib=40960,
    cc=(8, 0),
    sm_count=108,
    architecture=ARCH_AMPERE,
    tdp_w=400,
    idle_w=55,
    max_sm_clock=1410,
    max_mem_clock=1215,
    pcie_gen=4,
    decoders=5,
    compute_slices=7,
    memory_slices=8,
    mig_needs_reset=True,
    gi_profiles=_ga100({"1g": 4864, "2g": 9856, "4g": 19968, "7g": 40192}),
)

A100_SXM4_80GB = Product(
    key="a100-sxm4-80gb",
    name="NVIDIA A100-SXM4-80GB",
    pci_device_id=0x20B210DE,
    pci_subsystem_id=0x147F10DE,
    memory_mib=81920,
    cc=(8, 0),
    sm_count=108,
    architecture=ARCH_AMPERE,
    tdp_w=400,
    idle_w=60,
    max_sm_clock=1410,
    max_mem_clock=1593,
    pcie_gen=4,
    decoders=5,
    compute_slices=7,
    memory_slices=8,
    mig_needs_reset=True,
    gi_profiles=_ga100({"1g": 9728, "2g": 19968, "4g": 40192, "7g": 80896}),
)

A100_PCIE_80GB = Product(
    key="a100-pcie-80gb",
    name="NVIDIA A100 80GB PCIe",
    pci_device_id=0x20B510DE,
    pci_subsystem_id=0x153310DE,
    memory_mib=81920,
    cc=(8, 0),
    sm_count=108,
    architecture=ARCH_AMPERE,
    tdp_w=300,
    idle_w=45,
    max_sm_clock=1410,
    max_mem_clock=1512,
    pcie_gen=4,
    decoders=5,
    compute_slices=7,
    memory_slices=8,
    mig_needs_reset=True,
    gi_profiles=_ga100({"1g": 9728, "2g": 19968, "4g": 40192, "7g": 80896}),
)

H100_SXM5_80GB = Product(
    key="h100-sxm5-80gb",
    name="NVIDIA H100 80GB HBM3",
    pci_device_id=0x233010DE,
    pci_subsystem_id=0x16C110DE,
    memory_mib=81559,
    cc=(9, 0),
    sm_count=132,
    architecture=ARCH_HOPPER,
    tdp_w=700,
    idle_w=70,
    max_sm_clock=1980,
    max_mem_clock=2619,
    pcie_gen=5,
    decoders=7,
    compute_slices=7,
    memory_slices=8,
    gi_profiles=_gh100({"1g": 9984, "2g": 20096, "4g": 40448, "7g": 81152}),
)

H200_SXM_141GB = Product(
    key="h200-sxm-141gb",
    name="NVIDIA H200",
    pci_device_id=0x233510DE,
    pci_subsystem_id=0x18BE10DE,
    memory_mib=143771,
    cc=(9, 0),
    sm_count=132,
    architecture=ARCH_HOPPER,
    tdp_w=700,
    idle_w=75,
    max_sm_clock=1980,
    max_mem_clock=3201,
    pcie_gen=5,
    decoders=7,
    compute_slices=7,
    memory_slices=8,
    gi_profiles=_gh100({"1g": 16384, "2g": 33024, "4g": 71168, "7g": 143104}),
)

A30 = Product(
    key="a30",
    name="NVIDIA A30",
    pci_device_id=0x20B710DE,
    pci_subsystem_id=0x153210DE,
    memory_mib=24576,
    cc=(8, 0),
    sm_count=56,
    architecture=ARCH_AMPERE,
    tdp_w=165,
    idle_w=30,
    max_sm_clock=1440,
    max_mem_clock=1215,
    pcie_gen=4,
    decoders=4,
    compute_slices=4,
    memory_slices=4,
    mig_needs_reset=True,
    gi_profiles=(
        GiProfileSpec(mig.GI_1_SLICE, 14, 1, 14, 5952, 4, 1, 0, 0, 0, (0, 1, 2, 3)),
        GiProfileSpec(mig.GI_1_SLICE_REV1, 21, 1, 14, 5952, 1, 1, 1, 1, 1, (0, 1, 2, 3)),
        GiProfileSpec(mig.GI_2_SLICE, 5, 2, 28, 11968, 2, 2, 2, 0, 0, (0, 2)),
        GiProfileSpec(mig.GI_2_SLICE_REV1, 6, 2, 28, 11968, 1, 2, 2, 1, 1, (0, 2)),
        GiProfileSpec(mig.GI_4_SLICE, 0, 4, 56, 24000, 1, 4, 4, 1, 1, (0,)),
    ),
)

TESLA_T4 = Product(
    key="t4",
    name="Tesla T4",
    pci_device_id=0x1EB810DE,
    pci_subsystem_id=0x12A210DE,
    memory_mib=15360,
    cc=(7, 5),
    sm_count=40,
    architecture=ARCH_TURING,
    tdp_w=70,
    idle_w=10,
    max_sm_clock=1590,
    max_mem_clock=5001,
    pcie_gen=3,
    encoders=1,
    decoders=2,
)


def _gb100(memory: dict[str, int], sms: dict[str, int]) -> tuple[GiProfileSpec, ...]:
    """Blackwell (B200, GB200): Hopper's slice structure (7 compute, 8 memory slices) and profile ids.

    Published (`nvidia-smi mig -lgip` in gpu-operator #1242/#1303 and mig-parted #187/#227): the 1g, 1g+me,
    1g (two memory slices) and 2g rows: ids 19/20/15/14, SMs, GiB, CE/NVDEC/JPEG/OFA, maxima. Inferred:
    the 3g/4g/7g ids (9/5/0, the uniform A100/H100/H200 pattern), their engines (scaled from the 2g row:
    one NVDEC and one JPEG per compute slice, CE 2 per slice) and every placement (the 8-slot layout).
    """
    m, n = memory, sms
    return (
        GiProfileSpec(mig.GI_1_SLICE, 19, 1, n["1g"], m["1g"], 7, 2, 1, 1, 0, (0, 1, 2, 3, 4, 5, 6)),
        GiProfileSpec(mig.GI_1_SLICE_REV1, 20, 1, n["1g"], m["1g"], 1, 2, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        GiProfileSpec(mig.GI_1_SLICE_REV2, 15, 2, n["1g2"], m["2g"], 4, 2, 1, 1, 0, (0, 2, 4, 6)),
        GiProfileSpec(mig.GI_2_SLICE, 14, 2, n["2g"], m["2g"], 3, 4, 2, 2, 0, (0, 2, 4)),
        GiProfileSpec(mig.GI_3_SLICE, 9, 4, n["3g"], m["4g"], 2, 6, 3, 3, 0, (0, 4)),
        GiProfileSpec(mig.GI_4_SLICE, 5, 4, n["4g"], m["4g"], 1, 8, 4, 4, 0, (0,)),
        GiProfileSpec(mig.GI_7_SLICE, 0, 8, n["7g"], m["7g"], 1, 16, 7, 7, 1, (0,)),
    )


# -- Blackwell ------------------------------------------------------------------------------------------
# B200 (HGX/DGX B200 SXM6 module): 180 GB HBM3e, 1000 W, NVLink 5 (18 links, 1.8 TB/s), PCIe Gen5 x16
# to the host. NVML name "NVIDIA B200", device 0x2901 (pci.ids GB100 [B200]). 183359 MiB total is what
# nvidia-smi prints on B200 (and the only total that names the MIG profiles 1g.23gb/1g.45gb/3g.90gb/
# 7g.180gb with NVIDIA's arithmetic). 148 SMs (CUDA device properties). Inferred: the subsystem id
# (DGX B200 board), the idle power, the clocks (data sheet boost 1965 MHz; HBM3e 3996 MHz as NVML
# reports the memory clock), the SMs of the 3g/4g/7g profiles and the memory of 3g/4g/7g profiles
# (the published 2g figure doubled, below the half/whole GPU that their names require).
B200 = Product(
    key="b200",
    name="NVIDIA B200",
    pci_device_id=0x290110DE,
    pci_subsystem_id=0x199910DE,
    memory_mib=183359,
    cc=(10, 0),
    sm_count=148,
    architecture=ARCH_BLACKWELL,
    tdp_w=1000,
    min_power_w=200,
    idle_w=140,
    max_sm_clock=1965,
    max_mem_clock=3996,
    pcie_gen=5,
    decoders=7,
    compute_slices=7,
    memory_slices=8,
    gi_profiles=_gb100(
        {"1g": 22528, "2g": 45312, "4g": 91392, "7g": 182784},
        {"1g": 18, "1g2": 30, "2g": 36, "3g": 70, "4g": 72, "7g": 144},
    ),
    inferred=(
        "pci_subsystem_id",
        "idle_w",
        "min_power_w",
        "max_sm_clock",
        "max_mem_clock",
        "gi_profiles[3g,4g,7g]",
    ),
)

# GB200 (one Blackwell GPU of a GB200 Grace Blackwell superchip, as in a GB200 NVL72 compute tray: two
# superchips, four GPUs, each GPU tied to its Grace CPU by NVLink-C2C and to the rack's NVLink switch
# trays by 18 NVLink 5 links). NVML name "NVIDIA GB200", device 0x2941 (pci.ids GB100 [HGX GB200]),
# 186 GB HBM3e: the MIG names 1g.23gb/1g.47gb/3g.93gb/7g.186gb fix the total between 185 and 186 GiB;
# 189471 MiB is inferred within that range. The 1g/1g+me/1g.47gb/2g.47gb rows are the production
# boards' `-lgip` (mig-parted #227: 22.00 and 45.50 GiB, 18/32/38 SMs). Inferred: the subsystem id, SM
# count (152), power (1200 W per GPU in NVL72 at the top of the published range), clocks, the PCIe link
# NVML reports (the GPU reaches its Grace CPU over NVLink-C2C) and the 3g/4g/7g rows (see _gb100).
GB200 = Product(
    key="gb200",
    name="NVIDIA GB200",
    pci_device_id=0x294110DE,
    pci_subsystem_id=0x209210DE,
    memory_mib=189471,
    cc=(10, 0),
    sm_count=152,
    architecture=ARCH_BLACKWELL,
    tdp_w=1200,
    min_power_w=200,
    idle_w=150,
    max_sm_clock=2062,
    max_mem_clock=3996,
    pcie_gen=5,
    decoders=7,
    compute_slices=7,
    memory_slices=8,
    gi_profiles=_gb100(
        {"1g": 22528, "2g": 46592, "4g": 94464, "7g": 188928},
        {"1g": 18, "1g2": 32, "2g": 38, "3g": 74, "4g": 76, "7g": 152},
    ),
    inferred=(
        "pci_subsystem_id",
        "memory_mib",
        "sm_count",
        "tdp_w",
        "idle_w",
        "min_power_w",
        "max_sm_clock",
        "max_mem_clock",
        "pcie_gen",
        "gi_profiles[3g,4g,7g]",
    ),
)

# -- Hopper, PCIe ---------------------------------------------------------------------------------------
# H100 NVL (PCIe dual-slot, sold in pairs joined by three NVLink bridges: NV12 between the pair):
# 94 GB HBM3, NVML name "NVIDIA H100 NVL", device 0x2321 (pci.ids GH100 [H100L 94GB]) subsystem 0x1839,
# 95830 MiB (nvidia-smi), 132 SMs, 350-400 W configurable, boost 1785 MHz, PCIe Gen5 x16. MIG: the H100
# table (mig.md §5.4: "H100 NVL shows the identical -lgipp") with the 94 GB names 1g.12gb .. 7g.94gb.
# Inferred: the per-profile memory (H100 80GB's GiB scaled by 95830/81559), idle power and the 200 W
# floor of the power limit.
H100_NVL = Product(
    key="h100-nvl",
    name="NVIDIA H100 NVL",
    pci_device_id=0x232110DE,
    pci_subsystem_id=0x183910DE,
    memory_mib=95830,
    cc=(9, 0),
    sm_count=132,
    architecture=ARCH_HOPPER,
    tdp_w=400,
    min_power_w=200,
    idle_w=60,
    max_sm_clock=1785,
    max_mem_clock=2619,
    pcie_gen=5,
    decoders=7,
    compute_slices=7,
    memory_slices=8,
    gi_profiles=_gh100({"1g": 11008, "2g": 22144, "4g": 47488, "7g": 95360}),
    inferred=("idle_w", "min_power_w", "gi_profiles[memory]"),
)

# -- Ada Lovelace (no MIG, no NVLink) -------------------------------------------------------------------
# L4: AD104, 24 GB GDDR6 with ECC, 72 W (40 W minimum limit), single slot low profile, PCIe Gen4 x16,
# 2 NVENC / 4 NVDEC / 4 NVJPEG. NVML name "NVIDIA L4", device 0x27B8 subsystem 0x16CA, 23034 MiB
# (nvidia-smi), CC 8.9, 58 SMs, max clocks 2040 MHz SM / 6251 MHz memory. Inferred: idle power.
L4 = Product(
    key="l4",
    name="NVIDIA L4",
    pci_device_id=0x27B810DE,
    pci_subsystem_id=0x16CA10DE,
    memory_mib=23034,
    cc=(8, 9),
    sm_count=58,
    architecture=ARCH_ADA,
    tdp_w=72,
    min_power_w=40,
    idle_w=16,
    max_sm_clock=2040,
    max_mem_clock=6251,
    pcie_gen=4,
    encoders=2,
    decoders=4,
    inferred=("idle_w",),
)

# L40S: AD102, 48 GB GDDR6 with ECC, 350 W, dual slot, PCIe Gen4 x16, 3 NVENC / 3 NVDEC / 4 NVJPEG.
# NVML name "NVIDIA L40S", device 0x26B9 subsystem 0x1851, 46068 MiB (nvidia-smi, as the L40 and A40),
# CC 8.9, 142 SMs, max clocks 2520 MHz SM / 9001 MHz memory. Inferred: idle power, minimum limit.
L40S = Product(
    key="l40s",
    name="NVIDIA L40S",
    pci_device_id=0x26B910DE,
    pci_subsystem_id=0x185110DE,
    memory_mib=46068,
    cc=(8, 9),
    sm_count=142,
    architecture=ARCH_ADA,
    tdp_w=350,
    min_power_w=100,
    idle_w=35,
    max_sm_clock=2520,
    max_mem_clock=9001,
    pcie_gen=4,
    encoders=3,
    decoders=3,
    inferred=("idle_w", "min_power_w"),
)

# -- Ampere, PCIe inference cards (no MIG, no NVLink) ---------------------------------------------------
# A10: GA102, 24 GB GDDR6 with ECC, 150 W, single slot, PCIe Gen4 x16, 1 NVENC / 2 NVDEC. NVML name
# "NVIDIA A10", device 0x2236 subsystem 0x1482, 23028 MiB (nvidia-smi), CC 8.6, 72 SMs, max clocks
# 1695 MHz SM / 6251 MHz memory. Inferred: idle power, minimum limit.
A10 = Product(
    key="a10",
    name="NVIDIA A10",
    pci_device_id=0x223610DE,
    pci_subsystem_id=0x148210DE,
    memory_mib=23028,
    cc=(8, 6),
    sm_count=72,
    architecture=ARCH_AMPERE,
    tdp_w=150,
    min_power_w=100,
    idle_w=20,
    max_sm_clock=1695,
    max_mem_clock=6251,
    pcie_gen=4,
    encoders=1,
    decoders=2,
    inferred=("idle_w", "min_power_w"),
)

# A2: GA107, 16 GB GDDR6 with ECC, 40-60 W configurable, low profile, PCIe Gen4 x8, 1 NVENC / 2 NVDEC.
# NVML name "NVIDIA A2", device 0x25B6 (shared with the A16) subsystem 0x157E, 15356 MiB (nvidia-smi),
# CC 8.6, 10 SMs, max clocks 1770 MHz SM / 6251 MHz memory. Inferred: idle power.
A2 = Product(
    key="a2",
    name="NVIDIA A2",
    pci_device_id=0x25B610DE,
    pci_subsystem_id=0x157E10DE,
    memory_mib=15356,
    cc=(8, 6),
    sm_count=10,
    architecture=ARCH_AMPERE,
    tdp_w=60,
    min_power_w=40,
    idle_w=8,
    max_sm_clock=1770,
    max_mem_clock=6251,
    pcie_gen=4,
    pcie_width=8,
    encoders=1,
    decoders=2,
    inferred=("idle_w",),
)

PRODUCTS = {
    p.key: p
    for p in (
        A100_SXM4_40GB,
        A100_SXM4_80GB,
        A100_PCIE_80GB,
        H100_SXM5_80GB,
        H100_NVL,
        H200_SXM_141GB,
        A30,
        TESLA_T4,
        A10,
        A2,
        L4,
        L40S,
        B200,
        GB200,
    )
}


@dataclass(frozen=True)
class GpuSlot:
    """One GPU in a node: its product and where it sits."""

    product: Product
    bus: int  # PCI bus number; domain 0, device 0, function 0
    numa_node: int
    pcie_switch: int  # GPUs sharing a value sit under one PCIe switch
    socket: int
    domain: int = 0  # PCI domain (segment): Grace systems put each GPU in its own

    @property
    def bus_id(self) -> str:
        """The bus id as NVML prints it: "00000000:07:00.0"."""
        return f"{self.domain:08X}:{self.bus:02X}:00.0"


@dataclass(frozen=True)
class NvSwitch:
    bus: int


@dataclass(frozen=True)
class Fabric:
    """An NVLink multi-node fabric (GB200 NVL72): what nvmlDeviceGetGpuFabricInfoV reports once trained.

    The cluster UUID and clique id are assigned per NVLink domain by the fabric manager (IMEX domain);
    the values in the presets are examples of the published format, not of a real rack."""

    cluster_uuid: str  # canonical text form
    clique_id: int


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    gpus: tuple[GpuSlot, ...]
    # NVLink wiring: with switches, each GPU sends `links_per_switch` links to every switch;
    # without, `direct` lists (gpu_a, gpu_b, links) bridges.
    nvswitches: tuple[NvSwitch, ...] = ()
    links_per_switch: int = 0
    direct: tuple[tuple[int, int, int], ...] = field(default_factory=tuple)
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    fabric: Fabric | None = None
    cpu: str = "x86_64"  # the host CPUs, in words ("2x Intel Xeon", "2x NVIDIA Grace")


def _dgx(
    product: Product,
    buses: tuple[int, ...],
    numa: tuple[int, ...],
    switches: tuple[int, ...],
    lps: int,
    name: str,
    description: str,
    sockets: tuple[int, ...],
    **extra: Any,
) -> Preset:
    gpus = tuple(
        GpuSlot(product, bus, numa[i], pcie_switch=i // 2, socket=sockets[i]) for i, bus in enumerate(buses)
    )
    return Preset(name, description, gpus, tuple(NvSwitch(b) for b in switches), lps, **extra)


def _pcie(
    name: str, description: str, slots: tuple[tuple[Product, int, int, int], ...], **extra: Any
) -> Preset:
    """A PCIe server: (product, bus, NUMA node = socket, PCIe switch) per GPU."""
    gpus = tuple(GpuSlot(p, bus, numa, pcie_switch=sw, socket=numa) for p, bus, numa, sw in slots)
    return Preset(name, description, gpus, **extra)


_DGX_A100_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
_DGX_A100_NUMA = (3, 3, 1, 1, 7, 7, 5, 5)
_DGX_A100_SOCKETS = (0, 0, 0, 0, 1, 1, 1, 1)
_DGX_A100_SWITCHES = (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9)
_HGX_H100_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_HGX_H100_NUMA = (0, 0, 0, 0, 1, 1, 1, 1)
_HGX_H100_SWITCHES = (0x05, 0x06, 0x07, 0x08)
# DGX B200: two Xeon sockets, GPUs 0-3 on socket 0 and 4-7 on socket 1, two NVLink 5 switch chips on the
# GPU baseboard with 9 of each GPU's 18 links (NV18 between any two GPUs). Bus numbers inferred (the
# DGX H100 baseboard's), as are the switches' bus numbers.
_DGX_B200_BUSES = (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)
_DGX_B200_NUMA = (0, 0, 0, 0, 1, 1, 1, 1)
_DGX_B200_SWITCHES = (0x0A, 0x0B)
_L4X8_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
BLACKWELL_DRIVER: dict[str, Any] = {"driver_version": "570.124.06", "cuda_driver_version": 12080}
# A GB200 NVL72 compute tray: two GB200 superchips (one Grace CPU and two B200-class GPUs each), each GPU
# in its own PCI domain behind its Grace CPU (NVLink-C2C), NUMA node of its Grace. All 18 NVLink 5 links
# of a GPU go to the rack's NVLink switch trays (9 trays x 2 switch chips, one link per chip), so the
# four GPUs of the tray reach each other over NV18. The switch chips are outside the node: their
# "bus" numbers here only identify them. Domains follow what GB200 nodes print (0008/0009/0018/0019).
_GB200_DOMAINS = (0x0008, 0x0009, 0x0018, 0x0019)
_NVL72_SWITCHES = tuple(NvSwitch(0xE0 + i) for i in range(18))
GB200_FABRIC = Fabric("6c2f4a9e-1d7b-4e8a-9f35-b2a1c0d4e7f8", 32766)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _dgx(
            A100_SXM4_40GB,
            _DGX_A100_BUSES,
            _DGX_A100_NUMA,
            _DGX_A100_SWITCHES,
            2,
            "dgx-a100",
            "8x NVIDIA A100-SXM4-40GB, NVSwitch all-to-all (NV12)",
            _DGX_A100_SOCKETS,
        ),
        _dgx(
            A100_SXM4_80GB,
            _DGX_A100_BUSES,
            _DGX_A100_NUMA,
            _DGX_A100_SWITCHES,
            2,
            "dgx-a100-80gb",
            "8x NVIDIA A100-SXM4-80GB, NVSwitch all-to-all (NV12)",
            _DGX_A100_SOCKETS,
        ),
        _dgx(
            H100_SXM5_80GB,
            _HGX_H100_BUSES,
            _HGX_H100_NUMA,
            _HGX_H100_SWITCHES,
            0,
            "dgx-h100",
            "8x NVIDIA H100 80GB HBM3, NVSwitch all-to-all (NV18)",
            _HGX_H100_NUMA,
        ),
        _dgx(
            H200_SXM_141GB,
            _HGX_H100_BUSES,
            _HGX_H100_NUMA,
            _HGX_H100_SWITCHES,
            0,
            "hgx-h200",
            "8x NVIDIA H200, NVSwitch all-to-all (NV18)",
            _HGX_H100_NUMA,
        ),
        Preset(
            "a30x4",
            "4x NVIDIA A30, PCIe only",
            tuple(
                GpuSlot(A30, b, n, pcie_switch=i, socket=n)
                for i, (b, n) in enumerate(((0x17, 0), (0x65, 0), (0xCA, 1), (0xE3, 1)))
            ),
        ),
        Preset(
            "t4x4",
            "4x Tesla T4, PCIe only, no MIG",
            tuple(
                GpuSlot(TESLA_T4, b, n, pcie_switch=i, socket=n)
                for i, (b, n) in enumerate(((0x3B, 0), (0x5E, 0), (0xAF, 1), (0xD8, 1)))
            ),
        ),
        _dgx(
            B200,
            _DGX_B200_BUSES,
            _DGX_B200_NUMA,
            _DGX_B200_SWITCHES,
            9,
            "dgx-b200",
            "8x NVIDIA B200, NVSwitch all-to-all (NV18)",
            _DGX_B200_NUMA,
            cpu="2x Intel Xeon Platinum 8570",
            **BLACKWELL_DRIVER,
        ),
        Preset(
            "gb200-nvl4",
            "one GB200 NVL72 compute tray: 4x NVIDIA GB200, 2x Grace, NVLink fabric (NV18, clique)",
            tuple(
                GpuSlot(GB200, 0x01, i // 2, pcie_switch=i, socket=i // 2, domain=d)
                for i, d in enumerate(_GB200_DOMAINS)
            ),
            _NVL72_SWITCHES,
            1,
            fabric=GB200_FABRIC,
            cpu="2x NVIDIA Grace (aarch64)",
            **BLACKWELL_DRIVER,
        ),
        _pcie(
            "h100-nvl",
            "4x NVIDIA H100 NVL, two pairs joined by NVLink bridges (NV12)",
            ((H100_NVL, 0x1A, 0, 0), (H100_NVL, 0x3C, 0, 0), (H100_NVL, 0x9C, 1, 2), (H100_NVL, 0xBC, 1, 2)),
            direct=((0, 1, 12), (2, 3, 12)),
        ),
        _pcie(
            "l4x8",
            "8x NVIDIA L4, PCIe only, no MIG",
            tuple((L4, b, i // 4, i // 2) for i, b in enumerate(_L4X8_BUSES)),
        ),
        _pcie(
            "l40sx4",
            "4x NVIDIA L40S, PCIe only, no MIG",
            ((L40S, 0x17, 0, 0), (L40S, 0x65, 0, 1), (L40S, 0xCA, 1, 2), (L40S, 0xE3, 1, 3)),
        ),
        _pcie(
            "a10x4",
            "4x NVIDIA A10, PCIe only, no MIG",
            ((A10, 0x17, 0, 0), (A10, 0x65, 0, 1), (A10, 0xCA, 1, 2), (A10, 0xE3, 1, 3)),
        ),
        _pcie(
            "a2x2",
            "2x NVIDIA A2 (PCIe Gen4 x8), no MIG",
            ((A2, 0x3B, 0, 0), (A2, 0xAF, 1, 1)),
        ),
        _pcie(
            "mixed-ada-ampere",
            "2x NVIDIA L40S + 2x NVIDIA A10, PCIe only, no MIG",
            ((L40S, 0x17, 0, 0), (L40S, 0x65, 0, 1), (A10, 0xCA, 1, 2), (A10, 0xE3, 1, 3)),
        ),
        Preset(
            "mixed",
            "2x NVIDIA A100 80GB PCIe (NVLink bridge, NV12) + 2x Tesla T4",
            (
                GpuSlot(A100_PCIE_80GB, 0x17, 0, pcie_switch=0, socket=0),
                GpuSlot(A100_PCIE_80GB, 0x31, 0, pcie_switch=0, socket=0),
                GpuSlot(TESLA_T4, 0xCA, 1, pcie_switch=2, socket=1),
                GpuSlot(TESLA_T4, 0xE3, 1, pcie_switch=3, socket=1),
            ),
            direct=((0, 1, 12),),
        ),
    )
}

# Hopper systems carry 18 links per GPU spread over 4 switches (5,4,4,5); keep the total right.
HOPPER_LINKS_PER_SWITCH = (5, 4, 4, 5)


def links_to_switches(preset: Preset) -> tuple[int, ...]:
    """Links each GPU sends to each NVSwitch of the preset."""
    if not preset.nvswitches:
        return ()
    if preset.links_per_switch:
        return tuple(preset.links_per_switch for _ in preset.nvswitches)
    return HOPPER_LINKS_PER_SWITCH


def preset_names() -> list[str]:
    return sorted(PRESETS)


class UnknownPreset(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown simulator preset {self.name!r}; choose one of: {', '.join(preset_names())}"


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownPreset(name) from None

"""Hardware facts of the simulated products and nodes.

Values follow what NVML reports on the real products: names, PCI device ids, memory in MiB, compute
capability, SM counts, MIG profile tables (ids, placements, maxima, engines), NVLink wiring.
Sources: NVIDIA's MIG user guide tables and `nvidia-smi mig -lgip/-lgipp` dumps summarised in
shared/reference/mig.md §5. Nothing here is code from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunode.nvml import mig

ARCH_TURING = 6
ARCH_AMPERE = 7
ARCH_HOPPER = 9
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

PRODUCTS = {
    p.key: p
    for p in (A100_SXM4_40GB, A100_SXM4_80GB, A100_PCIE_80GB, H100_SXM5_80GB, H200_SXM_141GB, A30, TESLA_T4)
}


@dataclass(frozen=True)
class GpuSlot:
    """One GPU in a node: its product and where it sits."""

    product: Product
    bus: int  # PCI bus number; domain 0, device 0, function 0
    numa_node: int
    pcie_switch: int  # GPUs sharing a value sit under one PCIe switch
    socket: int


@dataclass(frozen=True)
class NvSwitch:
    bus: int


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


def _dgx(
    product: Product,
    buses: tuple[int, ...],
    numa: tuple[int, ...],
    switches: tuple[int, ...],
    lps: int,
    name: str,
    description: str,
    sockets: tuple[int, ...],
) -> Preset:
    gpus = tuple(
        GpuSlot(product, bus, numa[i], pcie_switch=i // 2, socket=sockets[i]) for i, bus in enumerate(buses)
    )
    return Preset(name, description, gpus, tuple(NvSwitch(b) for b in switches), lps)


_DGX_A100_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
_DGX_A100_NUMA = (3, 3, 1, 1, 7, 7, 5, 5)
_DGX_A100_SOCKETS = (0, 0, 0, 0, 1, 1, 1, 1)
_DGX_A100_SWITCHES = (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9)
_HGX_H100_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_HGX_H100_NUMA = (0, 0, 0, 0, 1, 1, 1, 1)
_HGX_H100_SWITCHES = (0x05, 0x06, 0x07, 0x08)

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

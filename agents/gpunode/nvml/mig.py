"""Pure MIG arithmetic: profile enums, GB naming, placement ids.

Nothing here touches NVML; the simulator, the NVML library and the MIG planner all share it. Facts
follow NVIDIA's MIG user guide and mig-parted's profile grammar (see shared/reference/mig.md §1.3-1.4);
the grammar itself (:class:`MigProfileName`, :func:`parse_profile`) is the file formats' business, in
:mod:`gpunode.api.mig_profiles`.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

from gpunode.api.mig_profiles import MigProfileName, parse_profile

# GPU-instance profile enums as NVML defines them (the value passed to nvmlDeviceGetGpuInstanceProfileInfo).
GI_1_SLICE = 0
GI_2_SLICE = 1
GI_3_SLICE = 2
GI_4_SLICE = 3
GI_7_SLICE = 4
GI_8_SLICE = 5
GI_6_SLICE = 6
GI_1_SLICE_REV1 = 7
GI_2_SLICE_REV1 = 8
GI_1_SLICE_REV2 = 9
GI_1_SLICE_GFX = 10
GI_2_SLICE_GFX = 11
GI_4_SLICE_GFX = 12
GI_1_SLICE_NO_ME = 13
GI_2_SLICE_NO_ME = 14
GI_1_SLICE_ALL_ME = 15
GI_2_SLICE_ALL_ME = 16
GI_3_SLICE_GFX = 17
GI_PROFILE_COUNT = 18

# Compute-instance profile enums (equal to the CI "profile ID" nvidia-smi prints).
CI_1_SLICE = 0
CI_2_SLICE = 1
CI_3_SLICE = 2
CI_4_SLICE = 3
CI_7_SLICE = 4
CI_8_SLICE = 5
CI_6_SLICE = 6
CI_1_SLICE_REV1 = 7
CI_7_SLICE_NVL = 8
CI_PROFILE_COUNT = 9

CI_ENGINE_PROFILE_SHARED = 0

# enum -> (compute slices, attributes)
GI_ENUMS: dict[int, tuple[int, tuple[str, ...]]] = {
    GI_1_SLICE: (1, ()),
    GI_2_SLICE: (2, ()),
    GI_3_SLICE: (3, ()),
    GI_4_SLICE: (4, ()),
    GI_7_SLICE: (7, ()),
    GI_8_SLICE: (8, ()),
    GI_6_SLICE: (6, ()),
    GI_1_SLICE_REV1: (1, ("me",)),
    GI_2_SLICE_REV1: (2, ("me",)),
    GI_1_SLICE_REV2: (1, ()),
    GI_1_SLICE_GFX: (1, ("gfx",)),
    GI_2_SLICE_GFX: (2, ("gfx",)),
    GI_4_SLICE_GFX: (4, ("gfx",)),
    GI_1_SLICE_NO_ME: (1, ("-me",)),
    GI_2_SLICE_NO_ME: (2, ("-me",)),
    GI_1_SLICE_ALL_ME: (1, ("me.all",)),
    GI_2_SLICE_ALL_ME: (2, ("me.all",)),
    GI_3_SLICE_GFX: (3, ("gfx",)),
}

CI_ENUMS: dict[int, int] = {
    CI_1_SLICE: 1,
    CI_2_SLICE: 2,
    CI_3_SLICE: 3,
    CI_4_SLICE: 4,
    CI_7_SLICE: 7,
    CI_8_SLICE: 8,
    CI_6_SLICE: 6,
    CI_1_SLICE_REV1: 1,
    CI_7_SLICE_NVL: 7,
}


def round_half_away(x: Fraction) -> int:
    """Go's math.Round: halves go away from zero (Python's round() would go to even)."""
    return math.floor(x + Fraction(1, 2)) if x >= 0 else -math.floor(-x + Fraction(1, 2))


@functools.lru_cache(maxsize=1024)
def memory_gb_for_name(device_total_bytes: int, gi_memory_mib: int) -> int:
    """The GB number in a MIG profile name, computed the way mig-parted / go-nvlib do.

    f = gi bytes / device bytes, rounded up to the next 1/8; the name uses round(f * ceil(device GiB)).
    """
    fraction = Fraction(gi_memory_mib * 2**20, device_total_bytes)
    eighths = math.ceil(fraction * 8)
    total_gib = math.ceil(Fraction(device_total_bytes, 2**30))
    return round_half_away(Fraction(eighths, 8) * total_gib)


@functools.lru_cache(maxsize=1024)
def gi_profile_name(enum: int, device_total_bytes: int, gi_memory_mib: int) -> str:
    g, attrs = GI_ENUMS[enum]
    gb = memory_gb_for_name(device_total_bytes, gi_memory_mib)
    neg = tuple(a[1:] for a in attrs if a.startswith("-"))
    pos = tuple(a for a in attrs if not a.startswith("-"))
    return str(MigProfileName(g=g, gb=gb, c=g, attrs=pos, negative=neg))


@functools.lru_cache(maxsize=1024)
def ci_profile_name(gi_name: str, ci_slices: int) -> str:
    parsed = parse_profile(gi_name)
    return str(MigProfileName(parsed.g, parsed.gb, ci_slices, parsed.attrs, parsed.negative))


def valid_ci_slices(gi_slices: int) -> list[int]:
    """Compute-instance sizes a GPU instance of `gi_slices` offers: C <= G and, when C < G, 2C <= G+1."""
    return [
        c
        for c in sorted(set(CI_ENUMS.values()))
        if c == gi_slices or (c < gi_slices and 2 * c <= gi_slices + 1)
    ]


def ci_placement_starts(gi_slices: int, ci_slices: int) -> list[int]:
    """Where a CI of `ci_slices` can start inside a GI: aligned to the next power of two, fully inside."""
    if ci_slices == gi_slices:
        return [0]
    align = 1 << (ci_slices - 1).bit_length()
    return [s for s in range(0, gi_slices, align) if s + ci_slices <= gi_slices]


def gpu_instance_id(start: int, size: int, memory_slices: int) -> int:
    """GPU-instance id from its memory-slice placement (the driver's binary-tree "swizzle" id).

    Whole GPU 0; halves 1-2; quarters 3-6; eighths 7-14 (on an 8-slice GPU).
    """
    level = (memory_slices // size).bit_length() - 1
    return (1 << level) - 1 + start // size

"""Pure MIG arithmetic: profile enums, profile-name grammar, GB naming, placement ids.

Nothing here touches NVML; the simulator, the NVML library and (later) the MIG planner all share it.
Facts follow NVIDIA's MIG user guide and mig-parted's profile grammar (see shared/reference/mig.md §1.3-1.4).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from fractions import Fraction

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

_ATTR_RE = re.compile(r"^[A-Za-z][A-Za-z0-9.]*$")
_PROFILE_RE = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<gb>\d+)gb(?:(?P<sign>[+-])(?P<attrs>.+))?$")


class ProfileSyntaxError(ValueError):
    """A MIG profile string does not follow `[<C>c.]<G>g.<GB>gb[+attr,...|-attr,...]`."""


@dataclass(frozen=True, order=True)
class MigProfileName:
    """A parsed profile string such as `1c.3g.20gb` or `1g.10gb+me`."""

    g: int
    gb: int
    c: int
    attrs: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()

    def __str__(self) -> str:
        head = f"{self.g}g.{self.gb}gb" if self.c == self.g else f"{self.c}c.{self.g}g.{self.gb}gb"
        if self.attrs:
            head += "+" + ",".join(self.attrs)
        if self.negative:
            head += "-" + ",".join(self.negative)
        return head

    @property
    def gi_name(self) -> str:
        """The GPU-instance part of the name (the CI prefix dropped)."""
        return str(MigProfileName(self.g, self.gb, self.g, self.attrs, self.negative))


def parse_profile(text: str) -> MigProfileName:
    """Parse a profile string; raises ProfileSyntaxError with the reason."""
    m = _PROFILE_RE.match(text.strip())
    if not m:
        raise ProfileSyntaxError(
            f"{text!r} is not a MIG profile (expected e.g. 1g.5gb, 1c.3g.20gb, 1g.10gb+me)"
        )
    g = int(m["g"])
    c = int(m["c"]) if m["c"] else g
    if g <= 0 or c <= 0 or int(m["gb"]) <= 0:
        raise ProfileSyntaxError(f"{text!r}: slice and memory counts must be positive")
    if c > g:
        raise ProfileSyntaxError(f"{text!r}: compute slices ({c}c) exceed the GPU instance ({g}g)")
    attrs: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()
    if m["attrs"] is not None:
        items = m["attrs"].split(",")
        for item in items:
            if not _ATTR_RE.match(item) or item.endswith("."):
                raise ProfileSyntaxError(f"{text!r}: bad attribute {item!r}")
        if len(set(items)) != len(items):
            raise ProfileSyntaxError(f"{text!r}: repeated attribute")
        if m["sign"] == "+":
            attrs = tuple(sorted(items))
        else:
            negative = tuple(sorted(items))
    return MigProfileName(g=g, gb=int(m["gb"]), c=c, attrs=attrs, negative=negative)


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

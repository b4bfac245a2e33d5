"""MIG profile arithmetic (`gpunode.nvml.mig`) against shared/reference/mig.md §1.3-1.4, §5."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpunode.nvml import mig

MIB = 1 << 20

# -- memory_gb_for_name (§1.4, §5) ---------------------------------------------------------------------


def _gb_cases() -> list[object]:
    products = {
        "a100-40gb": (40960, [(4864, 5), (9856, 10), (19968, 20), (40192, 40)]),
        "h200": (143771, [(16384, 18), (33024, 35), (71168, 71), (143104, 141)]),
        "h100": (81559, [(9984, 10), (20096, 20), (40448, 40), (81152, 80)]),
        "a30": (24576, [(5952, 6), (11968, 12), (24000, 24)]),
        "a100-80gb": (81920, [(9728, 10), (19968, 20), (40192, 40), (80896, 80)]),
    }
    return [
        pytest.param(total, gi, gb, id=f"{name}-{gi}MiB-{gb}gb")
        for name, (total, rows) in products.items()
        for gi, gb in rows
    ]


@pytest.mark.parametrize(("device_mib", "gi_mib", "gb"), _gb_cases())
def test_memory_gb_for_name(device_mib: int, gi_mib: int, gb: int) -> None:
    assert mig.memory_gb_for_name(device_mib * MIB, gi_mib) == gb


def test_h200_half_rounds_away_from_zero_unlike_python_round() -> None:
    # 71168 MiB is 4/8 of the H200; 4/8 * 141 GiB = 70.5 -> Go's math.Round gives 71 (3g.71gb).
    assert mig.memory_gb_for_name(143771 * MIB, 71168) == 71
    assert round(70.5) == 70  # the pitfall the implementation must avoid


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        pytest.param(Fraction(141, 2), 71, id="70.5-up"),
        pytest.param(Fraction(5, 2), 3, id="2.5-up"),
        pytest.param(Fraction(1, 2), 1, id="0.5-up"),
        pytest.param(Fraction(3, 2), 2, id="1.5-up"),
        pytest.param(Fraction(-5, 2), -3, id="minus-2.5-away"),
        pytest.param(Fraction(-1, 2), -1, id="minus-0.5-away"),
        pytest.param(Fraction(49, 20), 2, id="2.45-down"),
        pytest.param(Fraction(51, 20), 3, id="2.55-up"),
        pytest.param(Fraction(-49, 20), -2, id="minus-2.45"),
        pytest.param(Fraction(7), 7, id="integer"),
        pytest.param(Fraction(0), 0, id="zero"),
    ],
)
def test_round_half_away(x: Fraction, expected: int) -> None:
    assert mig.round_half_away(x) == expected


@pytest.mark.parametrize(
    ("enum", "device_mib", "gi_mib", "name"),
    [
        pytest.param(mig.GI_1_SLICE, 40960, 4864, "1g.5gb", id="a100-1g.5gb"),
        pytest.param(mig.GI_1_SLICE_REV1, 40960, 4864, "1g.5gb+me", id="a100-1g.5gb+me"),
        pytest.param(mig.GI_1_SLICE_REV2, 40960, 9856, "1g.10gb", id="a100-1g.10gb-rev2-no-attr"),
        pytest.param(mig.GI_3_SLICE, 143771, 71168, "3g.71gb", id="h200-3g.71gb"),
        pytest.param(mig.GI_7_SLICE, 143771, 143104, "7g.141gb", id="h200-7g.141gb"),
        pytest.param(mig.GI_2_SLICE_REV1, 24576, 11968, "2g.12gb+me", id="a30-2g.12gb+me"),
        pytest.param(mig.GI_2_SLICE_NO_ME, 24576, 11968, "2g.12gb-me", id="no-me-negative"),
        pytest.param(mig.GI_1_SLICE_ALL_ME, 24576, 5952, "1g.6gb+me.all", id="all-me"),
        pytest.param(mig.GI_4_SLICE_GFX, 24576, 24000, "4g.24gb+gfx", id="gfx"),
    ],
)
def test_gi_profile_name(enum: int, device_mib: int, gi_mib: int, name: str) -> None:
    assert mig.gi_profile_name(enum, device_mib * MIB, gi_mib) == name


@pytest.mark.parametrize(
    ("gi_name", "c", "name"),
    [
        pytest.param("3g.20gb", 1, "1c.3g.20gb", id="1c.3g.20gb"),
        pytest.param("3g.20gb", 3, "3g.20gb", id="full-3g"),
        pytest.param("7g.80gb", 2, "2c.7g.80gb", id="2c.7g.80gb"),
        pytest.param("4g.24gb", 2, "2c.4g.24gb", id="2c.4g.24gb"),
    ],
)
def test_ci_profile_name(gi_name: str, c: int, name: str) -> None:
    assert mig.ci_profile_name(gi_name, c) == name


# -- compute-instance sub-profiles and placements (§1.3, §5.1) ---------------------------------------------


@pytest.mark.parametrize(
    ("g", "slices"),
    [
        pytest.param(7, [1, 2, 3, 4, 7], id="7g"),
        pytest.param(4, [1, 2, 4], id="4g"),
        pytest.param(3, [1, 2, 3], id="3g"),
        pytest.param(2, [1, 2], id="2g"),
        pytest.param(1, [1], id="1g"),
    ],
)
def test_valid_ci_slices(g: int, slices: list[int]) -> None:
    assert mig.valid_ci_slices(g) == slices


@pytest.mark.parametrize(
    ("g", "c", "starts"),
    [
        pytest.param(7, 1, [0, 1, 2, 3, 4, 5, 6], id="7g-1c"),
        pytest.param(7, 2, [0, 2, 4], id="7g-2c"),
        pytest.param(7, 3, [0, 4], id="7g-3c"),
        pytest.param(7, 4, [0], id="7g-4c"),
        pytest.param(7, 7, [0], id="7g-7c"),
        pytest.param(4, 1, [0, 1, 2, 3], id="4g-1c"),
        pytest.param(4, 2, [0, 2], id="4g-2c"),
        pytest.param(3, 1, [0, 1, 2], id="3g-1c"),
        pytest.param(3, 2, [0], id="3g-2c"),
        pytest.param(3, 3, [0], id="3g-3c"),
        pytest.param(2, 1, [0, 1], id="2g-1c"),
        pytest.param(1, 1, [0], id="1g-1c"),
    ],
)
def test_ci_placement_starts(g: int, c: int, starts: list[int]) -> None:
    assert mig.ci_placement_starts(g, c) == starts


# -- GPU-instance ids by placement -------------------------------------------------------------------------


def _gi_id_cases() -> list[object]:
    eight = [(0, 8, 0), (0, 4, 1), (4, 4, 2)]
    eight += [(s, 2, 3 + s // 2) for s in (0, 2, 4, 6)]
    eight += [(s, 1, 7 + s) for s in range(7)]
    four = [(0, 4, 0), (0, 2, 1), (2, 2, 2)] + [(s, 1, 3 + s) for s in range(4)]
    return [pytest.param(s, n, 8, i, id=f"8slices-{s}:{n}-gi{i}") for s, n, i in eight] + [
        pytest.param(s, n, 4, i, id=f"a30-4slices-{s}:{n}-gi{i}") for s, n, i in four
    ]


@pytest.mark.parametrize(("start", "size", "memory_slices", "gi_id"), _gi_id_cases())
def test_gpu_instance_id(start: int, size: int, memory_slices: int, gi_id: int) -> None:
    assert mig.gpu_instance_id(start, size, memory_slices) == gi_id


def test_gpu_instance_ids_are_unique_on_8_slices() -> None:
    placements = [(0, 8), (0, 4), (4, 4)] + [(s, 2) for s in (0, 2, 4, 6)] + [(s, 1) for s in range(7)]
    ids = [mig.gpu_instance_id(s, n, 8) for s, n in placements]
    assert sorted(ids) == list(range(14))

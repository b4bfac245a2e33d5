"""MIG rules of the simulated libnvidia-ml, driven through plain pynvml calls.

Expected values are the product facts in shared/reference/mig.md §5 (MIG user guide tables and
`nvidia-smi mig -lgip/-lgipp` dumps), not values read back from the simulator's presets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml
import pytest

from gpunode.sim import nvml as sim

MIB = 1 << 20


@dataclass(frozen=True)
class GiFact:
    name: str
    enum: int
    profile_id: int
    slices: int  # compute slices (G)
    memory_slices: int
    sms: int
    memory_mib: int  # the `-lgip` GiB value times 1024
    max_count: int
    ce: int
    dec: int
    jpeg: int
    ofa: int
    starts: tuple[int, ...]


P = pynvml
ALL7 = (0, 1, 2, 3, 4, 5, 6)


def _ga100(
    g1: str, g1_2: str, g2: str, g3: str, g4: str, g7: str, mem: tuple[int, int, int, int]
) -> list[GiFact]:
    m1, m2, m4, m7 = mem
    return [
        GiFact(g1, P.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, 14, m1, 7, 1, 0, 0, 0, ALL7),
        GiFact(g1 + "+me", P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 14, m1, 1, 1, 1, 1, 1, ALL7),
        GiFact(g1_2, P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, 14, m2, 4, 1, 1, 0, 0, (0, 2, 4, 6)),
        GiFact(g2, P.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, 28, m2, 3, 2, 1, 0, 0, (0, 2, 4)),
        GiFact(g3, P.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, 42, m4, 2, 3, 2, 0, 0, (0, 4)),
        GiFact(g4, P.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, 56, m4, 1, 4, 2, 0, 0, (0,)),
        GiFact(g7, P.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, 98, m7, 1, 7, 5, 1, 1, (0,)),
    ]


def _gh100(
    g1: str, g1_2: str, g2: str, g3: str, g4: str, g7: str, mem: tuple[int, int, int, int]
) -> list[GiFact]:
    m1, m2, m4, m7 = mem
    return [
        GiFact(g1, P.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, 16, m1, 7, 1, 1, 1, 0, ALL7),
        GiFact(g1 + "+me", P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 16, m1, 1, 1, 1, 1, 1, ALL7),
        GiFact(g1_2, P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, 26, m2, 4, 1, 1, 1, 0, (0, 2, 4, 6)),
        GiFact(g2, P.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, 32, m2, 3, 2, 2, 2, 0, (0, 2, 4)),
        GiFact(g3, P.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, 60, m4, 2, 3, 3, 3, 0, (0, 4)),
        GiFact(g4, P.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, 64, m4, 1, 4, 4, 4, 0, (0,)),
        GiFact(g7, P.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, 132, m7, 1, 8, 7, 7, 1, (0,)),
    ]


def _gb100(
    names: tuple[str, str, str, str, str, str],
    mem: tuple[int, int, int, int],
    sms: tuple[int, int, int, int, int, int],
) -> list[GiFact]:
    """Blackwell: the 1g/1g+me/1g (2 slices)/2g rows are published `-lgip` output (gpu-operator #1242,
    #1303, mig-parted #187, #227); the 3g/4g/7g ids, engines and all placements follow the uniform 8-slot
    pattern (inferred, as the presets say)."""
    g1, g1_2, g2, g3, g4, g7 = names
    m1, m2, m4, m7 = mem
    s1, s1_2, s2, s3, s4, s7 = sms
    return [
        GiFact(g1, P.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, s1, m1, 7, 2, 1, 1, 0, ALL7),
        GiFact(g1 + "+me", P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, s1, m1, 1, 2, 1, 1, 1, ALL7),
        GiFact(
            g1_2, P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, s1_2, m2, 4, 2, 1, 1, 0, (0, 2, 4, 6)
        ),
        GiFact(g2, P.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, s2, m2, 3, 4, 2, 2, 0, (0, 2, 4)),
        GiFact(g3, P.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, s3, m4, 2, 6, 3, 3, 0, (0, 4)),
        GiFact(g4, P.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, s4, m4, 1, 8, 4, 4, 0, (0,)),
        GiFact(g7, P.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, s7, m7, 1, 16, 7, 7, 1, (0,)),
    ]


# §5.1-§5.6: preset -> (product name, compute slices = max MIG devices, GI profiles)
PRODUCTS: dict[str, tuple[str, int, list[GiFact]]] = {
    "dgx-a100": (
        "NVIDIA A100-SXM4-40GB",
        7,
        _ga100("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", (4864, 9856, 19968, 40192)),
    ),
    "dgx-a100-80gb": (
        "NVIDIA A100-SXM4-80GB",
        7,
        _ga100("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", (9728, 19968, 40192, 80896)),
    ),
    "dgx-h100": (
        "NVIDIA H100 80GB HBM3",
        7,
        _gh100("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", (9984, 20096, 40448, 81152)),
    ),
    "hgx-h200": (
        "NVIDIA H200",
        7,
        _gh100(
            "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", (16384, 33024, 71168, 143104)
        ),
    ),
    "h100-nvl": (
        "NVIDIA H100 NVL",
        7,
        _gh100(
            "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb", (11008, 22144, 47488, 95360)
        ),
    ),
    "dgx-b200": (
        "NVIDIA B200",
        7,
        _gb100(
            ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
            (22528, 45312, 91392, 182784),
            (18, 30, 36, 70, 72, 144),
        ),
    ),
    "gb200-nvl4": (
        "NVIDIA GB200",
        7,
        _gb100(
            ("1g.23gb", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
            (22528, 46592, 94464, 188928),
            (18, 32, 38, 74, 76, 152),
        ),
    ),
    "a30x4": (
        "NVIDIA A30",
        4,
        [
            GiFact(
                "1g.6gb", P.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 14, 1, 1, 14, 5952, 4, 1, 0, 0, 0, (0, 1, 2, 3)
            ),
            GiFact(
                "1g.6gb+me",
                P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
                21,
                1,
                1,
                14,
                5952,
                1,
                1,
                1,
                1,
                1,
                (0, 1, 2, 3),
            ),
            GiFact("2g.12gb", P.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 5, 2, 2, 28, 11968, 2, 2, 2, 0, 0, (0, 2)),
            GiFact(
                "2g.12gb+me",
                P.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
                6,
                2,
                2,
                28,
                11968,
                1,
                2,
                2,
                1,
                1,
                (0, 2),
            ),
            GiFact("4g.24gb", P.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 0, 4, 4, 56, 24000, 1, 4, 4, 1, 1, (0,)),
        ],
    ),
}
AMPERE = {"dgx-a100", "dgx-a100-80gb", "a30x4"}
HOPPER = {"dgx-h100", "hgx-h200", "h100-nvl", "dgx-b200", "gb200-nvl4"}  # and Blackwell: no reset

ALL_PROFILES = [
    pytest.param(preset, fact, id=f"{preset}-{fact.name}")
    for preset, (_, _, facts) in PRODUCTS.items()
    for fact in facts
]


# -- helpers -------------------------------------------------------------------------------------------


def _start(preset: str) -> sim.FakeNvmlLib:
    lib = sim.install(preset)
    pynvml.nvmlInit()
    return lib


def _enable_mig(lib: sim.FakeNvmlLib, index: int = 0) -> Any:
    """Enable MIG on one GPU the way an operator does: set the mode, reset the GPU where Ampere needs it."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    status = pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    if status == pynvml.NVML_ERROR_RESET_REQUIRED:
        with lib.node.mutate() as state:  # what `nvidia-smi -r` does on a real node
            assert state.reset_gpu(index) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    return handle


def _mig_gpu(preset: str = "dgx-a100") -> Any:
    return _enable_mig(_start(preset))


def _placement(start: int, size: int) -> Any:
    return pynvml.byref(pynvml.c_nvmlGpuInstancePlacement_t(start, size))


def _create_at(handle: Any, profile_id: int, start: int, size: int) -> Any:
    return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, _placement(start, size))


def _placements(handle: Any, profile_id: int) -> list[tuple[int, int]]:
    count = pynvml.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, pynvml.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, pynvml.byref(count))
    return [(array[i].start, array[i].size) for i in range(count.value)]


# -- enabling MIG ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", sorted(AMPERE))
def test_ampere_mig_enable_waits_for_a_gpu_reset(preset: str) -> None:
    lib = _start(preset)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    status = pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert status == pynvml.NVML_ERROR_RESET_REQUIRED == 16
    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 1]
    with lib.node.mutate() as state:
        assert state.reset_gpu(0) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(1)) == [0, 0]


@pytest.mark.parametrize("preset", sorted(HOPPER))
def test_hopper_mig_enable_applies_at_once(preset: str) -> None:
    _start(preset)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    assert pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(1)) == [0, 0]


def test_t4_has_no_mig() -> None:
    _start("t4x4")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)


def test_disabling_mig_with_gpu_instances_is_in_use() -> None:
    handle = _mig_gpu()
    gi = _create_at(handle, 9, 0, 4)
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_DISABLE)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    pynvml.nvmlGpuInstanceDestroy(gi)
    pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_DISABLE)
    assert pynvml.nvmlDeviceGetMigMode(handle)[1] == 0


# -- GPU-instance profiles (§5 tables) -------------------------------------------------------------------


@pytest.mark.parametrize(("preset", "fact"), ALL_PROFILES)
def test_gi_profile_info(preset: str, fact: GiFact) -> None:
    handle = _mig_gpu(preset)
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, fact.enum)
    got = (
        info.id,
        info.name,
        info.sliceCount,
        info.memorySizeMB,
        info.multiprocessorCount,
        info.instanceCount,
        (info.copyEngineCount, info.decoderCount, info.jpegCount, info.ofaCount, info.encoderCount),
    )
    expected = (
        fact.profile_id,
        f"MIG {fact.name}",
        fact.slices,
        fact.memory_mib,
        fact.sms,
        fact.max_count,
        (fact.ce, fact.dec, fact.jpeg, fact.ofa, 0),
    )
    assert got == expected


@pytest.mark.parametrize(("preset", "fact"), ALL_PROFILES)
def test_gi_profile_info_by_id_and_v1_agree(preset: str, fact: GiFact) -> None:
    handle = _mig_gpu(preset)
    by_id = pynvml.nvmlDeviceGetGpuInstanceProfileInfoById(handle, fact.profile_id)
    v1 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, fact.enum, version=1)
    assert by_id.name == f"MIG {fact.name}"
    for info in (by_id, v1):
        assert (info.id, info.memorySizeMB, info.instanceCount) == (
            fact.profile_id,
            fact.memory_mib,
            fact.max_count,
        )


@pytest.mark.parametrize(("preset", "fact"), ALL_PROFILES)
def test_gi_possible_placements(preset: str, fact: GiFact) -> None:
    handle = _mig_gpu(preset)
    assert _placements(handle, fact.profile_id) == [(s, fact.memory_slices) for s in fact.starts]


def test_possible_placements_array_too_small() -> None:
    # the count is output only (nvml.h): NVML would write 7 placements into 2 entries
    handle = _mig_gpu()
    count = pynvml.c_uint(2)
    array = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    with pytest.raises(sim.StrictModeViolation, match="holds 2 entries but NVML writes 7"):
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, 19, array, pynvml.byref(count))


@pytest.mark.parametrize(("preset", "fact"), ALL_PROFILES)
def test_max_instance_count(preset: str, fact: GiFact) -> None:
    handle = _mig_gpu(preset)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, fact.profile_id) == fact.max_count
    for _ in range(fact.max_count):
        pynvml.nvmlDeviceCreateGpuInstance(handle, fact.profile_id)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, fact.profile_id) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlDeviceCreateGpuInstance(handle, fact.profile_id)


@pytest.mark.parametrize("preset", sorted(PRODUCTS))
def test_max_mig_device_count(preset: str) -> None:
    lib = _start(preset)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(pynvml.nvmlDeviceGetHandleByIndex(0)) == 0
    handle = _enable_mig(lib)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == PRODUCTS[preset][1]


# -- creating GPU instances on an A100-SXM4-40GB (the acceptance facts) ---------------------------


@pytest.mark.parametrize("start", [0, 4])
def test_3g_placed_at_valid_start(start: int) -> None:
    handle = _mig_gpu()
    gi = _create_at(handle, 9, start, 4)
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.profileId, info.placement.start, info.placement.size) == (9, start, 4)


@pytest.mark.parametrize("start", [1, 2, 3, 5, 6, 7])
def test_3g_placed_at_invalid_start(start: int) -> None:
    handle = _mig_gpu()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        _create_at(handle, 9, start, 4)


def test_two_3g_fill_both_halves() -> None:
    handle = _mig_gpu()
    _create_at(handle, 9, 0, 4)
    _create_at(handle, 9, 4, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlDeviceCreateGpuInstance(handle, 9)


def test_second_4g_is_insufficient_resources() -> None:
    handle = _mig_gpu()
    pynvml.nvmlDeviceCreateGpuInstance(handle, 5)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlDeviceCreateGpuInstance(handle, 5)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        _create_at(handle, 5, 0, 4)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param((9, 0, 4), (14, 2, 2), id="3g@0-then-2g@2"),
        pytest.param((19, 4, 1), (9, 4, 4), id="1g@4-then-3g@4"),
        pytest.param((0, 0, 8), (19, 6, 1), id="7g@0-then-1g@6"),
        pytest.param((14, 2, 2), (15, 2, 2), id="2g@2-then-1g.10gb@2"),
        pytest.param((15, 6, 2), (9, 4, 4), id="1g.10gb@6-then-3g@4"),
        pytest.param((19, 3, 1), (5, 0, 4), id="1g@3-then-4g@0"),
        pytest.param((19, 0, 1), (19, 0, 1), id="same-1g-slot-twice"),
    ],
)
@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-b200", "gb200-nvl4"])
def test_overlapping_placements_are_insufficient_resources(
    preset: str, first: tuple[int, int, int], second: tuple[int, int, int]
) -> None:
    handle = _mig_gpu(preset)
    _create_at(handle, *first)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        _create_at(handle, *second)


def test_adjacent_placements_do_not_overlap() -> None:
    handle = _mig_gpu()
    _create_at(handle, 9, 4, 4)
    _create_at(handle, 14, 0, 2)
    _create_at(handle, 19, 2, 1)
    _create_at(handle, 19, 3, 1)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 19) == 0


@pytest.mark.parametrize(
    ("order", "fails_at"),
    [
        pytest.param((19, 19, 14, 9), 3, id="cgi-19,19,14,9-fails-at-3g"),
        pytest.param((9, 19, 14, 19), None, id="cgi-9,19,14,19-succeeds"),
    ],
)
@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "dgx-b200", "gb200-nvl4"])
def test_creation_order_matters(preset: str, order: tuple[int, ...], fails_at: int | None) -> None:
    """The MIG user guide's `nvidia-smi mig -cgi` example: the driver picks placements, so order matters
    (the same 8-slot placement rules on Hopper and Blackwell)."""
    handle = _mig_gpu(preset)
    for i, profile_id in enumerate(order):
        if i == fails_at:
            with pytest.raises(pynvml.NVMLError_InsufficientResources):
                pynvml.nvmlDeviceCreateGpuInstance(handle, profile_id)
            return
        pynvml.nvmlDeviceCreateGpuInstance(handle, profile_id)
    assert fails_at is None


@pytest.mark.parametrize(
    ("preset", "profile_id", "start", "size", "gi_id"),
    [
        pytest.param("dgx-a100", 9, 4, 4, 2, id="a100-3g@4-gi2"),
        pytest.param("dgx-a100", 9, 0, 4, 1, id="a100-3g@0-gi1"),
        pytest.param("dgx-a100", 5, 0, 4, 1, id="a100-4g@0-gi1"),
        pytest.param("dgx-a100", 0, 0, 8, 0, id="a100-7g@0-gi0"),
        pytest.param("dgx-a100", 14, 2, 2, 4, id="a100-2g@2-gi4"),
        pytest.param("dgx-a100", 15, 6, 2, 6, id="a100-1g.10gb@6-gi6"),
        pytest.param("dgx-a100", 19, 0, 1, 7, id="a100-1g@0-gi7"),
        pytest.param("dgx-a100", 19, 6, 1, 13, id="a100-1g@6-gi13"),
        pytest.param("dgx-h100", 9, 4, 4, 2, id="h100-3g@4-gi2"),
        pytest.param("dgx-b200", 9, 4, 4, 2, id="b200-3g@4-gi2"),
        pytest.param("dgx-b200", 15, 6, 2, 6, id="b200-1g.45gb@6-gi6"),
        pytest.param("gb200-nvl4", 19, 6, 1, 13, id="gb200-1g@6-gi13"),
        pytest.param("gb200-nvl4", 0, 0, 8, 0, id="gb200-7g@0-gi0"),
        pytest.param("a30x4", 0, 0, 4, 0, id="a30-4g@0-gi0"),
        pytest.param("a30x4", 5, 2, 2, 2, id="a30-2g@2-gi2"),
        pytest.param("a30x4", 14, 0, 1, 3, id="a30-1g@0-gi3"),
        pytest.param("a30x4", 14, 3, 1, 6, id="a30-1g@3-gi6"),
    ],
)
def test_gi_id_follows_placement(preset: str, profile_id: int, start: int, size: int, gi_id: int) -> None:
    handle = _mig_gpu(preset)
    gi = _create_at(handle, profile_id, start, size)
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (
        gi_id,
        profile_id,
        start,
        size,
    )
    by_id = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    assert pynvml.nvmlGpuInstanceGetInfo(by_id).id == gi_id


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        pytest.param((), {19: 7, 20: 1, 15: 4, 14: 3, 9: 2, 5: 1, 0: 1}, id="empty-gpu"),
        pytest.param(((9, 0, 4),), {19: 3, 20: 1, 15: 2, 14: 1, 9: 1, 5: 0, 0: 0}, id="3g@0"),
        pytest.param(((0, 0, 8),), {19: 0, 20: 0, 15: 0, 14: 0, 9: 0, 5: 0, 0: 0}, id="7g@0"),
        pytest.param(((20, 0, 1),), {19: 6, 20: 0, 15: 3, 14: 2, 9: 1, 5: 0, 0: 0}, id="1g+me@0"),
    ],
)
def test_gi_remaining_capacity(setup: tuple[tuple[int, int, int], ...], expected: dict[int, int]) -> None:
    handle = _mig_gpu()
    for placed in setup:
        _create_at(handle, *placed)
    got = {pid: pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, pid) for pid in expected}
    assert got == expected


# -- compute instances -----------------------------------------------------------------------------------

CI = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}  # compute slices -> NVML CI profile enum (= nvidia-smi CI profile id)


@pytest.mark.parametrize(
    ("preset", "gi_profile_id", "c", "name", "count", "sms"),
    [
        pytest.param("dgx-a100", 9, 1, "1c.3g.20gb", 3, 14, id="a100-1c.3g.20gb"),
        pytest.param("dgx-a100", 9, 2, "2c.3g.20gb", 1, 28, id="a100-2c.3g.20gb"),
        pytest.param("dgx-a100", 9, 3, "3g.20gb", 1, 42, id="a100-3g.20gb-full"),
        pytest.param("dgx-a100", 14, 1, "1c.2g.10gb", 2, 14, id="a100-1c.2g.10gb"),
        pytest.param("dgx-a100", 5, 1, "1c.4g.20gb", 4, 14, id="a100-1c.4g.20gb"),
        pytest.param("dgx-a100", 5, 2, "2c.4g.20gb", 2, 28, id="a100-2c.4g.20gb"),
        pytest.param("dgx-a100", 0, 1, "1c.7g.40gb", 7, 14, id="a100-1c.7g.40gb"),
        pytest.param("dgx-a100", 0, 2, "2c.7g.40gb", 3, 28, id="a100-2c.7g.40gb"),
        pytest.param("dgx-a100", 0, 3, "3c.7g.40gb", 2, 42, id="a100-3c.7g.40gb"),
        pytest.param("dgx-a100", 0, 4, "4c.7g.40gb", 1, 56, id="a100-4c.7g.40gb"),
        pytest.param("dgx-a100", 0, 7, "7g.40gb", 1, 98, id="a100-7g.40gb-full"),
        pytest.param("dgx-a100", 19, 1, "1g.5gb", 1, 14, id="a100-1g.5gb-full"),
        pytest.param("dgx-a100-80gb", 9, 1, "1c.3g.40gb", 3, 14, id="a100-80gb-1c.3g.40gb"),
        # Hopper's SMs per slice are not uniform (1g 16, 3g 60), so mig.md gives no CI SM count there.
        pytest.param("dgx-h100", 9, 1, "1c.3g.40gb", 3, None, id="h100-1c.3g.40gb"),
        pytest.param("dgx-h100", 0, 2, "2c.7g.80gb", 3, None, id="h100-2c.7g.80gb"),
        pytest.param("hgx-h200", 9, 1, "1c.3g.71gb", 3, None, id="h200-1c.3g.71gb"),
        pytest.param("a30x4", 5, 1, "1c.2g.12gb", 2, 14, id="a30-1c.2g.12gb"),
        pytest.param("a30x4", 0, 1, "1c.4g.24gb", 4, 14, id="a30-1c.4g.24gb"),
        pytest.param("a30x4", 0, 2, "2c.4g.24gb", 2, 28, id="a30-2c.4g.24gb"),
    ],
)
def test_ci_profile_info(
    preset: str, gi_profile_id: int, c: int, name: str, count: int, sms: int | None
) -> None:
    handle = _mig_gpu(preset)
    gi = pynvml.nvmlDeviceCreateGpuInstance(handle, gi_profile_id)
    info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, CI[c], pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    assert (info.id, info.sliceCount, info.instanceCount, info.name) == (CI[c], c, count, f"MIG {name}")
    if sms is not None:  # 14 SMs per compute slice on GA100 (§5.1-§5.3)
        assert info.multiprocessorCount == sms
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, CI[c]) == count


def test_three_1c_in_a_3g_then_a_fourth_fails() -> None:
    handle = _mig_gpu()
    gi = pynvml.nvmlDeviceCreateGpuInstance(handle, 9)
    ids = [
        pynvml.nvmlComputeInstanceGetInfo(pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)).id
        for _ in range(3)
    ]
    assert len(set(ids)) == 3
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)


def test_2c_on_a_1g_gi_is_not_supported() -> None:
    handle = _mig_gpu()
    gi = pynvml.nvmlDeviceCreateGpuInstance(handle, 19)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI[2])
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, CI[2], pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )


@pytest.mark.parametrize(
    ("gi_profile_id", "c"),
    [
        pytest.param(9, 4, id="4c-on-3g"),
        pytest.param(5, 3, id="3c-on-4g"),
        pytest.param(14, 3, id="3c-on-2g"),
        pytest.param(0, 3, id="ok-3c-on-7g"),
    ],
)
def test_ci_sizes_allowed_per_gi(gi_profile_id: int, c: int) -> None:
    handle = _mig_gpu()
    gi = pynvml.nvmlDeviceCreateGpuInstance(handle, gi_profile_id)
    g = {9: 3, 5: 4, 14: 2, 0: 7}[gi_profile_id]
    allowed = c == g or (c < g and 2 * c <= g + 1)  # mig.md §1.3
    if allowed:
        ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI[c])
        assert pynvml.nvmlComputeInstanceGetInfo(ci).placement.size == c
    else:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI[c])


def test_destroying_a_gi_with_cis_is_in_use() -> None:
    handle = _mig_gpu()
    gi = pynvml.nvmlDeviceCreateGpuInstance(handle, 9)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI[3])
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlGpuInstanceDestroy(gi)
    pynvml.nvmlComputeInstanceDestroy(ci)
    pynvml.nvmlGpuInstanceDestroy(gi)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 9) == 2


# -- MIG devices ---------------------------------------------------------------------------------------


def _build_a100_layout(handle: Any) -> list[tuple[int, str, int, int]]:
    """3g.20gb@4 (full CI) + 2g.10gb@0 (two 1c) + 1g.5gb@2.

    Returns (GI id, profile name, CI slices, GI profile id) per MIG device.
    """
    gi3 = _create_at(handle, 9, 4, 4)
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi3, CI[3])
    gi2 = _create_at(handle, 14, 0, 2)
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi2, CI[1])
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi2, CI[1])
    gi1 = _create_at(handle, 19, 2, 1)
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi1, CI[1])
    # NVML enumerates MIG devices by GI id, then CI id.
    return [
        (2, "3g.20gb", 3, 9),
        (3, "1c.2g.10gb", 1, 14),
        (3, "1c.2g.10gb", 1, 14),
        (9, "1g.5gb", 1, 19),
    ]


def test_mig_device_enumeration() -> None:
    handle = _mig_gpu()
    expected = _build_a100_layout(handle)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
    parent_uuid = pynvml.nvmlDeviceGetUUID(handle)
    seen = []
    for i, (gi_id, name, _, _) in enumerate(expected):
        mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        assert bool(pynvml.nvmlDeviceIsMigDeviceHandle(mig_handle))
        assert pynvml.nvmlDeviceGetGpuInstanceId(mig_handle) == gi_id
        assert pynvml.nvmlDeviceGetName(mig_handle) == f"NVIDIA A100-SXM4-40GB MIG {name}"
        uuid = pynvml.nvmlDeviceGetUUID(mig_handle)
        assert uuid.startswith("MIG-")
        assert uuid != parent_uuid
        seen.append((gi_id, pynvml.nvmlDeviceGetComputeInstanceId(mig_handle), uuid))
    assert len({s[2] for s in seen}) == len(expected)
    assert len({s[:2] for s in seen}) == len(expected)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, len(expected))
    assert not bool(pynvml.nvmlDeviceIsMigDeviceHandle(handle))


def test_mig_handle_by_uuid_and_parent() -> None:
    handle = _mig_gpu()
    _build_a100_layout(handle)
    parent_uuid = pynvml.nvmlDeviceGetUUID(handle)
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0))
    mig_handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    assert bool(pynvml.nvmlDeviceIsMigDeviceHandle(mig_handle))
    assert pynvml.nvmlDeviceGetUUID(mig_handle) == uuid
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_handle)
    assert pynvml.nvmlDeviceGetUUID(parent) == parent_uuid
    assert not bool(pynvml.nvmlDeviceIsMigDeviceHandle(parent))
    assert pynvml.nvmlDeviceGetIndex(parent) == 0


@pytest.mark.parametrize("index", [0, 1, 3])
def test_mig_device_memory_and_attributes_match_profile(index: int) -> None:
    handle = _mig_gpu()
    gi_id, name, c, profile_id = _build_a100_layout(handle)[index]
    fact = next(f for f in PRODUCTS["dgx-a100"][2] if f.profile_id == profile_id)
    mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
    assert pynvml.nvmlDeviceGetMemoryInfo(mig_handle).total == fact.memory_mib * MIB
    attrs = pynvml.nvmlDeviceGetAttributes(mig_handle)
    got = (
        attrs.memorySizeMB,
        attrs.gpuInstanceSliceCount,
        attrs.computeInstanceSliceCount,
        attrs.multiprocessorCount,
        attrs.sharedCopyEngineCount,
        attrs.sharedDecoderCount,
        attrs.sharedJpegCount,
        attrs.sharedOfaCount,
    )
    assert got == (
        fact.memory_mib,
        fact.slices,
        c,
        fact.sms * c // fact.slices,
        fact.ce,
        fact.dec,
        fact.jpeg,
        fact.ofa,
    )
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig_handle) == gi_id
    assert name.endswith(fact.name)


def test_no_mig_devices_without_compute_instances() -> None:
    handle = _mig_gpu()
    _create_at(handle, 9, 0, 4)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)


def test_a30_max_mig_devices_and_full_layout() -> None:
    handle = _mig_gpu("a30x4")
    for start in range(4):
        gi = _create_at(handle, 14, start, 1)
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI[1])
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 4
    names = [
        pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)) for i in range(4)
    ]
    assert names == ["NVIDIA A30 MIG 1g.6gb"] * 4
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlDeviceCreateGpuInstance(handle, 14)

"""Count arguments as nvml.h documents them, one table per simulated call.

Called the way pynvml calls the C library: the symbol from ``_nvmlGetFunctionPointer``, a ctypes array
(or NULL) and ``byref`` of a ``c_uint`` count. Three kinds of count (nvml.h's @param text):

* output only ("Returns number of allowed placements", "The count of returned GPU instances"): whatever
  ``*count`` holds, NVML writes every item into the array, which "must be large enough", and then the
  count. Placements accept a NULL array "to discover the number"; instance lists do not
  (INVALID_ARGUMENT).
* in/out ("Reference in which to provide the array size, and to return the number of elements"):
  too small -> INSUFFICIENT_SIZE with the count needed; nothing to return -> SUCCESS with 0; NULL
  only with ``*count = 0`` ("for this call infos is allowed to be NULL"), INVALID_ARGUMENT otherwise.
* input only (field values: how many entries to read and fill).

An array shorter than what NVML writes overflows in the real library: strict mode raises
StrictModeViolation; lenient mode answers INSUFFICIENT_SIZE with the count and writes nothing past it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pynvml
import pytest

from gpunode.sim import nvml as sim
from gpunode.sim.nvml.state import ProcessState

SUCCESS = pynvml.NVML_SUCCESS
SMALL = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
INVALID = pynvml.NVML_ERROR_INVALID_ARGUMENT
OVERFLOW = "overflow"  # strict: StrictModeViolation; lenient: INSUFFICIENT_SIZE, count = needed
NULL = None


@dataclass(frozen=True)
class Row:
    case: str
    count_in: int
    array: int | None  # entries in the caller's array; None: NULL
    expect: int | str
    count_out: int | None  # None: the count needed (the table's ``needed``)


@dataclass(frozen=True)
class Call:
    name: str
    elem: Any  # ctypes element type
    needed: int  # items NVML returns in the fixture's world
    args: Callable[[World], tuple[Any, ...]]  # the arguments before (array, count) / (count, array)
    count_first: bool  # (count, array) as the process calls take them; else (array, count)
    rows: tuple[Row, ...]


@dataclass
class World:
    lib: sim.FakeNvmlLib
    mig_gpu: Any
    plain_gpu: Any
    gi_3g: Any


def _output_only(null_counts: bool, needed: int) -> tuple[Row, ...]:
    return (
        Row("count 0, array large enough", 0, needed + 3, SUCCESS, None),
        Row("count equal to the items", needed, needed, SUCCESS, None),
        Row("count larger than the items", 2 * needed + 8, 2 * needed + 8, SUCCESS, None),
        Row("count 0, array exactly large enough", 0, needed, SUCCESS, None),
        Row("array one short of the items", needed, needed - 1, OVERFLOW, None),
        Row("NULL array", 0, NULL, SUCCESS if null_counts else INVALID, None if null_counts else 0),
    )


def _in_out(needed: int) -> tuple[Row, ...]:
    if needed == 0:
        return (
            Row("count 0, NULL: nothing to return", 0, NULL, SUCCESS, 0),
            Row("count 0, array: nothing to return", 0, 4, SUCCESS, 0),
            Row("count 8, array: nothing to return", 8, 8, SUCCESS, 0),
            Row("count 8, NULL array", 8, NULL, INVALID, 8),
        )
    return (
        Row("count 0, NULL asks for the size", 0, NULL, SMALL, None),
        Row("count 0 with an array", 0, needed + 3, SMALL, None),
        Row("count one short", needed - 1, needed - 1, SMALL, None),
        Row("count one short, array large enough", needed - 1, 2 * needed + 8, SMALL, None),
        Row("count equal to the items", needed, needed, SUCCESS, None),
        Row("count larger than the items", 2 * needed + 8, 2 * needed + 8, SUCCESS, None),
        Row("count says enough, array one short", needed, needed - 1, OVERFLOW, None),
        Row("count says enough, NULL array", needed, NULL, INVALID, None),
        Row("count larger than the items, NULL array", needed + 1, NULL, INVALID, needed + 1),
    )


CALLS = (
    Call(
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        pynvml.c_nvmlGpuInstancePlacement_t,
        7,  # 1g.5gb on A100-40GB
        lambda w: (w.mig_gpu, 19),
        False,
        _output_only(True, 7),
    ),
    Call(
        "nvmlDeviceGetGpuInstances",
        pynvml.c_nvmlGpuInstance_t,
        2,
        lambda w: (w.mig_gpu, 19),
        False,
        _output_only(False, 2),
    ),
    Call(
        "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
        pynvml.c_nvmlComputeInstancePlacement_t,
        3,  # 1-slice compute instances in a 3g GPU instance
        lambda w: (w.gi_3g, 0),
        False,
        _output_only(True, 3),
    ),
    Call(
        "nvmlGpuInstanceGetComputeInstances",
        pynvml.c_nvmlComputeInstance_t,
        2,
        lambda w: (w.gi_3g, 0),
        False,
        _output_only(False, 2),
    ),
    Call(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        pynvml.c_nvmlProcessInfo_v3_t,
        3,
        lambda w: (w.plain_gpu,),
        True,
        _in_out(3),
    ),
    Call(
        "nvmlDeviceGetSupportedMemoryClocks",
        ctypes.c_uint,
        1,  # one memory clock (the simulator reports the maximum, as HBM GPUs do)
        lambda w: (w.plain_gpu,),
        True,
        _in_out(1),
    ),
    Call(
        "nvmlDeviceGetSupportedGraphicsClocks",
        ctypes.c_uint,
        81,  # A100: 1410 MHz down to 210 MHz in 15 MHz steps
        lambda w: (w.plain_gpu, 1215),
        True,
        _in_out(81),
    ),
    Call(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        pynvml.c_nvmlProcessInfo_v3_t,
        0,
        lambda w: (w.plain_gpu,),
        True,
        _in_out(0),
    ),
    Call(
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        pynvml.c_nvmlProcessInfo_v3_t,
        0,
        lambda w: (w.plain_gpu,),
        True,
        _in_out(0),
    ),
)
ROWS = [pytest.param(call, row, id=f"{call.name}: {row.case}") for call in CALLS for row in call.rows]


def _world(strict: bool) -> World:
    lib = sim.install("dgx-a100", strict=strict)
    pynvml.nvmlInit()
    mig_gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetMigMode(mig_gpu, 1)
    with lib.node.mutate() as state:
        state.reset_gpu(0)
        state.gpus[1].processes += [ProcessState(pid, 1024) for pid in (101, 102, 103)]
    pynvml.nvmlDeviceCreateGpuInstance(mig_gpu, 19)
    pynvml.nvmlDeviceCreateGpuInstance(mig_gpu, 19)
    gi_3g = pynvml.nvmlDeviceCreateGpuInstance(mig_gpu, 9)
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi_3g, 0)
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi_3g, 0)
    return World(lib, mig_gpu, pynvml.nvmlDeviceGetHandleByIndex(1), gi_3g)


@pytest.fixture(params=[True, False], ids=["strict", "lenient"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield _world(bool(request.param))
    sim.uninstall()


def _call(world: World, call: Call, row: Row) -> tuple[int, ctypes.c_uint, Any]:
    fn = pynvml._nvmlGetFunctionPointer(call.name)
    count = ctypes.c_uint(row.count_in)
    array = None if row.array is None else (call.elem * row.array)()
    pair = (ctypes.byref(count), array) if call.count_first else (array, ctypes.byref(count))
    return int(fn(*call.args(world), *pair)), count, array


@pytest.mark.parametrize(("call", "row"), ROWS)
def test_count_semantics(world: World, call: Call, row: Row) -> None:
    needed = call.needed if row.count_out is None else row.count_out
    if row.expect == OVERFLOW and world.lib.strict:
        with pytest.raises(sim.StrictModeViolation, match=f"{call.name}: the array holds"):
            _call(world, call, row)
        return
    rc, count, array = _call(world, call, row)
    assert (rc, count.value) == (SMALL if row.expect == OVERFLOW else row.expect, needed)
    if rc == SUCCESS and array is not None:
        assert all(any(_entry(array, i)) for i in range(needed)), "every returned entry is filled in"
        assert not any(any(_entry(array, i)) for i in range(needed, len(array))), "nothing past the count"
    elif array is not None:
        assert not any(any(_entry(array, i)) for i in range(len(array))), "nothing written on failure"


def _entry(array: Any, i: int) -> bytes:
    size = ctypes.sizeof(array._type_)
    return ctypes.string_at(ctypes.addressof(array) + i * size, size)


def test_pynvml_wrappers_read_the_counts(nvml_sim: sim.FakeNvmlLib) -> None:
    world = _world(strict=True)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(world.plain_gpu)] == [101, 102, 103]
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(world.plain_gpu) == []
    assert pynvml.nvmlDeviceGetMPSComputeRunningProcesses(world.plain_gpu) == []
    assert pynvml.nvmlDeviceGetSupportedMemoryClocks(world.plain_gpu) == [1215]
    graphics = pynvml.nvmlDeviceGetSupportedGraphicsClocks(world.plain_gpu, 1215)
    assert (graphics[0], graphics[-1], len(graphics)) == (1410, 210, 81)
    with pytest.raises(pynvml.NVMLError_NotFound):  # not a supported memory clock
        pynvml.nvmlDeviceGetSupportedGraphicsClocks(world.plain_gpu, 1000)


# -- nvmlDeviceGetRetiredPages: in/out (pre-Ampere GPUs retire pages; T4 is Turing) --------------------
RETIRED_ROWS = [pytest.param(row, id=row.case) for row in _in_out(2)]


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("row", RETIRED_ROWS)
def test_retired_pages_count_semantics(strict: bool, row: Row) -> None:
    lib = sim.install("t4x4", strict=strict)
    try:
        pynvml.nvmlInit()
        with lib.node.mutate() as state:
            state.inject_ecc(1, "dbe", 2)
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetRetiredPages")
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        count = ctypes.c_uint(row.count_in)
        array = None if row.array is None else (ctypes.c_ulonglong * row.array)()
        cause = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        if row.expect == OVERFLOW and strict:
            with pytest.raises(sim.StrictModeViolation, match="nvmlDeviceGetRetiredPages"):
                fn(h, cause, ctypes.byref(count), array)
            return
        rc = fn(h, cause, ctypes.byref(count), array)
        needed = 2 if row.count_out is None else row.count_out
        assert (rc, count.value) == (SMALL if row.expect == OVERFLOW else row.expect, needed)
        assert len(pynvml.nvmlDeviceGetRetiredPages(h, cause)) == 2
    finally:
        sim.uninstall()


# -- nvmlDeviceGetFieldValues: valuesCount is input only ----------------------------------------------
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize(("count", "size"), [(2, 2), (1, 2), (0, 2), (3, 2)])
def test_field_values_count_is_input_only(strict: bool, count: int, size: int) -> None:
    sim.install("dgx-a100", strict=strict)
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        values = (pynvml.c_nvmlFieldValue_t * size)()
        for slot in values:
            slot.fieldId = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        if count > size and strict:
            with pytest.raises(sim.StrictModeViolation, match="holds 2 entries but NVML writes 3"):
                fn(h, ctypes.c_int32(count), ctypes.byref(values))
            return
        assert fn(h, ctypes.c_int32(count), ctypes.byref(values)) == SUCCESS
        filled = min(count, size)
        assert [v.timestamp > 0 for v in values] == [i < filled for i in range(size)]
    finally:
        sim.uninstall()

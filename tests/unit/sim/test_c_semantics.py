"""The simulated library behaves like the C library beneath pynvml's unmodified wrappers."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from gpunode.sim import nvml as sim


def test_calls_before_init_are_uninitialized(nvml_sim: sim.FakeNvmlLib) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_init_and_shutdown_are_reference_counted(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 8  # one init still holds
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_init_resolves_the_c_symbol_pynvml_uses(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    assert nvml_sim.symbols["nvmlInitWithFlags"].calls == 1
    pynvml.nvmlDeviceGetCount()
    assert nvml_sim.symbols["nvmlDeviceGetCount_v2"].calls == 1


def test_unimplemented_symbols_are_function_not_found(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetBoardPartNumber(h)


def test_handles_are_addresses_not_objects(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    a = pynvml.nvmlDeviceGetHandleByIndex(3)
    b = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert a is not b
    assert ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    assert ctypes.cast(a, ctypes.c_void_p).value  # never NULL
    uuid = pynvml.nvmlDeviceGetUUID(a)
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    assert pynvml.nvmlDeviceGetIndex(by_uuid) == 3
    by_bus = pynvml.nvmlDeviceGetHandleByPciBusId(pynvml.nvmlDeviceGetPciInfo(a).busId)
    assert pynvml.nvmlDeviceGetIndex(by_bus) == 3


def test_bad_index_and_unknown_uuid(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


def test_short_string_buffers_get_insufficient_size(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
    small = ctypes.create_string_buffer(8)
    assert fn(h, small, ctypes.c_uint(8)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    big = ctypes.create_string_buffer(96)
    assert fn(h, big, ctypes.c_uint(96)) == pynvml.NVML_SUCCESS
    assert big.value == b"NVIDIA A100-SXM4-40GB"


def test_memory_v2_checks_the_version_word(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v1.total == v2.total == 40960 * 2**20
    assert v2.reserved > 0
    assert v1.used == v2.used + v2.reserved
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(h, version=0x01000028)


def test_gi_profile_info_versions(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    v2 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    v1 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, version=1)
    assert (v2.id, v1.id, v2.memorySizeMB, v1.memorySizeMB) == (19, 19, 4864, 4864)
    assert v2.name == "MIG 1g.5gb"
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 0x07000098
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    assert fn(h, 0, ctypes.byref(info)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # A100 has no 8-slice profile
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE)


def test_error_strings_are_bytes_through_restype(nvml_sim: sim.FakeNvmlLib) -> None:
    # pynvml sets fn.restype = c_char_p on this symbol and decodes the bytes it gets back
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES) == "Insufficient resources"
    assert nvml_sim.symbols["nvmlErrorString"].restype is ctypes.c_char_p
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE))  # never raises


def _setup_mig(lib: sim.FakeNvmlLib) -> object:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetMigMode(h, 1)
    with lib.node.mutate() as state:
        state.reset_gpu(0)
    return h


@pytest.mark.parametrize(
    "call",
    [
        pytest.param("placement-struct-by-value", id="placement-struct-by-value"),
        pytest.param("count-without-byref", id="count-without-byref"),
        pytest.param("handle-by-reference", id="handle-by-reference"),
    ],
)
def test_strict_mode_rejects_calls_that_would_crash_the_real_library(
    nvml_sim: sim.FakeNvmlLib, call: str
) -> None:
    h = _setup_mig(nvml_sim)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 4)
    count = ctypes.c_uint(0)
    calls = {
        "placement-struct-by-value": lambda: pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, placement),
        "count-without-byref": lambda: pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 9, None, count),
        "handle-by-reference": lambda: pynvml.nvmlDeviceGetName(ctypes.byref(h)),
    }
    with pytest.raises(sim.StrictModeViolation):
        calls[call]()


def test_the_same_calls_with_byref_work(nvml_sim: sim.FakeNvmlLib) -> None:
    h = _setup_mig(nvml_sim)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 4)
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, ctypes.byref(placement))
    assert pynvml.nvmlGpuInstanceGetInfo(gi).placement.start == 0
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 9, None, ctypes.byref(count))
    assert count.value == 2


def test_lenient_mode_accepts_what_strict_mode_rejects() -> None:
    lib = sim.install("dgx-a100", strict=False)
    h = _setup_mig(lib)
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, pynvml.c_nvmlGpuInstancePlacement_t(4, 4))
    assert pynvml.nvmlGpuInstanceGetInfo(gi).id == 2


def test_too_small_caller_array_is_a_strict_mode_violation(nvml_sim: sim.FakeNvmlLib) -> None:
    # nvml.h: the count of placements is output only and the array "must be large enough": the real
    # library writes all 7 placements past the end of a 1-entry array
    h = _setup_mig(nvml_sim)
    count = ctypes.c_uint(1)
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * 1)()
    with pytest.raises(sim.StrictModeViolation, match="holds 1 entries but NVML writes 7"):
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 19, arr, ctypes.byref(count))


def test_too_small_caller_array_is_insufficient_size_in_lenient_mode() -> None:
    lib = sim.install("dgx-a100", strict=False)
    h = _setup_mig(lib)
    count = ctypes.c_uint(1)
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * 1)()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 19, arr, ctypes.byref(count))
    assert count.value == 7


def test_utilization_is_not_supported_in_mig_mode(nvml_sim: sim.FakeNvmlLib) -> None:
    h = _setup_mig(nvml_sim)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(h)
    other = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert 0 <= pynvml.nvmlDeviceGetUtilizationRates(other).gpu <= 100

"""GPM (GPU Performance Monitoring, Hopper and later) of the simulated library, through pynvml's unmodified
wrappers (RealNvml's use of it: tests/unit/nvml/test_gpm.py)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml
import pytest

from gpunode.sim import nvml as sim
from gpunode.sim.nvml.state import ProcessState

METRICS = (
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
)


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def h100(clock: Clock) -> Iterator[sim.FakeNvmlLib]:
    lib = sim.install("dgx-h100", clock=clock)
    pynvml.nvmlInit()
    yield lib
    pynvml.nvmlShutdown()


def _request(s1: object, s2: object, metric_ids: tuple[int, ...] = METRICS) -> pynvml.c_nvmlGpmMetricsGet_t:
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(metric_ids)
    req.sample1, req.sample2 = s1, s2
    for i, metric_id in enumerate(metric_ids):
        req.metrics[i].metricId = metric_id
    return req


def _interval(gpu: int, clock: Clock, seconds: float) -> list[tuple[int, float]]:
    """(nvmlReturn, value) per metric over `seconds` of simulated time on one GPU."""
    h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(h, s1)
        clock.now += seconds
        pynvml.nvmlGpmSampleGet(h, s2)
        req = pynvml.nvmlGpmMetricsGet(_request(s1, s2))
        return [(int(req.metrics[i].nvmlReturn), float(req.metrics[i].value)) for i in range(len(METRICS))]
    finally:
        pynvml.nvmlGpmSampleFree(s1)
        pynvml.nvmlGpmSampleFree(s2)


# -- the C surface -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("preset", "supported"), [("dgx-h100", 1), ("hgx-h200", 1), ("dgx-a100", 0)])
def test_device_support_follows_the_architecture(preset: str, supported: int) -> None:
    sim.install(preset)
    pynvml.nvmlInit()
    try:
        info = pynvml.nvmlGpmQueryDeviceSupport(pynvml.nvmlDeviceGetHandleByIndex(0))
        assert info.isSupportedDevice == supported
    finally:
        pynvml.nvmlShutdown()


def test_support_query_checks_the_version_word(h100: sim.FakeNvmlLib) -> None:
    info = pynvml.c_nvmlGpmSupport_t()
    info.version = 2
    fn = pynvml._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
    ret = fn(pynvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert ret == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_metrics_between_two_samples_are_percentages(h100: sim.FakeNvmlLib, clock: Clock) -> None:
    clock.now += 30
    results = _interval(0, clock, 10.0)
    assert [ret for ret, _ in results] == [pynvml.NVML_SUCCESS] * 3
    graphics, tensor, dram = (value for _, value in results)
    assert 0 < graphics <= 100
    assert tensor == pytest.approx(graphics * 0.55)
    assert 0 < dram <= graphics


def test_metrics_are_deterministic(clock: Clock) -> None:
    def run() -> list[tuple[int, float]]:
        clock.now = 1_700_000_000.0
        sim.install("dgx-h100", clock=clock)
        pynvml.nvmlInit()
        try:
            clock.now += 45
            return _interval(3, clock, 7.5)
        finally:
            pynvml.nvmlShutdown()
            sim.uninstall()

    assert run() == run()


def test_load_raises_the_graphics_activity(h100: sim.FakeNvmlLib, clock: Clock) -> None:
    idle = _interval(1, clock, 20.0)[0][1]
    clock.now -= 20
    with h100.node.mutate() as state:
        state.gpus[1].processes.append(ProcessState(pid=4242, used_mib=1024))
    busy = _interval(1, clock, 20.0)[0][1]
    assert busy > idle * 5


def test_unknown_metrics_are_not_supported_one_by_one(h100: sim.FakeNvmlLib, clock: Clock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h, s1)
    clock.now += 1
    pynvml.nvmlGpmSampleGet(h, s2)
    req = pynvml.nvmlGpmMetricsGet(
        _request(s1, s2, (pynvml.NVML_GPM_METRIC_INTEGER_UTIL, pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL))
    )
    assert req.metrics[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert req.metrics[1].nvmlReturn == pynvml.NVML_SUCCESS
    assert req.metrics[0].metricInfo.shortName is None  # names are left NULL


def test_metrics_get_checks_the_version_word(h100: sim.FakeNvmlLib, clock: Clock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h, s1)
    pynvml.nvmlGpmSampleGet(h, s2)
    req = _request(s1, s2)
    req.version = 0
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlGpmMetricsGet(req)


def test_samples_must_be_of_one_gpu_in_order(h100: sim.FakeNvmlLib, clock: Clock) -> None:
    h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    a, b, c, unfilled = (pynvml.nvmlGpmSampleAlloc() for _ in range(4))
    pynvml.nvmlGpmSampleGet(h0, a)
    clock.now += 1
    pynvml.nvmlGpmSampleGet(h1, b)
    pynvml.nvmlGpmSampleGet(h0, c)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(_request(a, b))  # different GPUs
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(_request(c, a))  # newer first
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(_request(a, a))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(_request(a, unfilled))
    assert pynvml.nvmlGpmMetricsGet(_request(a, c)).metrics[0].nvmlReturn == pynvml.NVML_SUCCESS


def test_freed_samples_are_no_longer_samples(h100: sim.FakeNvmlLib) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    assert ctypes.addressof(a.contents) != ctypes.addressof(b.contents)
    pynvml.nvmlGpmSampleFree(a)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleGet(h, a)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleFree(a)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleGet(h, pynvml.c_nvmlGpmSample_t())  # NULL


def test_lost_gpu_is_lost_for_gpm(h100: sim.FakeNvmlLib) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    sample = pynvml.nvmlGpmSampleAlloc()
    with h100.node.mutate() as state:
        state.lose(2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlGpmSampleGet(h, sample)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlGpmQueryDeviceSupport(h)


def test_pre_hopper_cannot_sample(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(pynvml.nvmlDeviceGetHandleByIndex(0), sample)
    pynvml.nvmlGpmSampleFree(sample)
    pynvml.nvmlShutdown()


def test_mig_samples_name_an_existing_gpu_instance(h100: sim.FakeNvmlLib, clock: Clock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    gi = pynvml.nvmlDeviceCreateGpuInstance(h, 19)  # 1g.10gb
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
    s1, s2, whole = (pynvml.nvmlGpmSampleAlloc() for _ in range(3))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMigSampleGet(h, gi_id + 1, s1)
    pynvml.nvmlGpmMigSampleGet(h, gi_id, s1)
    pynvml.nvmlGpmSampleGet(h, whole)
    clock.now += 5
    pynvml.nvmlGpmMigSampleGet(h, gi_id, s2)
    assert pynvml.nvmlGpmMetricsGet(_request(s1, s2)).metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(_request(whole, s2))  # the GPU and one of its instances differ
    mig_device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmQueryDeviceSupport(mig_device)  # ask the parent GPU


def test_strict_mode_knows_the_gpm_prototypes(h100: sim.FakeNvmlLib) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(sim.StrictModeViolation):
        h100.nvmlGpmSampleGet(h, ctypes.byref(sample))  # the sample goes by value
    with pytest.raises(sim.StrictModeViolation):
        h100.nvmlGpmMetricsGet(_request(sample, sample))  # the request goes by reference
    pynvml.nvmlGpmSampleFree(sample)

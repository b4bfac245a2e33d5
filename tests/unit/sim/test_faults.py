"""Every simulated fault, seen through plain pynvml and through gpunode.nvml."""

from __future__ import annotations

import asyncio
import threading
import time

import pynvml
import pytest

from gpunode.nvml import errors
from gpunode.nvml.api import EventKind, HealthEvent
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim


def _event_set(*indices: int, mask: int = pynvml.nvmlEventTypeXidCriticalError) -> object:
    es = pynvml.nvmlEventSetCreate()
    for i in indices:
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i), mask, es)
    return es


def test_xid_reaches_every_registered_event_set(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    a, b, other = _event_set(2), _event_set(2, 3), _event_set(5)
    with nvml_sim.node.mutate() as state:
        state.inject_xid(2, 43)
        state.inject_xid(3, 79)
    for es, expected in ((a, [(2, 43)]), (b, [(2, 43), (3, 79)]), (other, [])):
        got = []
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(es, 0)
            except pynvml.NVMLError_Timeout:
                break
            got.append((pynvml.nvmlDeviceGetIndex(data.device), data.eventData))
            assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
            assert data.gpuInstanceId == data.computeInstanceId == 0xFFFFFFFF
        assert got == expected
        pynvml.nvmlEventSetFree(es)


def test_event_wait_blocks_for_its_timeout_without_spinning(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    es = _event_set(0)
    cpu0, wall0 = time.thread_time(), time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 400)
    assert time.monotonic() - wall0 >= 0.39
    assert time.thread_time() - cpu0 < 0.05  # a spinning wait would burn the whole 400 ms


def test_a_waiting_thread_wakes_when_an_xid_is_injected(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    es = _event_set(1)
    result: list[tuple[int, float]] = []

    def waiter() -> None:
        data = pynvml.nvmlEventSetWait_v2(es, 5000)
        result.append((data.eventData, time.monotonic()))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    injected = time.monotonic()
    with nvml_sim.node.mutate() as state:
        state.inject_xid(1, 31)
    t.join(2)
    assert result
    assert result[0][0] == 31
    assert result[0][1] - injected < 0.1


def test_lost_gpu_answers_gpu_is_lost_until_restored(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(4)
    es = _event_set(4)
    with nvml_sim.node.mutate() as state:
        state.lose(4)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(4)
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 79  # fell off the bus
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(3))  # the others carry on
    with nvml_sim.node.mutate() as state:
        state.restore(4)
    assert pynvml.nvmlDeviceGetUUID(h).startswith("GPU-")


@pytest.mark.parametrize(
    ("kind", "mask", "counter", "event_type"),
    [
        pytest.param(
            "sbe",
            pynvml.nvmlEventTypeSingleBitEccError,
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.nvmlEventTypeSingleBitEccError,
            id="single-bit",
        ),
        pytest.param(
            "dbe",
            pynvml.nvmlEventTypeDoubleBitEccError,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.nvmlEventTypeDoubleBitEccError,
            id="double-bit",
        ),
    ],
)
def test_ecc_errors_count_and_raise_events(
    nvml_sim: sim.FakeNvmlLib, kind: str, mask: int, counter: int, event_type: int
) -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    es = _event_set(0, mask=mask)
    with nvml_sim.node.mutate() as state:
        state.inject_ecc(0, kind, 3)
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, counter, pynvml.NVML_VOLATILE_ECC) == 3
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, counter, pynvml.NVML_AGGREGATE_ECC) == 3
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventType == event_type
    corr, unc, pending, _failure = pynvml.nvmlDeviceGetRemappedRows(h)
    assert (corr, unc, bool(pending)) == ((3, 0, False) if kind == "sbe" else (0, 3, True))


def test_dbe_on_turing_retires_pages() -> None:
    lib = sim.install("t4x4")
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    with lib.node.mutate() as state:
        state.inject_ecc(1, "dbe", 2)
    assert (
        len(pynvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)) == 2
    )
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(h)


@pytest.mark.parametrize(
    ("fault", "exc"),
    [
        pytest.param("library-not-found", pynvml.NVMLError_LibraryNotFound, id="library-not-found"),
        pytest.param("driver-not-loaded", pynvml.NVMLError_DriverNotLoaded, id="driver-not-loaded"),
    ],
)
def test_init_faults(nvml_sim: sim.FakeNvmlLib, fault: str, exc: type[Exception]) -> None:
    with nvml_sim.node.mutate() as state:
        state.init_fault = fault
    with pytest.raises(exc):
        pynvml.nvmlInit()
    with nvml_sim.node.mutate() as state:
        state.restore()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 8


async def test_init_fault_surfaces_as_init_failed(nvml_sim: sim.FakeNvmlLib) -> None:
    with nvml_sim.node.mutate() as state:
        state.init_fault = "driver-not-loaded"
    with pytest.raises(errors.InitFailed) as exc:
        await RealNvml.open()
    assert exc.value.code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED


async def test_lost_gpu_is_data_not_a_crash(nvml_sim: sim.FakeNvmlLib) -> None:
    nvml = await RealNvml.open()
    try:
        with nvml_sim.node.mutate() as state:
            state.lose(6)
        gpus = await nvml.gpus()
        assert [g.index for g in gpus] == [0, 1, 2, 3, 4, 5, 7]
        assert await nvml.lost_gpus() == [6]
        with pytest.raises(errors.GpuLost):
            await nvml.telemetry(6)
    finally:
        await nvml.close()


async def test_events_arrive_through_the_async_iterator(nvml_sim: sim.FakeNvmlLib) -> None:
    nvml = await RealNvml.open()
    gpus = await nvml.gpus()
    received: list[HealthEvent] = []
    registered = asyncio.Event()

    async def consume() -> None:
        async for ev in nvml.events(ready=registered):
            received.append(ev)
            if len(received) == 2:
                return

    task = asyncio.create_task(consume())
    await asyncio.wait_for(registered.wait(), 2)  # events from now on are seen
    with nvml_sim.node.mutate() as state:
        state.inject_xid(5, 48)
        state.inject_ecc(2, "dbe")  # DBE event, then XID 48
    await asyncio.wait_for(task, 2)
    assert received[0] == HealthEvent(5, gpus[5].uuid, EventKind.XID, xid=48, data=48)
    assert received[1].kind is EventKind.DOUBLE_BIT_ECC
    assert received[1].gpu_index == 2
    await nvml.close()


async def test_cancelling_the_event_iterator_leaves_nothing_running(nvml_sim: sim.FakeNvmlLib) -> None:
    nvml = await RealNvml.open()
    registered = asyncio.Event()

    async def consume() -> None:
        async for _ in nvml.events(ready=registered):
            pass

    task = asyncio.create_task(consume())
    await asyncio.wait_for(registered.wait(), 2)  # the waiting thread is running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await nvml.close()
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert pending == []
    for t in [t for t in threading.enumerate() if t.name.startswith("nvml-events")]:
        await asyncio.to_thread(t.join, 4)  # it ends after its current wait slice
    assert not any(t.name.startswith("nvml-events") for t in threading.enumerate())


def test_mig_config_changes_reach_only_event_sets_that_asked(nvml_sim: sim.FakeNvmlLib) -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig_es = _event_set(0, mask=pynvml.nvmlEventTypeXidCriticalError | 0x100)
    xid_only = _event_set(0)
    pynvml.nvmlDeviceSetMigMode(h, 1)
    with nvml_sim.node.mutate() as state:
        state.reset_gpu(0)
    gi = pynvml.nvmlDeviceCreateGpuInstance(h, 19)
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
    first = pynvml.nvmlEventSetWait_v2(mig_es, 0)
    second = pynvml.nvmlEventSetWait_v2(mig_es, 0)
    assert (first.eventType, first.gpuInstanceId, first.computeInstanceId) == (0x100, gi_id, 0xFFFFFFFF)
    assert (second.eventType, second.gpuInstanceId, second.computeInstanceId) == (0x100, gi_id, 0)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(xid_only, 0)
    assert pynvml.nvmlDeviceGetSupportedEventTypes(h) & 0x100
    t4 = sim.install("t4x4")
    assert t4 is not nvml_sim
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no MIG, so no MIG events to ask for
        _event_set(0, mask=0x100)

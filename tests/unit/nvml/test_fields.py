"""Issue 18: the typed NVML readings behind dcgm-exporter's extra fields, over the simulated library:
memory temperature, reserved framebuffer, NVLink totals, violation times, VBIOS/InfoROM versions, vGPU
licence status; and None (no series) where a GPU lacks the feature."""

from __future__ import annotations

import pytest

from gpunode.nvml.real import FIELDS, RealNvml
from gpunode.sim import nvml as sim


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_h100_reports_every_field(clock: Clock) -> None:
    lib = sim.install("dgx-h100", clock=clock)
    nvml = await RealNvml.open()
    try:
        clock.now += 100
        a = await nvml.telemetry(0)
        clock.now += 10
        b = await nvml.telemetry(0)
        info = (await nvml.gpus())[0]
    finally:
        await nvml.close()
        sim.uninstall()
    assert a.memory_temp_c is not None
    assert a.temperature_c is not None
    assert 20 <= a.memory_temp_c <= 110
    assert a.memory_reserved_mib is not None
    assert a.memory_reserved_mib > 0
    assert a.memory_used_mib is not None
    assert a.memory_free_mib is not None
    total = a.memory_used_mib + a.memory_free_mib + a.memory_reserved_mib
    assert abs(total - info.memory_total_mib) <= 2  # v2: reserved is apart from used (MiB rounding)
    for name in ("nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors"):
        assert getattr(a, name) == 0, name
    for name in ("nvlink_raw_kib", "violation_power_ns", "violation_low_util_ns"):
        before, after = getattr(a, name), getattr(b, name)
        assert before is not None, name
        assert after is not None, name
        assert after > before, name  # counters grow
    assert a.violation_sync_boost_ns == 0
    assert a.vgpu_license_status is None  # bare metal: no vGPU licensing
    assert info.vbios_version
    assert info.inforom_oem
    assert info.inforom_ecc
    assert info.inforom_image
    assert info.inforom_power is None  # the simulated H100 has no power InfoROM object
    # one field-values call per telemetry()
    assert lib.symbols["nvmlDeviceGetFieldValues"].calls == 2


async def test_a_gpu_without_hbm_or_nvlink_has_none(clock: Clock) -> None:
    sim.install("t4x4", clock=clock)
    nvml = await RealNvml.open()
    try:
        clock.now += 100
        t = await nvml.telemetry(0)
    finally:
        await nvml.close()
        sim.uninstall()
    assert t.memory_temp_c is None
    assert t.nvlink_raw_kib is None
    assert t.nvlink_crc_flit_errors is None
    assert t.violation_power_ns is not None  # every GPU has clock-event counters
    assert t.memory_reserved_mib is not None


def test_each_field_is_read_once() -> None:
    assert len({f for _, f in FIELDS}) == len(FIELDS)

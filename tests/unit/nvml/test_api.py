"""gpunode.nvml's typed API over the simulator: MIG operations, errors at the boundary, telemetry."""

from __future__ import annotations

import pytest

from gpunode.nvml import errors, mig
from gpunode.nvml.api import Placement
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def _open(preset: str = "dgx-a100", **kw: object) -> tuple[RealNvml, sim.FakeNvmlLib]:
    lib = sim.install(preset, **kw)  # type: ignore[arg-type]
    return await RealNvml.open(), lib


async def test_mig_layout_round_trip() -> None:
    nvml, lib = await _open()
    try:
        result = await nvml.set_mig_mode(1, True)
        assert (result.current, result.pending, result.activation) == (False, True, "reset-required")
        assert result.needs_reset
        with lib.node.mutate() as state:
            state.reset_gpu(1)
        assert (await nvml.mig_mode(1)).current  # type: ignore[union-attr]
        profiles = {p.name: p for p in await nvml.gi_profiles(1)}
        assert profiles["3g.20gb"].placements == (Placement(0, 4), Placement(4, 4))
        gi = await nvml.create_gpu_instance(1, mig.GI_3_SLICE, Placement(0, 4))
        assert (gi.id, gi.profile.name, gi.placement) == (1, "3g.20gb", Placement(0, 4))
        cis = {c.name: c for c in await nvml.ci_profiles(1, mig.GI_3_SLICE)}
        assert sorted(cis) == ["1c.3g.20gb", "2c.3g.20gb", "3g.20gb"]
        for _ in range(3):
            await nvml.create_compute_instance(1, gi.id, cis["1c.3g.20gb"].enum)
        with pytest.raises(errors.InsufficientResources):
            await nvml.create_compute_instance(1, gi.id, cis["1c.3g.20gb"].enum)
        devices = await nvml.mig_devices(1)
        assert [d.profile for d in devices] == ["1c.3g.20gb"] * 3
        assert all(d.memory_mib == 19968 and d.sm_count == 14 and d.gi_slices == 3 for d in devices)
        assert [d.ci_id for d in devices] == [0, 1, 2]
        assert devices[0].name == "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"
        assert [c.id for c in await nvml.compute_instances(1, gi.id)] == [0, 1, 2]
        with pytest.raises(errors.InUse):
            await nvml.destroy_gpu_instance(1, gi.id)
        for ci in await nvml.compute_instances(1, gi.id):
            await nvml.destroy_compute_instance(1, gi.id, ci.id)
        await nvml.destroy_gpu_instance(1, gi.id)
        assert await nvml.gpu_instances(1) == []
        with pytest.raises(errors.NotFound):
            await nvml.destroy_gpu_instance(1, gi.id)
    finally:
        await nvml.close()


async def test_hopper_applies_mig_mode_at_once() -> None:
    nvml, _ = await _open("hgx-h200")
    try:
        result = await nvml.set_mig_mode(0, True)
        assert (result.current, result.pending, result.activation) == (True, True, "applied")
        names = [p.name for p in await nvml.gi_profiles(0)]
        assert names == ["1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "1g.18gb+me", "1g.35gb"]
    finally:
        await nvml.close()


async def test_non_mig_gpu_answers_none_not_an_error() -> None:
    nvml, _ = await _open("t4x4")
    try:
        assert await nvml.mig_mode(0) is None
        assert await nvml.gpu_instances(0) == []
        assert await nvml.mig_devices(0) == []
        with pytest.raises(errors.NotSupported):
            await nvml.set_mig_mode(0, True)
    finally:
        await nvml.close()


async def test_bad_index_is_invalid_argument() -> None:
    nvml, _ = await _open("a30x4")
    try:
        with pytest.raises(errors.InvalidArgument):
            await nvml.telemetry(4)
    finally:
        await nvml.close()


async def _busy_gpu0(clock: Clock) -> RealNvml:
    """A seeded dgx-a100 created at t=1e6 with one process on GPU 0."""
    nvml, lib = await _open("dgx-a100", seed=7, clock=clock)
    with lib.node.mutate() as state:
        state.created = 1_000_000.0
        state.gpus[0].processes.append(sim.state.ProcessState(pid=4242, used_mib=2048))
    return nvml


async def test_telemetry_is_deterministic_under_a_seed_and_moves_over_time() -> None:
    clock = Clock(1_000_000.0)
    first = await _busy_gpu0(clock)
    try:
        clock.t += 30
        a = await first.telemetry(0)
        clock.t += 12
        b = await first.telemetry(0)
    finally:
        await first.close()
    assert a.processes == ((4242, 2048),)
    assert a.memory_used_mib is not None
    assert a.memory_used_mib >= 2048
    assert (a.gpu_util, a.power_w) != (b.gpu_util, b.power_w)
    assert b.energy_mj is not None
    assert a.energy_mj is not None
    assert b.energy_mj > a.energy_mj
    # 12 s at between idle and TDP: the energy step is plausible
    assert 55 * 12_000 <= b.energy_mj - a.energy_mj <= 400 * 12_000
    for t in (a, b):
        assert t.gpu_util is not None
        assert 0 <= t.gpu_util <= 100
        assert t.temperature_c is not None
        assert 25 <= t.temperature_c <= 90
        assert t.power_w is not None
        assert 55 <= t.power_w <= 400
        assert t.sm_clock_mhz is not None
        assert 0 < t.sm_clock_mhz <= 1410
        assert t.retired_pages_sbe is None  # Ampere remaps rows instead
        assert t.remapped_rows_uncorrectable == 0

    again = await _busy_gpu0(Clock(1_000_042.0))
    try:
        c = await again.telemetry(0)
    finally:
        await again.close()
    assert c == b


async def test_energy_counter_never_goes_backwards() -> None:
    clock = Clock(5_000.0)
    nvml, lib = await _open("dgx-h100", seed=3, clock=clock)
    with lib.node.mutate() as state:
        state.created = 5_000.0
    try:
        last = -1
        for _ in range(50):
            clock.t += 3.7
            energy = (await nvml.telemetry(2)).energy_mj
            assert energy is not None
            assert energy > last
            last = energy
    finally:
        await nvml.close()

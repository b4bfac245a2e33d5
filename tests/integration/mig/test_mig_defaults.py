"""Every shipped default layout, on every MIG-capable simulated node: it applies and asserts where the
GPU has its profiles, and is refused with the profile named where it does not; never a silent success."""

from __future__ import annotations

import pytest

from gpunode.mig.apply import Applier
from gpunode.mig.layouts import default_spec
from gpunode.mig.plan import Infeasible, current_devices
from gpunode.mig.selection import SelectionError, desired_per_gpu
from gpunode.mig.state import identity, read_states
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim
from gpunode.sim.mig_reset import SimResetter

# preset -> layouts that must apply there (a floor: more may)
MUST_APPLY = {
    "dgx-a100": {"all-disabled", "all-enabled", "all-balanced", "all-1g.5gb", "all-1g.5gb.me", "all-2g.10gb",
                 "all-3g.20gb", "all-4g.20gb", "all-7g.40gb", "all-1g.10gb"},
    "dgx-a100-80gb": {"all-balanced", "all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb", "all-2g.20gb",
                      "all-3g.40gb", "all-4g.40gb", "all-7g.80gb"},
    "dgx-h100": {"all-balanced", "all-1g.10gb", "all-1g.20gb", "all-2g.20gb", "all-3g.40gb", "all-7g.80gb"},
    "hgx-h200": {"all-balanced", "all-1g.18gb", "all-1g.18gb.me", "all-1g.35gb", "all-2g.35gb", "all-3g.71gb",
                 "all-4g.71gb", "all-7g.141gb"},
    "a30x4": {"all-balanced", "all-1g.6gb", "all-1g.6gb.me", "all-2g.12gb", "all-2g.12gb.me", "all-4g.24gb"},
    "mixed": {"all-disabled", "all-balanced", "all-1g.10gb", "all-7g.80gb"},
    "h100-nvl": {"all-balanced", "all-1g.12gb", "all-1g.12gb.me", "all-1g.24gb", "all-2g.24gb", "all-3g.47gb",
                 "all-4g.47gb", "all-7g.94gb"},
    # every Blackwell entry of the default config (the GPU Operator's) for B200 and GB200
    "dgx-b200": {"all-disabled", "all-enabled", "all-balanced", "all-1g.23gb", "all-1g.23gb.me",
                 "all-1g.45gb", "all-2g.45gb", "all-3g.90gb", "all-4g.90gb", "all-7g.180gb"},
    "gb200-nvl4": {"all-disabled", "all-enabled", "all-balanced", "all-1g.23gb", "all-1g.23gb.me",
                   "all-1g.47gb", "all-2g.47gb", "all-3g.93gb", "all-4g.93gb", "all-7g.186gb"},
}  # fmt: skip


@pytest.mark.parametrize("preset", sorted(MUST_APPLY))
async def test_every_default_layout_applies_or_is_refused_by_name(preset: str) -> None:
    spec = default_spec()
    lib = sim.install(preset)
    nvml = await RealNvml.open()
    applied: set[str] = set()
    try:
        gpus = await nvml.gpus()
        ids = [identity(g) for g in gpus]
        applier = Applier(nvml, SimResetter(lib.node))
        for name, entries in spec.configs.items():
            try:
                chosen = desired_per_gpu(name, entries, ids)
            except SelectionError:
                continue  # for other products (its filters match no GPU here)
            refused = ""
            try:
                await applier.apply(name, entries)
            except Infeasible as exc:
                refused = str(exc)
            if refused:
                # Only ever because this GPU lacks a profile the layout names; placements never fail.
                assert "unknown MIG profile" in refused, f"{name}: {refused}"
                continue
            assert (await applier.check(name, entries)).empty, name
            states = await read_states(nvml, gpus)
            for index, want in chosen.items():
                have = current_devices(states[index]) if want.mig_enabled else {}
                assert have == dict(want.devices), f"{name} on GPU {index}: {have} != {dict(want.devices)}"
                assert states[index].mode_current == want.mig_enabled
            applied.add(name)
    finally:
        await nvml.close()
        sim.uninstall()
    assert MUST_APPLY[preset] <= applied, sorted(MUST_APPLY[preset] - applied)

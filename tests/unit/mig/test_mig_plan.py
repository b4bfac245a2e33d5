"""The MIG planner, table by table, with every plan applied to the simulator's MIG rules.

GPU states come from the simulator's product tables (agents/gpunode/sim/nvml/presets.py, which follow
shared/reference/mig.md §5). Each feasible plan is executed against the simulated driver's state
machine (overlaps, compute-slice totals, media engines, CI placements), read back, and re-planned: the
result must be the desired devices and an empty plan.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from gpunode.api.mig_profiles import parse_profile
from gpunode.mig import plan as mp
from gpunode.nvml import mig
from gpunode.nvml.api import CiProfile, GiProfile, Placement
from gpunode.sim.nvml import codes
from gpunode.sim.nvml import presets as pr
from gpunode.sim.nvml.state import SimNodeState

A100 = pr.A100_SXM4_40GB
A100_80 = pr.A100_SXM4_80GB
H100 = pr.H100_SXM5_80GB
H200 = pr.H200_SXM_141GB
A30 = pr.A30
T4 = pr.TESLA_T4
MIG_PRODUCTS = [A100, A100_80, pr.A100_PCIE_80GB, H100, H200, A30]
PRESET_OF = {
    A100.key: "dgx-a100",
    A100_80.key: "dgx-a100-80gb",
    pr.A100_PCIE_80GB.key: "mixed",
    H100.key: "dgx-h100",
    H200.key: "hgx-h200",
    A30.key: "a30x4",
    T4.key: "t4x4",
}

BALANCED = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


# -- helpers --------------------------------------------------------------------------------------------
def gi_profiles(product: pr.Product, *, listed: bool = True) -> tuple[GiProfile, ...]:
    """The product's GI profiles as NVML reports them (placements only when `listed`)."""
    return tuple(
        GiProfile(
            enum=spec.enum,
            id=spec.profile_id,
            name=mig.gi_profile_name(spec.enum, product.memory_mib * 2**20, spec.memory_mib),
            slices=spec.compute_slices,
            instance_count=spec.max_count,
            sm_count=spec.sm_count,
            memory_mib=spec.memory_mib,
            copy_engines=spec.copy_engines,
            decoders=spec.decoders,
            encoders=spec.encoders,
            jpeg=spec.jpeg,
            ofa=spec.ofa,
            placements=tuple(Placement(s, spec.memory_slices) for s in spec.starts) if listed else (),
        )
        for spec in product.gi_profiles
    )


def gpu_state(
    product: pr.Product,
    index: int = 0,
    *,
    mode: bool = True,
    pending: bool | None = None,
    instances: tuple[mp.GiState, ...] = (),
    processes: tuple[int, ...] = (),
    listed: bool = False,
) -> mp.GpuMigState:
    return mp.GpuMigState(
        index=index,
        name=product.name,
        mig_capable=product.mig_capable,
        mode_current=mode and product.mig_capable,
        mode_pending=(mode if pending is None else pending) and product.mig_capable,
        reset_for_mode=product.mig_needs_reset,
        compute_slices=product.compute_slices,
        memory_slices=product.memory_slices,
        gi_profiles=gi_profiles(product, listed=listed),
        ci_profiles={},
        instances=instances,
        processes=processes,
    )


class Driver:
    """One GPU of the simulated driver (its MIG rules), that plans are executed against."""

    def __init__(self, product: pr.Product, *, mode: bool = True) -> None:
        self.product = product
        self.node = SimNodeState.new(PRESET_OF[product.key])
        self.node.gpus[0].mig_current = self.node.gpus[0].mig_pending = int(mode)
        self.profiles = {p.enum: p for p in gi_profiles(product)}

    def state(self, processes: tuple[int, ...] = ()) -> mp.GpuMigState:
        st = self.node.gpus[0]
        instances = tuple(
            mp.GiState(
                gi.id,
                self.profiles[gi.profile],
                gi.start,
                gi.size,
                tuple(mp.CiState(ci.id, ci.profile, ci.size, ci.start) for ci in gi.cis),
            )
            for gi in st.gis
        )
        return replace(
            gpu_state(self.product, mode=bool(st.mig_current), pending=bool(st.mig_pending)),
            instances=instances,
            processes=processes,
        )

    def create(self, enum: int, start: int, cis: Sequence[tuple[int, int]] = ()) -> int:
        rc, gi_id = self.node.create_gi(0, enum, start)
        assert rc == codes.SUCCESS
        for ci_enum, ci_start in cis:
            assert self.node.create_ci(0, gi_id, ci_enum, ci_start)[0] == codes.SUCCESS
        return gi_id

    def apply(self, plan: mp.GpuPlan) -> None:
        for gi_id, ci_id in plan.destroy:
            if ci_id is None:
                assert self.node.destroy_gi(0, gi_id) == codes.SUCCESS, plan.describe()
            else:
                assert self.node.destroy_ci(0, gi_id, ci_id) == codes.SUCCESS, plan.describe()
        if plan.set_mode is not None:
            assert self.node.set_mig_mode(0, int(plan.set_mode))[0] == codes.SUCCESS
        if plan.reset:
            assert self.node.reset_gpu(0) == codes.SUCCESS
        for gi_id, ci in plan.create_cis:
            assert self.node.create_ci(0, gi_id, ci.profile_enum, ci.start)[0] == codes.SUCCESS
        for gi in plan.create:
            rc, gi_id = self.node.create_gi(0, gi.profile_enum, gi.start, size=gi.size)
            assert rc == codes.SUCCESS, (plan.describe(), gi)
            for ci in gi.cis:
                assert self.node.create_ci(0, gi_id, ci.profile_enum, ci.start)[0] == codes.SUCCESS, ci

    def converge(self, devices: Mapping[str, int]) -> mp.GpuPlan:
        """Plan, apply (re-planning after a mode change, as the executor does), and check the result."""
        desired = mp.DesiredGpu(True, devices)
        first = mp.plan_gpu(self.state(), desired)
        self.apply(first)
        if first.set_mode is not None or first.reset:
            self.apply(mp.plan_gpu(self.state(), desired))
        after = self.state()
        assert mp.current_devices(after) == canonical(devices)
        assert mp.plan_gpu(after, desired).empty
        return first


def canonical(devices: Mapping[str, int]) -> dict[str, int]:
    """Desired names spelled the way current_devices spells them."""
    return {str(parse_profile(k)): v for k, v in devices.items() if v > 0}


def layout(plan: mp.GpuPlan) -> list[str]:
    """Compact form of the created GIs: name@start:size, sub-CIs as [1c@0,...]."""
    out = []
    for gi in plan.create:
        text = f"{gi.name}@{gi.start}:{gi.size}"
        if any(ci.name != gi.name for ci in gi.cis):
            text += "[" + ",".join(f"{ci.slices}c@{ci.start}" for ci in gi.cis) + "]"
        out.append(text)
    return out


# -- derived placements ---------------------------------------------------------------------------------
@pytest.mark.parametrize("product", MIG_PRODUCTS, ids=lambda p: p.key)
def test_derived_placements_equal_the_tables(product: pr.Product) -> None:
    derived = mp.derived_placements(gpu_state(product, listed=False))
    expected = {
        spec.enum: tuple(Placement(s, spec.memory_slices) for s in spec.starts)
        for spec in product.gi_profiles
    }
    assert derived == expected


def test_listed_placements_are_used_as_given() -> None:
    assert mp.derived_placements(gpu_state(A100, listed=True)) == mp.derived_placements(gpu_state(A100))


# -- feasible layouts from an empty GPU -----------------------------------------------------------------
FEASIBLE = [
    ("a100-balanced", A100, BALANCED, ["1g.5gb@0:1", "1g.5gb@1:1", "2g.10gb@2:2", "3g.20gb@4:4"]),
    ("a100-7x1g", A100, {"1g.5gb": 7}, [f"1g.5gb@{s}:1" for s in range(7)]),
    ("a100-4g+3g", A100, {"4g.20gb": 1, "3g.20gb": 1}, ["4g.20gb@0:4", "3g.20gb@4:4"]),
    (
        "a100-1c.3g-x6",
        A100,
        {"1c.3g.20gb": 6},
        ["3g.20gb@0:4[1c@0,1c@1,1c@2]", "3g.20gb@4:4[1c@0,1c@1,1c@2]"],
    ),
    ("a100-1g.10gb-x4", A100, {"1g.10gb": 4}, ["1g.10gb@0:2", "1g.10gb@2:2", "1g.10gb@4:2", "1g.10gb@6:2"]),
    ("a100-7g", A100, {"7g.40gb": 1}, ["7g.40gb@0:8"]),
    ("a100-3x2g", A100, {"2g.10gb": 3}, ["2g.10gb@0:2", "2g.10gb@2:2", "2g.10gb@4:2"]),
    ("a100-2c+2c+3c-in-7g", A100, {"2c.7g.40gb": 2, "3c.7g.40gb": 1}, ["7g.40gb@0:8[2c@0,2c@2,3c@4]"]),
    ("a100-mixed-ci-sizes", A100, {"2c.3g.20gb": 1, "1c.3g.20gb": 1}, ["3g.20gb@4:4[2c@0,1c@2]"]),
    (
        "a100-full-and-sub-of-3g",
        A100,
        {"3g.20gb": 1, "1c.3g.20gb": 2},
        ["3g.20gb@0:4[1c@0,1c@1]", "3g.20gb@4:4"],
    ),
    ("a100-me+6x1g", A100, {"1g.5gb+me": 1, "1g.5gb": 6}, None),
    ("a100-4g+1g.10gb+1g.5gb", A100, {"4g.20gb": 1, "1g.10gb": 1, "1g.5gb": 2}, None),
    ("a100-80gb-balanced", A100_80, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, None),
    ("h100-balanced", H100, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, None),
    ("h200-3g.71gb", H200, {"3g.71gb": 2}, ["3g.71gb@0:4", "3g.71gb@4:4"]),
    ("h200-1g.18gb", H200, {"1g.18gb": 7}, None),
    ("h200-1g.35gb-x4", H200, {"1g.35gb": 4}, ["1g.35gb@0:2", "1g.35gb@2:2", "1g.35gb@4:2", "1g.35gb@6:2"]),
    ("h200-7g.141gb", H200, {"7g.141gb": 1}, ["7g.141gb@0:8"]),
    ("h200-balanced", H200, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}, None),
    ("a30-2g+2x1g", A30, {"2g.12gb": 1, "1g.6gb": 2}, ["1g.6gb@0:1", "1g.6gb@1:1", "2g.12gb@2:2"]),
    ("a30-4g", A30, {"4g.24gb": 1}, ["4g.24gb@0:4"]),
    ("a30-me+3x1g", A30, {"1g.6gb+me": 1, "1g.6gb": 3}, None),
    ("a30-1c.4g-x4", A30, {"1c.4g.24gb": 4}, ["4g.24gb@0:4[1c@0,1c@1,1c@2,1c@3]"]),
    ("a30-2c.4g-x2", A30, {"2c.4g.24gb": 2}, ["4g.24gb@0:4[2c@0,2c@2]"]),
    ("a30-1c.2g-x4", A30, {"1c.2g.12gb": 4}, ["2g.12gb@0:2[1c@0,1c@1]", "2g.12gb@2:2[1c@0,1c@1]"]),
    ("explicit-zero-count-ignored", A100, {"7g.40gb": 1, "1g.5gb": 0}, ["7g.40gb@0:8"]),
    ("sub-profile-spelled-in-full", A100, {"3c.3g.20gb": 1}, ["3g.20gb@4:4"]),
]


@pytest.mark.parametrize(
    ("product", "devices", "expected"), [c[1:] for c in FEASIBLE], ids=[c[0] for c in FEASIBLE]
)
def test_feasible_layout_is_placed_and_accepted_by_the_driver(
    product: pr.Product, devices: dict[str, int], expected: list[str] | None
) -> None:
    plan = mp.plan_gpu(gpu_state(product), mp.DesiredGpu(True, devices))
    if expected is not None:
        assert layout(plan) == expected
    assert plan.set_mode is None
    assert not plan.reset
    assert not plan.destroy
    assert plan.disrupted_processes == ()
    Driver(product).converge(devices)


def test_mig_guide_19_19_14_9_is_always_placed() -> None:
    """The guide's `-cgi 19,19,14,9` fails with automatic placement; explicit placements never do."""
    devices = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    for _ in range(3):
        plan = mp.plan_gpu(gpu_state(A100), mp.DesiredGpu(True, devices))
        starts = {(gi.name, gi.start) for gi in plan.create}
        assert ("3g.20gb", 4) in starts  # 3g at 0 would leave no room for 2g + 1g + 1g
        Driver(A100).converge(devices)


# -- infeasible layouts ---------------------------------------------------------------------------------
INFEASIBLE = [
    ("3x3g", A100, {"3g.20gb": 3}, "3 x 3g.20gb: at most 2 on this GPU"),
    ("2x4g", A100, {"4g.20gb": 2}, "2 x 4g.20gb: at most 1 on this GPU"),
    ("4g+3g+1g", A100, {"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1}, "needs 8 compute slices"),
    ("8x1g", A100, {"1g.5gb": 8}, "8 x 1g.5gb: at most 7 on this GPU"),
    (
        "unknown-2g.20gb-on-40gb",
        A100,
        {"2g.20gb": 1},
        "unknown MIG profile 2g.20gb; this GPU has "
        "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb",
    ),
    ("2x1g+me", A100, {"1g.5gb+me": 2}, "2 x 1g.5gb+me: at most 1 on this GPU"),
    ("memory-slices", A100, {"1g.10gb": 4, "1g.5gb": 1}, "needs 9 memory slices"),
    ("1c.3g-x9", A100, {"1c.3g.20gb": 9}, "9 x 1c.3g.20gb need 3 x 3g.20gb GPU instances: at most 2"),
    ("bad-ci-size", A100, {"3c.4g.20gb": 1}, "a 4g.20gb GPU instance offers compute instances 1c, 2c, 4g"),
    ("syntax", A100, {"1g.5": 1}, "is not a MIG profile"),
    ("a30-3x2g", A30, {"2g.12gb": 3}, "3 x 2g.12gb: at most 2 on this GPU"),
    ("a30-two-media-owners", A30, {"1g.6gb+me": 1, "2g.12gb+me": 1}, "only one GPU instance can own"),
    ("a30-sub-of-me", A30, {"1c.2g.12gb+me": 1}, "offers compute instances 2g.12gb+me"),
    ("a30-a100-name", A30, {"1g.5gb": 1}, "unknown MIG profile 1g.5gb; this GPU has 1g.6gb"),
    ("h200-old-name", H200, {"3g.70gb": 1}, "unknown MIG profile 3g.70gb; this GPU has 1g.18gb"),
]


@pytest.mark.parametrize(
    ("product", "devices", "reason"), [c[1:] for c in INFEASIBLE], ids=[c[0] for c in INFEASIBLE]
)
def test_infeasible_layout_names_the_reason(
    product: pr.Product, devices: dict[str, int], reason: str
) -> None:
    with pytest.raises(mp.Infeasible) as err:
        mp.plan_gpu(gpu_state(product, index=3), mp.DesiredGpu(True, devices))
    assert reason in err.value.reason
    assert err.value.gpu == 3
    assert str(err.value).startswith(f"GPU 3 ({product.name}): ")


def test_placement_conflict_is_reported_concretely() -> None:
    """A (made-up) table where 2g fits only where 3g must go: no count or slice rule catches it."""
    squeezed = ("2g.10gb", "3g.20gb")
    profiles = tuple(
        replace(p, placements=(Placement(0, p.placements[0].size),)) if p.name in squeezed else p
        for p in gi_profiles(A100)
    )
    state = replace(gpu_state(A100), gi_profiles=profiles)
    with pytest.raises(mp.Infeasible, match=r"no placement \{0\}:2 fits 2g.10gb with 3g.20gb @0:4"):
        mp.plan_gpu(state, mp.DesiredGpu(True, {"3g.20gb": 1, "2g.10gb": 1}))


def test_listed_ci_profiles_restrict_the_sizes() -> None:
    g3 = next(p for p in gi_profiles(A100) if p.name == "3g.20gb")
    only_full = {g3.enum: (CiProfile(mig.CI_3_SLICE, g3.enum, "3g.20gb", 3, 1, 42),)}
    state = replace(gpu_state(A100), ci_profiles=only_full)
    with pytest.raises(mp.Infeasible, match=r"offers compute instances 3g\.20gb"):
        mp.plan_gpu(state, mp.DesiredGpu(True, {"1c.3g.20gb": 1}))
    assert layout(mp.plan_gpu(state, mp.DesiredGpu(True, {"3g.20gb": 1}))) == ["3g.20gb@4:4"]


# -- incremental changes --------------------------------------------------------------------------------
def built(product: pr.Product, devices: Mapping[str, int]) -> Driver:
    driver = Driver(product)
    driver.converge(devices)
    return driver


def test_same_layout_is_an_empty_plan() -> None:
    driver = built(A100, BALANCED)
    plan = mp.plan_gpu(driver.state(processes=(42,)), mp.DesiredGpu(True, BALANCED))
    assert plan.empty
    assert plan.disrupted_processes == ()
    assert mp.plan_node([driver.state()], {0: mp.DesiredGpu(True, BALANCED)}).gpus == ()


def test_balanced_to_four_1g_keeps_the_3g_and_the_1g_instances() -> None:
    driver = built(A100, BALANCED)
    before = {gi.profile.name: gi.id for gi in driver.state().instances if gi.profile.name != "1g.5gb"}
    ones = sorted(gi.id for gi in driver.state().instances if gi.profile.name == "1g.5gb")
    target = {"1g.5gb": 4, "3g.20gb": 1}
    plan = mp.plan_gpu(driver.state(processes=(7,)), mp.DesiredGpu(True, target))
    assert plan.keep == tuple(sorted([before["3g.20gb"], *ones]))
    assert [gi for gi, ci in plan.destroy if ci is None] == [before["2g.10gb"]]
    assert layout(plan) == ["1g.5gb@2:1", "1g.5gb@3:1"]  # where the 2g was
    assert plan.disrupted_processes == (7,)
    driver.apply(plan)
    assert mp.current_devices(driver.state()) == target
    assert mp.plan_gpu(driver.state(), mp.DesiredGpu(True, target)).empty


def test_extra_instance_destroys_only_it() -> None:
    driver = built(A100, {"1g.5gb": 7})
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"1g.5gb": 6}))
    assert len(plan.keep) == 6
    assert [gi for gi, ci in plan.destroy if ci is None] == [13]  # the 1g at memory slice 6
    assert plan.destroy == ((13, 0), (13, None))
    assert not plan.create
    assert not plan.create_cis
    driver.apply(plan)
    assert mp.current_devices(driver.state()) == {"1g.5gb": 6}


def test_growing_touches_nothing_and_disrupts_no_one() -> None:
    driver = built(A100, {"3g.20gb": 1})
    target = {"3g.20gb": 1, "2g.10gb": 2}
    plan = mp.plan_gpu(driver.state(processes=(5,)), mp.DesiredGpu(True, target))
    assert not plan.destroy
    assert plan.disrupted_processes == ()
    assert len(plan.keep) == 1
    driver.apply(plan)
    assert mp.current_devices(driver.state()) == target


def test_sub_profile_growth_adds_cis_to_kept_instances() -> None:
    driver = built(A100, {"1c.3g.20gb": 2})
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"1c.3g.20gb": 6}))
    assert not plan.destroy
    assert len(plan.create_cis) == 1  # the kept GI fills up to three 1c CIs ...
    assert layout(plan) == ["3g.20gb@0:4[1c@0,1c@1,1c@2]"]  # ... and one more GI takes the rest
    driver.apply(plan)
    assert mp.current_devices(driver.state()) == {"1c.3g.20gb": 6}


def test_other_ci_grouping_with_the_same_devices_is_kept() -> None:
    driver = Driver(A100)
    driver.create(mig.GI_3_SLICE, 0, [(mig.CI_2_SLICE, 0)])
    driver.create(mig.GI_3_SLICE, 4, [(mig.CI_1_SLICE, 0), (mig.CI_1_SLICE, 1), (mig.CI_1_SLICE, 2)])
    desired = mp.DesiredGpu(True, {"2c.3g.20gb": 1, "1c.3g.20gb": 3})
    assert mp.plan_gpu(driver.state(), desired).empty


def test_keeps_that_block_the_layout_are_dropped() -> None:
    driver = Driver(A100)
    blocking = driver.create(mig.GI_1_SLICE, 3, [(mig.CI_1_SLICE, 0)])
    harmless = driver.create(mig.GI_1_SLICE, 6, [(mig.CI_1_SLICE, 0)])
    target = {"4g.20gb": 1, "1g.5gb": 2}
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, target))
    assert plan.keep == (harmless,)
    assert [gi for gi, ci in plan.destroy if ci is None] == [blocking]
    assert layout(plan) == ["4g.20gb@0:4", "1g.5gb@5:1"]
    driver.apply(plan)
    assert mp.current_devices(driver.state()) == target


def test_no_keep_fits_then_the_gpu_is_rebuilt() -> None:
    driver = Driver(A100)
    driver.create(mig.GI_1_SLICE, 3, [(mig.CI_1_SLICE, 0)])
    target = {"4g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1}
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, target))
    assert plan.keep == ()
    driver.apply(plan)
    assert mp.current_devices(driver.state()) == target


def test_orphan_instance_is_adopted_by_creating_its_ci() -> None:
    driver = Driver(A100)
    orphan = driver.create(mig.GI_3_SLICE, 4)
    assert mp.current_devices(driver.state()) == {}
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"3g.20gb": 1}))
    assert plan.keep == (orphan,)
    assert not plan.destroy
    assert plan.create_cis == ((orphan, mp.CiCreate(mig.CI_3_SLICE, 0, 3, "3g.20gb")),)
    driver.apply(plan)
    assert mp.current_devices(driver.state()) == {"3g.20gb": 1}


def test_orphan_instance_nobody_wants_is_destroyed() -> None:
    driver = Driver(A100)
    orphan = driver.create(mig.GI_1_SLICE, 0)
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"7g.40gb": 1}))
    assert plan.destroy == ((orphan, None),)
    driver.apply(plan)
    assert mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"7g.40gb": 1})).empty


def test_instance_with_unwanted_cis_is_rebuilt() -> None:
    driver = built(A100, {"1c.7g.40gb": 7})
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"2c.7g.40gb": 3}))
    assert plan.keep == ()
    assert plan.destroy[-1] == (0, None)
    assert [ci for gi, ci in plan.destroy[:-1]] == list(range(7))
    driver.apply(plan)
    assert mp.current_devices(driver.state()) == {"2c.7g.40gb": 3}


def test_all_enabled_with_no_devices_destroys_everything() -> None:
    driver = built(A100, BALANCED)
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {}))
    assert plan.set_mode is None
    assert len([1 for _, ci in plan.destroy if ci is None]) == 4
    driver.apply(plan)
    assert driver.state().instances == ()


def test_destroy_lists_cis_before_gis() -> None:
    driver = built(A100, {"1c.3g.20gb": 3, "2g.10gb": 2})
    plan = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"7g.40gb": 1}))
    kinds = [ci is None for _, ci in plan.destroy]
    assert kinds == sorted(kinds)
    assert kinds.count(False) == 5


# -- mode -----------------------------------------------------------------------------------------------
def test_ampere_enable_sets_the_mode_and_resets_only_that_gpu() -> None:
    plan = mp.plan_gpu(gpu_state(A100, mode=False), mp.DesiredGpu(True, BALANCED))
    assert plan.set_mode is True
    assert plan.reset is True
    assert len(plan.create) == 4  # computed already, so infeasibility is known before the change
    driver = Driver(A100, mode=False)
    driver.converge(BALANCED)
    assert driver.node.gpus[0].mig_current == 1


def test_hopper_enable_needs_no_reset() -> None:
    plan = mp.plan_gpu(gpu_state(H100, mode=False), mp.DesiredGpu(True, {"7g.80gb": 1}))
    assert plan.set_mode is True
    assert plan.reset is False
    Driver(H100, mode=False).converge({"7g.80gb": 1})


def test_enable_with_impossible_devices_fails_before_the_mode_changes() -> None:
    with pytest.raises(mp.Infeasible, match=r"3 x 3g\.20gb"):
        mp.plan_gpu(gpu_state(A100, mode=False), mp.DesiredGpu(True, {"3g.20gb": 3}))


def test_pending_enable_only_needs_the_reset() -> None:
    plan = mp.plan_gpu(gpu_state(A100, mode=False, pending=True), mp.DesiredGpu(True, {}))
    assert plan.set_mode is None
    assert plan.reset is True


@pytest.mark.parametrize("product", [A100, H100], ids=lambda p: p.key)
def test_disable_destroys_everything_then_sets_the_mode(product: pr.Product) -> None:
    devices = {"1g.5gb": 7} if product is A100 else {"1g.10gb": 7}
    driver = built(product, devices)
    plan = mp.plan_gpu(driver.state(processes=(11, 12)), mp.DesiredGpu(False))
    assert plan.set_mode is False
    assert plan.reset is product.mig_needs_reset
    assert len(plan.destroy) == 14
    assert not plan.create
    assert plan.disrupted_processes == (11, 12)
    driver.apply(plan)
    assert driver.node.gpus[0].mig_current == 0


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
def test_right_mode_gets_no_mode_step_and_no_reset(enabled: bool) -> None:
    plan = mp.plan_gpu(gpu_state(A100, mode=enabled, processes=(3,)), mp.DesiredGpu(enabled, {}))
    assert plan.empty
    assert plan.set_mode is None
    assert not plan.reset


def test_mode_only_plans_just_the_mode_step() -> None:
    plan = mp.plan_gpu(gpu_state(A100, mode=False), mp.DesiredGpu(True, BALANCED), mode_only=True)
    assert (plan.set_mode, plan.reset, plan.create) == (True, True, ())
    driver = built(A100, BALANCED)
    assert mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"7g.40gb": 1}), mode_only=True).empty
    disable = mp.plan_gpu(driver.state(), mp.DesiredGpu(False), mode_only=True)
    assert disable.set_mode is False
    assert len([1 for _, ci in disable.destroy if ci is None]) == 4


def test_non_capable_gpu() -> None:
    assert mp.plan_gpu(gpu_state(T4), mp.DesiredGpu(False)).empty
    with pytest.raises(mp.Infeasible, match=r"GPU 0 \(Tesla T4\): MIG is not supported"):
        mp.plan_gpu(gpu_state(T4), mp.DesiredGpu(True, {}))


# -- node level -----------------------------------------------------------------------------------------
def test_node_plan_leaves_absent_and_converged_gpus_alone() -> None:
    converged = built(A100, BALANCED).state()
    states = [replace(converged, index=0), gpu_state(A100, 1, mode=False), gpu_state(A100, 2)]
    plan = mp.plan_node(states, {0: mp.DesiredGpu(True, BALANCED), 1: mp.DesiredGpu(True, {"7g.40gb": 1})})
    assert [g.index for g in plan.gpus] == [1]
    assert plan.gpus[0].reset
    assert not plan.empty


def test_node_plan_raises_for_the_first_infeasible_gpu() -> None:
    states = [gpu_state(A100, i) for i in range(4)]
    desired = {
        0: mp.DesiredGpu(True, BALANCED),
        3: mp.DesiredGpu(True, {"2g.20gb": 1}),
        2: mp.DesiredGpu(True, {"9g.1gb": 1}),
    }
    with pytest.raises(mp.Infeasible) as err:
        mp.plan_node(states, desired)
    assert err.value.gpu == 2


def test_node_plan_per_gpu_resolution_on_a_mixed_node() -> None:
    states = [gpu_state(A100, 0), gpu_state(A100_80, 1), gpu_state(T4, 2)]
    plan = mp.plan_node(
        states,
        {
            0: mp.DesiredGpu(True, {"1g.10gb": 4}),
            1: mp.DesiredGpu(True, {"1g.10gb": 7}),
            2: mp.DesiredGpu(False),
        },
    )
    assert [len(g.create) for g in plan.gpus] == [4, 7]
    assert [g.create[0].size for g in plan.gpus] == [2, 1]  # the same name, two different profiles


def test_unknown_gpu_index() -> None:
    with pytest.raises(mp.Infeasible, match=r"GPU 5 .*no such GPU"):
        mp.plan_node([gpu_state(A100)], {5: mp.DesiredGpu(False)})


def test_describe() -> None:
    driver = Driver(A100)
    keep = driver.create(mig.GI_3_SLICE, 4, [(mig.CI_3_SLICE, 0)])
    drop = driver.create(mig.GI_1_SLICE, 0, [(mig.CI_1_SLICE, 0)])
    plan = mp.plan_node(
        [driver.state(processes=(99,))], {0: mp.DesiredGpu(True, {"3g.20gb": 1, "2g.10gb": 1})}
    )
    assert plan.describe() == [
        f"GPU 0: keep GI {keep} (3g.20gb @4:4); destroy GI {drop} (1g.5gb @0:1); "
        "create 2g.10gb @2:2 [CI 2g.10gb @0]; disrupts pids 99"
    ]
    assert mp.NodePlan().describe() == ["nothing to do"]
    mode = mp.plan_gpu(gpu_state(A100, mode=False), mp.DesiredGpu(True, {"1c.2g.10gb": 2}))
    assert mode.describe() == [
        "GPU 0: enable MIG; reset GPU; create 2g.10gb @4:2 [CI 1c.2g.10gb @0, CI 1c.2g.10gb @1]"
    ]


def test_current_devices_counts_cis_and_skips_empty_instances() -> None:
    driver = Driver(A100)
    driver.create(mig.GI_7_SLICE, 0, [(mig.CI_2_SLICE, 0), (mig.CI_2_SLICE, 2), (mig.CI_3_SLICE, 4)])
    assert mp.current_devices(driver.state()) == {"2c.7g.40gb": 2, "3c.7g.40gb": 1}
    driver = Driver(A100)
    driver.create(mig.GI_4_SLICE, 0, [(mig.CI_4_SLICE, 0)])
    driver.create(mig.GI_2_SLICE, 4)
    assert mp.current_devices(driver.state()) == {"4g.20gb": 1}


def test_plans_are_deterministic() -> None:
    driver = built(A100, BALANCED)
    a = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"1g.5gb": 5, "1c.2g.10gb": 2}))
    b = mp.plan_gpu(driver.state(), mp.DesiredGpu(True, {"1c.2g.10gb": 2, "1g.5gb": 5}))
    assert a == b


# -- speed ----------------------------------------------------------------------------------------------
DEFAULT_LAYOUTS = [
    BALANCED,
    {"1g.5gb": 7},
    {"1c.3g.20gb": 6},
    {"4g.20gb": 1, "3g.20gb": 1},
    {"2g.10gb": 3},
    {"1g.10gb": 4},
    {"7g.40gb": 1},
    {"1g.5gb+me": 1, "1g.5gb": 6},
]


def test_planning_eight_gpus_is_fast() -> None:
    states = [gpu_state(A100, i, mode=i % 2 == 0) for i in range(8)]
    desired = {i: mp.DesiredGpu(True, d) for i, d in enumerate(DEFAULT_LAYOUTS)}
    samples = []
    for _ in range(60):
        t0 = time.perf_counter()
        plan = mp.plan_node(states, desired)
        samples.append(time.perf_counter() - t0)
    assert len(plan.gpus) == 8
    assert statistics.median(samples) < 0.020  # about 1 ms on a laptop core; 5 ms is the target


# -- exactness ------------------------------------------------------------------------------------------
def driver_can_hold(node: SimNodeState, items: list[int], low: int = -1) -> bool:
    """Exhaustive search with the simulated driver's own rules: can GIs of these enums coexist?"""
    if not items:
        return True
    spec = node.product(0).gi_profile(items[0])
    assert spec is not None
    same = len(items) > 1 and items[1] == items[0]
    for start in spec.starts:
        if start <= low:
            continue
        rc, gi_id = node.create_gi(0, items[0], start, emit=False)
        if rc != codes.SUCCESS:
            continue
        ok = driver_can_hold(node, items[1:], start if same else -1)
        node.destroy_gi(0, gi_id)
        if ok:
            return True
    return False


@pytest.mark.parametrize("product", [A100, A30], ids=lambda p: p.key)
def test_feasibility_agrees_with_exhaustive_search_on_the_driver(product: pr.Product) -> None:
    """Every combination of full profiles: the planner says yes exactly when some placement exists."""
    profiles = gi_profiles(product)
    state = gpu_state(product)
    driver = Driver(product)
    checked = feasible = 0
    for counts in itertools.product(*(range(p.instance_count + 2) for p in profiles)):
        if sum(n * p.slices for n, p in zip(counts, profiles, strict=True)) > product.compute_slices + 1:
            continue
        devices = {p.name: n for n, p in zip(counts, profiles, strict=True) if n}
        items = [p.enum for n, p in zip(counts, profiles, strict=True) for _ in range(n)]
        expected = driver_can_hold(driver.node, items)
        try:
            plan = mp.plan_gpu(state, mp.DesiredGpu(True, devices))
        except mp.Infeasible:
            assert not expected, devices
        else:
            assert expected, devices
            assert sorted(gi.profile_enum for gi in plan.create) == sorted(items)
            fresh = Driver(product)
            fresh.apply(plan)
            assert mp.current_devices(fresh.state()) == canonical(devices)
            feasible += 1
        checked += 1
    assert feasible > 10
    assert checked > feasible


TRANSITIONS = [
    *DEFAULT_LAYOUTS,
    {"1c.3g.20gb": 1, "2c.3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2},
    {"1c.7g.40gb": 7},
]


@pytest.mark.parametrize("source", range(len(TRANSITIONS)), ids=lambda i: f"from{i}")
def test_every_transition_is_one_plan_the_driver_accepts(source: int) -> None:
    """From each layout to each other: one plan converges, and a GI that stays is never recreated."""
    for target in TRANSITIONS:
        driver = built(A100, TRANSITIONS[source])
        before = driver.state()
        plan = mp.plan_gpu(before, mp.DesiredGpu(True, target))
        driver.apply(plan)
        after = driver.state()
        assert mp.current_devices(after) == canonical(target), (TRANSITIONS[source], target)
        assert mp.plan_gpu(after, mp.DesiredGpu(True, target)).empty
        assert plan.empty == (target == TRANSITIONS[source])
        old = {gi.id: gi for gi in before.instances}
        now = {gi.id: gi for gi in after.instances}
        grown = {gi_id for gi_id, _ in plan.create_cis}
        for gi_id in plan.keep:
            assert now[gi_id].start == old[gi_id].start
            assert gi_id in grown or now[gi_id] == old[gi_id]

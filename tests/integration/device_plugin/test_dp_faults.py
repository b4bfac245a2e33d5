"""Faults leave no stale state: what the kubelet holds matches the node after a lost GPU, a MIG layout
change made meanwhile, an NVML error during a rebuild, and the GPU's return (issue 14, item 9)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from gpunode.nvml import errors
from gpunode.sim import nvml as sim
from gpunode.sim.kubelet import FakeKubelet
from helpers.faults import all_balanced, apply_layout_async, node_mig_view
from helpers.waiting import SkewedClock, until

Starter = Any  # the start_plugin fixture (see conftest.py)

MIXED = {"mig_strategy": "mixed"}


def kubelet_view(kubelet: FakeKubelet) -> dict[str, set[str]]:
    """The device IDs per resource the kubelet holds (a resource whose stream ended holds none)."""
    return {
        name: set(p.devices)
        for name, p in kubelet.plugins.items()
        if not p.ended and p.devices and name.startswith("nvidia.com/mig-")
    }


def mismatch(kubelet: FakeKubelet, state: Path) -> str:
    """Why the kubelet does not hold what the node has (the same devices, those of lost GPUs Unhealthy),
    or ""."""
    want, on_lost = node_mig_view(state)
    got = kubelet_view(kubelet)
    if got != want:
        return f"devices differ: kubelet {_counts(got)}, node {_counts(want)}"
    healthy = {i for name in got for i in kubelet.healthy(name)}
    if healthy & on_lost:
        return f"{len(healthy & on_lost)} devices of a lost GPU are Healthy"
    return ""


def _counts(view: dict[str, set[str]]) -> dict[str, int]:
    return {name: len(ids) for name, ids in sorted(view.items())}


async def matches(kubelet: FakeKubelet, state: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (why := mismatch(kubelet, state)) != "":
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.05)


async def test_layout_change_beside_a_lost_gpu_is_advertised_and_the_gpu_recovers(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    r = await start_plugin(
        overrides=MIXED, prepare=all_balanced, recovery_period=0.5, wait="nvidia.com/mig-3g.20gb"
    )
    await matches(kubelet, r.state, timeout=5)
    with r.mutate() as st:
        st.lose(7)
    await matches(kubelet, r.state, timeout=5)  # GPU 7's four devices Unhealthy
    assert len({i for p in kubelet_view(kubelet).values() for i in p} - kubelet_healthy(kubelet)) == 4

    await apply_layout_async(r.state, tmp_path, "seven-1g-on-0-6")
    await matches(kubelet, r.state, timeout=10)
    view = kubelet_view(kubelet)
    assert len(view["nvidia.com/mig-1g.5gb"]) == 7 * 7 + 2  # GPU 7 keeps its two 1g (Unhealthy)
    assert len(view["nvidia.com/mig-2g.10gb"]) == len(view["nvidia.com/mig-3g.20gb"]) == 1

    with r.mutate() as st:
        st.restore(7)
    restored = time.monotonic()
    await kubelet.wait_for(lambda: not any(kubelet.unhealthy(name) for name in kubelet_view(kubelet)), 5)
    # Healthy again after the hold-down (0.5 s), not after some later rebuild
    assert time.monotonic() - restored < 3.0
    assert mismatch(kubelet, r.state) == ""


def kubelet_healthy(kubelet: FakeKubelet) -> set[str]:
    return {i for name in kubelet_view(kubelet) for i in kubelet.healthy(name)}


async def test_a_failed_rebuild_is_retried_until_it_succeeds(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    r = await start_plugin(overrides=MIXED, prepare=all_balanced, wait="nvidia.com/mig-3g.20gb")
    nvml = r.plugin.nvml
    assert nvml is not None
    failures = {"left": 3}
    real = nvml.mig_devices

    async def flaky(index: int) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise errors.NvmlError("Unknown Error", 999)
        return await real(index)

    nvml.mig_devices = flaky  # type: ignore[method-assign]
    await apply_layout_async(r.state, tmp_path, "seven-1g-on-0-6")
    # no further MIG event comes: the rebuild that failed three times is retried until it succeeds
    await matches(kubelet, r.state, timeout=15)
    assert failures["left"] == 0


async def test_a_gpu_lost_at_start_is_advertised_once_it_returns(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    def balanced_and_lost(st: sim.SimNodeState) -> None:
        all_balanced(st)
        st.lose(7)

    clock = SkewedClock()
    r = await start_plugin(
        overrides=MIXED,
        prepare=balanced_and_lost,
        recovery_period=0.3,
        wait="nvidia.com/mig-3g.20gb",
        clock=clock,
    )
    assert len(kubelet_view(kubelet)["nvidia.com/mig-3g.20gb"]) == 7  # nothing known of GPU 7 yet
    with r.mutate() as st:
        st.restore(7)
    await matches(kubelet, r.state, timeout=5)
    assert len(kubelet_view(kubelet)["nvidia.com/mig-3g.20gb"]) == 8


async def test_a_layout_being_applied_is_advertised_only_once_complete(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    r = await start_plugin(overrides=MIXED, prepare=all_balanced, wait="nvidia.com/mig-3g.20gb")
    before = kubelet_view(kubelet)
    seen: dict[str, set[frozenset[str]]] = defaultdict(set)

    def record() -> bool:  # called at every change the kubelet sees
        for name in before.keys() | kubelet_view(kubelet).keys():
            seen[name].add(frozenset(kubelet_view(kubelet).get(name, ())))
        return False

    watching = asyncio.create_task(kubelet.wait_for(record, timeout=60))
    await apply_layout_async(r.state, tmp_path, "seven-1g-on-0-6")
    await matches(kubelet, r.state, timeout=10)
    watching.cancel()
    after = kubelet_view(kubelet)
    for name, views in seen.items():  # each resource went from the old list straight to the new one
        assert views <= {frozenset(before.get(name, ())), frozenset(after.get(name, ()))}, name


async def test_a_layout_changed_just_before_its_gpu_was_lost_is_read_once_it_is_back(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    r = await start_plugin(overrides=MIXED, prepare=all_balanced, wait="nvidia.com/mig-3g.20gb")
    with r.mutate() as st:  # GPU 3 loses its 3g instance and, before the plugin reads it, falls off
        gi = next(g for g in st.gpus[3].gis if g.size == 4)
        assert st.destroy_ci(3, gi.id, gi.cis[0].id) == 0
        assert st.destroy_gi(3, gi.id) == 0
        st.lose(3)
    # the MIG events' rebuild has run, GPU 3 lost: advertised as last read, to be read once it answers
    await until(lambda: 3 in r.plugin.resources.stale, timeout=10)
    assert len(kubelet_view(kubelet)["nvidia.com/mig-3g.20gb"]) == 8
    with r.mutate() as st:
        st.restore(3)
    await matches(kubelet, r.state, timeout=5)  # read again once it answers: seven 3g instances
    assert len(kubelet_view(kubelet)["nvidia.com/mig-3g.20gb"]) == 7

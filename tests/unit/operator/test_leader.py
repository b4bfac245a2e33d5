"""gpunode.operator.leader against an in-memory Lease store with resourceVersions and an injected clock:
one leader at a time, renewals, take-over only after expiry, stepping down, release."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gpunode.kube.api import KubeConflict, KubeUnavailable
from gpunode.kube.cluster import LeaseRecord
from gpunode.operator.leader import LeaderElector


class Store:
    """One Lease with optimistic concurrency, as the API server keeps it."""

    def __init__(self) -> None:
        self.lease: LeaseRecord | None = None
        self.version = 0
        self.down = False
        self.writes = 0

    def _check(self) -> None:
        if self.down:
            raise KubeUnavailable("get", "leases", "down")

    async def get_lease(self, name: str, namespace: str | None = None) -> LeaseRecord | None:
        self._check()
        return self.lease

    async def create_lease(self, lease: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.lease is not None:
            raise KubeConflict("create", "leases", "exists", status=409)
        return self._store(lease)

    async def update_lease(self, lease: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.lease is None or lease.resource_version != self.lease.resource_version:
            raise KubeConflict("update", "leases", "stale", status=409)
        return self._store(lease)

    def _store(self, lease: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.writes += 1
        self.lease = replace(lease, resource_version=str(self.version))
        return self.lease


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(store: Store, clock: Clock, identity: str) -> LeaderElector:
    return LeaderElector(
        store,
        name="gpunode-operator",
        namespace="gpunode",
        identity=identity,
        lease_duration=15,
        renew_deadline=10,
        retry_period=2,
        clock=clock,
        wall_clock=clock,
    )


async def test_first_candidate_leads_the_second_waits() -> None:
    store, clock = Store(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert a.is_leader
    assert not b.is_leader
    for _ in range(20):  # a renews every 2 s: b never gets it
        clock.now += 2
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        assert not (a.is_leader and b.is_leader)
    assert store.lease is not None
    assert store.lease.holder == "a"


async def test_take_over_only_after_the_lease_expires_and_the_old_leader_steps_down() -> None:
    store, clock = Store(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b sees the lease now
    clock.now += 10  # a stopped renewing (dead or cut off)
    assert not a.is_leader  # past the renew deadline: a no longer counts itself leader
    assert not await b.try_acquire_or_renew()  # not expired yet for b
    clock.now += 5
    assert await b.try_acquire_or_renew()
    assert store.lease is not None
    assert (store.lease.holder, store.lease.transitions) == ("b", 1)
    assert not await a.try_acquire_or_renew()  # a comes back: b holds it
    assert not a.is_leader


async def test_racing_candidates_one_wins() -> None:
    store, clock = Store(), Clock()
    candidates = [elector(store, clock, name) for name in "abcde"]
    results = await asyncio.gather(*(c.try_acquire_or_renew() for c in candidates))
    assert results.count(True) == 1


async def test_an_api_outage_makes_the_leader_step_down_within_the_deadline() -> None:
    store, clock = Store(), Clock()
    a = elector(store, clock, "a")
    assert await a.try_acquire_or_renew()
    store.down = True
    clock.now += 4
    assert not await a.try_acquire_or_renew()
    assert a.is_leader  # still within the renew deadline
    clock.now += 6
    assert not a.is_leader


async def test_run_leads_then_releases() -> None:
    store = Store()
    a = LeaderElector(
        store,
        name="l",
        namespace="n",
        identity="a",
        lease_duration=1.5,
        renew_deadline=1.0,
        retry_period=0.01,
    )
    ran = asyncio.Event()

    async def lead() -> None:
        ran.set()
        await asyncio.sleep(0.05)

    await asyncio.wait_for(a.run(lead), 5)
    assert ran.is_set()
    assert store.lease is not None
    assert store.lease.holder == ""  # released: a follower takes over at once
    b = LeaderElector(
        store,
        name="l",
        namespace="n",
        identity="b",
        lease_duration=1.5,
        renew_deadline=1.0,
        retry_period=0.01,
    )
    assert await b.try_acquire_or_renew()


async def test_run_stops_leading_when_the_lease_is_taken() -> None:
    store = Store()
    a = LeaderElector(
        store,
        name="l",
        namespace="n",
        identity="a",
        lease_duration=1.5,
        renew_deadline=1.0,
        retry_period=0.01,
    )
    cancelled = asyncio.Event()
    leading = asyncio.Event()

    async def lead() -> None:
        leading.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    runner = asyncio.create_task(a.run(lead))
    await asyncio.wait_for(leading.wait(), 5)
    assert store.lease is not None
    store.lease = replace(store.lease, holder="intruder")  # as if it expired and b took over
    await asyncio.wait_for(runner, 5)
    assert cancelled.is_set()
    assert not a.is_leader


def test_timings_are_checked() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(
            Store(),
            name="l",
            namespace="n",
            identity="a",
            lease_duration=10,
            renew_deadline=9,
            retry_period=2,
        )

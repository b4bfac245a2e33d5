"""Leader election through a ``coordination.k8s.io/v1`` Lease: two replicas never both write.

Each candidate reads the Lease and takes it only when it is free or expired; every write carries the
resourceVersion it read, so of two candidates racing for it one gets 409 and stays a follower. Expiry
is judged on the candidate's own clock from when it *saw* the Lease change (as client-go does), so
clock skew between machines does not matter. The leader renews every ``retry_period``; one that cannot
renew for ``renew_deadline`` (shorter than the lease duration) steps down before anyone else may take
over. The clock and sleep are injectable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

from gpunode.common.logging import get_logger
from gpunode.kube.api import KubeConflict, KubeError
from gpunode.kube.cluster import LeaseRecord

__all__ = ["LeaderElector", "LeaseApi", "micro_time"]


class LeaseApi(Protocol):
    """The calls the elector makes (satisfied by :class:`gpunode.kube.client.Kube`)."""

    async def get_lease(self, name: str, namespace: str | None = None) -> LeaseRecord | None: ...

    async def create_lease(self, lease: LeaseRecord) -> LeaseRecord: ...

    async def update_lease(self, lease: LeaseRecord) -> LeaseRecord: ...


def micro_time(epoch: float) -> str:
    """Kubernetes MicroTime text for a wall-clock time."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        kube: LeaseApi,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not (retry_period < renew_deadline and renew_deadline + retry_period < lease_duration):
            # a leader notices a failed renewal within a retry period; it must step down before the lease
            # can expire for the others
            raise ValueError(
                "leader election needs retry period < renew deadline and "
                "renew deadline + retry period < lease duration"
            )
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._observed: tuple[str, float] | None = None  # (resourceVersion, local time it was first seen)
        self._renewed_at: float | None = None  # local time of our last successful acquire/renew
        self.log = get_logger("gpunode.operator.leader")

    @property
    def is_leader(self) -> bool:
        """Held, and renewed within the renew deadline."""
        return self._renewed_at is not None and self._clock() - self._renewed_at < self.renew_deadline

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: create, renew or take over the Lease; True when we hold it afterwards. API
        failures count as not holding it (the caller's deadline decides when to step down)."""
        start = self._clock()
        try:
            lease = await self.kube.get_lease(self.name, self.namespace)
            now_text = micro_time(self._wall())
            if lease is None:
                mine = LeaseRecord(
                    self.name, self.namespace, self.identity, int(self.lease_duration), now_text, now_text, 0
                )
                got = await self.kube.create_lease(mine)
            else:
                if self._observed is None or self._observed[0] != lease.resource_version:
                    self._observed = (lease.resource_version, start)
                if lease.holder == self.identity:
                    got = await self.kube.update_lease(replace(lease, renew_time=now_text))
                else:
                    expired = not lease.holder or start >= self._observed[1] + (
                        lease.duration_s or self.lease_duration
                    )
                    if not expired:
                        self._renewed_at = None
                        return False
                    got = await self.kube.update_lease(
                        replace(
                            lease,
                            holder=self.identity,
                            duration_s=int(self.lease_duration),
                            acquire_time=now_text,
                            renew_time=now_text,
                            transitions=lease.transitions + 1,
                        )
                    )
                    self.log.info(
                        "leader_acquired", lease=self.name, identity=self.identity, previous=lease.holder
                    )
        except KubeConflict:
            return False  # someone else wrote it first; judged again next round
        except KubeError as exc:
            self.log.warning("leader_lease_failed", lease=self.name, error=str(exc))
            return False
        self._observed = (got.resource_version, start)
        self._renewed_at = start
        return True

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Wait to be elected, run ``lead()`` while leading, return when leadership is lost (``lead`` is
        cancelled first) or ``lead`` returns. The Lease is released when ``lead`` ends normally."""
        while not await self.try_acquire_or_renew():
            await self._sleep(self.retry_period)
        task = asyncio.ensure_future(lead())
        try:
            while not task.done():
                await self._sleep(self.retry_period)
                if task.done():
                    break
                if not await self.try_acquire_or_renew() and not self.is_leader:
                    self.log.warning("leader_lost", lease=self.name, identity=self.identity)
                    return
            await task
            await self.release()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._renewed_at = None

    async def release(self) -> None:
        """Give the Lease up (holder cleared) if we hold it, so a follower takes over at once."""
        with contextlib.suppress(KubeError):
            lease = await self.kube.get_lease(self.name, self.namespace)
            if lease is not None and lease.holder == self.identity:
                await self.kube.update_lease(replace(lease, holder="", renew_time=micro_time(self._wall())))
        self._renewed_at = None

"""gpunode.operator.queue: de-duplication, held keys, per-key backoff, against an injected clock."""

from __future__ import annotations

import asyncio

import pytest

from gpunode.operator.queue import QueueShutDown, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[WorkQueue[str], Clock]:
    clock = Clock()
    return WorkQueue(base_delay=0.1, max_delay=3.0, clock=clock), clock


def test_a_key_is_queued_once() -> None:
    q, _ = make()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert [q.pop_ready(), q.pop_ready(), q.pop_ready()] == ["a", "b", None]


def test_earlier_due_time_wins() -> None:
    q, clock = make()
    q.add("a", delay=5)
    q.add("a", delay=1)
    q.add("a", delay=10)
    assert q.next_due() == 101.0
    assert q.pop_ready() is None
    clock.now = 101.0
    assert q.pop_ready() == "a"
    assert q.next_due() is None  # the stale entries are gone


def test_a_held_key_is_not_handed_out_twice_and_comes_back_when_done() -> None:
    q, _ = make()
    q.add("a")
    assert q.pop_ready() == "a"
    q.add("a")
    q.add("a")
    assert q.pop_ready() is None
    q.done("a")
    assert q.pop_ready() == "a"
    q.done("a")
    assert q.pop_ready() is None


@pytest.mark.parametrize(("failures", "delays"), [(6, [0.1, 0.2, 0.4, 0.8, 1.6, 3.0])])
def test_backoff_grows_per_key_and_resets(failures: int, delays: list[float]) -> None:
    q, clock = make()
    got = []
    for _ in range(failures):
        got.append(q.retry("a"))
        clock.now = q.next_due() or clock.now
        assert q.pop_ready() == "a"
        q.done("a")
    assert got == pytest.approx(delays)
    assert q.retry("b") == pytest.approx(0.1)  # another key has its own count
    q.forget("a")
    assert q.failures("a") == 0
    assert q.retry("a") == pytest.approx(0.1)


async def test_get_waits_for_the_due_time_and_for_adds() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("later", delay=0.05)
    waiter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.add("now")
    assert await asyncio.wait_for(waiter, 1) == "now"
    assert await asyncio.wait_for(q.get(), 1) == "later"
    q.shutdown()
    with pytest.raises(QueueShutDown):
        await q.get()

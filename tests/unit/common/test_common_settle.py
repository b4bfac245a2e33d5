"""settle(): a burst of MIG events is waited out, but not for ever."""

from __future__ import annotations

import asyncio

from gpunode.common.runtime import settle


async def _events(event: asyncio.Event, every: float, count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(every)
        event.set()


async def test_returns_once_quiet() -> None:
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    event.set()
    burst = asyncio.create_task(_events(event, 0.02, 10))  # a change every 20 ms for 0.2 s
    t0 = loop.time()
    await settle(event, quiet=0.1, cap=5.0)
    took = loop.time() - t0
    assert burst.done()  # not before the burst was over ...
    assert 0.28 <= took < 1.0  # ... and soon after: 0.2 s of events, then 0.1 s quiet
    assert not event.is_set()


async def test_returns_at_the_cap_when_it_never_gets_quiet() -> None:
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    endless = asyncio.create_task(_events(event, 0.02, 1000))
    t0 = loop.time()
    await settle(event, quiet=0.1, cap=0.4)
    took = loop.time() - t0
    endless.cancel()
    assert 0.38 <= took < 0.8

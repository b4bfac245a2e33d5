"""NVML event waits on their own thread, delivered as an async iterator.

The event set is created on the NVML thread; waits run in short slices on a dedicated thread so a
blocked wait never holds up other NVML calls, and cancelling the iterator never frees the event set
while a wait is still using it (the free is queued behind the wait on the same thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

E = TypeVar("E")

WAIT_SLICE_MS = 500


class EventPump(Generic[E]):
    def __init__(
        self,
        nvml_pool: Executor,
        create: Callable[[], Any],
        wait: Callable[[Any, int], E | None],
        free: Callable[[Any], None],
        slice_ms: int = WAIT_SLICE_MS,
    ) -> None:
        self._nvml_pool = nvml_pool
        self._create = create
        self._wait = wait
        self._free = free
        self._slice_ms = slice_ms

    async def run(self) -> AsyncIterator[E]:
        loop = asyncio.get_running_loop()
        event_set = await loop.run_in_executor(self._nvml_pool, self._create)
        waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml-events")
        try:
            while True:
                event = await loop.run_in_executor(waiter, self._wait, event_set, self._slice_ms)
                if event is not None:
                    yield event
        finally:
            # Runs after any wait still in flight on the same single thread.
            waiter.submit(self._free, event_set)
            waiter.shutdown(wait=False)

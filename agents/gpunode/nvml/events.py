"""NVML event waits on their own thread, delivered as an async iterator.

The event set is created on the NVML thread; a dedicated daemon thread then waits on it in slices (so
an idle agent wakes only every few seconds) and hands each event to the event loop. Cancelling the
iterator stops the thread after its current slice; the thread frees the event set itself, so the set is
never freed while a wait still uses it. Being a daemon thread, it never delays the process's exit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Generic, TypeVar

S = TypeVar("S")  # the event set
E = TypeVar("E")  # an event

WAIT_SLICE_MS = 2000


class EventPump(Generic[S, E]):
    def __init__(
        self,
        nvml_pool: Executor,
        create: Callable[[], S],
        wait: Callable[[S, int], E | None],
        free: Callable[[S], None],
        slice_ms: int = WAIT_SLICE_MS,
    ) -> None:
        self._nvml_pool = nvml_pool
        self._create = create
        self._wait = wait
        self._free = free
        self._slice_ms = slice_ms

    async def run(self, ready: asyncio.Event | None = None) -> AsyncIterator[E]:
        loop = asyncio.get_running_loop()
        event_set = await loop.run_in_executor(self._nvml_pool, self._create)
        if ready is not None:
            ready.set()
        queue: asyncio.Queue[tuple[E | None, BaseException | None]] = asyncio.Queue()
        stop = threading.Event()

        def deliver(item: E | None, error: BaseException | None) -> bool:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (item, error))
            except RuntimeError:  # the loop is gone
                return False
            return True

        def pump() -> None:
            try:
                while not stop.is_set():
                    try:
                        event = self._wait(event_set, self._slice_ms)
                    except Exception as exc:
                        deliver(None, exc)
                        return
                    if event is not None and not stop.is_set() and not deliver(event, None):
                        return
            finally:
                self._free(event_set)

        thread = threading.Thread(target=pump, name="nvml-events", daemon=True)
        thread.start()
        try:
            while True:
                event, error = await queue.get()
                if error is not None:
                    raise error
                assert event is not None
                yield event
        finally:
            stop.set()

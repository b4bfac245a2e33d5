"""A de-duplicating work queue with per-key backoff, for the operator's reconcilers.

A key is queued at most once: adding a queued key again keeps the earlier due time; adding a key a
worker holds marks it dirty, and it is queued again when the worker is done (never two workers on one
key). :meth:`WorkQueue.retry` queues a key after a delay growing from ``base_delay`` to ``max_delay``
(NVIDIA's controllers: 100 ms to 3 s); :meth:`WorkQueue.forget` resets it after a success. The clock
is injectable; :meth:`WorkQueue.pop_ready` and :meth:`WorkQueue.next_due` are the pure core,
:meth:`WorkQueue.get` waits on them. :func:`serve` is the worker loop every reconciler runs on a queue.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from gpunode.kube.api import KubeError

if TYPE_CHECKING:
    from gpunode.common.logging import Logger

__all__ = ["QueueShutDown", "WorkQueue", "serve"]

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """:meth:`WorkQueue.get` after :meth:`WorkQueue.shutdown`."""


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        base_delay: float = 0.1,
        max_delay: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._clock = clock
        self._heap: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}  # queued key -> when it is due (the heap may hold stale entries)
        self._active: set[K] = set()
        self._dirty: dict[K, float] = {}  # held keys added again -> the delay asked for
        self._failures: dict[K, int] = {}
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._due)

    def add(self, key: K, delay: float = 0.0) -> None:
        """Queue ``key`` (after ``delay`` seconds); a queued key keeps the earlier of the two due times."""
        if self._closed:
            return
        if key in self._active:
            self._dirty[key] = min(delay, self._dirty.get(key, delay))
            return
        due = self._clock() + max(0.0, delay)
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        self._wake.set()

    def retry(self, key: K) -> float:
        """Queue ``key`` again after its next backoff delay; returns the delay."""
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        delay = min(self.max_delay, self.base_delay * 2.0 ** (n - 1))
        self.add(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """A success: the next failure of ``key`` starts from ``base_delay`` again."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def next_due(self) -> float | None:
        """When the earliest queued key is due (clock time), None when nothing is queued."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_ready(self) -> K | None:
        """A due key, now held by the caller (call :meth:`done` with it), or None."""
        self._drop_stale()
        if not self._heap or self._heap[0][0] > self._clock():
            return None
        _, _, key = heapq.heappop(self._heap)
        del self._due[key]
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        """The worker holding ``key`` is finished; a key added meanwhile is queued now."""
        self._active.discard(key)
        if key in self._dirty:
            self.add(key, self._dirty.pop(key))

    async def get(self) -> K:
        """Wait for a due key; :class:`QueueShutDown` once shut down."""
        while True:
            if self._closed:
                raise QueueShutDown
            key = self.pop_ready()
            if key is not None:
                return key
            self._wake.clear()
            due = self.next_due()
            timeout = None if due is None else max(0.0, due - self._clock())
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def shutdown(self) -> None:
        self._closed = True
        self._wake.set()

    def _drop_stale(self) -> None:
        while self._heap:
            due, _, key = self._heap[0]
            if self._due.get(key) == due:
                return
            heapq.heappop(self._heap)


class _Pass(Protocol):
    @property
    def requeue_after(self) -> float | None: ...  # seconds until the next pass; None: events only


P = TypeVar("P", bound=_Pass)


async def serve(
    work: WorkQueue[K],
    reconcile: Callable[[], Awaitable[P]],
    *,
    log: Logger,
    retry_event: str,
    error_event: str,
    on_result: Callable[[P], None] = lambda result: None,
    on_pass: Callable[[float, bool], None] = lambda seconds, ok: None,
) -> None:
    """Take keys from ``work`` and reconcile, until cancelled: a success forgets the key's backoff and
    queues it again after ``requeue_after``; a Kubernetes error (``retry_event``) or a bug
    (``error_event``, logged with its traceback: it must not stop the controller) retries it with
    backoff. ``on_pass(seconds, ok)`` after every pass, ``on_result`` after a successful one."""
    while True:
        key = await work.get()
        started = time.perf_counter()
        try:
            result = await reconcile()
        except KubeError as exc:
            on_pass(time.perf_counter() - started, False)
            log.warning(retry_event, error=str(exc), retry_in_s=work.retry(key))
        except Exception:
            on_pass(time.perf_counter() - started, False)
            log.exception(error_event, retry_in_s=work.retry(key))
        else:
            on_pass(time.perf_counter() - started, True)
            work.forget(key)
            if result.requeue_after is not None:
                work.add(key, result.requeue_after)
            on_result(result)
        finally:
            work.done(key)

"""The ClusterPolicy loop's requeue rules, observed on its work queue against an injected clock: 5 s while
not ready, 45 s while no node carries NFD labels, nothing while ready (events only: a watch event brings
the next pass, and without one the loop waits without spinning); a failed pass is retried with backoff."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from gpunode.common.logging import get_logger
from gpunode.kube.api import KubeUnavailable
from gpunode.kube.cluster import ObjectEvent, ResourceKind
from gpunode.operator.controller import (
    KEY,
    NFD_REQUEUE_S,
    NOT_READY_REQUEUE_S,
    ReconcileResult,
    run_controller,
)
from gpunode.operator.queue import WorkQueue
from helpers.waiting import until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Events:
    """watch_objects: one queue of events per resource."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[ObjectEvent]] = {}

    def queue(self, plural: str) -> asyncio.Queue[ObjectEvent]:
        return self.queues.setdefault(plural, asyncio.Queue())

    async def watch_objects(self, kind: ResourceKind, **_: Any) -> AsyncIterator[ObjectEvent]:
        q = self.queue(kind.plural)
        while True:
            yield await q.get()


class Scripted:
    """A controller whose passes return the scripted results (an exception is raised), then ready."""

    def __init__(self, script: list[ReconcileResult | Exception]) -> None:
        self.kube = Events()
        self.cache = None
        self.namespace = "gpunode"
        self.log = get_logger("test")
        self.script = script
        self.calls = 0

    async def reconcile(self) -> ReconcileResult:
        self.calls += 1
        step = self.script.pop(0) if self.script else ReconcileResult(state="ready")
        if isinstance(step, Exception):
            raise step
        return step


class ObservedQueue(WorkQueue[str]):
    """A work queue on an injected clock that records every add with its delay, and lets the delay pass
    at once (the clock jumps to the due time), so the loop runs its whole script without waiting."""

    def __init__(self, clock: Clock, seen: list[tuple[str, Any]]) -> None:
        super().__init__(clock=clock)
        self.clock = clock
        self.seen = seen

    def add(self, key: str, delay: float = 0.0) -> None:
        super().add(key, delay)
        if key not in self._active:  # a held key is queued when its worker is done (add again then)
            self.seen.append(("queued", delay))
            self.clock.now += delay


async def run_script(
    script: list[ReconcileResult | Exception],
) -> tuple[Scripted, list[tuple[str, Any]], ObservedQueue, asyncio.Task[None]]:
    seen: list[tuple[str, Any]] = []
    work = ObservedQueue(Clock(), seen)
    controller = Scripted(script)
    task = asyncio.create_task(
        run_controller(controller, queue=work, on_result=lambda r: seen.append(("pass", r.state)))  # type: ignore[arg-type]
    )
    return controller, seen, work, task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_5_s_while_not_ready_45_s_without_nfd_labels_and_nothing_once_ready() -> None:
    script: list[ReconcileResult | Exception] = [
        ReconcileResult(state="notReady", requeue_after=NFD_REQUEUE_S),  # no node has NFD labels
        ReconcileResult(state="notReady", requeue_after=NOT_READY_REQUEUE_S),
        ReconcileResult(state="notReady", requeue_after=NOT_READY_REQUEUE_S),
        ReconcileResult(state="ready", requeue_after=None),
    ]
    controller, seen, work, task = await run_script(script)
    try:
        await until(lambda: controller.calls == 4 and len(seen) >= 8, 30)
        assert seen == [
            ("queued", 0.0),  # the first pass, at start
            ("pass", "notReady"),
            ("queued", 45.0),  # no node has NFD labels
            ("pass", "notReady"),
            ("queued", 5.0),
            ("pass", "notReady"),
            ("queued", 5.0),
            ("pass", "ready"),  # nothing queued after it: events only
        ]
        for _ in range(50):  # the loop waits for an event without spinning
            await asyncio.sleep(0)
        assert controller.calls == 4
        assert (len(work), work.next_due()) == (0, None)

        # an event of an owned DaemonSet (or of the policy) brings the next pass
        controller.kube.queue("daemonsets").put_nowait(ObjectEvent("MODIFIED", obj={}))
        await until(lambda: controller.calls == 5, 30)
        controller.kube.queue("clusterpolicies").put_nowait(ObjectEvent("MODIFIED", obj={}))
        await until(lambda: controller.calls == 6 and len(seen) == 12, 30)
        assert seen[8:] == [("queued", 0.0), ("pass", "ready"), ("queued", 0.0), ("pass", "ready")]
    finally:
        await stop(task)


async def test_a_failed_pass_is_retried_with_growing_backoff_then_forgotten() -> None:
    down = KubeUnavailable("list", "clusterpolicies", "connection refused")
    controller, seen, work, task = await run_script([down, down, down, ReconcileResult(state="ready")])
    try:
        await until(lambda: controller.calls == 4 and ("pass", "ready") in seen, 30)
        assert seen == [("queued", 0.0), ("queued", 0.1), ("queued", 0.2), ("queued", 0.4), ("pass", "ready")]
        assert (work.failures(KEY), work.next_due()) == (0, None)  # a success resets the backoff
    finally:
        await stop(task)


async def test_a_bug_in_a_pass_does_not_stop_the_loop() -> None:
    _, seen, _, task = await run_script([RuntimeError("a bug"), ReconcileResult(state="ready")])
    try:
        await until(lambda: ("pass", "ready") in seen, 30)
        assert seen == [("queued", 0.0), ("queued", 0.1), ("pass", "ready")]
        assert not task.done()
    finally:
        await stop(task)

"""gpunode.operator.cache: the owned objects as the watches report them; our own writes are not undone by
late events; a re-list drops what is gone; every change is reported; a failed watch is retried and its
kind counts as not synced meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from gpunode.kube.api import KubeForbidden
from gpunode.kube.cluster import DAEMON_SET, ObjectEvent, ResourceKind, resource_kind
from gpunode.operator.cache import OWNED_SELECTOR, ObjectCache
from gpunode.operator.states import key_of
from helpers.waiting import until

CONFIG_MAP = resource_kind("v1", "ConfigMap")


def ds(name: str, rv: int, image: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "gpunode", "resourceVersion": str(rv)},
        "spec": {"image": image},
    }


class Watches:
    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[ObjectEvent | Exception]] = {}
        self.calls: list[tuple[str, str | None, dict[str, str] | None]] = []

    def queue(self, plural: str) -> asyncio.Queue[ObjectEvent | Exception]:
        return self.queues.setdefault(plural, asyncio.Queue())

    async def watch_objects(
        self, kind: ResourceKind, *, namespace: str | None = None, labels: Any = None, **_: Any
    ) -> AsyncIterator[ObjectEvent]:
        self.calls.append((kind.plural, namespace, dict(labels) if labels else None))
        q = self.queue(kind.plural)
        while True:
            item = await q.get()
            if isinstance(item, Exception):
                raise item
            yield item


async def test_events_keep_the_cache_and_report_every_change() -> None:
    kube = Watches()
    changes: list[int] = []
    cache = ObjectCache(kube, namespace="gpunode", on_change=lambda: changes.append(1))
    task = asyncio.create_task(cache.run())
    try:
        cache.watch([DAEMON_SET, DAEMON_SET])
        await until(lambda: bool(kube.calls))
        assert kube.calls == [("daemonsets", "gpunode", dict(OWNED_SELECTOR))]  # one watch, selected
        assert not cache.synced(DAEMON_SET)
        q = kube.queue("daemonsets")
        q.put_nowait(ObjectEvent("SYNC", objects=(ds("a", 5), ds("b", 6))))
        await until(lambda: cache.synced(DAEMON_SET))
        assert sorted(k.name for k in cache.objects) == ["a", "b"]

        cache.store(ds("a", 9, image="ours"))  # our own write came back from the server
        q.put_nowait(ObjectEvent("MODIFIED", obj=ds("a", 7, image="older")))  # a late event: ignored
        q.put_nowait(ObjectEvent("DELETED", obj=ds("b", 10)))  # deleted, or its label removed
        await until(lambda: len(changes) == 2)
        assert cache.get(key_of(ds("a", 0))) == ds("a", 9, image="ours")
        assert cache.get(key_of(ds("b", 0))) is None

        q.put_nowait(ObjectEvent("SYNC", objects=(ds("c", 11),)))  # a re-list: a is gone too
        await until(lambda: len(changes) == 3)
        assert [k.name for k in cache.objects] == ["c"]
        cache.store({**ds("cm", 12), "apiVersion": "v1", "kind": "ConfigMap"})  # a kind not watched
        assert cache.of_kind(CONFIG_MAP) == []
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_failed_watch_is_retried_and_not_synced_meanwhile() -> None:
    kube = Watches()
    cache = ObjectCache(kube, namespace="gpunode", retry=(0.01, 0.02))
    task = asyncio.create_task(cache.run())
    try:
        cache.watch([DAEMON_SET])
        q = kube.queue("daemonsets")
        q.put_nowait(ObjectEvent("SYNC", objects=(ds("a", 1),)))
        await until(lambda: cache.synced(DAEMON_SET))
        q.put_nowait(KubeForbidden("watch", "daemonsets", "forbidden"))
        await until(lambda: "daemonsets" in cache.errors)
        assert not cache.synced(DAEMON_SET)  # the controller reads such objects itself meanwhile
        await until(lambda: len(kube.calls) == 2)  # watched again
        q.put_nowait(ObjectEvent("SYNC", objects=(ds("a", 2),)))
        await until(lambda: cache.synced(DAEMON_SET) and "daemonsets" not in cache.errors)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""The operator's cache of the objects it applies: one list-and-watch per kind, label-selected.

The controller asks for the kinds it renders (:meth:`ObjectCache.watch`); each gets a watch on the
objects labelled ``app.kubernetes.io/part-of=gpunode`` (namespaced kinds: in the operator's namespace
only), kept as JSON by :class:`~gpunode.operator.states.ObjectKey`. Every change calls ``on_change``, so
a hand edit, a deletion or a label removed (the object leaves the selection: a ``DELETED`` event) queues
a reconcile at once; the controller then judges the object from the cache without reading it again.
Objects the controller itself writes are stored at once (:meth:`ObjectCache.store`); resource versions
only move forward, so a late watch event of an older version does not undo that.

A watch that fails (403, a kind whose CRD is missing) is retried with a delay growing from 0.1 s to
30 s; its kind counts as not synced meanwhile and the controller reads such objects directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Protocol

from gpunode.common.logging import get_logger
from gpunode.kube.api import KubeError
from gpunode.kube.cluster import ObjectEvent, ResourceKind
from gpunode.operator.states import ObjectKey, key_of

__all__ = ["OWNED_SELECTOR", "ObjectCache", "WatchApi"]

OWNED_SELECTOR: Mapping[str, str] = {"app.kubernetes.io/part-of": "gpunode"}  # on every rendered object
RETRY = (0.1, 30.0)

Obj = dict[str, Any]


class WatchApi(Protocol):
    def watch_objects(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        server_timeout: int = 300,
        idle_timeout: float | None = None,
    ) -> AsyncIterator[ObjectEvent]: ...


def _older(version: str, than: str) -> bool:
    if version.isdecimal() and than.isdecimal():
        return int(version) < int(than)
    return False


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class ObjectCache:
    """See the module docstring. Run :meth:`run` as a task (the controller's loop does)."""

    def __init__(
        self,
        kube: WatchApi,
        *,
        namespace: str,
        labels: Mapping[str, str] = OWNED_SELECTOR,
        on_change: Callable[[], None] = lambda: None,
        retry: tuple[float, float] = RETRY,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.labels = dict(labels)
        self.on_change = on_change
        self.retry = retry
        self.objects: dict[ObjectKey, Obj] = {}
        self.errors: dict[str, KubeError] = {}  # resource -> why its watch is down
        self._synced: set[ResourceKind] = set()
        self._watched: set[ResourceKind] = set()
        self._start: asyncio.Queue[ResourceKind] = asyncio.Queue()
        self.log = get_logger("gpunode.operator.cache")

    def watch(self, kinds: Iterable[ResourceKind]) -> None:
        """Start watching the kinds not watched yet (their first list arrives later)."""
        for kind in kinds:
            if kind not in self._watched:
                self._watched.add(kind)
                self._start.put_nowait(kind)

    def synced(self, kind: ResourceKind) -> bool:
        """Whether the cache holds every selected object of ``kind`` (its watch is up)."""
        return kind in self._synced

    def get(self, key: ObjectKey) -> Obj | None:
        return self.objects.get(key)

    def of_kind(self, kind: ResourceKind) -> list[Obj]:
        return [o for k, o in self.objects.items() if _same_kind(k, kind)]

    def store(self, obj: Mapping[str, Any]) -> None:
        """An object as the API server returned it to our own write (unless a newer one is cached); of a
        kind not watched (the namespace, CRDs): nothing."""
        key = key_of(obj)
        if not any(_same_kind(key, kind) for kind in self._watched):
            return
        old = self.objects.get(key)
        if old is None or not _older(_version(obj), _version(old)):
            self.objects[key] = dict(obj)

    def forget(self, key: ObjectKey) -> None:
        """An object we deleted."""
        self.objects.pop(key, None)

    async def run(self) -> None:
        """Watch every kind asked for, until cancelled."""
        async with asyncio.TaskGroup() as group:
            while True:
                kind = await self._start.get()
                group.create_task(self._watch(kind), name=f"cache-{kind.plural}")

    async def _watch(self, kind: ResourceKind) -> None:
        first, cap = self.retry
        delay = first
        namespace = self.namespace if kind.namespaced else None
        while True:
            try:
                async for event in self.kube.watch_objects(kind, namespace=namespace, labels=self.labels):
                    delay = first
                    if self.errors.pop(kind.plural, None) is not None:
                        self.log.info("cache_watch_restored", resource=kind.plural)
                    self._on_event(kind, event)
            except KubeError as exc:
                self._synced.discard(kind)
                self.errors[kind.plural] = exc
                self.log.warning("cache_watch_failed", resource=kind.plural, error=str(exc), retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(cap, delay * 2)

    def _on_event(self, kind: ResourceKind, event: ObjectEvent) -> None:
        if event.type == "SYNC":
            listed = {key_of(o): o for o in event.objects}
            for key in [k for k in self.objects if _same_kind(k, kind) and k not in listed]:
                del self.objects[key]
            for key, obj in listed.items():
                self.objects[key] = dict(obj)
            self._synced.add(kind)
        elif event.obj is not None:
            key = key_of(event.obj)
            old = self.objects.get(key)
            if old is not None and _older(_version(event.obj), _version(old)):
                return  # we already stored a newer version (our own write)
            if event.type == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = dict(event.obj)
        self.on_change()


def _same_kind(key: ObjectKey, kind: ResourceKind) -> bool:
    return (key.api_version, key.kind) == (kind.api_version, kind.kind)

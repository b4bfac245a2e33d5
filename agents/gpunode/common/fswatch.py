"""Watching a directory with inotify (asyncinotify): no polling, raw events, no debounce.

Watch the directory, not the file: ConfigMap volumes update by swapping a ``..data`` symlink, the kubelet
recreates its socket, and editors replace files, all of which a watch on the file itself would miss.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DirEvent", "watch_directory"]


@dataclass(frozen=True)
class DirEvent:
    kind: str  # "created" or "deleted"
    name: str


async def watch_directory(directory: Path, *, writes: bool = False) -> AsyncIterator[DirEvent]:
    """Creations and deletions in a directory (inotify, no polling); with `writes`, finished writes too
    (kind "written"), for files edited in place rather than replaced."""
    from asyncinotify import Inotify, Mask

    mask = Mask.CREATE | Mask.MOVED_TO | Mask.DELETE | Mask.MOVED_FROM
    if writes:
        mask |= Mask.CLOSE_WRITE
    with Inotify() as ino:
        ino.add_watch(directory, mask)
        async for event in ino:
            if event.name is None:
                continue
            if event.mask & (Mask.CREATE | Mask.MOVED_TO):
                kind = "created"
            elif event.mask & Mask.CLOSE_WRITE:
                kind = "written"
            else:
                kind = "deleted"
            yield DirEvent(kind, event.name.name)

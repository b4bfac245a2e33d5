"""Registering with the kubelet, and noticing when the kubelet (or its socket directory) restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpunode._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

API_VERSION = "v1beta1"


class RegistrationFailed(Exception):
    """The kubelet was absent or refused the registration."""


async def register(kubelet_socket: Path, endpoint: str, resource_name: str, timeout: float = 5.0) -> None:
    """One `Registration/Register` call; the kubelet dials back our socket before it answers."""
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
    )
    try:
        async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise RegistrationFailed(f"{exc.code().name}: {exc.details()}") from None


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


class Backoff:
    """Retry delays for registering while the kubelet is away: quick at first, capped."""

    def __init__(self, first: float = 0.05, cap: float = 5.0, factor: float = 2.0) -> None:
        self.first, self.cap, self.factor = first, cap, factor
        self.delay = first

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.cap, self.delay * self.factor)
        return delay

    def reset(self) -> None:
        self.delay = self.first


async def sleep_or(event: asyncio.Event, seconds: float) -> bool:
    """Sleep, waking early when `event` is set; returns whether it was set."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True

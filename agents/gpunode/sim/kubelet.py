"""A fake kubelet: the real `Registration` gRPC service on a Unix socket, and a real plugin client.

It behaves like the kubelet's device manager where plugins can tell: it accepts `Register` only for
version v1beta1, dials the plugin's socket back and calls `GetDevicePluginOptions` before answering,
then keeps one `ListAndWatch` stream per resource and records every device list it receives. `restart()`
does what a kubelet restart does to the plugin directory: it stops, removes every socket, and creates
`kubelet.sock` anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpunode._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc


@dataclass
class PluginEndpoint:
    resource: str
    endpoint: str
    channel: grpc.aio.Channel
    stub: pb_grpc.DevicePluginStub
    options: pb.DevicePluginOptions
    registered_at: float
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    numa: dict[str, list[int]] = field(default_factory=dict)
    updates: int = 0
    stream_task: asyncio.Task[None] | None = None
    ended: bool = False


class FakeKubelet:
    def __init__(self, plugin_dir: Path) -> None:
        self.dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.plugins: dict[str, PluginEndpoint] = {}
        self.registrations: list[tuple[str, float]] = []
        self.refuse: str | None = None  # set to make Register fail with this message
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()

    async def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for plugin in self.plugins.values():
            await self._drop(plugin)
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def restart(self, downtime: float = 0.0) -> None:
        """Stop, wipe the plugin directory's sockets (as the kubelet does), start again."""
        await self.stop()
        for entry in self.dir.iterdir():
            if entry.is_socket() or entry.name == "kubelet.sock":
                entry.unlink()
        if downtime:
            await asyncio.sleep(downtime)
        await self.start()

    async def _drop(self, plugin: PluginEndpoint) -> None:
        if plugin.stream_task is not None:
            plugin.stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await plugin.stream_task
        await plugin.channel.close()

    # -- Registration service --------------------------------------------------------------------------
    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        if self.refuse is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.refuse)
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        if "/" not in request.resource_name or request.resource_name.startswith("kubernetes.io/"):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource {request.resource_name!r}"
            )
        channel = grpc.aio.insecure_channel(f"unix://{self.dir / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
        except grpc.aio.AioRpcError as exc:
            await channel.close()
            await context.abort(grpc.StatusCode.UNKNOWN, f"cannot reach plugin: {exc.details()}")
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._drop(old)
        plugin = PluginEndpoint(
            request.resource_name, request.endpoint, channel, stub, options, time.monotonic()
        )
        self.plugins[request.resource_name] = plugin
        self.registrations.append((request.resource_name, plugin.registered_at))
        plugin.stream_task = asyncio.create_task(
            self._watch(plugin), name=f"listandwatch:{request.resource_name}"
        )
        async with self._changed:
            self._changed.notify_all()
        return pb.Empty()

    async def _watch(self, plugin: PluginEndpoint) -> None:
        try:
            async for msg in plugin.stub.ListAndWatch(pb.Empty()):
                plugin.devices = {d.ID: d.health for d in msg.devices}
                plugin.numa = {d.ID: [n.ID for n in d.topology.nodes] for d in msg.devices}
                plugin.updates += 1
                async with self._changed:
                    self._changed.notify_all()
        except grpc.aio.AioRpcError:
            pass
        finally:
            plugin.ended = True  # the kubelet would mark every device unhealthy now
            async with self._changed:
                self._changed.notify_all()

    # -- helpers for tests ------------------------------------------------------------------------------
    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    async def wait_registered(
        self, resource: str, after: float = 0.0, timeout: float = 5.0
    ) -> PluginEndpoint:
        def ok() -> bool:
            p = self.plugins.get(resource)
            return p is not None and p.registered_at > after and p.updates > 0

        await self.wait_for(ok, timeout)
        return self.plugins[resource]

    def healthy(self, resource: str) -> set[str]:
        p = self.plugins.get(resource)
        return {i for i, h in (p.devices.items() if p else ()) if h == "Healthy"}

    def unhealthy(self, resource: str) -> set[str]:
        p = self.plugins.get(resource)
        return {i for i, h in (p.devices.items() if p else ()) if h != "Healthy"}

    async def allocate(self, resource: str, *requests: list[str]) -> pb.AllocateResponse:
        req = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=r) for r in requests]
        )
        resp: pb.AllocateResponse = await self.plugins[resource].stub.Allocate(req, timeout=5)
        return resp

    async def preferred(
        self, resource: str, available: list[str], must_include: list[str], size: int
    ) -> list[str]:
        req = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
            ]
        )
        resp = await self.plugins[resource].stub.GetPreferredAllocation(req, timeout=5)
        return list(resp.container_responses[0].deviceIDs)

"""The kubelet-facing gRPC server: one `DevicePlugin` service on its own Unix socket per resource."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import Message

from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpunode.api.mps import DEFAULT_ROOT, ReadyResource
from gpunode.common.bounds import clip, clip_list
from gpunode.common.errors import UsageError
from gpunode.common.logging import get_logger
from gpunode.device_plugin.allocation import (
    AllocationError,
    ContainerAllocation,
    allocate_response,
    cdi_annotation_key,
    mps_allocation,
    preferred_allocation,
    validate_request,
)
from gpunode.device_plugin.devices import PluginDevice, Resource
from gpunode.device_plugin.health import Health, HealthTracker
from gpunode.device_plugin.metrics import DevicePluginMetrics
from gpunode.device_plugin.settings import PluginSettings
from gpunode.nvml.api import Topology

if TYPE_CHECKING:
    from grpc.aio import ServicerContext

    from gpunode.api.plugin_types import TimeSlicing

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)

MAX_SOCKET_PATH = 107  # bytes: sockaddr_un.sun_path holds 108, one of them the terminating NUL


@dataclass
class SharedState:
    """What every resource server reads: effective settings, cached topology, health, metrics."""

    settings: PluginSettings
    health: HealthTracker
    metrics: DevicePluginMetrics
    topology: Topology | None = None
    dev_root: Path = Path("/")
    #: MPS sharing: the resources the MPS control daemon declares ready (None: not ready, or no MPS)
    mps_ready: dict[str, ReadyResource] | None = None
    #: the sharing settings ``mps_ready`` was read for: after a config change it counts for nothing until
    #: read again for the new settings (a daemon still running with the old limits is not ready)
    mps_ready_for: TimeSlicing | None = None

    def dev_node_exists(self, container_path: str) -> bool:
        return (self.dev_root / container_path.lstrip("/")).exists()


def device_message(dev: PluginDevice, health: Health) -> pb.Device:
    msg = pb.Device(ID=dev.id, health=health.value)
    if dev.numa_node is not None:
        msg.topology.nodes.add(ID=dev.numa_node)
    return msg


def to_proto(alloc: ContainerAllocation) -> pb.ContainerAllocateResponse:
    resp = pb.ContainerAllocateResponse(envs=alloc.envs, annotations=alloc.annotations)
    for container_path, host_path, read_only in alloc.mounts:
        resp.mounts.add(container_path=container_path, host_path=host_path, read_only=read_only)
    for container_path, host_path, permissions in alloc.devices:
        resp.devices.add(container_path=container_path, host_path=host_path, permissions=permissions)
    for name in alloc.cdi_devices:
        resp.cdi_devices.add(name=name)
    return resp


class ResourceServer:
    """Serves one resource (e.g. nvidia.com/gpu) on `<plugin dir>/<socket name>`."""

    def __init__(self, resource: Resource, plugin_dir: Path, state: SharedState) -> None:
        self.resource = resource
        self.socket_path = plugin_dir / resource.socket_name
        self.state = state
        self.log = get_logger("gpunode.device_plugin.server").bind(resource=resource.name)
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()
        self._version = 0
        self._closing = False
        self.streams = 0  # ListAndWatch streams open now (the kubelet keeps exactly one)
        self.stream_opened = asyncio.Event()

    @property
    def name(self) -> str:
        return self.resource.name

    def devices_message(self) -> pb.ListAndWatchResponse:
        health = self.state.health
        return pb.ListAndWatchResponse(
            devices=[device_message(d, health.health(d.physical_uuid)) for d in self.resource.devices]
        )

    def _observe(self) -> None:
        """The devices gauge follows what is advertised, whether or not a kubelet is listening."""
        self.state.metrics.observe_devices(self.resource.name, self.devices_message().devices)

    async def update(self, resource: Resource | None = None) -> None:
        """A new device list or new health: every ListAndWatch stream sends the full list again."""
        if resource is not None:
            self.resource = resource
        self._observe()
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def withdraw(self) -> None:
        """Advertise no devices (the kubelet sets capacity to 0 at once instead of after 5 minutes)."""
        await self.update(
            Resource(
                self.resource.name,
                (),
                self.resource.shared,
                self.resource.replicas,
                self.resource.fail_requests_greater_than_one,
            )
        )

    async def start(self) -> None:
        if self._server is not None:  # a restart: never leave a server running unowned
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:  # grpc would only say "Failed to bind"
            raise UsageError(
                f"{self.socket_path}: a unix socket path can be at most {MAX_SOCKET_PATH} bytes; "
                "point --kubelet-socket (or --host-root) at a shorter directory"
            )
        self._closing = False
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        add_service(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        os.chmod(self.socket_path, 0o600)
        self._server = server
        self._observe()
        self.log.info("plugin_serving", socket=str(self.socket_path), devices=len(self.resource.devices))

    async def stop(self, grace: float = 0.5) -> None:
        self._closing = True
        async with self._changed:
            self._changed.notify_all()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.log.info("plugin_stopped", socket=str(self.socket_path))

    def socket_present(self) -> bool:
        return self._server is not None and self.socket_path.exists()

    async def stream(self) -> AsyncIterator[pb.ListAndWatchResponse]:
        seen = [-1]
        self.streams += 1
        self.stream_opened.set()
        try:
            while not self._closing:
                async with self._changed:
                    await self._changed.wait_for(lambda: self._version != seen[0] or self._closing)
                    if self._closing:
                        return
                    seen[0] = self._version
                yield self.devices_message()
        finally:
            self.streams -= 1
            if self.streams == 0:
                self.stream_opened.clear()


class Malformed:
    """A request whose bytes are not the message they should be."""

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient(message: type[Req]) -> Callable[[bytes], Req | Malformed]:
    def parse(data: bytes) -> Req | Malformed:
        try:
            return message.FromString(data)
        except Exception as exc:  # DecodeError and friends: answered with INVALID_ARGUMENT, not UNKNOWN
            return Malformed(f"malformed {message.DESCRIPTOR.full_name}: {exc}")

    return parse


def _checked(
    handler: Callable[[Req, ServicerContext[Req, Resp]], Awaitable[Resp]],
) -> Callable[[Req | Malformed, ServicerContext[Req, Resp]], Awaitable[Resp]]:
    async def unary(request: Req | Malformed, context: ServicerContext[Req, Resp]) -> Resp:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        return await handler(request, context)

    return unary


def _checked_stream(
    handler: Callable[[Req, ServicerContext[Req, Resp]], AsyncIterator[Resp]],
) -> Callable[[Req | Malformed, ServicerContext[Req, Resp]], AsyncIterator[Resp]]:
    async def stream(request: Req | Malformed, context: ServicerContext[Req, Resp]) -> AsyncIterator[Resp]:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        async for item in handler(request, context):
            yield item

    return stream


def add_service(servicer: _Servicer, server: grpc.aio.Server) -> None:
    """`v1beta1.DevicePlugin` on `server`, like the generated helper but with lenient request parsing,
    so a corrupt request gets INVALID_ARGUMENT from us instead of gRPC's UNKNOWN."""
    unary = grpc.unary_unary_rpc_method_handler
    # grpc's own signature: one dict for handlers of different message types
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "GetDevicePluginOptions": unary(
            _checked(servicer.GetDevicePluginOptions),
            request_deserializer=_lenient(pb.Empty),
            response_serializer=pb.DevicePluginOptions.SerializeToString,
        ),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            _checked_stream(servicer.ListAndWatch),
            request_deserializer=_lenient(pb.Empty),
            response_serializer=pb.ListAndWatchResponse.SerializeToString,
        ),
        "GetPreferredAllocation": unary(
            _checked(servicer.GetPreferredAllocation),
            request_deserializer=_lenient(pb.PreferredAllocationRequest),
            response_serializer=pb.PreferredAllocationResponse.SerializeToString,
        ),
        "Allocate": unary(
            _checked(servicer.Allocate),
            request_deserializer=_lenient(pb.AllocateRequest),
            response_serializer=pb.AllocateResponse.SerializeToString,
        ),
        "PreStartContainer": unary(
            _checked(servicer.PreStartContainer),
            request_deserializer=_lenient(pb.PreStartContainerRequest),
            response_serializer=pb.PreStartContainerResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers),))


def _unknown(resource: Resource, ids: list[str]) -> list[str]:
    known = resource.by_id
    return sorted({i for i in ids if i not in known})


class _Servicer:
    """The DevicePlugin service (registered with add_DevicePluginServicer_to_server)."""

    def __init__(self, owner: ResourceServer) -> None:
        self.owner = owner

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: pb.Empty, context: ServicerContext[pb.Empty, pb.ListAndWatchResponse]
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        self.owner.log.info("listandwatch_opened")
        async for msg in self.owner.stream():
            yield msg

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: ServicerContext[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        owner = self.owner
        resource = owner.resource
        resp = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            ids = [*req.available_deviceIDs, *req.must_include_deviceIDs]
            unknown = _unknown(resource, ids)
            if unknown:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, _unknown_text(resource, unknown))
            if req.allocation_size < 0:
                await _abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, "allocation_size must not be negative"
                )
            chosen = preferred_allocation(
                resource,
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs),
                req.allocation_size,
                topology=owner.state.topology,
                policy=owner.state.settings.shared_allocation_policy,
            )
            resp.container_responses.add(deviceIDs=chosen)
        return resp

    async def Allocate(
        self, request: pb.AllocateRequest, context: ServicerContext[pb.AllocateRequest, pb.AllocateResponse]
    ) -> pb.AllocateResponse:
        owner = self.owner
        resource = owner.resource
        settings = owner.state.settings
        resp = pb.AllocateResponse()
        for req in request.container_requests:
            try:
                devices = validate_request(resource, list(req.devices_ids))
            except AllocationError as exc:
                owner.log.warning(
                    "allocate_rejected",
                    reason=str(exc),
                    ids=[clip(i) for i in req.devices_ids[:10]],  # each at most 256 characters
                    id_count=len(req.devices_ids),
                )
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            mps = None
            if resource.shared and settings.sharing is not None and settings.sharing.mps:
                ready = (owner.state.mps_ready or {}).get(resource.name)
                if ready is None:  # withdrawn a moment ago: the kubelet must retry elsewhere
                    why = f"{resource.name}: the MPS control daemon is not ready"
                    await _abort(context, grpc.StatusCode.UNAVAILABLE, why)
                mps = mps_allocation(resource.name, devices, settings.mps_root or DEFAULT_ROOT, ready)
            alloc = allocate_response(
                devices,
                settings,
                dev_root_exists=owner.state.dev_node_exists,
                annotation_key=cdi_annotation_key(settings.cdi_annotation_prefix, str(uuid.uuid4())),
                mps=mps,
            )
            resp.container_responses.append(to_proto(alloc))
            owner.state.metrics.allocations.labels(resource=resource.name).inc()
        return resp

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: ServicerContext[pb.PreStartContainerRequest, pb.PreStartContainerResponse],
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _unknown_text(resource: Resource, unknown: list[str]) -> str:
    return f"unknown device IDs for {resource.name}: {clip_list(unknown, 10)}"  # an ID can be 4 MiB


async def _abort(context: ServicerContext[Req, Resp], code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)

"""A fake kubelet PodResources endpoint: the real `v1.PodResourcesLister` gRPC service on a Unix socket.

It answers `List` from the pods given to `set_pods()` (dicts shaped like the proto messages), after an
optional `delay` to play a slow kubelet, or fails with `error`; `GetAllocatableResources` answers empty and
`Get` finds one pod by name and namespace. `calls` counts `List` calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from gpunode._proto.podresources.v1 import api_pb2 as pb
from gpunode._proto.podresources.v1 import api_pb2_grpc as pb_grpc


class FakePodResources:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.delay = 0.0  # seconds List waits before answering
        self.error: grpc.StatusCode | None = None  # set to make List fail with this code
        self.calls = 0
        self._response = pb.ListPodResourcesResponse()
        self._server: grpc.aio.Server | None = None

    def set_pods(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """Replace the pods, e.g. `[{"name": "p", "namespace": "ns", "containers": [{"name": "c",
        "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-..."]}]}]}]`."""
        self._response = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(**pod) for pod in pods])

    @property
    def response(self) -> pb.ListPodResourcesResponse:
        return self._response

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def restart(self, downtime: float = 0.0) -> None:
        await self.stop()
        if downtime:
            await asyncio.sleep(downtime)
        await self.start()

    # -- v1.PodResourcesLister ---------------------------------------------------------------------------
    async def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        self.calls += 1
        response = self._response  # what was set when the call came in
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error is not None:
            await context.abort(self.error, "fake kubelet refuses")
        return response

    async def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: Any
    ) -> pb.AllocatableResourcesResponse:
        return pb.AllocatableResourcesResponse()

    async def Get(self, request: pb.GetPodResourcesRequest, context: Any) -> pb.GetPodResourcesResponse:
        for pod in self._response.pod_resources:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pb.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found"
        )
        raise AssertionError("unreachable")  # context.abort raises

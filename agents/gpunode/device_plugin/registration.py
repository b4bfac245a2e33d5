"""The one Register call to the kubelet (keeping registrations current: :mod:`.registrar`)."""

from __future__ import annotations

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

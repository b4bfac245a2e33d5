"""Which pods hold which GPUs: the kubelet's PodResources API (v1) and the pure attribution over it.

`PodResourcesClient.list()` calls `v1.PodResourcesLister/List` on the kubelet's Unix socket (by default
`/var/lib/kubelet/pod-resources/kubelet.sock`) and raises `PodResourcesUnavailable` for every way that can
go wrong, so the exporter serves its series without pod labels and counts the failure.

`attribute()` turns the answer into two lookups, the way dcgm-exporter keys them:

* `by_gpu_uuid`: full GPU UUID (`GPU-...`, as NVML reports it) -> the containers holding that GPU;
* `by_mig`: `(gpu index, GPU instance id)` -> the containers holding that MIG device.

Devices are kept when their resource is `nvidia.com/gpu`, any `nvidia.com/gpu.<suffix>` (the names
time-slicing and MPS give replicas with `renameByDefault`, e.g. `nvidia.com/gpu.shared`; dcgm-exporter
needs those listed in `NVIDIA_RESOURCE_NAMES`, we accept them without), any `nvidia.com/mig-<profile>`,
or one named in `resource_names`. Device ids are read in these forms:

| device id                        | key                                   | `vgpu` |
|----------------------------------|---------------------------------------|--------|
| `GPU-<uuid>`                     | `by_gpu_uuid["GPU-<uuid>"]`           |        |
| `GPU-<uuid>::<n>` (replica)      | `by_gpu_uuid["GPU-<uuid>"]`           | `n`    |
| `MIG-<uuid>`, `MIG-<uuid>::<n>`  | `by_mig[mig_by_uuid["MIG-<uuid>"]]`   | `n`    |
| `nvidia<N>` (GKE)                | `by_gpu_uuid[gpu_by_device_name[...]]`|        |
| `nvidia<N>/vgpu<n>` (GKE shared) | `by_gpu_uuid[gpu_by_device_name[...]]`| `n`    |
| `nvidia<N>/gi<g>[/vgpu<n>]` (GKE)| `by_mig[(N, g)]` (N read as the index)| `n`    |

Any other id of a kept resource (an unknown MIG UUID, a GKE name missing from `gpu_by_device_name`, a
malformed id) is skipped and counted in `Attribution.unmatched`. Every container sharing a device is
kept, ordered by namespace, pod, container and replica: the caller emits one series per pod
(`KUBERNETES_VIRTUAL_GPUS`) or uses the first only.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # gRPC loads only when --kubernetes asks for pod attribution (tens of MB otherwise)
    import grpc

    from gpunode._proto.podresources.v1 import api_pb2 as pb
    from gpunode._proto.podresources.v1 import api_pb2_grpc as pb_grpc

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # what the kubelet's own PodResources client accepts

# --- the response shape attribute() reads (the generated messages satisfy it) -------------------------


class DevicesLike(Protocol):
    @property
    def resource_name(self) -> str: ...
    @property
    def device_ids(self) -> Iterable[str]: ...


class ContainerLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def devices(self) -> Iterable[DevicesLike]: ...


class PodLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def containers(self) -> Iterable[ContainerLike]: ...


class ListResponseLike(Protocol):
    @property
    def pod_resources(self) -> Iterable[PodLike]: ...


# --- attribution ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodRef:
    pod: str
    namespace: str
    container: str
    vgpu: str | None = None  # the replica number of a shared device, as the device id carries it


@dataclass(frozen=True)
class Attribution:
    by_gpu_uuid: Mapping[str, tuple[PodRef, ...]] = field(default_factory=dict)
    by_mig: Mapping[tuple[int, int], tuple[PodRef, ...]] = field(default_factory=dict)
    unmatched: int = 0  # device ids of kept resources that named no known device

    def pods_for_gpu(self, uuid: str) -> tuple[PodRef, ...]:
        return self.by_gpu_uuid.get(uuid, ())

    def pods_for_mig(self, gpu_index: int, gi_id: int) -> tuple[PodRef, ...]:
        return self.by_mig.get((gpu_index, gi_id), ())


_GKE_ID = re.compile(r"nvidia(?P<gpu>\d+)(?:/gi(?P<gi>\d+))?(?:/vgpu(?P<vgpu>\d+))?")


def is_gpu_resource(name: str, extra: Collection[str] = ()) -> bool:
    """Whether devices of resource `name` are NVIDIA GPUs, MIG devices or replicas of either."""
    return (
        name == GPU_RESOURCE
        or name.startswith(GPU_RESOURCE + ".")
        or name.startswith(MIG_RESOURCE_PREFIX)
        or name in extra
    )


def _strip_mig(uuid: str) -> str:
    return uuid.removeprefix("MIG-")


def _vgpu_order(vgpu: str | None) -> tuple[int, int, str]:
    if vgpu is None:
        return (0, 0, "")
    if vgpu.isdigit():
        return (1, int(vgpu), "")
    return (2, 0, vgpu)


def _order(ref: PodRef) -> tuple[str, str, str, tuple[int, int, str]]:
    return (ref.namespace, ref.pod, ref.container, _vgpu_order(ref.vgpu))


def attribute(
    response: ListResponseLike,
    *,
    resource_names: Collection[str],
    mig_by_uuid: Mapping[str, tuple[int, int]],
    gpu_by_device_name: Mapping[str, str] | None = None,
) -> Attribution:
    """Map a `ListPodResourcesResponse` onto GPUs and MIG devices (see the module docstring).

    `mig_by_uuid` maps MIG UUIDs (with or without the `MIG-` prefix) to `(parent gpu index, gi id)`;
    `gpu_by_device_name` maps GKE device names (`nvidia0`) to GPU UUIDs.
    """
    migs = {_strip_mig(uuid): key for uuid, key in mig_by_uuid.items()}
    gpus: dict[str, set[PodRef]] = {}
    mig: dict[tuple[int, int], set[PodRef]] = {}
    unmatched = 0
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name, resource_names):
                    continue
                for device_id in devices.device_ids:
                    target = _resolve(device_id, migs, gpu_by_device_name)
                    if target is None:
                        unmatched += 1
                        continue
                    key, vgpu = target
                    ref = PodRef(pod.name, pod.namespace, container.name, vgpu)
                    if isinstance(key, str):
                        gpus.setdefault(key, set()).add(ref)
                    else:
                        mig.setdefault(key, set()).add(ref)
    return Attribution(
        by_gpu_uuid={k: tuple(sorted(v, key=_order)) for k, v in sorted(gpus.items())},
        by_mig={k: tuple(sorted(v, key=_order)) for k, v in sorted(mig.items())},
        unmatched=unmatched,
    )


def _resolve(
    device_id: str,
    migs: Mapping[str, tuple[int, int]],
    gpu_by_device_name: Mapping[str, str] | None,
) -> tuple[str | tuple[int, int], str | None] | None:
    """`(GPU UUID or (gpu, gi), vgpu)` for one device id, or None when it names nothing known."""
    base, sep, replica = device_id.partition("::")
    if sep and not replica.isdigit():
        return None
    vgpu = replica if sep else None
    if base.startswith("GPU-") and len(base) > len("GPU-"):
        return base, vgpu
    if base.startswith("MIG-"):
        key = migs.get(_strip_mig(base))
        return None if key is None else (key, vgpu)
    gke = _GKE_ID.fullmatch(device_id)
    if gke is None:
        return None
    gke_vgpu = gke["vgpu"]
    if gke["gi"] is not None:
        return (int(gke["gpu"]), int(gke["gi"])), gke_vgpu
    uuid = None if gpu_by_device_name is None else gpu_by_device_name.get(f"nvidia{gke['gpu']}")
    return None if uuid is None else (uuid, gke_vgpu)


# --- the client ----------------------------------------------------------------------------------------


class PodResourcesUnavailable(Exception):
    """The kubelet's PodResources API could not be read; `reason` is a short constant for counters."""

    NO_SOCKET = "no_socket"
    NO_ACCESS = "no_access"  # the socket's directory may not be entered (run as root: the kubelet's mode)
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    RPC_ERROR = "rpc_error"

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class PodResourcesClient:
    """`v1.PodResourcesLister/List` over one gRPC channel on `unix://<socket>`, reopened after a failure."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout: float = 10.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None

    async def list(self) -> pb.ListPodResourcesResponse:
        import grpc

        from gpunode._proto.podresources.v1 import api_pb2 as pb

        try:
            present = self.socket.is_socket()
        except OSError as exc:  # pod-resources/ is 0750 root, as kubelets make it: only pod labels are lost
            await self._drop(self._channel)
            raise PodResourcesUnavailable(
                PodResourcesUnavailable.NO_ACCESS, f"{self.socket}: {exc.strerror or exc}"
            ) from None
        if not present:
            await self._drop(self._channel)
            detail = "not a socket" if self.socket.exists() else "missing"
            raise PodResourcesUnavailable(PodResourcesUnavailable.NO_SOCKET, f"{self.socket}: {detail}")
        channel, stub = self._open()
        try:
            # gRPC enforces the deadline; the outer timeout only guards against a wedged channel
            async with asyncio.timeout(self.timeout + 1.0):
                response: pb.ListPodResourcesResponse = await stub.List(
                    pb.ListPodResourcesRequest(), timeout=self.timeout
                )
        except grpc.aio.AioRpcError as exc:
            await self._drop(channel)
            raise PodResourcesUnavailable(_reason(exc.code()), f"{exc.code().name}: {exc.details()}") from exc
        except TimeoutError as exc:
            await self._drop(channel)
            raise PodResourcesUnavailable(
                PodResourcesUnavailable.TIMEOUT, f"no answer in {self.timeout:g}s"
            ) from exc
        except grpc.aio.UsageError as exc:  # the channel was closed under this call
            await self._drop(channel)
            raise PodResourcesUnavailable(PodResourcesUnavailable.RPC_ERROR, str(exc)) from exc
        return response

    async def close(self) -> None:
        await self._drop(self._channel)

    def _open(self) -> tuple[grpc.aio.Channel, pb_grpc.PodResourcesListerStub]:
        import grpc

        from gpunode._proto.podresources.v1 import api_pb2_grpc as pb_grpc

        if self._channel is None or self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket}", options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
            )
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._channel, self._stub

    async def _drop(self, channel: grpc.aio.Channel | None) -> None:
        """Close `channel`; forget it unless a concurrent call has already put a new one in its place."""
        if channel is None:
            return
        if channel is self._channel:
            self._channel = None
            self._stub = None
        await channel.close()


def _reason(code: grpc.StatusCode) -> str:
    import grpc

    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesUnavailable.TIMEOUT
    if code is grpc.StatusCode.UNAVAILABLE:
        return PodResourcesUnavailable.UNAVAILABLE
    return PodResourcesUnavailable.RPC_ERROR

"""PodResourcesClient against a fake kubelet PodResources endpoint: real gRPC over a Unix socket."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gpunode._proto.podresources.v1 import api_pb2 as pb
from gpunode._proto.podresources.v1 import api_pb2_grpc as pb_grpc
from gpunode.exporter.podresources import PodRef, PodResourcesClient, PodResourcesUnavailable, attribute
from gpunode.sim.podresources import FakePodResources

GPU0 = "GPU-11111111-0000-0000-0000-000000000000"
PODS = [
    {
        "name": "train",
        "namespace": "ml",
        "containers": [
            {"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [GPU0]}]},
            {"name": "side", "devices": [{"resource_name": "example.com/foo", "device_ids": ["x"]}]},
        ],
    }
]


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakePodResources]:
    fake = FakePodResources(tmp_path / "pod-resources" / "kubelet.sock")
    fake.set_pods(PODS)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def client(kubelet: FakePodResources) -> AsyncIterator[PodResourcesClient]:
    c = PodResourcesClient(kubelet.socket, timeout=0.5)
    yield c
    await c.close()


async def test_list_returns_the_pods(kubelet: FakePodResources, client: PodResourcesClient) -> None:
    response = await client.list()
    assert [p.name for p in response.pod_resources] == ["train"]
    got = attribute(response, resource_names=(), mig_by_uuid={})
    assert got.by_gpu_uuid == {GPU0: (PodRef("train", "ml", "main"),)}
    assert kubelet.calls == 1


async def test_channel_is_reused_and_sees_new_pods(
    kubelet: FakePodResources, client: PodResourcesClient
) -> None:
    await client.list()
    channel = client._channel
    kubelet.set_pods([])
    response = await client.list()
    assert list(response.pod_resources) == []
    assert client._channel is channel
    assert kubelet.calls == 2


async def test_missing_socket_fails_fast(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "nowhere" / "kubelet.sock", timeout=5.0)
    started = time.monotonic()
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.list()
    assert info.value.reason == PodResourcesUnavailable.NO_SOCKET
    assert "missing" in str(info.value)
    assert time.monotonic() - started < 0.5
    await client.close()


async def test_socket_path_holding_a_plain_file(tmp_path: Path) -> None:
    (tmp_path / "kubelet.sock").touch()
    client = PodResourcesClient(tmp_path / "kubelet.sock", timeout=5.0)
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.list()
    assert info.value.reason == PodResourcesUnavailable.NO_SOCKET
    assert "not a socket" in str(info.value)
    await client.close()


async def test_stale_socket_is_refused_at_once(tmp_path: Path) -> None:
    """A socket file left behind by a kubelet that is gone: refused at once, not after the timeout."""
    path = tmp_path / "kubelet.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))  # bound, never listening, closed: the file stays
    client = PodResourcesClient(path, timeout=5.0)
    started = time.monotonic()
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.list()
    assert info.value.reason == PodResourcesUnavailable.UNAVAILABLE
    assert time.monotonic() - started < 1.0
    await client.close()


async def test_slow_kubelet_times_out(kubelet: FakePodResources, client: PodResourcesClient) -> None:
    kubelet.delay = 2.0
    started = time.monotonic()
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.list()
    assert info.value.reason == PodResourcesUnavailable.TIMEOUT
    assert 0.4 < time.monotonic() - started < 1.5
    assert client._channel is None  # dropped; the next call opens a new one
    kubelet.delay = 0.0
    assert len((await client.list()).pod_resources) == 1


async def test_rpc_error_is_reported(kubelet: FakePodResources, client: PodResourcesClient) -> None:
    kubelet.error = grpc.StatusCode.RESOURCE_EXHAUSTED  # the kubelet's rate limiter
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.list()
    assert info.value.reason == PodResourcesUnavailable.RPC_ERROR
    assert "RESOURCE_EXHAUSTED" in str(info.value)


async def test_recovers_after_kubelet_restart(kubelet: FakePodResources, client: PodResourcesClient) -> None:
    await client.list()
    await kubelet.stop()
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.list()
    assert info.value.reason == PodResourcesUnavailable.NO_SOCKET
    await kubelet.start()
    assert len((await client.list()).pod_resources) == 1


async def test_recovers_when_the_socket_is_replaced_under_an_open_channel(
    kubelet: FakePodResources, client: PodResourcesClient
) -> None:
    await client.list()
    kubelet.set_pods([])
    await kubelet.restart()
    started = time.monotonic()
    failures: list[str] = []
    for _ in range(2):  # at most one failure on the old connection, then a fresh channel
        try:
            response = await client.list()
            break
        except PodResourcesUnavailable as exc:
            failures.append(exc.reason)
    else:
        pytest.fail(f"client did not recover: {failures}")
    assert failures in ([], [PodResourcesUnavailable.UNAVAILABLE])
    assert list(response.pod_resources) == []
    assert time.monotonic() - started < 1.0


async def test_fake_answers_allocatable_and_get(kubelet: FakePodResources) -> None:
    async with grpc.aio.insecure_channel(f"unix://{kubelet.socket}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)
        alloc = await stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=2)
        assert list(alloc.devices) == []
        got = await stub.Get(pb.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"), timeout=2)
        assert got.pod_resources.containers[0].devices[0].device_ids == [GPU0]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Get(pb.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"), timeout=2)
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert kubelet.calls == 0  # only List is counted

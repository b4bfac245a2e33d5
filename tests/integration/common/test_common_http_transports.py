"""Both transports of the HTTP core answer alike: the same bytes (but the Date) for the same request."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator

import pytest

from gpunode.common.asynchttp import AsyncEndpoint
from gpunode.common.http import HealthServer
from gpunode.common.httpcore import Health, metrics_route, registry_renderer
from gpunode.common.metrics import create_metrics


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return re.sub(rb"\r\nDate: [^\r]*", b"", b"".join(chunks))


@pytest.fixture
async def ports() -> AsyncIterator[tuple[int, int]]:
    registry = create_metrics("exporter", "9.9.9", process_metrics=False).registry
    threaded = HealthServer(registry, port=0, poll_interval=0.01)
    threaded.set_ready("sampled", False, "no sample yet")
    health = Health()
    health.set_ready("sampled", False, "no sample yet")
    on_loop = AsyncEndpoint(health.routes(metrics_route(registry_renderer(registry))), port=0)
    await on_loop.start()
    try:
        async with threaded:
            yield threaded.port, on_loop.port
    finally:
        await on_loop.close()


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", id="healthz"),
        pytest.param(b"GET /health?x=1 HTTP/1.0\r\n\r\n", id="health-1.0"),
        pytest.param(b"GET /readyz HTTP/1.1\r\nConnection: close\r\n\r\n", id="readyz"),
        pytest.param(b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n", id="404"),
        pytest.param(b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nxx", id="405"),
        pytest.param(b"GARBAGE\r\n\r\n", id="400"),
        pytest.param(
            b"GET /readyz HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", id="two"
        ),
        pytest.param(b"GET / HTTP/1.1\r\nX: " + b"a" * 70000, id="oversized"),
    ],
)
async def test_same_answer_from_both_transports(ports: tuple[int, int], request_bytes: bytes) -> None:
    threaded, on_loop = ports
    a = await asyncio.to_thread(_raw, threaded, request_bytes)
    b = await asyncio.to_thread(_raw, on_loop, request_bytes)
    assert a == b


async def test_metrics_same_content_type_from_both(ports: tuple[int, int]) -> None:
    replies = [
        await asyncio.to_thread(_raw, port, b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        for port in ports
    ]
    heads = [reply.partition(b"\r\n\r\n")[0] for reply in replies]
    for head in heads:
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in head

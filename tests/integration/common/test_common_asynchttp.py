"""gpunode.common.asynchttp: real HTTP/1.1 requests to the event-loop endpoint over 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.client
import socket
from collections.abc import AsyncIterator

import pytest

from gpunode.common.asynchttp import AsyncEndpoint


def _routes() -> dict[str, object]:
    return {
        "/metrics": lambda accept: (200, f"accept={accept}\n".encode(), "text/plain"),
        "/readyz": lambda accept: (503, b"not ready\n", "text/plain"),
    }


@pytest.fixture
async def endpoint() -> AsyncIterator[AsyncEndpoint]:
    ep = AsyncEndpoint(_routes(), host="127.0.0.1", port=0)  # type: ignore[arg-type]
    await ep.start()
    try:
        yield ep
    finally:
        await ep.close()


def _get_twice(port: int) -> list[tuple[int, bytes, str | None]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    out = []
    try:
        for accept in ("text/plain", "application/openmetrics-text"):
            conn.request("GET", "/metrics?x=1", headers={"Accept": accept})
            r = conn.getresponse()
            out.append((r.status, r.read(), r.getheader("Connection")))
    finally:
        conn.close()
    return out


async def test_keep_alive_serves_several_requests_on_one_connection(endpoint: AsyncEndpoint) -> None:
    replies = await asyncio.to_thread(_get_twice, endpoint.port)
    assert replies == [
        (200, b"accept=text/plain\n", "keep-alive"),
        (200, b"accept=application/openmetrics-text\n", "keep-alive"),
    ]


def _one(port: int, method: str, path: str) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=b"x" * 10 if method == "POST" else None)
        r = conn.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("method", "path", "status", "body_has"),
    [
        ("GET", "/readyz", 503, b"not ready"),
        ("GET", "/nope", 404, b"/metrics, /readyz"),
        ("POST", "/metrics", 405, b"only GET and HEAD"),
        ("HEAD", "/metrics", 200, b""),
    ],
)
async def test_status_codes(
    endpoint: AsyncEndpoint, method: str, path: str, status: int, body_has: bytes
) -> None:
    got_status, body, headers = await asyncio.to_thread(_one, endpoint.port, method, path)
    assert got_status == status
    assert body_has in body
    if method == "HEAD":
        assert body == b""
        assert int(headers["Content-Length"]) == len(b"accept=\n")  # length of the GET body
    if method == "POST":
        assert headers["Allow"] == "GET, HEAD"
        assert headers["Connection"] == "close"  # the unread body is never parsed as a request


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


async def test_malformed_request_line_gets_400_and_close(endpoint: AsyncEndpoint) -> None:
    reply = await asyncio.to_thread(_raw, endpoint.port, b"GARBAGE\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"Connection: close" in reply


async def test_oversized_request_is_dropped_and_server_keeps_serving(endpoint: AsyncEndpoint) -> None:
    reply = await asyncio.to_thread(_raw, endpoint.port, b"GET / HTTP/1.1\r\nX: " + b"a" * 70000)
    assert reply == b""  # closed without an answer
    status, _, _ = await asyncio.to_thread(_one, endpoint.port, "GET", "/metrics")
    assert status == 200


async def test_port_in_use_raises_oserror(endpoint: AsyncEndpoint) -> None:
    other = AsyncEndpoint({}, host="127.0.0.1", port=endpoint.port)
    with pytest.raises(OSError, match="in use"):
        await other.start()
    with pytest.raises(RuntimeError, match="not started"):
        _ = other.port


async def test_http_1_0_closes_after_the_answer(endpoint: AsyncEndpoint) -> None:
    reply = await asyncio.to_thread(_raw, endpoint.port, b"GET /metrics HTTP/1.0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b"accept=\n")

"""A small HTTP/1.1 endpoint on the event loop (asyncio streams), for agents whose scrapes must stay fast
under many concurrent clients.

The threaded `HealthServer` gives every connection its own thread; under a burst of scrapers those
threads queue for the GIL and the slowest answers wait tens of milliseconds. Here every request is
answered in order by the event loop from precomputed bytes, so the wait is fair and short. GET and HEAD
only, keep-alive, bounded request size and idle time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from http import HTTPStatus

# route: Accept header -> (status, body, content type)
Route = Callable[[str], tuple[int, bytes, str]]

MAX_REQUEST_BYTES = 16384
IDLE_TIMEOUT_S = 10.0


class AsyncEndpoint:
    def __init__(self, routes: Mapping[str, Route], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.routes = dict(routes)
        self.host = host
        self.requested_port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("endpoint not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Bind and listen (raises OSError, e.g. when the port is in use)."""
        self._server = await asyncio.start_server(
            self._handle, self.host, self.requested_port, limit=MAX_REQUEST_BYTES, backlog=128
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
                keep_alive = await self._answer(head, writer)
                if not keep_alive:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            await _send(writer, HTTPStatus.BAD_REQUEST, b"bad request\n", "text/plain", keep_alive=False)
            return False
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if method not in ("GET", "HEAD"):
            keep_alive = False  # a request body may follow; never read it as the next request
            await _send(
                writer,
                HTTPStatus.METHOD_NOT_ALLOWED,
                b"only GET is allowed\n",
                "text/plain",
                keep_alive,
                extra={"Allow": "GET"},
            )
            return keep_alive
        route = self.routes.get(target.split("?", 1)[0])
        if route is None:
            body = ("not found; try " + ", ".join(sorted(self.routes)) + "\n").encode()
            await _send(writer, HTTPStatus.NOT_FOUND, body, "text/plain", keep_alive)
            return keep_alive
        status, body, content_type = route(headers.get("accept", ""))
        await _send(
            writer, status, b"" if method == "HEAD" else body, content_type, keep_alive, length=len(body)
        )
        return keep_alive


async def _send(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    content_type: str,
    keep_alive: bool,
    *,
    length: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> None:
    phrase = HTTPStatus(status).phrase
    headers = [
        f"HTTP/1.1 {status} {phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body) if length is None else length}",
        "Cache-Control: no-store",
        "Server: gpunode",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
        *(f"{k}: {v}" for k, v in (extra or {}).items()),
    ]
    writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()

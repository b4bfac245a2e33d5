"""The event-loop transport of the agents' HTTP endpoint (:mod:`gpunode.common.httpcore` says what it
answers), for agents whose scrapes must stay fast under many concurrent clients.

The threaded `HealthServer` gives every connection its own thread; under a burst of scrapers those
threads queue for the GIL and the slowest answers wait tens of milliseconds. Here every request is
answered in order by the event loop from precomputed bytes, so the wait is fair and short.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from gpunode.common.httpcore import IDLE_TIMEOUT_S, MAX_REQUEST_BYTES, Route, respond

__all__ = ["AsyncEndpoint"]


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
            keep_alive = True
            while keep_alive:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
                answer, keep_alive = respond(self.routes, head)
                writer.write(answer)
                del answer  # an idle kept-alive connection holds no copy of its last scrape
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

"""The threaded transport of the agents' HTTP endpoint (:mod:`gpunode.common.httpcore` says what it answers).

Why a listener thread rather than the event loop (:mod:`gpunode.common.asynchttp`):

* liveness must reflect *event-loop progress*. Served from a thread, ``/healthz`` still answers when
  the loop is wedged and can say so with a clean 503 (a loop-side task stamps a heartbeat; the thread
  compares it with the clock). An endpoint on the loop would just stop answering;
* rendering ``/metrics`` (custom collectors, many series) never blocks the event loop.

Readiness checks run on the HTTP thread, so they must be cheap and thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from gpunode.common.httpcore import (
    IDLE_TIMEOUT_S,
    MAX_REQUEST_BYTES,
    Health,
    Route,
    metrics_route,
    registry_renderer,
    respond,
)
from gpunode.common.logging import get_logger

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from structlog.stdlib import BoundLogger

__all__ = ["HealthServer"]


class _Server(socketserver.ThreadingTCPServer):
    request_queue_size = 128  # listen backlog: socketserver's 5 makes bursts of scrapers wait for SYN retries
    daemon_threads = True
    allow_reuse_address = True
    routes: dict[str, Route]


class _Server6(_Server):
    address_family = socket.AF_INET6


def _read_head(rfile: io.BufferedIOBase) -> bytes | None:
    """The request line and headers through the blank line; None at EOF or when too long."""
    head = b""
    while True:
        line = rfile.readline(MAX_REQUEST_BYTES + 1 - len(head))
        head += line
        if not line or len(head) > MAX_REQUEST_BYTES:
            return None
        if line in (b"\r\n", b"\n"):
            return head


class _Handler(socketserver.StreamRequestHandler):
    server: _Server
    timeout = IDLE_TIMEOUT_S  # a stuck client frees its thread
    disable_nagle_algorithm = True  # one write per answer; as asyncio does

    def handle(self) -> None:
        with contextlib.suppress(OSError):  # timeouts, resets
            while (head := _read_head(self.rfile)) is not None:
                answer, keep_alive = respond(self.server.routes, head)
                self.wfile.write(answer)
                del answer  # an idle kept-alive connection holds no copy of its last answer
                if not keep_alive:
                    return


class HealthServer(Health):
    """Serves ``/healthz``, ``/readyz`` and ``/metrics`` for one agent on ``host:port``, from a thread.

    Use as ``async with HealthServer(...) as http:`` (starts the listener thread and the heartbeat
    task; stops both on exit) or run :meth:`serve` as a task in the agent's TaskGroup. ``port=0`` binds
    an ephemeral port; read the bound one from :attr:`port` once started.

    ``/healthz`` is 200 while the event loop stamped a heartbeat within ``stale_after`` seconds, 503
    otherwise. ``/readyz`` runs the named checks (:class:`~gpunode.common.httpcore.Health`).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_interval: float = 1.0,
        stale_after: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        poll_interval: float = 0.5,
        log: BoundLogger | None = None,
    ) -> None:
        super().__init__(stale_after=stale_after, clock=clock)
        self.registry = registry
        self.host = host
        self.requested_port = port
        self.heartbeat_interval = heartbeat_interval
        self.poll_interval = poll_interval
        self.log = log if log is not None else get_logger("gpunode.http")
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound port (the requested one until started)."""
        if self._server is None:
            return self.requested_port
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind and start serving on a thread (synchronous; prefer ``async with``)."""
        if self._server is not None:
            raise RuntimeError("HealthServer already started")
        server_class = _Server6 if ":" in self.host else _Server
        server = server_class((self.host, self.requested_port), _Handler)
        metrics = None if self.registry is None else metrics_route(registry_renderer(self.registry), self.log)
        server.routes = self.routes(metrics)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": self.poll_interval},
            name=f"http-{self.port}",
            daemon=True,
        )
        self._thread.start()
        self.log.info("http_listening", host=self.host, port=self.port)

    def stop(self) -> None:
        """Stop serving and close the socket (blocks up to ``poll_interval``)."""
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server, self._thread = None, None

    async def _beat_forever(self) -> None:
        while True:
            self.beat()
            await asyncio.sleep(self.heartbeat_interval)

    async def __aenter__(self) -> HealthServer:
        self.beat()
        self.start()
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="http-heartbeat")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._heartbeat = self._heartbeat, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # unlike `await task`, does not swallow our own cancellation
        await asyncio.to_thread(self.stop)

    async def serve(self) -> None:
        """Serve until cancelled (a TaskGroup task)."""
        async with self:
            await asyncio.Event().wait()

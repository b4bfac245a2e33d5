"""The threaded transport of the agents' HTTP endpoint (:mod:`gpunode.common.httpcore` says what it answers).

Why a thread of its own rather than the agent's event loop (:mod:`gpunode.common.asynchttp`):

* liveness must reflect *event-loop progress*. Served from a thread, ``/healthz`` still answers when
  the loop is wedged and can say so with a clean 503 (a loop-side task stamps a heartbeat; the thread
  compares it with the clock). An endpoint on the loop would just stop answering;
* rendering ``/metrics`` (custom collectors, many series) never blocks the event loop.

The thread runs the event-loop transport on a private loop: connections cost no thread, the
connection policy is the same (deadlines, cap), and the answers are byte for byte the same.
``/healthz`` and ``/readyz`` are answered on that thread; ``/metrics`` is rendered by a pool of
:data:`RENDER_THREADS` threads, so a slow render never delays a probe. The process therefore gains at
most ``1 + RENDER_THREADS`` threads, however many clients connect.

Readiness checks run on the HTTP thread, so they must be cheap and thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from types import TracebackType
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from gpunode.common.asynchttp import BACKLOG, AsyncEndpoint
from gpunode.common.httpcore import (
    ANSWER_TIMEOUT_S,
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT_S,
    Health,
    metrics_route,
    registry_renderer,
)
from gpunode.common.logging import get_logger, log_loop_exception

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from structlog.stdlib import BoundLogger

__all__ = ["RENDER_THREADS", "HealthServer"]

RENDER_THREADS = 2  # threads rendering /metrics (the probes are answered by the HTTP thread itself)

P = ParamSpec("P")
T = TypeVar("T")


class _RenderPool(Executor):
    """At most ``size`` daemon threads, started as work arrives. Daemon threads, unlike those of
    :class:`~concurrent.futures.ThreadPoolExecutor`: a render stuck in a collector never keeps the
    process from exiting (as the thread-per-connection server's daemon threads never did)."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self.name = name
        # (cancel the future, do the work), or None: stop
        self._queue: queue.SimpleQueue[tuple[Callable[[], bool], Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((future.cancel, work))
            if len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            item[1]()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads once their current work is done; queued work runs first unless
        ``cancel_futures`` (its futures are then cancelled)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while True:
                    item = self._queue.get_nowait()
                    if item is not None:
                        item[0]()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host has a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


class HealthServer(Health):
    """Serves ``/healthz``, ``/readyz`` and ``/metrics`` for one agent on ``host:port``, from a thread.

    Use as ``async with HealthServer(...) as http:`` (starts the listener thread and the heartbeat
    task; stops both on exit) or run :meth:`serve` as a task in the agent's TaskGroup. ``port=0`` binds
    an ephemeral port; read the bound one from :attr:`port` once started.

    ``/healthz`` is 200 while the event loop stamped a heartbeat within ``stale_after`` seconds, 503
    otherwise. ``/readyz`` runs the named checks (:class:`~gpunode.common.httpcore.Health`).
    ``max_connections``, ``request_timeout``, ``answer_timeout``: the connection policy
    (:mod:`gpunode.common.httpcore`).
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
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT_S,
        answer_timeout: float = ANSWER_TIMEOUT_S,
        log: BoundLogger | None = None,
    ) -> None:
        super().__init__(stale_after=stale_after, clock=clock)
        self.registry = registry
        self.host = host
        self.requested_port = port
        self.heartbeat_interval = heartbeat_interval
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.answer_timeout = answer_timeout
        self.log = log if log is not None else get_logger("gpunode.http")
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._pool: _RenderPool | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound port (the requested one until started)."""
        if self._sock is None:
            return self.requested_port
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind and start serving on a thread (synchronous; prefer ``async with``). Raises OSError
        when the address cannot be bound."""
        if self._sock is not None:
            raise RuntimeError("HealthServer already started")
        try:
            sock = _listen(self.host, self.requested_port)
        except OSError as exc:  # name the address: --http-address / --http-port
            where = f"{self.host}:{self.requested_port}"
            raise OSError(exc.errno, f"cannot listen on {where}: {exc.strerror or exc}") from None
        port = int(sock.getsockname()[1])
        metrics = None if self.registry is None else metrics_route(registry_renderer(self.registry), self.log)
        pool = _RenderPool(RENDER_THREADS, f"http-{port}-render")
        endpoint = AsyncEndpoint(
            self.routes(metrics),
            host=self.host,
            port=port,
            max_connections=self.max_connections,
            request_timeout=self.request_timeout,
            answer_timeout=self.answer_timeout,
            executor=pool,
            offload=("/metrics",),
        )
        started = threading.Event()
        failed: list[BaseException] = []
        thread = threading.Thread(
            target=self._serve, args=(endpoint, sock, started, failed), name=f"http-{port}", daemon=True
        )
        thread.start()
        started.wait()
        if failed:
            thread.join()
            pool.shutdown(wait=False)
            sock.close()
            raise failed[0]
        self._sock, self._thread, self._pool = sock, thread, pool
        self.log.info("http_listening", host=self.host, port=port)

    def _serve(
        self,
        endpoint: AsyncEndpoint,
        sock: socket.socket,
        started: threading.Event,
        failed: list[BaseException],
    ) -> None:
        """The HTTP thread: the endpoint on a private event loop until :meth:`stop`."""

        async def main() -> None:
            asyncio.get_running_loop().set_exception_handler(log_loop_exception)
            try:
                await endpoint.start(sock)
            except BaseException as exc:
                failed.append(exc)
                started.set()
                return
            self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
            started.set()
            try:
                await self._stopping.wait()
            finally:
                await endpoint.close()

        asyncio.run(main())

    def stop(self) -> None:
        """Stop serving: close the socket and every connection, end the thread."""
        thread, loop, stopping, pool = self._thread, self._loop, self._stopping, self._pool
        if thread is None:
            return
        if loop is not None and stopping is not None:
            loop.call_soon_threadsafe(stopping.set)
        thread.join()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)  # a render still running ends on its own
        if self._sock is not None:
            self._sock.close()
        self._sock, self._thread, self._loop, self._stopping, self._pool = None, None, None, None, None

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

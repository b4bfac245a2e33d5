"""The event-loop transport of the agents' HTTP endpoint (:mod:`gpunode.common.httpcore` says what it
answers and the connection policy: whole-request deadline, answer deadline, connection cap).

The exporter runs it on its own event loop: every request is answered in order from precomputed
bytes, so the wait is fair and short under many concurrent scrapers. The threaded transport
(:class:`gpunode.common.http.HealthServer`) runs the same endpoint on a private loop in one thread, with
``/metrics`` rendered by a small pool of threads: either way no connection gets a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Collection, Mapping
from concurrent.futures import Executor

from gpunode.common.httpcore import (
    ANSWER_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT_S,
    Route,
    request_path,
    respond,
)

__all__ = ["AsyncEndpoint"]

# listen backlog: a burst of clients (500 at once in tests/hostile) queues in the kernel, is accepted and
# decided on in turn, instead of having its SYNs dropped and retried a second later (a probe's timeout)
BACKLOG = 1024
_HEAD_END = re.compile(rb"(?:^|\n)\r?\n")  # the blank line after the headers (CRLF or bare LF)


class _TooLarge(Exception):
    """The request head is longer than MAX_REQUEST_BYTES: dropped unanswered."""


async def _read_head(reader: asyncio.StreamReader, buffered: bytearray) -> bytes:
    """The request line and headers through the blank line; what follows stays in ``buffered``.

    Raises :class:`asyncio.IncompleteReadError` at end of input, :class:`_TooLarge` past the limit.
    """
    searched = 0
    while True:
        found = _HEAD_END.search(buffered, max(0, searched - 3))
        if found is not None:
            head = bytes(buffered[: found.end()])
            del buffered[: found.end()]
            return head
        if len(buffered) > MAX_REQUEST_BYTES:
            raise _TooLarge
        searched = len(buffered)
        chunk = await reader.read(MAX_REQUEST_BYTES + 1 - len(buffered))
        if not chunk:
            raise asyncio.IncompleteReadError(bytes(buffered), None)
        buffered += chunk


def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets as :func:`asyncio.start_server` binds them: one per address ``host`` resolves
    to ("": every interface, IPv4 and IPv6); IPv6 sockets are IPv6-only."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:
                continue  # a family this host lacks (IPv6 off)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                reason = (exc.strerror or str(exc)).lower()  # worded as asyncio.start_server words it
                raise OSError(
                    exc.errno, f"error while attempting to bind on address {address!r}: {reason}"
                ) from None
            sock.listen(BACKLOG)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(f"no address to listen on for {host!r}")
    return socks


class AsyncEndpoint:
    """Serves ``routes`` on ``host:port`` from the running event loop.

    ``max_connections``, ``request_timeout`` and ``answer_timeout``: the connection policy of
    :mod:`gpunode.common.httpcore`. The endpoint accepts one connection at a time and decides on it
    (admit, make room, or close) before it gets a transport, so the process never holds more than
    ``max_connections`` client sockets, plus the one being decided on. With an ``executor``, requests
    for the paths in ``offload`` are answered on it (a slow ``/metrics`` render then delays neither the
    loop nor ``/healthz``).
    """

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT_S,
        answer_timeout: float = ANSWER_TIMEOUT_S,
        executor: Executor | None = None,
        offload: Collection[str] = (),
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self.routes = dict(routes)
        self.host = host
        self.requested_port = port
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.answer_timeout = answer_timeout
        self.executor = executor
        self.offload = frozenset(offload) if executor is not None else frozenset()
        self._listeners: list[socket.socket] = []
        self._acceptors: list[asyncio.Task[None]] = []
        self._open: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}  # admitted connections
        # admitted connections waiting for a request or for their answer to be read, longest first:
        # the ones a new connection beyond the cap closes
        self._evictable: dict[asyncio.StreamWriter, None] = {}
        self._admitting = 0  # connections admitted whose transport is being made

    @property
    def port(self) -> int:
        if not self._listeners:
            raise RuntimeError("endpoint not started")
        return int(self._listeners[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open now (admitted, not yet closed)."""
        return len(self._open) + self._admitting

    async def start(self, sock: socket.socket | None = None) -> None:
        """Listen on ``host:port``, or on ``sock`` (bound and listening) when given. Raises OSError
        (e.g. when the port is in use)."""
        socks = [sock] if sock is not None else _bind(self.host, self.requested_port)
        for listener in socks:
            listener.setblocking(False)
        self._listeners = socks
        self._acceptors = [
            asyncio.create_task(self._accept_forever(listener), name="http-accept") for listener in socks
        ]

    async def close(self) -> None:
        """Stop listening and cut every open connection."""
        acceptors, self._acceptors = self._acceptors, []
        for task in acceptors:
            task.cancel()
        if acceptors:
            await asyncio.wait(acceptors)
        for listener in self._listeners:
            listener.close()
        self._listeners = []
        tasks = list(self._open.values())
        for writer in list(self._open):
            writer.transport.abort()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _accept_forever(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:  # EMFILE, ECONNABORTED ...: not this endpoint's end
                await asyncio.sleep(0.1)
                continue
            if self.connections >= self.max_connections and not self._make_room():
                conn.close()  # refused: every admitted connection is being answered
                continue
            self._admitting += 1
            try:
                reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_REQUEST_BYTES)
            except OSError:
                conn.close()
                continue
            finally:
                self._admitting -= 1
            self._open[writer] = asyncio.create_task(self._handle(reader, writer), name="http-connection")
            self._evictable[writer] = None  # waiting for its request from now on
            # One loop turn per accept: the connections admitted get to read their requests before a
            # burst of newer ones pushes them out (a probe among 500 flooding clients is answered).
            await asyncio.sleep(0)

    def _make_room(self) -> bool:
        """Close the connection that has waited longest (for a request, or for its answer to be read);
        False when every connection is having its answer computed."""
        if not self._evictable:
            return False
        oldest = next(iter(self._evictable))
        del self._evictable[oldest]
        self._open.pop(oldest, None)  # counted out now, not when its task gets round to it
        oldest.transport.abort()
        return True

    async def _answer(self, head: bytes) -> tuple[bytes, bool]:
        if self.executor is not None and request_path(head) in self.offload:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, respond, self.routes, head)
        return respond(self.routes, head)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buffered = bytearray()
        clean = False
        try:
            keep_alive = True
            while keep_alive:
                if writer not in self._open:
                    return  # made room for a newer connection
                self._evictable[writer] = None  # (re)queued last (the first time: kept in accept order)
                try:
                    async with asyncio.timeout(self.request_timeout):
                        head = await _read_head(reader, buffered)
                finally:
                    self._evictable.pop(writer, None)
                async with asyncio.timeout(self.answer_timeout):
                    answer, keep_alive = await self._answer(head)
                    if writer not in self._open:
                        return  # cut meanwhile (the endpoint closed)
                    writer.write(answer)
                    del answer  # an idle kept-alive connection holds no copy of its last answer
                    self._evictable[writer] = None
                    try:
                        await writer.drain()
                    finally:
                        self._evictable.pop(writer, None)
            clean = True
        except (asyncio.IncompleteReadError, _TooLarge, TimeoutError, ConnectionError):
            pass
        finally:
            self._open.pop(writer, None)
            if clean:
                writer.close()  # the last answer is written: FIN
            else:
                writer.transport.abort()  # a deadline, an eviction, a reset: nothing left to flush
            with contextlib.suppress(Exception):
                await writer.wait_closed()

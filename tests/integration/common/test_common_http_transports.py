"""Both transports of the HTTP core answer alike: the same bytes (but the Date) for the same request, and
the same connection policy (whole-request deadline, answer deadline, connection cap)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

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
    threaded = HealthServer(registry, port=0)
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
        pytest.param(b"GET /healthz HTTP/1.0\nAccept: */*\n\n", id="bare-LF"),
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


# ------------------------------------------------------------------ the connection policy, alike in both

CAP = 4
REQUEST_TIMEOUT = 1.0
ANSWER_TIMEOUT = 2.0


class Control:
    """What the test registry's collector does at the next scrape."""

    def __init__(self) -> None:
        self.huge = False  # a 16 MB exposition
        self.gate: threading.Event | None = None  # wait for it before rendering
        self.rendering = threading.Semaphore(0)  # released by each render that starts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.rendering.release()
        if self.gate is not None:
            self.gate.wait(10)
        yield GaugeMetricFamily("gpunode_test", "x" * (16 << 20) if self.huge else "test", value=1)

    def describe(self) -> list[object]:
        return []


@pytest.fixture
async def policy() -> AsyncIterator[tuple[Control, dict[str, int]]]:
    control = Control()
    registry = CollectorRegistry()
    registry.register(control)
    threaded = HealthServer(
        registry,
        port=0,
        max_connections=CAP,
        request_timeout=REQUEST_TIMEOUT,
        answer_timeout=ANSWER_TIMEOUT,
    )
    pool = ThreadPoolExecutor(2)  # as the threaded transport renders /metrics
    on_loop = AsyncEndpoint(
        Health().routes(metrics_route(registry_renderer(registry))),
        port=0,
        max_connections=CAP,
        request_timeout=REQUEST_TIMEOUT,
        answer_timeout=ANSWER_TIMEOUT,
        executor=pool,
        offload=("/metrics",),
    )
    await on_loop.start()
    try:
        async with threaded:
            yield control, {"threaded": threaded.port, "on-loop": on_loop.port}
    finally:
        if control.gate is not None:
            control.gate.set()
        await on_loop.close()
        pool.shutdown(wait=False)


def _closed(sock: socket.socket, wait: float) -> bool:
    """Whether the server closed ``sock`` (EOF or reset) within ``wait`` seconds; data is discarded."""
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            return False
        try:
            if not sock.recv(65536):
                return True
        except ConnectionError:
            return True
    return False


def _trickle(port: int, data: bytes, every: float, limit: float = 5.0) -> tuple[bytes, float]:
    """Send ``data`` a byte every ``every`` seconds until the server closes: (what came back, seconds)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as s:
        t0 = time.monotonic()
        for byte in data:
            try:
                s.sendall(bytes([byte]))
            except ConnectionError:
                break
            readable, _, _ = select.select([s], [], [], every)
            if readable:
                try:
                    chunk = s.recv(65536)
                except ConnectionError:
                    break
                if not chunk:
                    break
                got += chunk
            if time.monotonic() - t0 > limit:
                raise AssertionError(f"still open after {limit}s")
        return got, time.monotonic() - t0


async def test_trickled_request_is_cut_off_at_the_whole_request_deadline(
    policy: tuple[Control, dict[str, int]],
) -> None:
    _, ports = policy
    # 20 bytes a second: every read is quick, the request never completes
    request = b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 1000
    results = await asyncio.gather(*(asyncio.to_thread(_trickle, p, request, 0.05) for p in ports.values()))
    for got, seconds in results:
        assert got == b""  # cut off unanswered
        assert REQUEST_TIMEOUT - 0.1 <= seconds <= REQUEST_TIMEOUT + 0.8


def _idle_after_answer(port: int) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        answer = s.recv(65536)
        t0 = time.monotonic()
        assert _closed(s, 5)
        return re.sub(rb"\r\nDate: [^\r]*", b"", answer), time.monotonic() - t0


async def test_idle_kept_alive_connection_closes_at_the_deadline(
    policy: tuple[Control, dict[str, int]],
) -> None:
    _, ports = policy
    results = await asyncio.gather(*(asyncio.to_thread(_idle_after_answer, p) for p in ports.values()))
    assert results[0][0] == results[1][0]
    assert results[0][0].startswith(b"HTTP/1.1 200 OK\r\n")
    for _, seconds in results:
        assert REQUEST_TIMEOUT - 0.1 <= seconds <= REQUEST_TIMEOUT + 0.8


def _over_the_cap(port: int) -> tuple[bytes, list[bool]]:
    """CAP idle connections, then one more asking /healthz: (its answer, which idle ones were closed)."""
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CAP)]
    try:
        time.sleep(0.2)  # all admitted
        answer = _raw(port, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        return answer, [_closed(s, 0.2) for s in idle]
    finally:
        for s in idle:
            s.close()


async def test_connection_over_the_cap_closes_the_longest_waiting(
    policy: tuple[Control, dict[str, int]],
) -> None:
    _, ports = policy
    results = [await asyncio.to_thread(_over_the_cap, p) for p in ports.values()]
    assert results[0] == results[1]
    answer, closed = results[0]
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert answer.endswith(b"\r\n\r\nok\n")
    assert closed == [True] + [False] * (CAP - 1)  # the oldest made room; the others stay


def _unread_answer(port: int) -> tuple[int, float]:
    """Ask for the huge /metrics and never read: (bytes received once cut off, seconds until cut off)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    with s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        t0 = time.monotonic()
        # the server stops writing once the buffers are full; wait for its deadline to pass
        time.sleep(ANSWER_TIMEOUT + 0.5)
        received = 0
        s.settimeout(5)
        try:
            while chunk := s.recv(1 << 20):
                received += len(chunk)
        except ConnectionError:
            pass
        return received, time.monotonic() - t0


async def test_answer_not_read_is_cut_off_at_the_answer_deadline(
    policy: tuple[Control, dict[str, int]],
) -> None:
    control, ports = policy
    control.huge = True
    results = await asyncio.gather(*(asyncio.to_thread(_unread_answer, p) for p in ports.values()))
    for received, _ in results:
        assert 0 < received < 16 << 20  # part of the answer, then the connection was cut


def _busy(port: int, control: Control) -> tuple[bool, list[bytes]]:
    """CAP connections whose /metrics renders are held, then one more: (was it refused, the CAP answers)."""
    control.gate = threading.Event()
    busy = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CAP)]
    try:
        for s in busy:
            s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        for _ in range(2):  # both render threads hold a request; the others queue for them
            assert control.rendering.acquire(timeout=5)
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
            refused = _closed(extra, 0.5)
        control.gate.set()
        answers = []
        for s in busy:
            chunks = []
            with contextlib.suppress(ConnectionError):
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            answers.append(b"".join(chunks).partition(b"\r\n")[0])
        return refused, answers
    finally:
        for s in busy:
            s.close()
        while control.rendering.acquire(blocking=False):
            pass
        control.gate = None


async def test_connection_over_the_cap_is_refused_while_every_answer_is_being_computed(
    policy: tuple[Control, dict[str, int]],
) -> None:
    control, ports = policy
    for port in ports.values():
        refused, answers = await asyncio.to_thread(_busy, port, control)
        assert refused
        assert answers == [b"HTTP/1.1 200 OK"] * CAP
        after = await asyncio.to_thread(_raw, port, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert after.startswith(b"HTTP/1.1 200 OK\r\n")  # room again once they are answered

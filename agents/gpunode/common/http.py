"""The per-agent HTTP endpoint: ``/healthz`` (liveness), ``/readyz`` (readiness), ``/metrics``.

Why the standard library's ``ThreadingHTTPServer`` on its own thread rather than an asyncio server:

* liveness must reflect *event-loop progress*. Served from a thread, ``/healthz`` still answers when
  the loop is wedged and can say so with a clean 503 (a loop-side task stamps a heartbeat; the thread
  compares it with the clock). An asyncio server would just stop answering;
* rendering ``/metrics`` (custom collectors, many series) never blocks the event loop;
* the standard library's HTTP parsing is battle-tested and costs no dependency (no aiohttp).

Readiness checks are plain callables run on the HTTP thread, so they must be cheap and thread-safe:
typically they read a flag the agent sets (or use :meth:`HealthServer.set_ready`).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gpunode.common.logging import get_logger

if TYPE_CHECKING:  # importing prometheus_client reads /proc (its default registry); do that on first use
    from prometheus_client import CollectorRegistry

__all__ = ["CheckResult", "HealthServer", "default_listen_host"]

CheckResult = bool | tuple[bool, str]
Check = Callable[[], CheckResult]

_TEXT = "text/plain; charset=utf-8"


def default_listen_host(environ: Mapping[str, str]) -> str:
    """``127.0.0.1`` under systemd (``$INVOCATION_ID`` set), ``0.0.0.0`` otherwise (pods, probes)."""
    return "127.0.0.1" if environ.get("INVOCATION_ID") else "0.0.0.0"  # pods: probes come from the node


def _check_line(name: str, ok: bool, detail: str) -> str:
    line = f"{name}: {'ok' if ok else 'failing'}"
    return f"{line}: {detail}" if detail else line


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # listen backlog: socketserver's 5 makes bursts of scrapers wait for SYN retries
    daemon_threads = True
    allow_reuse_address = True
    health: HealthServer


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection between scrapes
    timeout = 10  # seconds a client may take to send its request; a stuck client frees its thread

    def version_string(self) -> str:
        return "gpunode"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        health = self.server.health
        if path in ("/healthz", "/health"):  # /health: dcgm-exporter's probe path
            ok, detail = health.liveness()
            self._reply(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, detail + "\n")
        elif path == "/readyz":
            ready, results = health.readiness()
            lines = [_check_line(name, ok, detail) for name, ok, detail in results]
            lines.append("ready" if ready else "not ready")
            self._reply(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, "\n".join(lines) + "\n")
        elif path == "/metrics" and health.registry is not None:
            self._metrics(health.registry)
        else:
            self._reply(HTTPStatus.NOT_FOUND, "not found; try /healthz, /readyz or /metrics\n")

    def _metrics(self, registry: CollectorRegistry) -> None:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        try:
            body = encoder(registry)
        except Exception:
            self.server.health.log.error("metrics_render_failed", exc_info=True)
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, "metrics collection failed\n")
            return
        self._reply(HTTPStatus.OK, body, content_type)

    def _not_allowed(self) -> None:
        self._reply(HTTPStatus.METHOD_NOT_ALLOWED, "only GET is allowed\n", headers={"Allow": "GET"})

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

    def _reply(
        self,
        status: HTTPStatus,
        body: str | bytes,
        content_type: str = _TEXT,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return  # probes every few seconds would drown the logs

    def log_error(self, format: str, *args: Any) -> None:
        self.server.health.log.debug("http_error", message=format % args, client=self.client_address[0])


class HealthServer:
    """Serves ``/healthz``, ``/readyz`` and ``/metrics`` for one agent on ``host:port``.

    Use as ``async with HealthServer(...) as http:`` (starts the listener thread and the heartbeat
    task; stops both on exit) or run :meth:`serve` as a task in the agent's TaskGroup. ``port=0`` binds
    an ephemeral port; read the bound one from :attr:`port` once started.

    ``/healthz`` is 200 while the event loop stamped a heartbeat within ``stale_after`` seconds, 503
    otherwise. ``/readyz`` runs the named checks and is 503 if any fails, listing each check's state.
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
        log: Any = None,
    ) -> None:
        self.registry = registry
        self.host = host
        self.requested_port = port
        self.heartbeat_interval = heartbeat_interval
        self.stale_after = stale_after
        self.clock = clock
        self.poll_interval = poll_interval
        self.log = log if log is not None else get_logger("gpunode.http")
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()
        self._last_beat: float | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------ health state

    def add_check(self, name: str, check: Check) -> None:
        """Register (or replace) the readiness check ``name``: returns ok, or (ok, detail)."""
        with self._lock:
            self._checks[name] = check

    def remove_check(self, name: str) -> None:
        with self._lock:
            self._checks.pop(name, None)

    def set_ready(self, name: str, ok: bool, detail: str = "") -> None:
        """Set a readiness check's state directly (for states the agent already tracks)."""
        result: tuple[bool, str] = (ok, detail)
        self.add_check(name, lambda: result)

    def beat(self) -> None:
        """Stamp the liveness heartbeat (the heartbeat task does this from the event loop)."""
        self._last_beat = self.clock()

    def liveness(self) -> tuple[bool, str]:
        last = self._last_beat
        if last is None:
            return False, "no heartbeat yet"
        age = self.clock() - last
        if age > self.stale_after:
            return False, f"event loop stalled: no heartbeat for {age:.1f}s (limit {self.stale_after:g}s)"
        return True, "ok"

    def readiness(self) -> tuple[bool, list[tuple[str, bool, str]]]:
        """Run every check; (all ok, [(name, ok, detail), ...] sorted by name)."""
        with self._lock:
            checks = sorted(self._checks.items())
        results: list[tuple[str, bool, str]] = []
        for name, check in checks:
            try:
                outcome = check()
                ok, detail = outcome if isinstance(outcome, tuple) else (bool(outcome), "")
            except Exception as exc:
                ok, detail = False, f"check raised {type(exc).__name__}: {exc}"
            results.append((name, bool(ok), detail))
        return all(ok for _, ok, _ in results), results

    # --------------------------------------------------------------------------------- lifecycle

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
        server.health = self
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

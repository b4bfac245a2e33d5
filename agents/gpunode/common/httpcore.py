"""What every agent's HTTP endpoint says, whichever transport carries it: the health/readiness model,
the routes (``/healthz``, ``/health``, ``/readyz``, ``/metrics``), request parsing and the one
response builder (status line, content type and charset, length, HEAD, keep-alive).

Two transports move the bytes: :class:`gpunode.common.http.HealthServer` (a thread, so that
``/healthz`` can report a wedged event loop) and :class:`gpunode.common.asynchttp.AsyncEndpoint`
(the event loop itself, fair under many concurrent scrapers). Both hand each request head to
:func:`respond` and write back what it returns, so they answer alike.

Rules: GET and HEAD (HEAD: the GET answer's headers, no body); any other method is 405 and closes
the connection (its body is never read as the next request). HTTP/1.1 keeps the connection open
unless the client sends ``Connection: close``; HTTP/1.0 closes after the answer. The query string is
ignored. Text answers are ``text/plain; charset=utf-8``; nothing is cached (``Cache-Control:
no-store``).

Connections (one policy, :class:`gpunode.common.asynchttp.AsyncEndpoint`, which both transports run):

* a whole-request deadline: a request's head must be complete :data:`REQUEST_TIMEOUT_S` after the
  connection opened or the previous answer was written (a client trickling bytes, or idling, is cut
  off then, however often it sends); an answer must be computed and written within
  :data:`ANSWER_TIMEOUT_S` (a client that does not read it is cut off);
* a connection cap, :data:`MAX_CONNECTIONS`: a connection beyond it makes room by closing the one
  that has waited longest for its request or for its answer to be read (a slow or idle client), so a
  probe still gets in during a flood of slow clients; when every connection is having its answer
  computed, the new one is closed at once, unanswered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING

from gpunode.common.logging import get_logger

if TYPE_CHECKING:  # importing prometheus_client reads /proc (its default registry); do that on first use
    from prometheus_client import CollectorRegistry
    from structlog.stdlib import BoundLogger

__all__ = [
    "ANSWER_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "MAX_REQUEST_BYTES",
    "REQUEST_TIMEOUT_S",
    "TEXT",
    "Check",
    "CheckResult",
    "Health",
    "Reply",
    "Route",
    "build_response",
    "default_listen_host",
    "metrics_route",
    "registry_renderer",
    "request_path",
    "respond",
]

TEXT = "text/plain; charset=utf-8"
MAX_REQUEST_BYTES = 16384  # request line and headers; a longer request is dropped unanswered
REQUEST_TIMEOUT_S = 5.0  # seconds from connecting (or the last answer) to the end of the request's head
ANSWER_TIMEOUT_S = 10.0  # seconds to compute and write one answer (a client that does not read it)
MAX_CONNECTIONS = 64  # open connections per endpoint; above 50 concurrent scrapers (benchmarks/exporter.py)

Reply = tuple[int, bytes, str]  # status, body, content type
Route = Callable[[str], Reply]  # the request's Accept header -> its reply
CheckResult = bool | tuple[bool, str]
Check = Callable[[], CheckResult]


def default_listen_host(environ: Mapping[str, str]) -> str:
    """``127.0.0.1`` under systemd (``$INVOCATION_ID`` set), ``0.0.0.0`` otherwise (pods, probes)."""
    return "127.0.0.1" if environ.get("INVOCATION_ID") else "0.0.0.0"  # pods: probes come from the node


def _text(status: int, text: str) -> Reply:
    return status, text.encode(), TEXT


def _check_line(name: str, ok: bool, detail: str) -> str:
    line = f"{name}: {'ok' if ok else 'failing'}"
    return f"{line}: {detail}" if detail else line


class Health:
    """An agent's liveness and readiness.

    Readiness: named checks (plain callables returning ok or (ok, detail)), run on every ``/readyz``;
    they must be cheap and thread-safe (typically they read a flag the agent sets, or use
    :meth:`set_ready`). ``/readyz`` is 200 when all pass (none: ready), 503 otherwise, and lists each
    check then ``ready`` / ``not ready``.

    Liveness: with ``stale_after`` (a transport on its own thread), ``/healthz`` is 200 while the
    event loop stamped :meth:`beat` within that many seconds, 503 otherwise. Without it (a transport
    on the event loop), answering at all proves the loop runs: always 200 ``ok``.
    """

    def __init__(
        self, *, stale_after: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stale_after = stale_after
        self.clock = clock
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()
        self._last_beat: float | None = None

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
        """Stamp the liveness heartbeat (from the event loop)."""
        self._last_beat = self.clock()

    def liveness(self) -> tuple[bool, str]:
        if self.stale_after is None:
            return True, "ok"
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

    def healthz(self, accept: str = "") -> Reply:
        ok, detail = self.liveness()
        return _text(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, detail + "\n")

    def readyz(self, accept: str = "") -> Reply:
        ready, results = self.readiness()
        lines = [_check_line(name, ok, detail) for name, ok, detail in results]
        lines.append("ready" if ready else "not ready")
        return _text(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, "\n".join(lines) + "\n")

    def routes(self, metrics: Route | None = None) -> dict[str, Route]:
        """``/healthz`` (and ``/health``, dcgm-exporter's probe path), ``/readyz``, and ``/metrics``
        when given."""
        routes: dict[str, Route] = {"/healthz": self.healthz, "/health": self.healthz, "/readyz": self.readyz}
        if metrics is not None:
            routes["/metrics"] = metrics
        return routes


def registry_renderer(registry: CollectorRegistry) -> Callable[[str], tuple[bytes, str]]:
    """Accept header -> (exposition, content type) of ``registry``: OpenMetrics when asked for."""

    def render(accept: str) -> tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type

    return render


def metrics_route(render: Callable[[str], tuple[bytes, str]], log: BoundLogger | None = None) -> Route:
    """``/metrics`` from ``render`` (Accept -> body, content type); a failing render is a logged 500."""

    def route(accept: str) -> Reply:
        try:
            body, content_type = render(accept)
        except Exception:
            (log or get_logger("gpunode.http")).error("metrics_render_failed", exc_info=True)
            return _text(HTTPStatus.INTERNAL_SERVER_ERROR, "metrics collection failed\n")
        return HTTPStatus.OK, body, content_type

    return route


def build_response(
    status: int,
    body: bytes,
    content_type: str,
    *,
    keep_alive: bool,
    head: bool = False,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """The whole answer, ready to write; ``head``: headers only, with the body's length."""
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Server: gpunode",
        f"Date: {formatdate(usegmt=True)}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
        *(f"{key}: {value}" for key, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body)


def request_path(head: bytes) -> str:
    """The path of a request head's target (no query string); "" when the request line is malformed."""
    lines = head.splitlines()
    parts = lines[0].split(b" ") if lines else []
    return parts[1].partition(b"?")[0].decode("latin-1") if len(parts) == 3 else ""


def respond(routes: Mapping[str, Route], head: bytes) -> tuple[bytes, bool]:
    """One request head (request line and headers, through the blank line) -> (answer, keep alive)."""
    lines = head.decode("latin-1").splitlines()
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3:
        return build_response(HTTPStatus.BAD_REQUEST, b"bad request\n", TEXT, keep_alive=False), False
    method, target, version = parts
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if method not in ("GET", "HEAD"):
        # a request body may follow; never read it as the next request
        answer = build_response(
            HTTPStatus.METHOD_NOT_ALLOWED,
            b"only GET and HEAD are allowed\n",
            TEXT,
            keep_alive=False,
            headers={"Allow": "GET, HEAD"},
        )
        return answer, False
    keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    route = routes.get(target.partition("?")[0])
    if route is None:
        status, body, content_type = _text(
            HTTPStatus.NOT_FOUND, "not found; try " + ", ".join(sorted(routes)) + "\n"
        )
    else:
        try:
            status, body, content_type = route(headers.get("accept", ""))
        except Exception:
            get_logger("gpunode.http").error("http_route_failed", path=target, exc_info=True)
            status, body, content_type = _text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n")
    return build_response(
        status, body, content_type, keep_alive=keep_alive, head=method == "HEAD"
    ), keep_alive

"""gpunode.common.httpcore: the health model, routing and the response builder, without sockets."""

from __future__ import annotations

import pytest

from gpunode.common.httpcore import (
    TEXT,
    Health,
    Route,
    build_response,
    default_listen_host,
    metrics_route,
    request_path,
    respond,
)


def _routes() -> dict[str, Route]:
    return {"/metrics": lambda accept: (200, f"accept={accept}\n".encode(), "text/plain; version=0.0.4")}


def _parse(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return status, headers, body


def test_get_keeps_http_1_1_alive_and_passes_accept() -> None:
    answer, keep = respond(_routes(), b"GET /metrics?x=1 HTTP/1.1\r\nAccept: text/plain\r\n\r\n")
    status, headers, body = _parse(answer)
    assert (status, body, keep) == ("HTTP/1.1 200 OK", b"accept=text/plain\n", True)
    assert headers["Content-Type"] == "text/plain; version=0.0.4"
    assert headers["Content-Length"] == str(len(body))
    assert headers["Connection"] == "keep-alive"
    assert headers["Cache-Control"] == "no-store"
    assert headers["Server"] == "gpunode"
    assert headers["Date"].endswith(" GMT")


@pytest.mark.parametrize(
    ("head", "keep"),
    [
        pytest.param(b"GET /metrics HTTP/1.1\r\nConnection: Close\r\n\r\n", False, id="close"),
        pytest.param(b"GET /metrics HTTP/1.0\r\n\r\n", False, id="http-1.0"),
        pytest.param(b"GET /metrics HTTP/1.1\n\n", True, id="bare-lf"),
    ],
)
def test_keep_alive_rules(head: bytes, keep: bool) -> None:
    answer, keep_alive = respond(_routes(), head)
    assert keep_alive is keep
    assert _parse(answer)[1]["Connection"] == ("keep-alive" if keep else "close")


def test_head_sends_the_get_headers_without_the_body() -> None:
    answer, keep = respond(_routes(), b"HEAD /metrics HTTP/1.1\r\n\r\n")
    status, headers, body = _parse(answer)
    assert (status, body, keep) == ("HTTP/1.1 200 OK", b"", True)
    assert headers["Content-Length"] == str(len(b"accept=\n"))


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
def test_other_methods_are_405_and_close(method: str) -> None:
    answer, keep = respond(_routes(), f"{method} /metrics HTTP/1.1\r\n\r\n".encode())
    status, headers, body = _parse(answer)
    assert (status, body, keep) == (
        "HTTP/1.1 405 Method Not Allowed",
        b"only GET and HEAD are allowed\n",
        False,
    )
    assert headers["Allow"] == "GET, HEAD"
    assert headers["Content-Type"] == TEXT == "text/plain; charset=utf-8"


def test_head_answers_headers_only() -> None:
    answer, keep = respond(_routes(), b"HEAD /metrics HTTP/1.1\r\n\r\n")
    status, headers, body = _parse(answer)
    assert status == "HTTP/1.1 200 OK"
    assert int(headers["Content-Length"]) > 0
    assert body == b""
    assert keep is True


def test_unknown_path_is_404_naming_the_routes() -> None:
    answer, keep = respond(Health().routes(), b"GET /nope HTTP/1.1\r\n\r\n")
    status, headers, body = _parse(answer)
    assert (status, body, keep) == (
        "HTTP/1.1 404 Not Found",
        b"not found; try /health, /healthz, /readyz\n",
        True,
    )
    assert headers["Content-Type"] == TEXT


@pytest.mark.parametrize("head", [b"GARBAGE\r\n\r\n", b"\r\n", b"GET /\r\n\r\n"])
def test_malformed_request_line_is_400_and_close(head: bytes) -> None:
    answer, keep = respond(_routes(), head)
    status, headers, body = _parse(answer)
    assert (status, body, keep) == ("HTTP/1.1 400 Bad Request", b"bad request\n", False)
    assert headers["Connection"] == "close"


def test_a_raising_route_is_500() -> None:
    def broken(accept: str) -> tuple[int, bytes, str]:
        raise RuntimeError("boom")

    answer, keep = respond({"/x": broken}, b"GET /x HTTP/1.1\r\n\r\n")
    assert _parse(answer)[0] == "HTTP/1.1 500 Internal Server Error"
    assert keep is True


def test_metrics_route_turns_a_failing_render_into_500() -> None:
    def render(accept: str) -> tuple[bytes, str]:
        raise RuntimeError("NVML gone")

    assert metrics_route(render)("") == (500, b"metrics collection failed\n", TEXT)
    assert metrics_route(lambda accept: (b"m 1\n", "text/plain"))("") == (200, b"m 1\n", "text/plain")


def test_readiness_text_and_status() -> None:
    health = Health()
    assert health.readyz() == (200, b"ready\n", TEXT)
    health.add_check("sampled", lambda: (False, "no sample yet"))
    health.set_ready("nvml", True)
    assert health.readyz() == (503, b"nvml: ok\nsampled: failing: no sample yet\nnot ready\n", TEXT)
    health.add_check("sampled", lambda: (True, "first sample taken"))
    assert health.readyz() == (200, b"nvml: ok\nsampled: ok: first sample taken\nready\n", TEXT)


def test_liveness_without_heartbeat_is_always_ok() -> None:
    assert Health().healthz() == (200, b"ok\n", TEXT)


def test_liveness_with_heartbeat_follows_the_clock() -> None:
    now = [100.0]
    health = Health(stale_after=5, clock=lambda: now[0])
    assert health.healthz() == (503, b"no heartbeat yet\n", TEXT)
    health.beat()
    assert health.healthz()[0] == 200
    now[0] += 6
    assert health.healthz() == (503, b"event loop stalled: no heartbeat for 6.0s (limit 5s)\n", TEXT)


def test_routes_include_metrics_only_when_given() -> None:
    assert sorted(Health().routes()) == ["/health", "/healthz", "/readyz"]
    assert "/metrics" in Health().routes(metrics_route(lambda accept: (b"", "text/plain")))


def test_build_response_head_keeps_the_length() -> None:
    answer = build_response(200, b"hello", TEXT, keep_alive=False, head=True, headers={"X-A": "1"})
    _, headers, body = _parse(answer)
    assert (headers["Content-Length"], headers["X-A"], body) == ("5", "1", b"")


@pytest.mark.parametrize(
    ("environ", "host"),
    [({}, "0.0.0.0"), ({"INVOCATION_ID": "abc"}, "127.0.0.1")],
)
def test_default_listen_host(environ: dict[str, str], host: str) -> None:
    assert default_listen_host(environ) == host


@pytest.mark.parametrize(
    ("head", "path"),
    [
        pytest.param(b"GET /metrics?x=1 HTTP/1.1\r\nAccept: */*\r\n\r\n", "/metrics", id="query"),
        pytest.param(b"HEAD /healthz HTTP/1.0\n\n", "/healthz", id="bare-LF"),
        pytest.param(b"GARBAGE\r\n\r\n", "", id="malformed"),
        pytest.param(b"\r\n", "", id="blank"),
    ],
)
def test_request_path(head: bytes, path: str) -> None:
    assert request_path(head) == path

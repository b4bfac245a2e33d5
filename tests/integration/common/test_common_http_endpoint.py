"""gpunode.common.http: real HTTP requests to the endpoint over 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.client
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import pytest

from gpunode.common.http import HealthServer
from gpunode.common.httpcore import default_listen_host
from gpunode.common.metrics import AgentMetrics, create_metrics


@dataclass
class Reply:
    status: int
    body: str
    headers: Mapping[str, str]


def _request_sync(port: int, method: str, path: str, headers: Mapping[str, str]) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, headers=dict(headers))
        response = conn.getresponse()
        return Reply(response.status, response.read().decode(), dict(response.getheaders()))
    finally:
        conn.close()


async def request(
    port: int, path: str, method: str = "GET", headers: Mapping[str, str] | None = None
) -> Reply:
    return await asyncio.to_thread(_request_sync, port, method, path, headers or {})


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def metrics() -> AgentMetrics:
    return create_metrics("exporter", "9.9.9", process_metrics=False)


@pytest.fixture
async def server(metrics: AgentMetrics) -> AsyncIterator[tuple[HealthServer, FakeClock]]:
    clock = FakeClock()
    # a heartbeat interval far beyond the test: only the beat on entry happens; the fake clock ages it
    async with HealthServer(
        metrics.registry,
        host="127.0.0.1",
        port=0,
        heartbeat_interval=3600,
        stale_after=10,
        clock=clock,
    ) as endpoint:
        yield endpoint, clock


async def test_binds_an_ephemeral_port(server: tuple[HealthServer, FakeClock]) -> None:
    endpoint, _ = server
    assert endpoint.port > 0
    assert endpoint.url == f"http://127.0.0.1:{endpoint.port}"


async def test_healthz_follows_the_heartbeat(server: tuple[HealthServer, FakeClock]) -> None:
    endpoint, clock = server
    reply = await request(endpoint.port, "/healthz")
    assert (reply.status, reply.body) == (200, "ok\n")
    clock.now += 10.5  # the loop has not stamped a heartbeat for longer than stale_after
    reply = await request(endpoint.port, "/healthz")
    assert reply.status == 503
    assert "event loop stalled: no heartbeat for 10.5s (limit 10s)" in reply.body
    endpoint.beat()
    assert (await request(endpoint.port, "/healthz")).status == 200


async def test_wedged_loop_fails_liveness_until_it_runs_again() -> None:
    clock = FakeClock()
    async with HealthServer(None, port=0, heartbeat_interval=0.001, stale_after=10, clock=clock) as endpoint:
        clock.now += 60
        # a blocking call on the loop thread: the heartbeat task cannot run, the HTTP thread still answers
        wedged = _request_sync(endpoint.port, "GET", "/healthz", {})
        assert wedged.status == 503
        assert "no heartbeat for 60.0s" in wedged.body
        for _ in range(1000):  # once the loop runs, the heartbeat task stamps the new time
            await asyncio.sleep(0.001)
            if endpoint.liveness()[0]:
                break
        assert (await request(endpoint.port, "/healthz")).status == 200


async def test_readyz_without_checks_is_ready(server: tuple[HealthServer, FakeClock]) -> None:
    endpoint, _ = server
    reply = await request(endpoint.port, "/readyz")
    assert (reply.status, reply.body) == (200, "ready\n")


async def test_readyz_lists_every_check(server: tuple[HealthServer, FakeClock]) -> None:
    endpoint, _ = server
    state = {"registered": False}
    endpoint.add_check("registered_with_kubelet", lambda: state["registered"])
    endpoint.set_ready("nvml_initialized", True)
    endpoint.add_check("first_snapshot", lambda: (False, "sampler has not run yet"))

    def broken() -> bool:
        raise OSError("no such device")

    endpoint.add_check("config_loaded", broken)
    reply = await request(endpoint.port, "/readyz")
    assert reply.status == 503
    assert reply.body.splitlines() == [
        "config_loaded: failing: check raised OSError: no such device",
        "first_snapshot: failing: sampler has not run yet",
        "nvml_initialized: ok",
        "registered_with_kubelet: failing",
        "not ready",
    ]
    state["registered"] = True
    endpoint.remove_check("config_loaded")
    endpoint.set_ready("first_snapshot", True)
    reply = await request(endpoint.port, "/readyz")
    assert reply.status == 200
    assert reply.body.splitlines()[-1] == "ready"


async def test_metrics_exposition(server: tuple[HealthServer, FakeClock], metrics: AgentMetrics) -> None:
    endpoint, _ = server
    metrics.count_error("sampler")
    reply = await request(endpoint.port, "/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=")
    assert 'gpunode_build_info{agent="exporter"' in reply.body
    assert 'gpunode_errors_total{agent="exporter",reason="sampler"} 1.0' in reply.body


async def test_metrics_openmetrics_when_asked(server: tuple[HealthServer, FakeClock]) -> None:
    endpoint, _ = server
    reply = await request(
        endpoint.port, "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
    assert reply.body.endswith("# EOF\n")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/", 404, id="root"),
        pytest.param("GET", "/healthz/extra", 404, id="subpath"),
        pytest.param("GET", "/metricsz", 404, id="typo"),
        pytest.param("GET", "/healthz?verbose=1", 200, id="query-ignored"),
        pytest.param("POST", "/healthz", 405, id="post"),
        pytest.param("PUT", "/metrics", 405, id="put"),
        pytest.param("DELETE", "/readyz", 405, id="delete"),
        pytest.param("HEAD", "/healthz", 200, id="head"),
    ],
)
async def test_routes_and_methods(
    server: tuple[HealthServer, FakeClock], method: str, path: str, status: int
) -> None:
    endpoint, _ = server
    reply = await request(endpoint.port, path, method=method)
    assert reply.status == status
    if status == 405:
        assert reply.headers["Allow"] == "GET, HEAD"


async def test_metrics_404_without_registry() -> None:
    async with HealthServer(None, port=0) as endpoint:
        assert (await request(endpoint.port, "/metrics")).status == 404


async def test_failing_collector_gives_500(metrics: AgentMetrics) -> None:
    class Broken:
        def collect(self) -> list[object]:
            raise RuntimeError("NVML gone")

        def describe(self) -> list[object]:
            return []

    metrics.registry.register(Broken())  # type: ignore[arg-type]
    async with HealthServer(metrics.registry, port=0) as endpoint:
        reply = await request(endpoint.port, "/metrics")
        assert reply.status == 500
        assert (await request(endpoint.port, "/healthz")).status == 200  # the server survives


async def test_stops_cleanly_in_a_task_group() -> None:
    endpoint = HealthServer(None, port=0)
    before = asyncio.all_tasks()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(endpoint.serve(), name="http")
        for _ in range(1000):
            await asyncio.sleep(0.001)
            if endpoint.port:
                break
        port = endpoint.port
        assert (await request(port, "/healthz")).status == 200
        task.cancel()
    assert task.cancelled()
    assert asyncio.all_tasks() == before  # heartbeat task gone too
    with pytest.raises(ConnectionRefusedError):
        await request(port, "/healthz")


async def test_start_twice_is_an_error() -> None:
    async with HealthServer(None, port=0) as endpoint:
        with pytest.raises(RuntimeError, match="already started"):
            endpoint.start()


@pytest.mark.parametrize(
    ("environ", "host"),
    [
        pytest.param({}, "0.0.0.0", id="pod"),
        pytest.param({"INVOCATION_ID": "abc"}, "127.0.0.1", id="systemd"),
    ],
)
def test_default_listen_host(environ: dict[str, str], host: str) -> None:
    assert default_listen_host(environ) == host


STUCK_RENDER = """
import asyncio, socket, threading
from prometheus_client import CollectorRegistry
from gpunode.common.http import HealthServer

class Stuck:
    def collect(self):
        threading.Event().wait()  # a collector that never returns
        yield from ()

    def describe(self):
        return []

async def main():
    registry = CollectorRegistry()
    registry.register(Stuck())
    async with HealthServer(registry, port=0) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"GET /metrics HTTP/1.1\\r\\n\\r\\n")
            await asyncio.sleep(0.3)  # the render is stuck by now
        print("leaving", flush=True)

asyncio.run(main())
print("stopped", flush=True)
"""


def test_a_stuck_render_does_not_keep_the_process_alive() -> None:
    """The /metrics render threads are daemons: the process exits with the render still stuck."""
    done = subprocess.run(
        [sys.executable, "-c", STUCK_RENDER], capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["leaving", "stopped"]


async def test_an_address_it_cannot_listen_on_is_named() -> None:
    async with HealthServer(None, port=0) as endpoint:
        other = HealthServer(None, host="127.0.0.1", port=endpoint.port)
        with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{endpoint.port}: .*in use"):
            other.start()

"""Slow HTTP clients against an endpoint served by another process, and what that process holds meanwhile.

Shared by ``tests/hostile/test_http_slow_clients.py`` (asserts the bounds) and a measurement script run
against an older checkout for the before/after figures. :func:`flood` opens ``clients`` connections that
either trickle a request that never ends (a byte every ``every`` seconds), connect and idle, or trickle
and reconnect as soon as they are cut off; while they
do, it samples the server's thread count and the client connections it holds (its own socket fds on the
port, not the kernel's accept queue), and asks ``/healthz`` on a fresh connection every ``probe_every``
seconds from a thread of its own, as a liveness probe would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

SLOW_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100_000  # never ends in time
PROBE = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def threads(pid: int) -> int:
    """The process's thread count."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Threads: line for {pid}")


def _inodes_on_port(port: int) -> set[str]:
    """Socket inodes of TCP connections (not listeners) whose local port is ``port``."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] != "0A":  # 0A: LISTEN
                    found.add(cols[9])
    return found


def held_connections(pid: int, port: int) -> int:
    """Client connections on ``port`` the process holds open (fds), not those waiting to be accepted."""
    on_port = _inodes_on_port(port)
    held = 0
    with contextlib.suppress(FileNotFoundError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in on_port:
                    held += 1
    return held


@dataclass
class Probe:
    at: float  # seconds into the flood
    seconds: float  # until the whole answer came (the timeout when none)
    status: int | None  # None: no answer within the timeout (or the connection was cut)
    error: str = ""  # why there was no answer


@dataclass
class FloodReport:
    clients: int
    mode: str
    seconds: float  # how long the slow clients kept at it
    base_threads: int  # before the flood
    base_held: int
    max_threads: int = 0
    max_held: int = 0
    connected: int = 0
    connect_failed: int = 0
    connect_errors: set[str] = field(default_factory=set)
    answered: int = 0  # slow clients that got any bytes back (an unfinished request gets none)
    lifetimes: list[float] = field(default_factory=list)  # connect -> cut by the server
    survivors: int = 0  # still open when the flood ended
    probes: list[Probe] = field(default_factory=list)
    after_threads: int = 0
    after_held: int = 0
    wall: float = 0.0

    def summary(self) -> str:
        answered = [p for p in self.probes if p.status == 200]
        worst = max((p.seconds for p in self.probes), default=0.0)
        life = max(self.lifetimes, default=0.0)
        return (
            f"{self.clients} {self.mode} clients for {self.seconds:g}s: threads {self.base_threads} -> max "
            f"{self.max_threads} (after {self.after_threads}); held connections max {self.max_held} "
            f"(before {self.base_held}, after {self.after_held}); connected {self.connected}, connect failed "
            f"{self.connect_failed} {sorted(self.connect_errors)}; cut by the server {len(self.lifetimes)} "
            f"(longest {life:.1f}s), "
            f"still open at the end {self.survivors}; /healthz probes {len(answered)}/{len(self.probes)} "
            f"answered 200, slowest {worst:.3f}s; wall {self.wall:.1f}s"
        )


def probe(port: int, timeout: float) -> tuple[float, int | None, str]:
    """``GET /healthz`` on a fresh connection, blocking: (seconds, status or None, why none). Run it on
    a thread of its own (as a kubelet probes from another process): it sends its request as soon as
    it is connected, however busy the clients' event loop is."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(PROBE)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError("answer not complete in time")
    except OSError as exc:  # TimeoutError too
        return time.monotonic() - t0, None, repr(exc)
    answer = b"".join(chunks)
    line = answer.split(b"\r\n", 1)[0].split()
    status = int(line[1]) if len(line) >= 2 and line[1].isdigit() else None
    return time.monotonic() - t0, status, "" if status else f"answer {answer[:60]!r}"


async def _slow_client(port: int, mode: str, end: float, every: float, report: FloodReport) -> None:
    """One slow client; in "churn" mode it trickles and connects again each time it is cut off."""
    while time.monotonic() < end:
        try:
            async with asyncio.timeout(max(0.1, end - time.monotonic())):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except (TimeoutError, OSError) as exc:
            report.connect_failed += 1
            report.connect_errors.add(type(exc).__name__)
            return
        report.connected += 1
        t0 = time.monotonic()
        sent = 0
        try:
            while time.monotonic() < end:
                if mode in ("trickle", "churn"):
                    writer.write(SLOW_REQUEST[sent : sent + 1])
                    sent += 1
                try:
                    data = await asyncio.wait_for(reader.read(4096), every)
                except TimeoutError:
                    continue
                if data:
                    report.answered += 1
                    continue
                report.lifetimes.append(time.monotonic() - t0)  # EOF: cut by the server
                break
            else:
                report.survivors += 1
        except ConnectionError:
            report.lifetimes.append(time.monotonic() - t0)
        finally:
            writer.transport.abort()
        if mode != "churn":
            return


async def flood(
    pid: int,
    port: int,
    *,
    clients: int = 500,
    mode: str = "trickle",
    seconds: float = 8.0,
    every: float = 0.25,
    probe_every: float = 0.5,
    probe_timeout: float = 1.0,
    settle: float = 1.0,
) -> FloodReport:
    """``clients`` slow clients for ``seconds``; see the module doc. ``mode``: "trickle", "idle", or
    "churn" (trickle, and connect again at once when cut off: a steady stream of new connections)."""
    report = FloodReport(clients, mode, seconds, threads(pid), held_connections(pid, port))
    t0 = time.monotonic()
    end = t0 + seconds
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                report.max_threads = max(report.max_threads, threads(pid))
                report.max_held = max(report.max_held, held_connections(pid, port))
            await asyncio.sleep(0.05)

    async def probes() -> None:
        while time.monotonic() + probe_timeout < end:
            at = time.monotonic() - t0
            took, status, error = await asyncio.to_thread(probe, port, probe_timeout)
            report.probes.append(Probe(at, took, status, error))
            await asyncio.sleep(max(0.0, probe_every - took))

    sampler = asyncio.create_task(sample())
    await asyncio.gather(probes(), *(_slow_client(port, mode, end, every, report) for _ in range(clients)))
    await asyncio.sleep(settle)  # the server closes what the clients left
    done.set()
    await sampler
    report.after_threads = threads(pid)
    report.after_held = held_connections(pid, port)
    report.wall = time.monotonic() - t0
    return report

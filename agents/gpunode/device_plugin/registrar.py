"""Registration with the kubelet kept current: the registrar loop, the plugin directory watch, the self-check.

Each resource server is registered once it serves, and again after a kubelet restart (its
``kubelet.sock`` created anew), a removed socket, or a kubelet that stopped watching a registered
resource. The first round of registrations done, the plugin is ready (``ready``, and sd_notify READY).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpunode.common import sdnotify
from gpunode.common.fswatch import watch_directory
from gpunode.common.runtime import Backoff, sleep_or, trim_memory
from gpunode.device_plugin.registration import RegistrationFailed, register

if TYPE_CHECKING:
    from pathlib import Path

    from gpunode.common.logging import Logger
    from gpunode.device_plugin.resources import Resources

__all__ = ["Registrar"]

TRIM_EVERY = 60.0  # seconds between handing memory that RPC bursts freed back to the OS


class Registrar:
    """Tells the kubelet of ``resources``' servers through ``kubelet_socket`` (None: never register)."""

    def __init__(
        self,
        resources: Resources,
        *,
        kubelet_socket: Path | None,
        self_check_interval: float,
        log: Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resources = resources
        self.kubelet_socket = kubelet_socket
        self.self_check_interval = self_check_interval
        self.log = log
        self.clock = clock
        self.ready = asyncio.Event()
        self._silent_since: dict[str, float] = {}
        self._trimmed = 0.0

    def registered_check(self) -> tuple[bool, str]:
        """Readiness: every advertised resource is registered."""
        servers, pending = self.resources.servers, self.resources.pending
        if not servers:
            return (True, "no devices to advertise")
        if pending:
            return (False, "not registered: " + ", ".join(sorted(pending)))
        return (True, ", ".join(sorted(servers)))

    async def run(self) -> None:
        """Register what is pending whenever kicked; back off while the kubelet is away."""
        res = self.resources
        backoff = Backoff()
        outage_logged = False
        announced = False
        while True:
            await res.kick.wait()
            res.kick.clear()
            kubelet = self.kubelet_socket
            if kubelet is None:
                res.pending.clear()
            while res.pending:
                assert kubelet is not None
                name = sorted(res.pending)[0]
                server = res.servers.get(name)
                if server is None:
                    res.pending.discard(name)
                    continue
                try:
                    await register(kubelet, server.socket_path.name, name)
                except RegistrationFailed as exc:
                    if not outage_logged:
                        self.log.warning("kubelet_unavailable", error=str(exc), socket=str(kubelet))
                        outage_logged = True
                    if await sleep_or(res.kick, backoff.next()):
                        # something changed (the kubelet's socket appeared): retry quickly again, since
                        # the socket can exist a moment before the kubelet answers on it
                        backoff.reset()
                    res.kick.clear()
                    continue
                res.pending.discard(name)
                self._silent_since.pop(name, None)
                backoff.reset()
                outage_logged = False
                res.metrics.registered(name, time.time())
                self.log.info("registered", resource=name, endpoint=server.socket_path.name)
            if not announced:
                announced = True
                sdnotify.notify(
                    ready=True, status=f"serving {', '.join(sorted(res.servers)) or 'no devices'}"
                )
            self.ready.set()

    async def watch_kubelet(self) -> None:
        """The plugin directory: a new ``kubelet.sock`` (kubelet restart) or a deleted socket of ours."""
        res = self.resources
        assert self.kubelet_socket is not None
        kubelet = self.kubelet_socket.name
        async for event in watch_directory(res.plugin_dir):
            if event.kind == "created" and event.name == kubelet:
                self.log.info("kubelet_restarted")
                for server in list(res.servers.values()):
                    if not server.socket_present():
                        await res.restart(server, "socket removed by the kubelet")
                res.pending.update(res.servers)
                res.kick.set()
            elif event.kind == "deleted":
                for server in list(res.servers.values()):
                    if event.name == server.socket_path.name and not server.socket_path.exists():
                        await res.restart(server, "socket deleted")

    async def self_check(self) -> None:
        """Belt and braces for missed inotify events: our sockets exist and the kubelet is listening."""
        res = self.resources
        while True:
            await asyncio.sleep(self.self_check_interval)
            now = self.clock()
            for server in list(res.servers.values()):
                if not server.socket_present():
                    await res.restart(server, "self-check: socket missing")
                    continue
                if self.kubelet_socket is None or server.name in res.pending:
                    continue
                if server.streams > 0:
                    self._silent_since.pop(server.name, None)
                    continue
                since = self._silent_since.setdefault(server.name, now)
                if now - since >= 2 * self.self_check_interval:
                    self.log.warning("kubelet_not_watching", resource=server.name, action="re-registering")
                    self._silent_since.pop(server.name, None)
                    res.pending.add(server.name)
                    res.kick.set()
            res.base_metrics.mark_success("self-check")
            if now - self._trimmed >= TRIM_EVERY:  # hand memory that RPC bursts freed back to the OS
                self._trimmed = now
                trim_memory()

"""systemd's readiness/watchdog notification protocol, in-tree (no libsystemd).

The protocol is one ``AF_UNIX``/``SOCK_DGRAM`` datagram of newline-separated ``KEY=value`` lines sent to
the socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` means the Linux abstract namespace). When the
variable is unset (not started by systemd with ``Type=notify``) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping

__all__ = ["notify", "notify_socket_address", "watchdog_interval", "watchdog_task"]


def notify_socket_address(environ: Mapping[str, str] | None = None) -> str | bytes | None:
    """The address ``$NOTIFY_SOCKET`` names (abstract names as bytes with a leading NUL), or None."""
    env = os.environ if environ is None else environ
    name = env.get("NOTIFY_SOCKET", "")
    if not name:
        return None
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    if name.startswith("/"):
        return name
    return None  # e.g. "vsock:..." addresses; not used for services on the host


def notify(
    *,
    ready: bool = False,
    status: str | None = None,
    stopping: bool = False,
    reloading: bool = False,
    watchdog: bool = False,
    extra: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Send one notification; True if a datagram was sent, False if not under systemd or it failed.

    ``reloading`` sends ``RELOADING=1`` with the ``MONOTONIC_USEC`` that systemd 253+ expects; follow it
    with ``ready=True`` once the reload is complete. Failures never raise: notification is best effort.
    """
    address = notify_socket_address(environ)
    if address is None:
        return False
    lines: list[str] = []
    if ready:
        lines.append("READY=1")
    if reloading:
        lines.append("RELOADING=1")
        lines.append(f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
    if stopping:
        lines.append("STOPPING=1")
    if status is not None:
        lines.append("STATUS=" + " ".join(status.splitlines()))
    if watchdog:
        lines.append("WATCHDOG=1")
    for key, value in (extra or {}).items():
        lines.append(f"{key}={' '.join(value.splitlines())}")
    if not lines:
        return False
    message = ("\n".join(lines) + "\n").encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)  # never stall the event loop on a full receive queue
            sock.sendto(message, address)
    except OSError:
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """The watchdog period in seconds from ``$WATCHDOG_USEC``, or None when no watchdog applies.

    ``$WATCHDOG_PID``, when set, must be this process's pid (the variable may be inherited by children).
    """
    env = os.environ if environ is None else environ
    pid = env.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1_000_000 if usec > 0 else None


async def watchdog_task(
    interval: float | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    send: Callable[[], object] | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Send ``WATCHDOG=1`` every half watchdog period until cancelled; returns at once without one.

    It runs on the event loop, so a wedged loop stops feeding and systemd restarts the service.
    ``interval`` overrides ``$WATCHDOG_USEC``; ``send`` and ``sleep`` are injectable for tests.
    """
    period = interval if interval is not None else watchdog_interval(environ)
    if period is None or period <= 0:
        return
    feed: Callable[[], object] = (
        send if send is not None else (lambda: notify(watchdog=True, environ=environ))
    )
    while True:
        feed()
        await sleep(period / 2)

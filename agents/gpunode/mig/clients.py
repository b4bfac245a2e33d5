"""Host GPU clients: the systemd services stopped around a MIG change and started again afterwards.

The GPU Operator's MIG manager stops the host services that hold the GPUs open (nvidia-persistenced,
DCGM, nvsm, fabric manager, ...) when ``WITH_SHUTDOWN_HOST_GPU_CLIENTS`` is set, listed in the
``GPU_CLIENTS_FILE``::

    version: v1
    systemd-services:
      - nvidia-persistenced.service
      - nvidia-dcgm.service

What happens to each service depends on its state (shared/reference/mig.md §3.5 step 9; the table is
:func:`client_action`): an active one is stopped and remembered; a failed one and an inactive one
(unless a oneshot) are remembered only, so that the change leaves them running; one that does not
exist or is disabled is skipped. Whatever was remembered is started again, in reverse order, after the
change: on success, on failure, and when the manager is cancelled. The file is read by
:mod:`gpunode.api.gpu_clients`.

systemd is reached through ``systemctl`` (on the host: ``chroot <host root> systemctl``), behind the
:class:`Systemctl` protocol so that tests use a fake. Unit names are arguments, never options: each is
checked against systemd's unit-name grammar (:func:`gpunode.common.cmdargs.unit_name_problem`) before
any ``systemctl`` runs, and placed after ``--``. Its output is kept as a bounded tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol

from gpunode.common.bounds import Tail, clip, communicate
from gpunode.common.cmdargs import unit_name_problem
from gpunode.common.logging import Logger, get_logger

__all__ = [
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_STOP_TIMEOUT_S",
    "ClientAction",
    "ClientsError",
    "HostClients",
    "StoppedClients",
    "Systemctl",
    "SystemctlCommand",
    "UnitStatus",
    "client_action",
    "parse_show",
    "systemctl_prefix",
]

DEFAULT_STOP_TIMEOUT_S = 30.0  # NVIDIA's per-service limits
DEFAULT_START_TIMEOUT_S = 120.0
ClientAction = Literal["stop", "restart", "skip"]
_ACTIVE = frozenset({"active", "activating", "reloading", "refreshing"})
_DISABLED = frozenset({"disabled", "masked", "masked-runtime"})


# -- the rules --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitStatus:
    """What ``systemctl show`` says about a unit."""

    name: str
    load_state: str = "loaded"  # loaded | not-found | masked | error ...
    active_state: str = "inactive"  # active | inactive | failed | activating | deactivating ...
    unit_file_state: str = "enabled"  # enabled | disabled | static | masked | "" ...
    type: str = "simple"  # simple | oneshot | forking | notify ...


def client_action(status: UnitStatus) -> tuple[ClientAction, str]:
    """What to do with one host client before a MIG change, and why (NVIDIA's rules, in their order)."""
    if status.load_state == "not-found":
        return "skip", "not found"
    if status.active_state in _ACTIVE:
        return "stop", status.active_state
    if status.active_state == "failed":
        return "restart", "failed: started again after the change"
    if status.unit_file_state in _DISABLED:
        return "skip", f"inactive and {status.unit_file_state}"
    if status.type == "oneshot":
        return "skip", "inactive oneshot"
    return "restart", "inactive: started after the change"


def parse_show(name: str, text: str) -> UnitStatus:
    """``systemctl show --property=...`` output (``Key=value`` lines) as a :class:`UnitStatus`."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return UnitStatus(
        name=name,
        load_state=props.get("LoadState", "") or "not-found",
        active_state=props.get("ActiveState", "") or "inactive",
        unit_file_state=props.get("UnitFileState", ""),
        type=props.get("Type", "") or "simple",
    )


# -- systemctl --------------------------------------------------------------------------------------
class ClientsError(Exception):
    """systemctl failed to report, stop or start a host service."""


class Systemctl(Protocol):
    async def status(self, unit: str) -> UnitStatus: ...

    async def stop(self, unit: str, timeout: float) -> None: ...

    async def start(self, unit: str, timeout: float) -> None: ...


def systemctl_prefix(host_root: str) -> tuple[str, ...]:
    """``systemctl`` on this host, or through ``chroot`` into the host's root mounted elsewhere."""
    if os.path.realpath(host_root or "/") == "/":
        return ("systemctl",)
    return ("chroot", host_root, "systemctl")


class SystemctlCommand:
    """:class:`Systemctl` by running ``systemctl`` (behind ``prefix``, e.g. ``chroot /host``)."""

    def __init__(self, prefix: Sequence[str] = ("systemctl",), *, show_timeout: float = 10.0) -> None:
        self.prefix = tuple(prefix)
        self.show_timeout = show_timeout

    async def _run(self, args: Sequence[str], unit: str, timeout: float) -> tuple[int, str, str]:
        problem = unit_name_problem(unit)
        if problem is not None:  # the clients file is checked at load; this guards every other caller
            raise ClientsError(f"refusing to run systemctl {args[0]}: {problem}")
        argv = [*self.prefix, *args, "--", unit]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise ClientsError(f"cannot run {' '.join(argv)}: {exc.strerror or exc}") from None
        out, err = Tail(), Tail()
        try:
            await asyncio.wait_for(communicate(proc, out, err), timeout)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5.0)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ClientsError(f"{' '.join(argv)} timed out after {timeout:g} s") from None
        code = proc.returncode if proc.returncode is not None else -1
        return code, out.data.decode(errors="replace"), err.data.decode(errors="replace")

    async def status(self, unit: str) -> UnitStatus:
        code, out, err = await self._run(
            ["show", "--property=LoadState,ActiveState,UnitFileState,Type"], unit, self.show_timeout
        )
        if code != 0:
            raise ClientsError(f"systemctl show {unit}: exit {code}: {_last_line(err)}")
        return parse_show(unit, out)

    async def stop(self, unit: str, timeout: float) -> None:
        code, _, err = await self._run(["stop"], unit, timeout)
        if code != 0:
            raise ClientsError(f"systemctl stop {unit}: exit {code}: {_last_line(err)}")

    async def start(self, unit: str, timeout: float) -> None:
        code, _, err = await self._run(["start"], unit, timeout)
        if code != 0:
            raise ClientsError(f"systemctl start {unit}: exit {code}: {_last_line(err)}")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return clip(lines[-1], 500) if lines else "no message"


# -- stopping and restarting ------------------------------------------------------------------------
class HostClients:
    """The host GPU clients of one node; ``async with clients.stopped(extra) as stopped:`` around a
    change stops them and always starts them again (in reverse order) when the block ends."""

    def __init__(
        self,
        systemctl: Systemctl,
        services: Sequence[str],
        *,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT_S,
        start_timeout: float = DEFAULT_START_TIMEOUT_S,
        log: Logger | None = None,
    ) -> None:
        self.systemctl = systemctl
        self.services = tuple(services)
        self.stop_timeout = stop_timeout
        self.start_timeout = start_timeout
        self.log = log if log is not None else get_logger("gpunode.mig.clients")

    def stopped(self, extra: Sequence[str] = ()) -> StoppedClients:
        """Stop the listed services and ``extra`` ones (the kubelet, for a mode change)."""
        units = list(self.services)
        units += [unit for unit in extra if unit and unit not in units]
        return StoppedClients(self, units)


class StoppedClients:
    """The context of :meth:`HostClients.stopped`; :attr:`stopped` lists the units actually stopped,
    :attr:`remembered` every unit started again at the end."""

    def __init__(self, clients: HostClients, units: Sequence[str]) -> None:
        self.clients = clients
        self.units = tuple(units)
        self.remembered: list[str] = []
        self.stopped: list[str] = []

    async def __aenter__(self) -> StoppedClients:
        c = self.clients
        try:
            for unit in self.units:
                status = await c.systemctl.status(unit)
                action, why = client_action(status)
                c.log.info("mig_host_client", unit=unit, action=action, why=why)
                if action == "skip":
                    continue
                self.remembered.append(unit)  # before stopping: a stop that fails halfway is undone too
                if action == "stop":
                    await c.systemctl.stop(unit, c.stop_timeout)
                    self.stopped.append(unit)
        except BaseException as exc:
            await self._restart_shielded(exc)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._restart_shielded(exc)

    async def _restart_shielded(self, exc: BaseException | None) -> None:
        # Shielded: a cancelled manager still brings the host's services back before it goes.
        task = asyncio.ensure_future(self._restart())
        try:
            problems = await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            raise
        if problems and exc is None:
            raise ClientsError("host GPU clients not started again: " + "; ".join(problems))
        if problems:
            self.clients.log.error("mig_host_clients_not_restarted", problems=problems, after=str(exc))

    async def _restart(self) -> list[str]:
        c = self.clients
        problems: list[str] = []
        for unit in reversed(self.remembered):
            try:
                await c.systemctl.start(unit, c.start_timeout)
                c.log.info("mig_host_client_started", unit=unit)
            except Exception as exc:
                problems.append(str(exc))
                c.log.error("mig_host_client_start_failed", unit=unit, error=str(exc))
        self.remembered = []
        return problems

"""What the driver manager (upgrade) needs from the driver loader: a small seam between the two.

The loader (:mod:`gpunode.driver_loader.loader`) implements :class:`DriverOps` against the host; the
upgrade flow (:mod:`gpunode.driver_loader.upgrade`) only sees this Protocol, so it is tested with fakes
and with the real loader on a fake host tree alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DriverUser:
    """Something holding the driver: a process with /dev/nvidia* open, or a module depending on it."""

    kind: str  # "process" | "module"
    name: str  # process name or module name
    pid: int | None = None
    detail: str = ""  # e.g. the device node held, or the refcount

    def __str__(self) -> str:
        if self.kind == "process":
            return f"{self.name} (pid {self.pid}{', ' + self.detail if self.detail else ''})"
        return f"module {self.name}{' (' + self.detail + ')' if self.detail else ''}"


class DriverInUse(Exception):
    """The driver cannot be unloaded: these users hold it."""

    def __init__(self, users: Sequence[DriverUser]) -> None:
        self.users = tuple(users)
        listed = "; ".join(str(u) for u in self.users) or "unknown users (module refcount > 0)"
        super().__init__(f"the NVIDIA driver is in use: {listed}")


class DriverOps(Protocol):
    async def host_driver(self) -> str | None:
        """The version of a driver installed on the host itself (not by us), or None."""
        ...

    async def loaded(self) -> bool:
        """Whether the nvidia kernel module is loaded."""
        ...

    async def digest_matches(self) -> bool:
        """Whether the loaded driver was loaded with the configuration we would load now."""
        ...

    async def users(self) -> list[DriverUser]:
        """Who holds the driver right now (empty: it can be unloaded)."""
        ...

    async def unload(self) -> None:
        """Stop the driver's daemons and remove the modules; :class:`DriverInUse` if held."""
        ...

    async def load(self) -> None:
        """The full `init`: modules, device nodes, daemons, readiness files."""
        ...

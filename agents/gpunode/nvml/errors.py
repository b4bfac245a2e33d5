"""gpunode's NVML error tree. `real.py` translates vendor exceptions into these at the boundary."""

from __future__ import annotations


class NvmlError(Exception):
    """Base class; `code` is the NVML return code (nvmlReturn_t)."""

    code: int = 999

    def __init__(self, message: str = "", code: int | None = None) -> None:
        super().__init__(message or type(self).__name__)
        if code is not None:
            self.code = code


class Uninitialized(NvmlError):
    code = 1


class InvalidArgument(NvmlError):
    code = 2


class NotSupported(NvmlError):
    code = 3


class NoPermission(NvmlError):
    code = 4


class NotFound(NvmlError):
    code = 6


class DriverNotLoaded(NvmlError):
    code = 9


class Timeout(NvmlError):
    code = 10


class LibraryNotFound(NvmlError):
    code = 12


class FunctionNotFound(NvmlError):
    code = 13


class GpuLost(NvmlError):
    """The GPU fell off the bus (Xid 79) or otherwise stopped answering; a health fact, not a crash."""

    code = 15


class ResetRequired(NvmlError):
    code = 16


class InUse(NvmlError):
    code = 19


class InsufficientResources(NvmlError):
    code = 23


class VersionMismatch(NvmlError):
    code = 25


_BY_CODE: dict[int, type[NvmlError]] = {
    cls.code: cls
    for cls in (
        Uninitialized,
        InvalidArgument,
        NotSupported,
        NoPermission,
        NotFound,
        DriverNotLoaded,
        Timeout,
        LibraryNotFound,
        FunctionNotFound,
        GpuLost,
        ResetRequired,
        InUse,
        InsufficientResources,
        VersionMismatch,
    )
}


def from_code(code: int, message: str = "") -> NvmlError:
    """The error for an NVML return code (unknown codes become a plain NvmlError carrying the code)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return NvmlError(message or f"NVML error {code}", code)
    return cls(message)


class InitFailed(NvmlError):
    """NVML could not start: wraps the cause (library missing, driver not loaded, ...)."""


class ResetFailed(Exception):
    """A GPU could not be reset (in use, no reset support, lost). Not an NVML call's error: raised by the
    GPU resetters (the MIG manager's sysfs one, the simulator's), which live on both sides of NVML."""

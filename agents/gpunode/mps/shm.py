"""The MPS root's shared memory: a tmpfs at ``<root>/shm`` (NVIDIA's ``mount-shm`` step).

MPS clients and servers exchange data through ``/dev/shm``; every client container gets ``<root>/shm``
there, so it must be one file system that all of them and the servers see: a tmpfs mounted on the host
(in a pod: through a ``Bidirectional`` volume, by the DaemonSet's init container, which alone holds
``CAP_SYS_ADMIN``). :func:`mount_shm` is idempotent (a mount already there: nothing to do) and says why
it did not mount instead of raising when the caller lacks the privilege; the agent logs that and goes on
(under systemd ``/run`` is a tmpfs already and the unit binds ``<root>/shm`` as its ``/dev/shm``).

``python -m gpunode.mps.shm --mps-root DIR [--size SIZE]`` is the init container's command: exit 0 when
the tmpfs is there afterwards, 1 (with the reason) when it could not be mounted.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import os
import re
import sys
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_SIZE", "MOUNT_FLAGS", "ShmResult", "is_mountpoint", "main", "mount_shm", "parse_size"]

#: 64 MiB, the size a container runtime gives a container's /dev/shm.
DEFAULT_SIZE = "65536k"
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RELATIME = 0x2, 0x4, 0x8, 0x200000
MOUNT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RELATIME
_SIZE = re.compile(r"[1-9][0-9]*[kKmMgG]?|[1-9][0-9]?%|100%")


def parse_size(text: str) -> str:
    """A tmpfs ``size=`` value: bytes, ``k``/``m``/``g`` units or a percentage of RAM; else ValueError."""
    value = text.strip()
    if not _SIZE.fullmatch(value):
        raise ValueError(f"{text!r} is not a tmpfs size (e.g. 65536k, 1g, 10%)")
    return value


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def is_mountpoint(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The file system type mounted at ``path`` (resolved), or None when nothing is mounted there."""
    target = os.path.realpath(path)
    found: str | None = None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) >= 5 and _unescape(fields[4]) == target:
                    found = right.split()[0] if right.split() else "?"  # the last one wins (stacked)
    except OSError:
        return "unknown" if os.path.ismount(target) else None
    return found


@dataclass(frozen=True)
class ShmResult:
    outcome: Literal["mounted", "present", "skipped"]
    path: str
    detail: str = ""  # the file system already there, or why it was skipped


def mount_shm(path: str, size: str = DEFAULT_SIZE) -> ShmResult:
    """Mount a tmpfs of ``size`` at ``path`` (created if missing) unless something is mounted there."""
    os.makedirs(path, mode=0o755, exist_ok=True)
    fstype = is_mountpoint(path)
    if fstype is not None:
        return ShmResult("present", path, fstype)
    libc_name = ctypes.util.find_library("c") or "libc.so.6"
    libc = ctypes.CDLL(libc_name, use_errno=True)
    options = f"size={parse_size(size)},mode=1777".encode()
    rc = libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", ctypes.c_ulong(MOUNT_FLAGS), options)
    if rc != 0:
        err = ctypes.get_errno()
        why = os.strerror(err)
        if err in (errno.EPERM, errno.EACCES):
            why += " (mounting needs CAP_SYS_ADMIN in the host's mount namespace)"
        return ShmResult("skipped", path, f"mount -t tmpfs tmpfs {path}: {why}")
    return ShmResult("mounted", path, f"tmpfs size={size}")


def main(argv: list[str] | None = None) -> int:
    from gpunode.api.mps import DEFAULT_ROOT, MpsRoot

    parser = argparse.ArgumentParser(prog="python -m gpunode.mps.shm", description=__doc__.split("\n")[0])
    parser.add_argument("--mps-root", default=os.environ.get("MPS_ROOT", DEFAULT_ROOT))
    parser.add_argument("--size", default=os.environ.get("MPS_SHM_SIZE", DEFAULT_SIZE))
    args = parser.parse_args(argv)
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        print(f"--size: {exc}", file=sys.stderr)
        return 2
    result = mount_shm(MpsRoot(args.mps_root).shm_dir, size)
    print(f"{result.outcome}: {result.path} {result.detail}".rstrip(), file=sys.stderr)
    return 1 if result.outcome == "skipped" else 0


if __name__ == "__main__":
    sys.exit(main())

"""Mounts a test made (the MPS agent's <root>/shm tmpfs, when the tests run as root) taken away again."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

MNT_DETACH = 2


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below ``base`` (resolved), deepest first."""
    root = os.path.realpath(base)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == root or point.startswith(root + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def unmount_under(base: Path) -> list[str]:
    """Unmount (lazily) everything mounted at or below ``base``; what was unmounted."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    done = []
    for point in mounts_under(base):
        if libc.umount2(os.fsencode(point), MNT_DETACH) == 0:
            done.append(point)
    return done

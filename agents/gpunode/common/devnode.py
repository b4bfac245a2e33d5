"""Character device nodes as the agents check them, and the IMEX channel nodes' names.

:func:`char_device` says whether a path is a character device node (optionally of one major:minor). A
regular file holding ``c MAJOR:MINOR`` counts too: that is the stand-in node an unprivileged run writes
where it may not ``mknod`` (``gpunode sim init`` on a simulated node, the driver loader with
``--create-device-nodes`` pointed at a fake host); no real host has such a file under ``/dev``.

IMEX channels (multi-node NVLink memory export) are the character devices
``/dev/nvidia-caps-imex-channels/channel<N>``: major ``nvidia-caps-imex-channels`` of ``/proc/devices``
(registered by the nvidia module, driver 550 and later), minor ``N``. The driver creates none of them
(unless loaded with ``NVreg_CreateImexChannel0=1``): an administrator, or the driver loader, must.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

__all__ = [
    "IMEX_CHANNELS_DIR",
    "IMEX_CHANNELS_MAJOR_NAME",
    "IMEX_CHANNEL_COUNT",
    "char_device",
    "imex_channel_path",
    "parse_channel_name",
]

IMEX_CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"
IMEX_CHANNELS_MAJOR_NAME = "nvidia-caps-imex-channels"
IMEX_CHANNEL_COUNT = 2048  # channel0 ... channel2047
_MARKER = re.compile(r"^c (\d+):(\d+)$")
_CHANNEL = re.compile(r"^channel(\d{1,10})$")


def imex_channel_path(channel: int | str) -> str:
    """``/dev/nvidia-caps-imex-channels/channel<N>`` (a path inside a container, or under a dev root)."""
    return f"{IMEX_CHANNELS_DIR}/channel{channel}"


def parse_channel_name(name: str) -> int | None:
    """``channel7`` -> 7; None for any other name."""
    match = _CHANNEL.match(name)
    return int(match[1]) if match else None


def char_device(path: Path, major: int | None = None, minor: int | None = None) -> bool:
    """Whether ``path`` is a character device (of ``major``:``minor`` when given) or its stand-in file."""
    try:
        st = path.stat()
    except OSError:
        return False
    if stat.S_ISCHR(st.st_mode):
        found = (os.major(st.st_rdev), os.minor(st.st_rdev))
    elif stat.S_ISREG(st.st_mode) and st.st_size <= 32:
        text = ""
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = path.read_text().strip()
        match = _MARKER.match(text)
        if match is None:
            return False
        found = (int(match[1]), int(match[2]))
    else:
        return False
    return (major is None or found[0] == major) and (minor is None or found[1] == minor)

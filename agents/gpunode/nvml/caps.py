"""The driver's MIG capabilities: which ``/dev/nvidia-caps/nvidia-cap<minor>`` node grants access to a
GPU instance or compute instance.

The driver lists every capability with its device minor in ``/proc/driver/nvidia-caps/mig-minors``
(``gpu0/gi1/access 12`` lines, plus ``config`` and ``monitor``); ``gpu<N>`` there is the parent GPU's
device *minor* number, not its NVML index. The device plugin, the CDI generator and the simulator's
host all use these names.
"""

from __future__ import annotations

from pathlib import Path

from gpunode.common.hostpaths import HostPaths

__all__ = ["MIG_MINORS", "mig_cap_keys", "mig_minors_path", "parse_mig_minors", "read_mig_minors"]

#: the capability table, relative to /proc
MIG_MINORS = "driver/nvidia-caps/mig-minors"


def mig_cap_keys(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[str, str]:
    """The capability names of a MIG device, as ``mig-minors`` spells them:
    ``("gpu0/gi1/access", "gpu0/gi1/ci0/access")``."""
    gi = f"gpu{gpu_minor}/gi{gi_id}/access"
    return gi, f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"


def parse_mig_minors(text: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` -> ``{"gpu0/gi1/access": 12, "config": 1, ...}``.

    Lines that do not read ``<name> <minor>`` are skipped.
    """
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def mig_minors_path(host: HostPaths) -> Path:
    """``/proc/driver/nvidia-caps/mig-minors`` under the host's /proc."""
    return host.proc / MIG_MINORS


def read_mig_minors(host: HostPaths) -> dict[str, int] | None:
    """The host's capability table (:func:`parse_mig_minors`); None where it cannot be read (no driver,
    or a driver without MIG support)."""
    try:
        return parse_mig_minors(mig_minors_path(host).read_text())
    except OSError:
        return None

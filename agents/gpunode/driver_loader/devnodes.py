"""The ``/dev/nvidia*`` character devices the driver itself does not create.

The nvidia modules register character majors (``/proc/devices``: ``nvidia-frontend``, normally 195;
``nvidia-uvm`` and ``nvidia-caps``, dynamic) but create no nodes: NVIDIA leaves that to
``nvidia-modprobe`` and its operator's validator. :func:`plan_nodes` lists the nodes that should exist:

* ``/dev/nvidiactl`` 195:255 and ``/dev/nvidiaN`` 195:N per GPU (``Device Minor`` of
  ``/proc/driver/nvidia/gpus/<bdf>/information``), ``/dev/nvidia-modeset`` 195:254 when modeset is loaded;
* ``/dev/nvidia-uvm`` M:0 and ``/dev/nvidia-uvm-tools`` M:1 with M the ``nvidia-uvm`` major;
* ``/dev/nvidia-caps/nvidia-cap<minor>`` with the ``nvidia-caps`` major for every capability file
  under ``/proc/driver/nvidia/capabilities`` (``DeviceFileMinor``/``DeviceFileMode``; MIG access);
* ``/dev/nvidia-caps-imex-channels/channel<N>`` with the ``nvidia-caps-imex-channels`` major, minor N,
  for the IMEX channels asked for (``--imex-channels``; the driver makes channel 0 itself only when
  loaded with ``NVreg_CreateImexChannel0=1``).

:func:`ensure_nodes` creates the missing or wrong ones. Where udev runs (``/run/udev/control`` exists)
it first waits a little for udev to make them, watching udev's events through pyudev; this module is
the only one that imports pyudev, and only inside :func:`wait_for_udev`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpunode.common.devnode import IMEX_CHANNELS_MAJOR_NAME, imex_channel_path
from gpunode.common.hostpaths import HostPaths
from gpunode.driver_loader.kmod import HostOps
from gpunode.driver_loader.modules import (
    Capability,
    parse_capability,
    parse_gpu_minor,
    parse_proc_devices,
)

__all__ = ["DEFAULT_NVIDIA_MAJOR", "DeviceNode", "NodeError", "ensure_nodes", "plan_nodes", "wait_for_udev"]

DEFAULT_NVIDIA_MAJOR = 195


class NodeError(Exception):
    """The nodes cannot be planned or created (the message says which and why)."""


@dataclass(frozen=True)
class DeviceNode:
    path: Path
    major: int
    minor: int
    mode: int = 0o666

    def __str__(self) -> str:
        return f"{self.path.name} {self.major}:{self.minor}"


def plan_nodes(
    paths: HostPaths, loaded: Sequence[str], *, imex_channels: Sequence[int] = ()
) -> list[DeviceNode]:
    """Every node the loaded modules need (``loaded``: sysfs module names), and the IMEX channels asked
    for (:class:`NodeError` when the driver registered no IMEX major)."""
    try:
        majors = parse_proc_devices(paths.proc_devices.read_text())
    except OSError as exc:
        raise NodeError(f"cannot read {paths.proc_devices}: {exc.strerror or exc}") from None
    nodes: list[DeviceNode] = []
    if "nvidia" in loaded:
        major = majors.get("nvidia-frontend", majors.get("nvidia", DEFAULT_NVIDIA_MAJOR))
        nodes.append(DeviceNode(paths.nvidiactl, major, 255))
        nodes.extend(DeviceNode(paths.dev_nvidia(minor), major, minor) for minor in gpu_minors(paths))
        if "nvidia_modeset" in loaded:
            nodes.append(DeviceNode(paths.nvidia_modeset, major, 254))
        caps_major = majors.get("nvidia-caps")
        if caps_major is not None:
            for cap in capabilities(paths):
                path = paths.nvidia_caps / f"nvidia-cap{cap.minor}"
                nodes.append(DeviceNode(path, caps_major, cap.minor, cap.mode))
        nodes.extend(imex_nodes(paths, majors, imex_channels))
    if "nvidia_uvm" in loaded:
        uvm = majors.get("nvidia-uvm")
        if uvm is None:
            raise NodeError(f"nvidia_uvm is loaded but {paths.proc_devices} lists no nvidia-uvm major")
        nodes.append(DeviceNode(paths.nvidia_uvm, uvm, 0))
        nodes.append(DeviceNode(paths.nvidia_uvm_tools, uvm, 1))
    return nodes


def imex_nodes(paths: HostPaths, majors: dict[str, int], channels: Sequence[int]) -> list[DeviceNode]:
    """``/dev/nvidia-caps-imex-channels/channel<N>`` (mode 0666, as NVIDIA's guide makes them) with the
    ``nvidia-caps-imex-channels`` major; none asked for, none planned."""
    if not channels:
        return []
    major = majors.get(IMEX_CHANNELS_MAJOR_NAME)
    if major is None:
        raise NodeError(
            f"IMEX channels {', '.join(map(str, channels))} asked for (--imex-channels) but "
            f"{paths.proc_devices} lists no {IMEX_CHANNELS_MAJOR_NAME} major: the loaded driver has no "
            "IMEX channels (driver 550 or later has them); drop --imex-channels or upgrade the driver"
        )
    return [DeviceNode(paths.host(imex_channel_path(n)), major, n) for n in channels]


def gpu_minors(paths: HostPaths) -> list[int]:
    gpus = paths.proc_driver_nvidia / "gpus"
    minors: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in gpus.iterdir():
            with contextlib.suppress(OSError):
                minor = parse_gpu_minor((entry / "information").read_text())
                if minor is not None:
                    minors.add(minor)
    return sorted(minors)


def capabilities(paths: HostPaths) -> list[Capability]:
    found: dict[int, Capability] = {}
    root = paths.proc_driver_nvidia / "capabilities"
    for directory, _dirs, files in os.walk(root):
        for name in sorted(files):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                cap = parse_capability((Path(directory) / name).read_text())
                if cap is not None:
                    found.setdefault(cap.minor, cap)
    return [found[minor] for minor in sorted(found)]


async def ensure_nodes(
    paths: HostPaths,
    ops: HostOps,
    nodes: Sequence[DeviceNode],
    *,
    udev_timeout: float = 3.0,
    create: bool = True,
) -> tuple[list[DeviceNode], list[DeviceNode]]:
    """Make ``nodes`` exist; returns (created by us, made by udev while we waited).

    With ``create`` false nothing is created: the first list is then what would have been.
    """
    missing = [n for n in nodes if not ops.node_matches(n.path, n.major, n.minor)]
    if not missing or not create:
        return missing, []
    by_udev: list[DeviceNode] = []
    if udev_timeout > 0 and paths.host("/run/udev/control").exists():
        waiting = [n for n in missing if not n.path.exists()]  # udev never fixes a wrong node
        if waiting:
            await asyncio.to_thread(wait_for_udev, [n.path for n in waiting], udev_timeout)
            by_udev = [n for n in waiting if ops.node_matches(n.path, n.major, n.minor)]
            missing = [n for n in missing if n not in by_udev]
    created: list[DeviceNode] = []
    for node in missing:
        try:
            node.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            ops.mknod(node.path, node.mode, node.major, node.minor)
        except OSError as exc:
            raise NodeError(
                f"cannot create {node.path} (char {node.major}:{node.minor}): {exc.strerror or exc}"
                + (
                    "; the loader needs CAP_MKNOD (run it as root)"
                    if isinstance(exc, PermissionError)
                    else ""
                )
            ) from None
        created.append(node)
    return created, by_udev


def wait_for_udev(targets: Sequence[Path], timeout: float) -> bool:
    """Block until every path in ``targets`` exists or ``timeout`` passes; True if they all appeared.

    udev's events (pyudev's netlink monitor) wake the wait early; where the monitor cannot be opened
    (no netlink in this namespace) the paths are polled instead.
    """
    deadline = time.monotonic() + timeout
    monitor = None
    try:
        import pyudev  # type: ignore[import-untyped]  # no type information shipped

        monitor = pyudev.Monitor.from_netlink(pyudev.Context())
        monitor.start()
    except Exception:  # ImportError, OSError from netlink, pyudev's own errors: fall back to polling
        monitor = None
    try:
        while True:
            if all(path.exists() for path in targets):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if monitor is not None:
                try:
                    monitor.poll(timeout=min(0.1, left))
                except Exception:
                    monitor = None
            else:
                time.sleep(min(0.05, left))
    finally:
        del monitor  # pyudev closes the netlink socket when the monitor is freed

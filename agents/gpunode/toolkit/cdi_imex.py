"""The CDI spec of the IMEX channels: ``--class imex-channel`` (``nvidia.com/imex-channel=0``).

As ``nvidia-ctk cdi generate --class imex-channel``: no NVML; every character device
``/dev/nvidia-caps-imex-channels/channel<N>`` under the dev root is one device named ``<N>`` whose only
edit is that node (host path = dev root + path), in channel order, plus ``all`` (every channel) unless
``--no-all-device``; no spec-level edits (the GPU spec carries the driver). The device plugin's CDI
names (``k8s.device-plugin.nvidia.com/imex-channel=0``) resolve against the spec generated with
``--vendor k8s.device-plugin.nvidia.com --class imex-channel``. A stand-in file ``c MAJOR:MINOR`` counts
as a node (:func:`gpunode.common.devnode.char_device`), so a simulated node's tree works too.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Sequence

from gpunode.common.devnode import IMEX_CHANNELS_DIR, char_device, imex_channel_path, parse_channel_name
from gpunode.common.hostpaths import HostPaths
from gpunode.toolkit.cdi import CdiDevice, ContainerEdits, DeviceNode, Spec, SpecOptions, validate_kind

__all__ = ["IMEX_CLASS", "build_imex_spec", "discover_channels", "is_imex_kind"]

IMEX_CLASS = "imex-channel"


def is_imex_kind(kind: str) -> bool:
    """Whether ``kind`` (``vendor/class``) names IMEX channels."""
    return kind.rpartition("/")[2] == IMEX_CLASS


def discover_channels(host: HostPaths, dev_root: str) -> list[int]:
    """The channel numbers whose node exists under ``dev_root`` (a host path, read through ``host``)."""
    directory = host.host(posixpath.join(dev_root or "/", IMEX_CHANNELS_DIR.lstrip("/")))
    found: list[int] = []
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            number = parse_channel_name(entry.name)
            if number is not None and char_device(entry):
                found.append(number)
    return sorted(found)


def build_imex_spec(channels: Sequence[int], opts: SpecOptions) -> Spec:
    """The spec for ``channels``; ``ValueError`` for an invalid kind."""
    validate_kind(opts.kind)
    nodes = [
        DeviceNode(
            imex_channel_path(n), posixpath.normpath(posixpath.join(opts.dev_root, imex_channel_path(n)[1:]))
        )
        for n in sorted(set(channels))
    ]
    devices = [
        CdiDevice(str(n), ContainerEdits(device_nodes=(node,)))
        for n, node in zip(sorted(set(channels)), nodes, strict=True)
    ]
    if opts.all_device and devices:
        devices.append(CdiDevice("all", ContainerEdits(device_nodes=tuple(nodes))))
    return Spec(opts.kind, tuple(devices))

"""The IMEX channels the plugin hands out: the configured ones whose device node exists.

NVIDIA's plugin checks each configured channel (``imex.channelIDs``, ``--imex-channel-ids``) once per
configuration: ``/dev/nvidia-caps-imex-channels/channel<N>`` must be a character device under the dev
root (the host path) or at the container path itself (a management container that got the node
injected). A missing channel is an error with ``imex.required`` (``--imex-required``), else a warning
and the channel is not handed out. Here the dev root is also looked up under ``--host-root``, so a
simulated node's tree (``gpunode sim init``) is found, and a stand-in file counts as the node
(:func:`gpunode.common.devnode.char_device`).
"""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.devnode import char_device, imex_channel_path
from gpunode.device_plugin.devices import DeviceConfigError

if TYPE_CHECKING:
    from gpunode.common.hostpaths import HostPaths
    from gpunode.device_plugin.settings import PluginSettings

__all__ = ["ImexChannels", "ImexMissingError", "resolve_channels"]


class ImexMissingError(DeviceConfigError):
    """A required IMEX channel's device node is missing (the message names the paths looked at): like
    any refused configuration, an exit 2 at start and the current resources kept after."""


@dataclass(frozen=True)
class ImexChannels:
    """The outcome: the settings with only the channels found, and a warning per channel left out."""

    settings: PluginSettings
    warnings: tuple[str, ...] = ()


def candidates(host: HostPaths, dev_root: str, channel: int) -> list[Path]:
    """Where channel ``channel``'s node may be: under the dev root (seen through the host root), and
    the container path itself."""
    path = imex_channel_path(channel)
    out = [host.host(posixpath.join(dev_root or "/", path.lstrip("/")))]
    if Path(path) not in out:
        out.append(Path(path))
    return out


def resolve_channels(settings: PluginSettings, host: HostPaths) -> ImexChannels:
    """``settings`` with the channels whose node exists; raises :class:`ImexMissingError` when a
    channel is missing and ``imex_required`` is set."""
    if not settings.imex_channel_ids:
        return ImexChannels(settings)
    found: list[int] = []
    warnings: list[str] = []
    for channel in settings.imex_channel_ids:
        places = candidates(host, settings.dev_root, channel)
        if any(char_device(p) for p in places):
            found.append(channel)
            continue
        looked = " or ".join(str(p) for p in places)
        if settings.imex_required:
            raise ImexMissingError(
                f"requested IMEX channel channel{channel} does not exist (no character device at {looked}); "
                "create it (gpunode-driver-loader --imex-channels "
                f"{channel}, or mknod with the nvidia-caps-imex-channels major of /proc/devices) "
                "or set imex.required: false"
            )
        warnings.append(f"ignoring requested IMEX channel channel{channel}: no character device at {looked}")
    if len(found) == len(settings.imex_channel_ids):
        return ImexChannels(settings)
    return ImexChannels(dataclasses.replace(settings, imex_channel_ids=tuple(found)), tuple(warnings))

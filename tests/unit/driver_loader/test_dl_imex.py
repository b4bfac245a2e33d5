"""IMEX channel nodes: the loader makes /dev/nvidia-caps-imex-channels/channel<N> with the driver's
nvidia-caps-imex-channels major, only when asked, and says so when the driver has no such major."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.common.devnode import char_device
from gpunode.common.errors import UsageError
from gpunode.driver_loader import devnodes, kmod
from gpunode.driver_loader.config import imex_channels
from gpunode.sim.host import FakeHost
from helpers.fakehost import host_ops


def test_no_channels_asked_none_planned(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.load(["nvidia"])
    nodes = devnodes.plan_nodes(host.paths, kmod.loaded_modules(host.paths))
    assert not [n for n in nodes if "imex" in str(n.path)]


async def test_channels_get_the_major_from_proc_devices_and_are_created(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.load(["nvidia"])
    text = (host.root / "proc/devices").read_text()
    (host.root / "proc/devices").write_text(
        text.replace("234 nvidia-caps-imex-channels", "241 nvidia-caps-imex-channels")
    )
    nodes = devnodes.plan_nodes(host.paths, kmod.loaded_modules(host.paths), imex_channels=(0, 7))
    imex = [
        (n.path.relative_to(host.root).as_posix(), n.major, n.minor, n.mode)
        for n in nodes
        if "imex" in str(n.path)
    ]
    assert imex == [
        ("dev/nvidia-caps-imex-channels/channel0", 241, 0, 0o666),
        ("dev/nvidia-caps-imex-channels/channel7", 241, 7, 0o666),
    ]
    created, _ = await devnodes.ensure_nodes(host.paths, host_ops(host), nodes, udev_timeout=0)
    assert {str(n) for n in created} >= {"channel0 241:0", "channel7 241:7"}
    assert char_device(host.root / "dev/nvidia-caps-imex-channels/channel7", 241, 7)
    assert ((str(host.root / "dev/nvidia-caps-imex-channels/channel0"), 0o666, 241, 0)) in host.mknods


def test_a_driver_without_imex_major_is_a_clear_error(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.load(["nvidia"])
    text = (host.root / "proc/devices").read_text()
    (host.root / "proc/devices").write_text(text.replace("234 nvidia-caps-imex-channels\n", ""))
    with pytest.raises(devnodes.NodeError, match="lists no nvidia-caps-imex-channels major"):
        devnodes.plan_nodes(host.paths, ["nvidia"], imex_channels=(0,))


def test_channel_numbers_are_checked() -> None:
    assert imex_channels((3, 0, 3)) == (0, 3)
    with pytest.raises(UsageError, match="no IMEX channel 2048; the driver has channels 0-2047"):
        imex_channels((0, 2048))

"""IMEX channels: handed out only when the channel node exists; required + missing is an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpunode.common.devnode import char_device, parse_channel_name
from gpunode.common.hostpaths import HostPaths
from gpunode.device_plugin.devices import DeviceConfigError
from gpunode.device_plugin.imex import ImexMissingError, resolve_channels
from gpunode.device_plugin.settings import PluginSettings


def channel(root: Path, n: int = 0, text: str = "c 234:0\n") -> Path:
    path = root / "dev/nvidia-caps-imex-channels" / f"channel{n}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_no_channels_configured_is_a_no_op(tmp_path: Path) -> None:
    settings = PluginSettings()
    assert resolve_channels(settings, HostPaths(root=tmp_path)).settings is settings


def test_present_channel_is_kept_under_the_dev_root(tmp_path: Path) -> None:
    channel(tmp_path / "drv")
    settings = PluginSettings(imex_channel_ids=(0,), dev_root=str(tmp_path / "drv"))
    out = resolve_channels(settings, HostPaths(root="/"))
    assert out.settings.imex_channel_ids == (0,)
    assert out.warnings == ()


def test_present_channel_is_found_under_the_host_root(tmp_path: Path) -> None:
    channel(tmp_path)
    settings = PluginSettings(imex_channel_ids=(0,), imex_required=True)
    assert resolve_channels(settings, HostPaths(root=tmp_path)).settings.imex_channel_ids == (0,)


@pytest.mark.parametrize("text", ["not a device\n", "c 234:x\n", ""], ids=["prose", "bad-minor", "empty"])
def test_a_regular_file_that_is_no_stand_in_is_not_a_channel(tmp_path: Path, text: str) -> None:
    channel(tmp_path, text=text)
    settings = PluginSettings(imex_channel_ids=(0,))
    out = resolve_channels(settings, HostPaths(root=tmp_path))
    assert out.settings.imex_channel_ids == ()
    assert "ignoring requested IMEX channel channel0" in out.warnings[0]


def test_missing_and_not_required_warns_and_hands_out_none(tmp_path: Path) -> None:
    out = resolve_channels(PluginSettings(imex_channel_ids=(0,)), HostPaths(root=tmp_path))
    assert out.settings.imex_channel_ids == ()
    assert str(tmp_path / "dev/nvidia-caps-imex-channels/channel0") in out.warnings[0]


def test_missing_and_required_is_a_config_error_naming_path_and_fix(tmp_path: Path) -> None:
    settings = PluginSettings(imex_channel_ids=(0,), imex_required=True)
    with pytest.raises(ImexMissingError) as caught:
        resolve_channels(settings, HostPaths(root=tmp_path))
    assert isinstance(caught.value, DeviceConfigError)
    text = str(caught.value)
    assert "requested IMEX channel channel0 does not exist" in text
    assert str(tmp_path / "dev/nvidia-caps-imex-channels/channel0") in text
    assert "imex.required: false" in text


def test_char_device_checks_major_and_minor(tmp_path: Path) -> None:
    path = channel(tmp_path, 3, "c 234:3\n")
    assert char_device(path)
    assert char_device(path, 234, 3)
    assert not char_device(path, 234, 0)
    assert not char_device(tmp_path / "absent")
    assert char_device(Path("/dev/null"), os.major(os.stat("/dev/null").st_rdev))
    assert parse_channel_name("channel12") == 12
    assert parse_channel_name("channelx") is None

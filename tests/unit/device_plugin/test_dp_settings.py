"""gpunode.device_plugin.settings: the precedence flag > environment variable > config file > default."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.api.plugin_config import PluginConfig
from gpunode.common.config import parse_config_text
from gpunode.common.errors import UsageError
from gpunode.device_plugin.settings import settings_from_config


def parse(text: str) -> PluginConfig:
    return parse_config_text(text, "config.yaml", PluginConfig)


def sharing_yaml(entry: str, extra: str = "") -> str:
    return f"version: v1\nsharing:\n  timeSlicing:\n{extra}    resources:\n    - {entry}\n"


# -------------------------------------------------------------------------------------- precedence

FILE = """\
flags:
  migStrategy: mixed
  nvidiaDriverRoot: /run/nvidia/driver
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [cdi-cri]
    deviceIDStrategy: index
"""


@pytest.mark.parametrize(
    ("cfg_text", "overrides", "expected"),
    [
        pytest.param(None, {}, {"mig_strategy": "none", "device_id_strategy": "uuid"}, id="defaults"),
        pytest.param(
            FILE,
            {},
            {
                "mig_strategy": "mixed",
                "pass_device_specs": True,
                "device_list_strategies": ("cdi-cri",),
                "device_id_strategy": "index",
                "driver_root": "/run/nvidia/driver",
                "dev_root": "/run/nvidia/driver",
                "fail_on_init_error": True,
            },
            id="file-over-default",
        ),
        pytest.param(
            FILE,
            {
                "mig_strategy": "single",
                "pass_device_specs": False,
                "device_list_strategies": "envvar,cdi-cri",
            },
            {
                "mig_strategy": "single",
                "pass_device_specs": False,
                "device_list_strategies": ("envvar", "cdi-cri"),
                "device_id_strategy": "index",
            },
            id="override-over-file",
        ),
        pytest.param(
            FILE,
            {"mig_strategy": "none"},
            {"mig_strategy": "none"},
            id="override-equal-to-default-still-wins",
        ),
        pytest.param(
            FILE,
            {"dev_root": "/"},
            {"driver_root": "/run/nvidia/driver", "dev_root": "/"},
            id="dev-root-override",
        ),
        pytest.param(
            "flags: {nvidiaDriverRoot: /drv, nvidiaDevRoot: /devroot}\n",
            {"driver_root": "/other"},
            {"driver_root": "/other", "dev_root": "/devroot"},
            id="file-dev-root-kept",
        ),
        pytest.param(
            None, {"driver_root": "/drv"}, {"driver_root": "/drv", "dev_root": "/drv"}, id="dev-root-follows"
        ),
        pytest.param(
            sharing_yaml("{name: gpu, replicas: 2}"),
            {"sharing": None},
            {"sharing": None},
            id="sharing-override",
        ),
        pytest.param(
            "imex: {channelIDs: [0], required: true}\n",
            {},
            {"imex_channel_ids": (0,), "imex_required": True},
            id="imex",
        ),
    ],
)
def test_settings_precedence(
    cfg_text: str | None, overrides: dict[str, Any], expected: dict[str, Any]
) -> None:
    cfg = None if cfg_text is None else parse(cfg_text)
    settings = settings_from_config(cfg, overrides)
    assert {key: getattr(settings, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            {"device_list_strategies": "envvar,bogus"}, "invalid device list strategy 'bogus'", id="strategy"
        ),
        pytest.param({"device_list_strategies": ["cdi"]}, "invalid device list strategy 'cdi'", id="list"),
        pytest.param(
            {"mig_strategy": "auto"},
            "invalid MIG strategy 'auto': must be one of none, single, mixed",
            id="mig",
        ),
        pytest.param(
            {"device_id_strategy": "serial"}, "invalid device ID strategy 'serial'", id="id-strategy"
        ),
        pytest.param(
            {"shared_allocation_policy": "spread"}, "invalid shared devices allocation policy", id="policy"
        ),
        pytest.param({"pass_device_specs": "true"}, "pass_device_specs must be true or false", id="bool"),
        pytest.param({"imex_channel_ids": [3]}, "IMEX channel IDs must be [] or [0]", id="imex"),
    ],
)
def test_settings_reject_bad_overrides(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as info:
        settings_from_config(None, overrides)
    assert message in str(info.value)


def test_settings_reject_unknown_override_keys() -> None:
    with pytest.raises(KeyError, match="migStrategy"):
        settings_from_config(None, {"migStrategy": "none"})

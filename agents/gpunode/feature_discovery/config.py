"""What the config file changes about the labels: the MIG strategy and the time-slicing settings.

Read at start, again on SIGHUP, and from whichever file of a config directory a node label chooses.
The MIG strategy keeps the settings' precedence (flag > env var > file > default): the command line
and the environment of the start are resolved again against the (re)loaded file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.api.plugin_types import MigStrategy, TimeSlicing

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.common.settings import SettingsParser
    from gpunode.feature_discovery.settings import FdSettings

__all__ = ["ConfigReader", "LabelingConfig", "plugin_config_model", "sharing_of"]


@dataclass(frozen=True)
class LabelingConfig:
    """The part of the configuration a config file may change while the labeler runs."""

    mig_strategy: MigStrategy
    sharing: TimeSlicing | None


def plugin_config_model() -> type[PluginConfig]:
    """The file's model, imported when a file is given (pydantic is not loaded otherwise)."""
    from gpunode.api.plugin_config import PluginConfig

    return PluginConfig


def sharing_of(config: PluginConfig | None) -> TimeSlicing | None:
    """The file's time-slicing settings (GFD labels the replicas); None without a file.

    What the file sets that NVIDIA ignores (and so does this one, by default) is logged as a warning,
    the labels matching what the device plugin advertises."""
    if config is None:
        return None
    from gpunode.api.plugin_config import EXTENSIONS_HINT
    from gpunode.common.logging import get_logger

    for message in config.ignored_fields():
        get_logger("gpunode.feature_discovery").warning(
            "config_field_ignored", detail=message, hint=EXTENSIONS_HINT
        )
    for message in config.overridden_fields():
        get_logger("gpunode.feature_discovery").warning("config_field_ignored", detail=message)
    return config.time_slicing()


@dataclass(frozen=True)
class ConfigReader:
    """Reads the config file again: ``file`` (None: no file), or the given file of a config directory.

    ``args`` are the flags given on the command line (argparse's values) and ``environ`` the
    environment snapshot of the start. Raises :class:`~gpunode.common.errors.ConfigError` for a file
    that does not load.
    """

    parser: SettingsParser[FdSettings]
    args: Mapping[str, object]
    environ: Mapping[str, str]
    file: str | None

    def __call__(self, path: Path | None = None) -> LabelingConfig:
        file = str(path) if path is not None else self.file
        config: PluginConfig | None = None
        if file:
            from gpunode.api.plugin_config import PluginConfig
            from gpunode.common.config import load_config

            config = load_config(file, PluginConfig)
        settings, _ = self.parser.resolve(self.args, self.environ, config)
        return LabelingConfig(settings.mig_strategy, sharing_of(config))

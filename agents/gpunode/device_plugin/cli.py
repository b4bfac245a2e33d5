"""gpunode-device-plugin: advertise NVIDIA GPUs (and MIG devices, and time-sliced replicas) to the kubelet."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.agent.main import AgentContext, AgentSpec, Started
from gpunode.common.logging import get_logger
from gpunode.device_plugin.configwatch import connect_kube, label_config_options
from gpunode.device_plugin.flags import ALIASES, DevicePluginFlags
from gpunode.device_plugin.health import XidPolicy
from gpunode.device_plugin.plugin import AGENT, AgentOptions, DevicePlugin
from gpunode.device_plugin.settings import PluginSettings, plugin_settings

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.nvml import Nvml

__all__ = ["SPEC", "main"]


def start(ctx: AgentContext[DevicePluginFlags]) -> Started:
    flags = ctx.settings
    policy = XidPolicy.from_env(ctx.environ)

    def load(config: PluginConfig | None) -> PluginSettings:
        """Settings for a (re)loaded config file, with flags and env vars still taking precedence."""
        if config is not None:
            warn_ignored_fields(config)
        return plugin_settings(ctx.parser.resolve(ctx.parsed.args, ctx.environ, config)[0], config)

    settings = load(ctx.parsed.config)
    config_dir = label_config_options(flags)
    kube = connect_kube(flags, config_dir) if config_dir is not None else None
    http_host = flags.http.listen_host(ctx.environ)
    opts = AgentOptions.from_flags(flags, load, config_dir=config_dir, policy=policy, http_host=http_host)

    async def open_nvml() -> Nvml:
        return await ctx.open_nvml(plugin.state.settings.driver_root)  # a directory's config is chosen by now

    plugin = DevicePlugin(opts, open_nvml, settings, ctx.parsed.config, kube=kube)
    return Started(plugin.run(), {"health_checks": str(policy)})


def warn_ignored_fields(config: PluginConfig) -> None:
    """Log what the file sets that NVIDIA's plugin ignores (and so does this one, by default)."""
    from gpunode.api.plugin_config import EXTENSIONS_HINT

    for message in config.ignored_fields():
        get_logger("gpunode.device_plugin").warning(
            "config_field_ignored", detail=message, hint=EXTENSIONS_HINT
        )
    for message in config.overridden_fields():
        get_logger("gpunode.device_plugin").warning("config_field_ignored", detail=message)


def _config_model() -> type[PluginConfig]:
    from gpunode.api.plugin_config import PluginConfig  # pydantic only when a file is given

    return PluginConfig


def _wants_config(flags: DevicePluginFlags) -> bool:
    """A directory of configs is not loaded here: the node label chooses the file in it later."""
    return not (flags.common.config_file and Path(flags.common.config_file).is_dir())


SPEC = AgentSpec(
    name=AGENT,
    console_script="gpunode-device-plugin",
    settings_type=DevicePluginFlags,
    start=start,
    description=__doc__,
    config_model=_config_model,
    wants_config=_wants_config,
    aliases=ALIASES,
)
main = SPEC.main

"""gpunode-mps-control-daemon: NVIDIA's MPS control daemon for ``sharing.mps`` (one per shared resource)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpunode.agent.main import AgentContext, AgentSpec, Started
from gpunode.api.plugin_types import MPS_MIXED_REFUSAL, TimeSlicing
from gpunode.common.errors import UsageError
from gpunode.common.logging import get_logger
from gpunode.mps.agent import MpsAgent, MpsOptions
from gpunode.mps.settings import MpsSettings

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig

__all__ = ["SPEC", "main"]


def sharing_of(config: PluginConfig | None) -> TimeSlicing | None:
    """The file's effective sharing settings; what it sets that is ignored is logged, as the plugin does."""
    if config is None:
        return None
    from gpunode.api.plugin_config import EXTENSIONS_HINT

    log = get_logger("gpunode.mps")
    for message in config.ignored_fields():
        log.warning("config_field_ignored", detail=message, hint=EXTENSIONS_HINT)
    for message in config.overridden_fields():
        log.warning("config_field_ignored", detail=message)
    return config.time_slicing()


def start(ctx: AgentContext[MpsSettings]) -> Started:
    s = ctx.settings
    config_file = s.common.config_file
    first = sharing_of(ctx.parsed.config)
    if first is not None and first.mps and s.mig_strategy == "mixed":
        raise UsageError(MPS_MIXED_REFUSAL)
    pending: list[TimeSlicing | None] = [first]

    def read_sharing() -> TimeSlicing | None:
        if pending:  # the start's reading, once
            return pending.pop()
        if not config_file:
            return None
        from gpunode.api.plugin_config import PluginConfig
        from gpunode.common.config import load_config

        return sharing_of(load_config(config_file, PluginConfig))

    opts = MpsOptions(
        mps_root=s.mps_root,
        driver_root=s.common.driver_root,
        config_source=config_file or "sharing.mps",
        watch_interval=s.watch_interval,
        retry_interval=s.retry_interval,
        http_host=s.http.listen_host(ctx.environ),
        http_port=None if s.http.http_port < 0 else s.http.http_port,
    )
    agent = MpsAgent(opts, ctx.open_nvml, read_sharing, environ=ctx.environ)
    return Started(agent.run(), {"mps_root": s.mps_root})


def _config_model() -> type[PluginConfig]:
    from gpunode.api.plugin_config import PluginConfig  # pydantic only when a file is given

    return PluginConfig


SPEC = AgentSpec(
    name="mps-control-daemon",
    console_script="gpunode-mps-control-daemon",
    settings_type=MpsSettings,
    start=start,
    description=__doc__,
    config_model=_config_model,
)
main = SPEC.main

"""gpunode-feature-discovery: write NVIDIA's nvidia.com/* GPU node labels for Node Feature Discovery."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpunode.agent.main import AgentContext, AgentSpec, Started
from gpunode.common.cli import parse_interval
from gpunode.feature_discovery.config import ConfigReader, LabelingConfig, plugin_config_model, sharing_of
from gpunode.feature_discovery.loop import FdOptions, FeatureDiscovery
from gpunode.feature_discovery.output import NodeFeatureOutput
from gpunode.feature_discovery.settings import FdSettings, config_directory

if TYPE_CHECKING:
    from gpunode.kube.client import Kube

__all__ = ["SPEC", "main"]


def start(ctx: AgentContext[FdSettings]) -> Started:
    s = ctx.settings
    interval = parse_interval(s.sleep_interval)
    config = LabelingConfig(s.mig_strategy, sharing_of(ctx.parsed.config))
    directory = config_directory(s)
    kube = connect_kube(s) if s.use_node_feature_api or directory else None
    node_feature = (
        NodeFeatureOutput(kube, s.kube.namespace, s.pod_name)
        if kube is not None and s.use_node_feature_api
        else None
    )
    read = ConfigReader(ctx.parser, ctx.parsed.args, ctx.environ, None if directory else s.common.config_file)
    http_host = s.http.listen_host(ctx.environ)
    opts = FdOptions.from_settings(
        s, config, read, interval=interval, directory=directory, http_host=http_host
    )
    return Started(FeatureDiscovery(opts, ctx.open_nvml, node_feature=node_feature, kube=kube).run())


def connect_kube(s: FdSettings) -> Kube:
    """The API client (for --use-node-feature-api, or a config directory chosen by node label); the
    Kubernetes client is imported only here. Exit 2 without a node name or credentials."""
    from gpunode.kube.client import Kube

    k = s.kube
    return Kube.connect(
        s.common.node_name,
        k.kubeconfig,
        namespace=k.namespace,
        timeout=k.kube_api_timeout,
        field_manager="gpunode-feature-discovery",
    )


SPEC = AgentSpec(
    name="feature-discovery",
    console_script="gpunode-feature-discovery",
    settings_type=FdSettings,
    start=start,
    description=__doc__,
    config_model=plugin_config_model,
    wants_config=lambda s: config_directory(s) is None,  # a directory's file is read once the label chose it
    aliases={"--output": "output_file"},
)
main = SPEC.main

"""gpunode-mig-manager: keep the node's MIG layout at the one the nvidia.com/mig.config label names
(Kubernetes mode, NODE_NAME set), or the one a file names (bare metal, --selected-config-file)."""

from __future__ import annotations

from gpunode.agent.main import AgentContext, AgentSpec, Started
from gpunode.mig.settings import ManagerSettings

__all__ = ["SPEC", "main"]


def start(ctx: AgentContext[ManagerSettings]) -> Started:
    from gpunode.mig.daemon import serve
    from gpunode.mig.options import build_options

    s = ctx.settings
    opts = build_options(s, ctx.parsed.sources, ctx.environ)
    kube = None
    if opts.selected_config_file is None:
        from gpunode.mig.kube_mode import connect_kube

        kube = connect_kube(s.common, s.kube)
    return Started(lambda: serve(opts, s.common, kube))


SPEC = AgentSpec(
    name="mig-manager",
    console_script="gpunode-mig-manager",
    settings_type=ManagerSettings,
    start=start,
    description=__doc__,
    aliases={"-n": "node_name"},
)
main = SPEC.main

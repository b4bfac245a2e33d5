"""gpunode-operator: the cluster-side controller (ClusterPolicy -> the node agents, node labels).

:func:`make_spec` builds the :class:`~gpunode.agent.main.AgentSpec` around a renderer; the console
script's module (:mod:`gpunode.deploy.operator_cli`, in the rendering layer) passes ``gpunode render``'s.
"""

from __future__ import annotations

from gpunode.agent.main import AgentContext, AgentSpec, Started
from gpunode.operator.controller import Renderer
from gpunode.operator.settings import OperatorSettings

__all__ = ["CONSOLE_SCRIPT", "make_spec"]

CONSOLE_SCRIPT = "gpunode-operator"
DESCRIPTION = __doc__.splitlines()[0] if __doc__ else None


def make_spec(render: Renderer) -> AgentSpec[OperatorSettings]:
    def start(ctx: AgentContext[OperatorSettings]) -> Started:
        s = ctx.settings
        if s.lease_duration <= 0:
            raise ValueError("--lease-duration must be positive")
        if s.kube_api_timeout <= 0:
            raise ValueError("--kube-api-timeout must be positive")
        from gpunode.kube.client import load_kubeconfig  # exit 2 without credentials, before starting
        from gpunode.operator.app import run_operator

        load_kubeconfig(s.kubeconfig)
        return Started(run_operator(s, render, environ=ctx.environ))

    return AgentSpec(
        name="operator",
        console_script=CONSOLE_SCRIPT,
        settings_type=OperatorSettings,
        start=start,
        description=DESCRIPTION,
        uses_nvml=False,
    )

"""gpunode-operator's console script: the operator (agents layer) with ``gpunode render``'s renderer.

The operator reconciles with the render code of ``gpunode render``; rendering sits above the agents
layer, so the one module that joins them lives here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpunode.deploy.render import render_by_agent
from gpunode.operator.cli import make_spec

__all__ = ["SPEC", "main"]


def render(policy: Any, namespace: str) -> Mapping[str, Sequence[dict[str, Any]]]:
    return render_by_agent(policy, namespace=namespace)


SPEC = make_spec(render)
main = SPEC.main

"""Every gpunode node agent, listed once.

Each entry names the agent, its console script and the module whose ``SPEC`` (an
:class:`~gpunode.agent.main.AgentSpec`, or ``SPECS`` by verb for commands such as ``gpunode-mig apply``)
declares its settings, HTTP port and start function. The module is imported only when asked for,
so listing agents costs nothing; ``gpunode render`` and the tests take ports and env var names from
here instead of repeating them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpunode.agent.main import AgentSpec
__all__ = ["AGENTS", "AgentEntry", "entry", "spec", "specs"]


@dataclass(frozen=True)
class AgentEntry:
    """One agent: ``key`` is its short name (log field ``agent``, manifest file name), ``module`` holds
    its ``SPEC`` (daemons) or ``SPECS`` (commands with verbs), ``operand`` is the GPU Operator's
    ``nvidia.com/gpu.deploy.<operand>`` label when the agent is deployed as a DaemonSet. ``http_port``: the
    default HTTP port of what its DaemonSet runs (its ``SPEC``'s, or its main verb's), kept here so that
    rendering a DaemonSet does not import the agent's module (for the operator, grpc, protobuf and
    prometheus_client: about 18 MB); a test checks it against the spec."""

    key: str
    console_script: str
    module: str
    operand: str | None = None
    http_port: int | None = None


AGENTS: tuple[AgentEntry, ...] = (
    AgentEntry("driver", "gpunode-driver-loader", "gpunode.driver_loader.cli", "driver", 9454),
    AgentEntry("toolkit", "gpunode-toolkit", "gpunode.toolkit.cli", "container-toolkit"),
    AgentEntry("device-plugin", "gpunode-device-plugin", "gpunode.device_plugin.cli", "device-plugin", 9451),
    AgentEntry(
        "feature-discovery",
        "gpunode-feature-discovery",
        "gpunode.feature_discovery.cli",
        "gpu-feature-discovery",
        9452,
    ),
    AgentEntry("exporter", "gpunode-exporter", "gpunode.exporter.cli", "dcgm-exporter", 9400),
    AgentEntry("mig-manager", "gpunode-mig-manager", "gpunode.mig.manager_cli", "mig-manager", 9453),
    AgentEntry("mig", "gpunode-mig", "gpunode.mig.cli"),
    AgentEntry("validator", "gpunode-validator", "gpunode.validator.cli"),
    # NVIDIA's MPS control daemon: deployed with the device plugin (its operand label), where mps.capable
    AgentEntry("mps-control-daemon", "gpunode-mps-control-daemon", "gpunode.mps.cli", "device-plugin", 9456),
    # the cluster-side controller; its module is in the rendering layer (it reconciles with render's code)
    AgentEntry("operator", "gpunode-operator", "gpunode.deploy.operator_cli"),
)
_BY_KEY = {a.key: a for a in AGENTS}


def entry(key: str) -> AgentEntry:
    """The entry named ``key``; ``KeyError`` listing the agents otherwise."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown agent {key!r}; the agents are: {', '.join(_BY_KEY)}") from None


def specs(key: str) -> Mapping[str, AgentSpec[Any]]:
    """The agent's specs by verb (``{"": SPEC}`` for an agent without verbs), importing its module."""
    module = importlib.import_module(entry(key).module)
    found = getattr(module, "SPECS", None)
    if found is not None:
        return dict(found)
    return {"": module.SPEC}


def spec(key: str, verb: str = "") -> AgentSpec[Any]:
    """One :class:`~gpunode.agent.main.AgentSpec`: the agent's, or one of its verbs'."""
    by_verb = specs(key)
    try:
        return by_verb[verb]
    except KeyError:
        raise KeyError(f"{key}: unknown verb {verb!r}; the verbs are: {', '.join(by_verb)}") from None

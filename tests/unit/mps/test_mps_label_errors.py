"""The node-label controller's errors reach the MPS agent's gpunode_errors_total (they were counted into a
dict nothing read)."""

from __future__ import annotations

from pathlib import Path

from gpunode.common.logging import get_logger
from gpunode.kube.labelconfig import LabelConfigOptions
from gpunode.mps.agent import MpsAgent, MpsOptions, Plan
from gpunode.mps.labelled import LabelledConfig


async def _never() -> Plan:
    raise AssertionError("not planned in this test")


def test_label_controller_errors_count_in_the_agents_metrics(tmp_path: Path) -> None:
    labelled = LabelledConfig(
        LabelConfigOptions(directory=tmp_path, node_label="nvidia.com/device-plugin.config"),
        kube=object(),  # type: ignore[arg-type]  # never called: only the error path is exercised
        log=get_logger("test"),
    )
    agent = MpsAgent(
        MpsOptions(mps_root=None, default_root=str(tmp_path), driver_root="/"), _never, labelled=labelled
    )
    labelled.config._count_error("config-selection")  # what the controller calls on a refused file
    labelled.config._count_error("config-selection")
    value = agent.metrics.registry.get_sample_value(
        "gpunode_errors_total", {"agent": "mps-control-daemon", "reason": "config-selection"}
    )
    assert value == 2.0

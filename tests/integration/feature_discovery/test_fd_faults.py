"""Feature discovery's labels match the node after faults (issue 14, item 9): a MIG layout applied beside a
lost GPU is labeled once, complete; an NVML error in a pass is retried, not fatal."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.sim import nvml as sim
from helpers.faults import all_balanced, apply_layout
from helpers.waiting import EventLog, wait_until

FD = str(Path(sys.executable).parent / "gpunode-feature-discovery")


def labels_of(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    with sim.SimNode.open(state).mutate() as st:
        all_balanced(st)
    return state


@pytest.fixture
def labeler(node: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], EventLog]]:
    out = tmp_path / "gfd"
    args = ["--http-port", "-1", "--mig-strategy", "mixed", "--sleep-interval", "60s"]
    p = subprocess.Popen(
        [FD, "--sim-state", str(node), "-o", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert p.stdout is not None
    log = EventLog(p.stdout)
    try:
        wait_until(lambda: out.exists() or p.poll() is not None)
        assert out.exists(), log.text()
        yield p, log
    finally:
        p.kill()
        p.wait(5)


def test_a_layout_applied_beside_a_lost_gpu_is_labeled_once_and_complete(
    labeler: tuple[subprocess.Popen[str], EventLog], node: Path, tmp_path: Path
) -> None:
    _, log = labeler
    out = tmp_path / "gfd"
    assert labels_of(out)["nvidia.com/mig-3g.20gb.count"] == "8"
    with sim.SimNode.open(node).mutate() as st:
        st.lose(7)
    wait_until(lambda: labels_of(out).get("nvidia.com/gpu.count") == "7", timeout=5)
    assert labels_of(out)["nvidia.com/mig-3g.20gb.count"] == "7"  # a lost GPU's devices are not counted
    written = log.count("labels_written")

    apply_layout(node, tmp_path, "seven-1g-on-0-6")
    wait_until(lambda: labels_of(out).get("nvidia.com/mig-1g.5gb.count") == "49", timeout=10)
    labels = labels_of(out)
    assert labels["nvidia.com/gpu.count"] == "7"
    assert "nvidia.com/mig-2g.10gb.count" not in labels
    assert "nvidia.com/mig-3g.20gb.count" not in labels
    time.sleep(1.5)  # longer than the settle time: a pass still to come would have run by now
    assert log.count("labels_written") == written + 1  # one label set for the whole change
    assert log.count("labeling_failed") == 0


async def test_an_nvml_error_in_a_pass_is_retried_until_a_pass_succeeds(node: Path, tmp_path: Path) -> None:
    from gpunode.common.logging import get_logger
    from gpunode.common.metrics import create_metrics
    from gpunode.feature_discovery.config import LabelingConfig
    from gpunode.feature_discovery.labeler import Labeler, LabelerOptions
    from gpunode.nvml import errors
    from gpunode.nvml.real import RealNvml

    sim.install(state=node)
    nvml = await RealNvml.open()
    failures = {"left": 2}
    real_gpus = nvml.gpus

    async def flaky() -> object:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise errors.NvmlError("Unknown Error", 999)
        return await real_gpus()

    nvml.gpus = flaky  # type: ignore[method-assign,assignment]
    out = tmp_path / "labels"
    labeler = Labeler(
        LabelerOptions(str(out), interval=0.1),
        LabelingConfig(mig_strategy="none", sharing=None),
        lambda: nvml,
        timestamp=None,
        log=get_logger("test"),
        metrics=create_metrics("feature-discovery-test", process_metrics=False),
    )
    try:
        await labeler.write_with_retry()  # fails twice, then labels
    finally:
        await nvml.close()
        sim.uninstall()
    assert failures["left"] == 0
    assert labels_of(out)["nvidia.com/gpu.count"] == "8"

"""The MIG manager's re-assert loop with a lost GPU (issue 14, item 9): a layout selected while a GPU is
lost is applied to the GPUs that answer, and to the lost one once it is back, with nobody relabelling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpunode.sim import nvml as sim
from helpers.faults import LAYOUTS, all_balanced
from helpers.waiting import wait_until

MANAGER = str(Path(sys.executable).parent / "gpunode-mig-manager")
# Never SIGHUP a real agent someone else runs on this machine: tell a made-up program instead.
NOTIFY_NAME = f"gpunode-test-agent-{os.getpid()}"


def devices(node: Path) -> list[int]:
    """MIG devices (compute instances) per GPU."""
    return [sum(len(gi.cis) for gi in g.gis) for g in sim.SimNode.open(node).state.gpus]


def test_a_layout_chosen_while_a_gpu_is_lost_reaches_it_once_it_is_back(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    sim.init_state_file(node, "dgx-a100")
    with sim.SimNode.open(node).mutate() as st:
        all_balanced(st)
        st.lose(7)
    config = tmp_path / "layouts.yaml"
    config.write_text(
        LAYOUTS
        + '  all-1g.5gb:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {"1g.5gb": 7}\n'
    )
    selected = tmp_path / "selected-config"
    selected.write_text("all-1g.5gb\n")
    state_file = tmp_path / "state.json"
    args = ["--sim-state", str(node), "--config-file", str(config), "--http-port", "-1"]
    args += ["--journal-file", str(tmp_path / "journal.json"), "--reassert-interval", "1"]
    args += ["--selected-config-file", str(selected), "--state-file", str(state_file)]
    log = (tmp_path / "manager.log").open("w")
    env = {**os.environ, "GPUNODE_MIG_NOTIFY_PROCESSES": NOTIFY_NAME, "LOG_FORMAT": "json"}
    proc = subprocess.Popen([MANAGER, *args], stdout=log, stderr=subprocess.STDOUT, env=env)

    def written() -> dict[str, Any]:
        try:
            loaded: dict[str, Any] = json.loads(state_file.read_text())
            return loaded
        except (OSError, ValueError):
            return {}

    try:
        wait_until(lambda: written().get("state") == "success", timeout=15)
        assert devices(node) == [7] * 7 + [4]  # GPU 7 is lost: left as it was, not a failure
        with sim.SimNode.open(node).mutate() as st:
            st.restore(7)
        wait_until(lambda: devices(node) == [7] * 8, timeout=15)  # the re-assert reached GPU 7
        wait_until(lambda: written().get("state") == "success", timeout=15)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()

"""`gpunode dev cluster --upgrade`: the operator's upgrade controller rolls a new driver over the fake GPU
nodes, printing each node's state as it moves, and every node ends ``upgrade-done``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GPUNODE = [sys.executable, "-c", "import sys; from gpunode.cli import main; sys.exit(main())"]
PATH = [
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
]


def test_upgrade_rehearsal_walks_every_gpu_node_to_upgrade_done(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *GPUNODE,
            "dev",
            "cluster",
            "--nodes",
            "3",
            "--other-nodes",
            "1",
            "--oneshot",
            "--upgrade",
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rolled = done.stdout.split("upgrade states as they move:", 1)[1]
    for node in ("gpu-0", "gpu-1", "gpu-2"):
        states = re.findall(rf"^\s+[\d.]+ s\s+{node}\s+(\S+)", rolled, re.MULTILINE)
        assert states == PATH, (node, rolled)
    assert "cpu-0" not in rolled
    assert "every GPU node upgraded to 580.95.05" in rolled
    # one node at a time (the default maxParallelUpgrades 1): a node starts only after the one before is done
    order = re.findall(r"^\s+[\d.]+ s\s+(\S+)\s+(cordon-required|upgrade-done)", rolled, re.MULTILINE)
    starts = [n for n, s in order if s == "cordon-required"]
    assert order == [(n, s) for n in starts for s in ("cordon-required", "upgrade-done")]

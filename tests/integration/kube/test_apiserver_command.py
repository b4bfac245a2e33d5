"""`gpunode test-apiserver`: the test API server as a command a newcomer can point agents at."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path

import yaml


def test_serves_nodes_writes_a_kubeconfig_and_stops_on_sigterm(
    gpunode_cmd: list[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "kubeconfig"
    p = subprocess.Popen(
        [
            *gpunode_cmd,
            "test-apiserver",
            "--kubeconfig",
            str(cfg),
            "--node",
            "a",
            "--node",
            "b",
            "--label",
            "x=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().startswith("serving http://127.0.0.1:")
        server = yaml.safe_load(cfg.read_text())["clusters"][0]["cluster"]["server"]
        with urllib.request.urlopen(f"{server}/api/v1/nodes", timeout=5) as resp:
            nodes = json.load(resp)["items"]
        assert sorted(n["metadata"]["name"] for n in nodes) == ["a", "b"]
        assert all(n["metadata"]["labels"]["x"] == "1" for n in nodes)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0


def test_bad_label_exits_2(gpunode_cmd: list[str], tmp_path: Path) -> None:
    r = subprocess.run(
        [*gpunode_cmd, "test-apiserver", "--kubeconfig", str(tmp_path / "k"), "--label", "nonsense"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert "KEY=VALUE" in r.stdout + r.stderr

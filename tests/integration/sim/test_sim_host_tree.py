"""`gpunode sim init --host-root`: the agents, as processes, read a simulated node's host tree right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpunode.common.hostpaths import HostPaths
from gpunode.nvml.caps import read_mig_minors

BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60)


def test_init_lays_down_the_tree_and_mig_apply_makes_its_capabilities(tmp_path: Path) -> None:
    state, root = tmp_path / "node.json", tmp_path / "host"
    out = run("gpunode", "sim", "init", "dgx-a100", "--state", str(state), "--host-root", str(root))
    assert out.returncode == 0, out.stderr
    labels = tmp_path / "labels"
    out = run(
        "gpunode-feature-discovery", "--sim-state", str(state), "--oneshot", "--output-file", str(labels),
        "--host-root", str(root), "--http-port", "-1",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "nvidia.com/gpu.mode=compute" in labels.read_text().splitlines()
    assert not list((root / "proc/driver/nvidia/capabilities").glob("gpu*"))
    out = run("gpunode-mig", "apply", "-c", "all-3g.20gb", "--sim-state", str(state))
    assert out.returncode == 0, out.stderr
    table = read_mig_minors(HostPaths(root=root))
    assert table is not None
    caps = sorted(
        p.relative_to(root / "proc/driver/nvidia/capabilities").as_posix()
        for p in (root / "proc/driver/nvidia/capabilities").glob("gpu*/mig/**/access")
    )
    assert len(caps) == 8 * 2 * 2  # 8 GPUs x two 3g GPU instances x (GI + CI)
    for cap in caps:
        key = cap.replace("/mig/", "/")
        minor = table[key]
        assert (root / "dev/nvidia-caps" / f"nvidia-cap{minor}").exists()


def test_bad_input_exits_2_and_names_the_fix(tmp_path: Path) -> None:
    out = run(
        "gpunode", "sim", "init", "dgx-z9", "--state", str(tmp_path / "s.json"), "--host-root", str(tmp_path)
    )
    assert out.returncode == 2
    assert "dgx-a100" in out.stderr
    assert "gb200-nvl4" in out.stderr
    out = run("gpunode", "sim", "init", "t4x4", "--state", str(tmp_path / "s.json"), "--imex-channel", "0")
    assert out.returncode == 2
    assert "--imex-channel needs --host-root" in out.stderr
    (tmp_path / "file").write_text("")
    out = run(
        "gpunode",
        "sim",
        "init",
        "t4x4",
        "--state",
        str(tmp_path / "s.json"),
        "--host-root",
        str(tmp_path / "file"),
    )
    assert out.returncode == 2
    assert "is not a directory" in out.stderr
    assert not (tmp_path / "s.json").exists()

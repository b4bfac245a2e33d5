"""`gpunode dev cluster`: the rehearsal of gpunode-operator on the test API server, as a user runs it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

GPUNODE = [sys.executable, "-c", "import sys; from gpunode.cli import main; sys.exit(main())"]


def _table(out: str) -> dict[str, tuple[str, set[str]]]:
    """node -> (GPU yes/no, DaemonSets) from the printed table."""
    rows: dict[str, tuple[str, set[str]]] = {}
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("DaemonSets scheduled per node"))
    for line in lines[start + 2 :]:
        m = re.match(r"^  (\S+)\s+(yes|no)\s+(\d+)\s+(.*)$", line)
        if not m:
            break
        names = set() if m[4] == "-" else set(m[4].split(", "))
        assert int(m[3]) == len(names)
        rows[m[1]] = (m[2], names)
    return rows


def test_oneshot_reaches_ready_with_the_agents_on_the_gpu_nodes_only(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [*GPUNODE, "dev", "cluster", "--nodes", "3", "--other-nodes", "2", "--oneshot"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 60
    assert re.search(r"clusterpolicy/cluster-policy: ready\b", done.stdout), done.stdout
    rows = _table(done.stdout)
    assert set(rows) == {"gpu-0", "gpu-1", "gpu-2", "cpu-0", "cpu-1"}
    agents = {"gpunode-device-plugin", "gpunode-exporter", "gpunode-feature-discovery", "gpunode-toolkit"}
    for node in ("gpu-0", "gpu-1", "gpu-2"):
        gpu, names = rows[node]
        assert gpu == "yes"
        assert agents <= names, (node, names)
    for node in ("cpu-0", "cpu-1"):
        gpu, names = rows[node]
        assert gpu == "no"
        assert names <= {"gpunode-nfd-worker"}, (node, names)  # NFD runs everywhere; no agent
    # the labels the operator set, on the GPU nodes only
    labels = done.stdout.split("node labels (nvidia.com/):", 1)[1].split("DaemonSets scheduled", 1)[0]
    assert "  gpu-0, gpu-1, gpu-2:\n" in labels
    assert "nvidia.com/gpu.deploy.device-plugin=true" in labels
    assert "  cpu-0, cpu-1:\n    (none)" in labels
    assert "nvidia.com/gpu.present=true" in labels


def test_serving_until_sigterm_stops_the_operator_and_exits_0(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [*GPUNODE, "dev", "cluster", "--nodes", "1", "--other-nodes", "0", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("serving until Ctrl-C"):
                break
        assert seen, "no output"
        assert seen[-1].startswith("serving until Ctrl-C"), "".join(seen)
        assert kubeconfig.exists()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "stopping" in out


def test_bad_input_exits_2(tmp_path: Path) -> None:
    for argv, text in (
        (["--nodes", "0"], "--nodes"),
        (["--nodes", "1", "--policy", str(tmp_path / "nope.yaml")], "nope.yaml"),
        (["--nodes", "1", "--policy", "a", "--values", "b"], "not allowed"),
    ):
        done = subprocess.run([*GPUNODE, "dev", "cluster", *argv], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (argv, done.stderr)
        assert text in done.stderr, (argv, done.stderr)


def test_oneshot_not_ready_within_the_timeout_exits_1() -> None:
    # the operator alone takes longer than this to start
    done = subprocess.run(
        [*GPUNODE, "dev", "cluster", "--nodes", "1", "--oneshot", "--timeout", "0.05"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not ready after 0.05 s" in done.stdout


def test_the_default_policy_is_containers_default_yaml() -> None:
    from gpunode.api.clusterpolicy import load_policy, parse_policy_text
    from gpunode.devcluster import DEFAULT_POLICY

    shipped = Path(__file__).resolve().parents[3] / "containers" / "policies" / "default.yaml"
    assert parse_policy_text(DEFAULT_POLICY, "default").policy == load_policy(shipped).policy

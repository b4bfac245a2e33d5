"""Agents' start-up time and memory, this tree against another checkout (issue 13: "not worse").

    .venv/bin/python benchmarks/startup.py                       # this tree only
    .venv/bin/python benchmarks/startup.py --base /path/to/old   # this tree and an older checkout
    .venv/bin/python benchmarks/startup.py --rounds 9 --json

For the device plugin and feature discovery, each round starts a real process on a fresh simulated
dgx-a100 (the plugin registering with this tree's kubelet emulator, `gpunode dev kubelet`, started
beforehand; feature discovery writing a label file every 60 s) and measures:

1. import: a fresh interpreter importing the agent's entry module (`python -c "import ..."`), wall time;
2. ready: from spawning the process until its `/readyz` answers 200 (the plugin: registered with the
   kubelet; feature discovery: first labels written);
3. RSS: the process's resident set 2 s after it became ready.

An older checkout runs with `PYTHONPATH=<base>/agents` in front of this venv's editable install, so the
same interpreter and libraries serve both; rounds alternate between the trees so that the machine's
noise falls on both alike. Medians and the worst round are printed. A report, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from benchlib import load_average, machine_base

AGENTS = {
    "device-plugin": ("gpunode.device_plugin.cli", []),
    "feature-discovery": ("gpunode.feature_discovery.cli", ["--sleep-interval", "60s"]),
}
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(tree: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree / "agents")
    env["INVOCATION_ID"] = "benchmark"  # agents then listen on 127.0.0.1 only
    return env


def import_seconds(module: str, env: dict[str, str]) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_once(agent: str, env: dict[str, str], work: Path) -> tuple[float, float]:
    """(seconds until /readyz is 200, RSS in MB 2 s later)."""
    _, extra = AGENTS[agent]
    port = free_port()
    state = work / "node.json"
    state.unlink(missing_ok=True)
    args = [str(BIN / f"gpunode-{agent}"), "--simulate", "dgx-a100", "--sim-state", str(state)]
    args += ["--http-port", str(port), "--log-level", "warning", *extra]
    kubelet = None
    if agent == "feature-discovery":
        args += ["--output-file", str(work / "gfd")]
    else:
        kdir = work / "kubelet"
        kubelet = subprocess.Popen(
            [str(BIN / "gpunode"), "dev", "kubelet", "--dir", str(kdir)],
            env=env_for(None),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while not (kdir / "kubelet.sock").exists():
            time.sleep(0.01)
        args += ["--kubelet-socket", str(kdir / "kubelet.sock")]
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = t0 + 30
        while not ready(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{agent} exited {proc.returncode}: {proc.stderr.read().decode()[-800:]}")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{agent} not ready after 30 s")
            time.sleep(0.01)
        took = time.perf_counter() - t0
        time.sleep(2)
        rss = psutil.Process(proc.pid).memory_info().rss / 1e6
        return took, rss
    finally:
        for p in (proc, kubelet):
            if p is None:
                continue
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="an older checkout to compare with")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trees: dict[str, Path | None] = {"this tree": None}
    if args.base is not None:
        trees["base"] = args.base.resolve()
    results: dict[str, dict[str, dict[str, list[float]]]] = {
        name: {agent: {"import_ms": [], "ready_ms": [], "rss_mb": []} for agent in AGENTS} for name in trees
    }
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(args.rounds):
            order = list(trees.items())
            if round_no % 2:
                order.reverse()
            for name, tree in order:
                env = env_for(tree)
                for agent, (module, _) in AGENTS.items():
                    work = Path(tmp) / name.replace(" ", "-") / agent
                    work.mkdir(parents=True, exist_ok=True)
                    row = results[name][agent]
                    row["import_ms"].append(import_seconds(module, env) * 1000)
                    took, rss = start_once(agent, env, work)
                    row["ready_ms"].append(took * 1000)
                    row["rss_mb"].append(rss)
    if args.json:
        print(json.dumps({"machine": machine_base(), "results": results}, indent=2))
        return 0
    print(f"machine: {machine_base()['cpu']}, load {load_average()}; {args.rounds} rounds")
    print(f"{'agent':<18} {'tree':<10} {'import ms':>16} {'ready ms':>16} {'RSS MB':>14}")
    for agent in AGENTS:
        for name in trees:
            row = results[name][agent]

            def cell(values: list[float], digits: int = 0) -> str:
                return f"{statistics.median(values):.{digits}f} (max {max(values):.{digits}f})"

            print(
                f"{agent:<18} {name:<10} {cell(row['import_ms']):>16} {cell(row['ready_ms']):>16} "
                f"{cell(row['rss_mb'], 1):>14}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Feature discovery figures (issue 4): one labeling pass with 56 MIG devices, steady-state RSS, idle CPU.

    .venv/bin/python benchmarks/feature_discovery.py [--quick] [--json]

1. A full labeling pass of the simulated dgx-a100 with 56 MIG devices (7 x 1g.5gb per GPU, single
   strategy): NVML facts + labels + rendering the feature file, timed in-process. Target <= 20 ms.
   The same on dgx-b200 with its densest layout (7 x 1g.23gb per GPU, 56 MIG devices; issue 19).
2. Steady-state RSS of a real `gpunode-feature-discovery` process (mixed strategy, 1 s interval) after
   several passes. Target <= 45 MB.
3. Its CPU between passes with the default 60 s interval (idle): target ~0.

Full runs (2 cores shared with other work): dgx-b200 p50 8.4 ms and dgx-a100 7.6 ms at load ~2.5, 11-15 ms at
load 4.5-5; RSS 34.6 MB; idle CPU 0.017-0.033 %. Nearly all of a pass is NVML (the simulator's Python on the
NVML thread): the labels take 0.1 ms and the file 0.01 ms, so the pass follows the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchlib import build_56_mig, load_average, machine_base, percentile
from gpunode.common.hostpaths import HostPaths
from gpunode.feature_discovery.facts import gather_facts
from gpunode.feature_discovery.labels import compute_labels
from gpunode.feature_discovery.output import render
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim

FD = str(Path(sys.executable).with_name("gpunode-feature-discovery"))


async def labeling_pass_ms(state: Path, rounds: int) -> list[float]:
    sim.install(state=state)
    nvml = await RealNvml.open()
    host = HostPaths(root=state.parent / "host")
    times = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            facts = await gather_facts(nvml, host, None)
            result = compute_labels(facts, mig_strategy="single", sharing=None, timestamp=1_700_000_000)
            render(result.labels)
            times.append((time.perf_counter_ns() - t0) / 1e6)
        assert result.labels["nvidia.com/gpu.count"] == "56", result.labels
    finally:
        await nvml.close()
        sim.uninstall()
    return times


def process_figures(state: Path, idle_s: float) -> dict[str, float]:
    out = state.parent / "gfd"
    busy = subprocess.Popen(
        [
            FD,
            "--sim-state",
            str(state),
            "-o",
            str(out),
            "--mig-strategy",
            "mixed",
            "--sleep-interval",
            "1s",
            "--http-port",
            "-1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(6)  # several passes
        mem = psutil.Process(busy.pid).memory_full_info()
    finally:
        busy.terminate()
        busy.wait(10)
    idle = subprocess.Popen(
        [FD, "--sim-state", str(state), "-o", str(out), "--mig-strategy", "mixed", "--http-port", "-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)  # start-up and the first pass
        proc = psutil.Process(idle.pid)
        before = proc.cpu_times()
        time.sleep(idle_s)
        after = proc.cpu_times()
    finally:
        idle.terminate()
        idle.wait(10)
    cpu = (after.user + after.system - before.user - before.system) / idle_s * 100
    return {"rss_mb": mem.rss / 1e6, "uss_mb": mem.uss / 1e6, "pss_mb": mem.pss / 1e6, "idle_cpu_pct": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds, 10 s idle window")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_at_start = load_average()
    rounds, idle_s = (50, 10.0) if args.quick else (300, 60.0)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "node.json"
        build_56_mig(state)
        passes = asyncio.run(labeling_pass_ms(state, rounds))
        b200 = Path(tmp) / "b200" / "node.json"
        build_56_mig(b200, "dgx-b200")
        b200_passes = asyncio.run(labeling_pass_ms(b200, rounds))
        proc = process_figures(state, idle_s)
    p50, p99 = statistics.median(passes), percentile(sorted(passes), 99)
    b50, b99 = statistics.median(b200_passes), percentile(sorted(b200_passes), 99)
    rows: list[tuple[str, str, str, str, bool]] = [
        ("labeling pass, dgx-a100, 56 MIG devices", f"{p50:.2f} ms", f"{p99:.2f} ms", "<= 20 ms", p50 <= 20),
        ("labeling pass, dgx-b200, 56 MIG devices", f"{b50:.2f} ms", f"{b99:.2f} ms", "<= 20 ms", b50 <= 20),
        (
            "steady-state RSS (mixed, 1 s interval)",
            f"{proc['rss_mb']:.1f} MB",
            "-",
            "<= 45 MB",
            proc["rss_mb"] <= 45,
        ),
        (
            f"idle CPU over {idle_s:.0f} s (60 s interval)",
            f"{proc['idle_cpu_pct']:.3f} %",
            "-",
            "~0",
            proc["idle_cpu_pct"] < 0.1,
        ),
    ]
    info: dict[str, Any] = machine_base(load_at_start=load_at_start, load_average=load_average())
    if args.json:
        passes_ms = {"p50": p50, "p99": p99, "dgx-b200": {"p50": b50, "p99": b99}}
        print(json.dumps({"machine": info, "passes_ms": passes_ms, "process": proc}, indent=2))
        return 0
    print(
        f"Feature discovery benchmark ({'quick' if args.quick else 'full'} run); {info['cpu']}, "
        f"{info['cpus_usable']} CPUs, {info['python']}, "
        f"load {info['load_at_start']} at the start, {info['load_average']} at the end"
    )
    print(f"{'figure':<44}{'median':>12}{'p99':>12}  {'target':<10} verdict")
    for name, med, p, target, ok in rows:
        print(f"{name:<44}{med:>12}{p:>12}  {target:<10} {'PASS' if ok else 'FAIL'}")
    print(f"memory detail: USS {proc['uss_mb']:.1f} MB, PSS {proc['pss_mb']:.1f} MB ({rounds} passes timed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

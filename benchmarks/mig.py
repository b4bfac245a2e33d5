"""MIG figures (issue 7): planning time, apply time, and which GPUs a one-GPU change touches.

    .venv/bin/python benchmarks/mig.py [--quick] [--json]

1. Planning: every default layout (the shipped default config) that applies to a preset, planned for all
   its GPUs from the live state of a fresh simulated node, in-process; median and worst per layout set.
   Target <= 5 ms per layout for 8 GPUs.
2. Applying `all-balanced` to a fresh simulated dgx-a100 (MIG mode on, GPU reset, 32 MIG devices),
   in-process through NVML: wall time. Target <= 1 s.
3. Changing one GPU's layout on a dgx-a100 already at all-balanced: the NVML create / destroy / mode calls
   per GPU (counted by the applier): only that GPU may appear.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import load_average, machine_base, percentile
from gpunode.api.mig_config import parse_spec
from gpunode.mig.apply import Applier
from gpunode.mig.layouts import default_spec
from gpunode.mig.plan import DesiredGpu, Infeasible, plan_node
from gpunode.mig.selection import SelectionError, desired_per_gpu
from gpunode.mig.state import identity, read_states
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim
from gpunode.sim.mig_reset import SimResetter

PRESETS = ("dgx-a100", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "a30x4", "h100-nvl", "dgx-b200", "gb200-nvl4")

ONE_CHANGED = """\
version: v1
mig-configs:
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  one-changed:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    - devices: [5]
      mig-enabled: true
      mig-devices: {"1g.5gb": 4, "3g.20gb": 1}
"""


async def planning(preset: str, rounds: int) -> dict[str, Any]:
    lib = sim.install(preset)
    nvml = await RealNvml.open()
    try:
        gpus = await nvml.gpus()
        states = await read_states(nvml, gpus)
        ids = [identity(g) for g in gpus]
        times: list[float] = []
        layouts = 0
        for name, entries in default_spec().configs.items():
            try:
                chosen = desired_per_gpu(name, entries, ids)
            except SelectionError:
                continue
            if not chosen:
                continue  # a layout for other products: it matches no GPU here
            desired = {i: DesiredGpu(d.mig_enabled, dict(d.devices)) for i, d in chosen.items()}
            try:
                plan_node(states, desired)
            except Infeasible:
                continue
            layouts += 1
            for _ in range(rounds):
                t0 = time.perf_counter_ns()
                plan_node(states, desired)
                times.append((time.perf_counter_ns() - t0) / 1e6)
        times.sort()
        return {
            "preset": preset,
            "gpus": len(gpus),
            "layouts": layouts,
            "median_ms": round(statistics.median(times), 3),
            "p99_ms": round(percentile(times, 99), 3),
            "max_ms": round(times[-1], 3),
        }
    finally:
        await nvml.close()
        sim.uninstall()
        del lib


async def apply_balanced(rounds: int) -> dict[str, Any]:
    spec = parse_spec(ONE_CHANGED, "<benchmark>")
    walls = []
    for _ in range(rounds):
        lib = sim.install("dgx-a100")
        nvml = await RealNvml.open()
        try:
            applier = Applier(nvml, SimResetter(lib.node))
            t0 = time.perf_counter()
            report = await applier.apply("all-balanced", spec.select("all-balanced"))
            walls.append(time.perf_counter() - t0)
            assert report.changed
            assert len(report.resets) == 8
            devices = sum([len(await nvml.mig_devices(i)) for i in range(8)])
            assert devices == 32, devices
        finally:
            await nvml.close()
            sim.uninstall()
    return {"median_s": round(statistics.median(walls), 3), "max_s": round(max(walls), 3), "rounds": rounds}


async def one_gpu_change() -> dict[str, Any]:
    spec = parse_spec(ONE_CHANGED, "<benchmark>")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "node.json"
        sim.init_state_file(state, "dgx-a100")
        lib = sim.install(state=state)
        nvml = await RealNvml.open()
        try:
            applier = Applier(nvml, SimResetter(lib.node))
            await applier.apply("all-balanced", spec.select("all-balanced"))
            report = await applier.apply("one-changed", spec.select("one-changed"))
            return {
                "calls_per_gpu": {str(k): v for k, v in sorted(report.calls.items())},
                "resets": report.resets,
            }
        finally:
            await nvml.close()
            sim.uninstall()


async def main_async(quick: bool) -> dict[str, Any]:
    rounds = 5 if quick else 50
    plans = [await planning(p, rounds) for p in PRESETS]
    applied = await apply_balanced(2 if quick else 5)
    change = await one_gpu_change()
    return {
        "machine": machine_base(load=load_average()),
        "planning": plans,
        "apply": applied,
        "change": change,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    result = asyncio.run(main_async(opts.quick))
    if opts.json:
        print(json.dumps(result, indent=2))
        return 0
    m = result["machine"]
    print(f"# MIG  ({m['cpu']}, {m['cpus_usable']} CPUs usable, {m['python']}, load {m['load']})")
    head = f"{'planning (all GPUs, per layout)':<40} {'layouts':>8} {'median':>9} {'p99':>9} {'max':>9}"
    print(f"{head} {'target':>8}")
    for row in result["planning"]:
        name = f"{row['preset']} ({row['gpus']} GPUs)"
        print(
            f"{name:<40} {row['layouts']:>8} {row['median_ms']:>7} ms {row['p99_ms']:>6} ms"
            f" {row['max_ms']:>6} ms {'<= 5 ms':>8}"
        )
    a = result["apply"]
    print(f"\napply all-balanced, fresh dgx-a100: median {a['median_s']} s, max {a['max_s']} s", end="")
    print(" (target <= 1 s)")
    c = result["change"]
    print(f"one GPU changed (GPU 5): NVML calls per GPU {c['calls_per_gpu']}, resets {c['resets']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

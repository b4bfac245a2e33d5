"""How fast the simulated libnvidia-ml answers, beneath plain pynvml and beneath gpunode.nvml.

    .venv/bin/python benchmarks/nvml_sim.py            # the full run (under a minute on two cores)
    .venv/bin/python benchmarks/nvml_sim.py --quick    # fewer iterations
    .venv/bin/python benchmarks/nvml_sim.py --json     # machine-readable output on stdout
    .venv/bin/python benchmarks/nvml_sim.py --profile  # cProfile the gpunode.nvml paths even when on target

Figures, all on the `dgx-a100` preset (8x A100-SXM4-40GB), in four modes: strict / lenient argument
checking, and the node in memory / shared through a state file (where every call first stats the file):

1. microseconds per pynvml call (median and p99 over many calls, after a warm-up);
2. a full 8-GPU inventory snapshot, `await nvml.gpus()` on a RealNvml (target <= 5 ms);
3. enumerating 56 MIG devices (MIG on all 8 GPUs, 7x 1g.5gb each with its full compute instance),
   `await nvml.mig_devices(i)` for every GPU, one after another and with asyncio.gather (target <= 20 ms);
4. the inventory snapshot of the other presets (issue 19: dgx-b200, l4x8, gb200-nvl4 and the rest), strict,
   in memory and in a state file (target <= 5 ms).

The four simulated nodes are built once and measured in interleaved rounds (every mode in turn, again and
again), so a machine that speeds up or slows down during the run biases no mode against another. Every call
is timed on its own with time.perf_counter_ns (the timer's own cost is printed, not subtracted); the garbage
collector stays on, as in an agent. The verdict compares the median with the target; a p99 over the target
is listed separately. A report, not a test: it exits 0 unless something crashes. When a median misses its
target, a cProfile of that path (top 15 by cumulative time) follows the table.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import gc
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pynvml

from benchlib import load_average, machine_base, percentile
from gpunode.nvml.api import HEALTH_EVENTS, MigDevice
from gpunode.nvml.real import RealNvml, install_library
from gpunode.sim import nvml as sim

PRESET = "dgx-a100"
GPUS = 8
MIG_PROFILE = "1g.5gb"
MIG_PER_GPU = 7
INVENTORY_TARGET_MS = 5.0
MIG_TARGET_MS = 20.0


# -- measuring -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Iterations:
    """Counts per round; every mode runs `rounds` times, so each figure pools rounds x count samples."""

    rounds: int
    micro: int  # timed calls of each pynvml call
    micro_warmup: int
    inventory: int  # timed inventory snapshots
    mig: int  # timed 56-device enumerations, each style
    warmup: int  # untimed gpunode.nvml runs before each series
    profile: int  # profiled runs of a path that missed its target


FULL = Iterations(rounds=10, micro=1_000, micro_warmup=100, inventory=30, mig=12, warmup=2, profile=20)
QUICK = Iterations(rounds=4, micro=250, micro_warmup=25, inventory=10, mig=5, warmup=1, profile=5)


@dataclass(frozen=True)
class Mode:
    strict: bool
    shared: bool  # the node lives in a state file, stat'ed on every call

    @property
    def label(self) -> str:
        return f"{'strict' if self.strict else 'lenient'}, {'state file' if self.shared else 'memory'}"


MODES = (Mode(True, False), Mode(True, True), Mode(False, False), Mode(False, True))


@dataclass(frozen=True)
class Node:
    """One simulated node, built once; `activate` puts it beneath pynvml."""

    mode: Mode
    lib: sim.FakeNvmlLib

    def activate(self) -> None:
        install_library(self.lib)


@dataclass(frozen=True)
class Figure:
    section: str
    figure: str
    mode: str
    unit: str
    n: int
    median: float
    p99: float
    target: float | None = None

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "-"
        return "PASS" if self.median <= self.target else "FAIL"

    @property
    def p99_over(self) -> bool:
        return self.target is not None and self.p99 > self.target


def summarise(
    samples_ns: list[int], section: str, figure: str, mode: Mode, unit: str, target: float | None = None
) -> Figure:
    scale = {"us": 1e3, "ms": 1e6}[unit]
    ordered = sorted(samples_ns)
    return Figure(
        section=section,
        figure=figure,
        mode=mode.label,
        unit=unit,
        n=len(ordered),
        median=statistics.median(ordered) / scale,
        p99=percentile(ordered, 99) / scale,
        target=target,
    )


def time_sync(fn: Callable[[], object], n: int, warmup: int) -> list[int]:
    for _ in range(warmup):
        fn()
    gc.collect()  # so one series' garbage is not billed to the next
    clock = time.perf_counter_ns
    out = [0] * n
    for i in range(n):
        t0 = clock()
        fn()
        out[i] = clock() - t0
    return out


async def time_async(fn: Callable[[], Awaitable[object]], n: int, warmup: int) -> list[int]:
    for _ in range(warmup):
        await fn()
    gc.collect()
    clock = time.perf_counter_ns
    out = [0] * n
    for i in range(n):
        t0 = clock()
        await fn()
        out[i] = clock() - t0
    return out


def timer_overhead_ns() -> float:
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(10_000):
        t0 = clock()
        deltas.append(clock() - t0)
    return statistics.median(deltas)


# -- 1. plain pynvml calls ---------------------------------------------------------------------------------
CALLS = (
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPowerUsage",
    "nvmlEventSetWait(0) -> Timeout",
)


def pynvml_calls() -> tuple[dict[str, Callable[[], object]], Callable[[], None]]:
    """The calls to time, on GPU 0 (MIG off), and a function that frees what they need."""
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    if pynvml.nvmlDeviceGetMigMode(h)[0]:
        raise RuntimeError("GPU 0 must have MIG off (utilization is not supported on a MIG-enabled GPU)")
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, HEALTH_EVENTS & pynvml.nvmlDeviceGetSupportedEventTypes(h), es)

    def event_wait_empty() -> None:
        try:
            pynvml.nvmlEventSetWait(es, 0)
        except pynvml.NVMLError_Timeout:
            return
        raise RuntimeError("nvmlEventSetWait returned an event; the queue was meant to be empty")

    calls: dict[str, Callable[[], object]] = {
        "nvmlDeviceGetCount": pynvml.nvmlDeviceGetCount,
        "nvmlDeviceGetHandleByIndex": lambda: pynvml.nvmlDeviceGetHandleByIndex(0),
        "nvmlDeviceGetName": lambda: pynvml.nvmlDeviceGetName(h),
        "nvmlDeviceGetUUID": lambda: pynvml.nvmlDeviceGetUUID(h),
        "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetPciInfo": lambda: pynvml.nvmlDeviceGetPciInfo(h),
        "nvmlDeviceGetMigMode": lambda: pynvml.nvmlDeviceGetMigMode(h),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        "nvmlEventSetWait(0) -> Timeout": event_wait_empty,
    }
    assert tuple(calls) == CALLS
    return calls, lambda: pynvml.nvmlEventSetFree(es)


def bench_pynvml(nodes: list[Node], it: Iterations) -> list[Figure]:
    samples: dict[tuple[Mode, str], list[int]] = defaultdict(list)
    for _ in range(it.rounds):
        for node in nodes:
            node.activate()
            pynvml.nvmlInit()
            try:
                calls, free = pynvml_calls()
                try:
                    for name, fn in calls.items():
                        samples[node.mode, name] += time_sync(fn, it.micro, it.micro_warmup)
                finally:
                    free()
            finally:
                pynvml.nvmlShutdown()
    return [
        summarise(samples[node.mode, name], "pynvml call", name, node.mode, "us")
        for node in nodes
        for name in CALLS
    ]


# -- 2. and 3. through gpunode.nvml --------------------------------------------------------------------------
@asynccontextmanager
async def opened(node: Node) -> AsyncIterator[RealNvml]:
    node.activate()
    nvml = await RealNvml.open()
    try:
        yield nvml
    finally:
        await nvml.close()


async def build_mig_layout(nvml: RealNvml, lib: sim.FakeNvmlLib) -> None:
    """MIG on every GPU (with the GPU reset Ampere needs), then 7x 1g.5gb, each with its full CI."""
    for i in range(GPUS):
        result = await nvml.set_mig_mode(i, True)
        if result.needs_reset:
            with lib.node.mutate() as state:  # what `nvidia-smi -r` does on a real node
                code = state.reset_gpu(i)
            if code != 0:
                raise RuntimeError(f"GPU {i}: reset failed with NVML code {code}")
        mode = await nvml.mig_mode(i)
        if mode is None or not mode.current:
            raise RuntimeError(f"GPU {i}: MIG is still off after enabling it")
        profile = next(p for p in await nvml.gi_profiles(i) if p.name == MIG_PROFILE)
        full = next(c for c in await nvml.ci_profiles(i, profile.enum) if c.slices == profile.slices)
        for _ in range(MIG_PER_GPU):
            gi = await nvml.create_gpu_instance(i, profile.enum)
            await nvml.create_compute_instance(i, gi.id, full.enum)


async def mig_sequential(nvml: RealNvml) -> list[MigDevice]:
    return [d for i in range(GPUS) for d in await nvml.mig_devices(i)]


async def mig_gathered(nvml: RealNvml) -> list[MigDevice]:
    per_gpu = await asyncio.gather(*(nvml.mig_devices(i) for i in range(GPUS)))
    return [d for devices in per_gpu for d in devices]


MIG_STYLES: dict[str, Callable[[RealNvml], Awaitable[list[MigDevice]]]] = {
    "sequential": mig_sequential,
    "gather": mig_gathered,
}


def check_mig(devices: list[MigDevice]) -> None:
    if len(devices) != GPUS * MIG_PER_GPU:
        raise RuntimeError(f"expected {GPUS * MIG_PER_GPU} MIG devices, found {len(devices)}")
    if any(d.profile != MIG_PROFILE for d in devices):
        raise RuntimeError(f"expected only {MIG_PROFILE} MIG devices")


def inventory_name() -> str:
    return f"inventory: await gpus() ({GPUS} GPUs)"


def mig_name(style: str) -> str:
    return f"MIG: mig_devices() x{GPUS}, {style} ({GPUS * MIG_PER_GPU})"


async def bench_gpunode(nodes: list[Node], it: Iterations) -> list[Figure]:
    inventory: dict[Mode, list[int]] = defaultdict(list)
    for _ in range(it.rounds):
        for node in nodes:
            async with opened(node) as nvml:
                inventory[node.mode] += await time_async(nvml.gpus, it.inventory, it.warmup)

    for node in nodes:
        async with opened(node) as nvml:
            if len(await nvml.gpus()) != GPUS:
                raise RuntimeError(f"expected {GPUS} GPUs")
            await build_mig_layout(nvml, node.lib)
            for fn in MIG_STYLES.values():
                check_mig(await fn(nvml))

    mig: dict[tuple[Mode, str], list[int]] = defaultdict(list)
    for _ in range(it.rounds):
        for node in nodes:
            async with opened(node) as nvml:
                for style, fn in MIG_STYLES.items():
                    mig[node.mode, style] += await time_async(functools.partial(fn, nvml), it.mig, it.warmup)

    figures = []
    for node in nodes:
        figures.append(
            summarise(
                inventory[node.mode], "gpunode.nvml", inventory_name(), node.mode, "ms", INVENTORY_TARGET_MS
            )
        )
        figures += [
            summarise(mig[node.mode, s], "gpunode.nvml", mig_name(s), node.mode, "ms", MIG_TARGET_MS)
            for s in MIG_STYLES
        ]
    return figures


# -- profiles ------------------------------------------------------------------------------------------------
async def profile_path(nvml: RealNvml, fn: Callable[[], Awaitable[object]], n: int) -> str:
    """cProfile `n` runs of `fn` on the NVML worker thread (where the work happens), top 15 by cumtime."""
    prof = cProfile.Profile()
    pool = nvml._pool  # one worker thread: profiling it sees every NVML call
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(pool, prof.enable)
    try:
        for _ in range(n):
            await fn()
    finally:
        await loop.run_in_executor(pool, prof.disable)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).strip_dirs().sort_stats("cumulative").print_stats(15)
    return out.getvalue()


async def profile_misses(
    nodes: list[Node], figures: list[Figure], it: Iterations, every: bool
) -> dict[str, str]:
    """Profile each path whose median missed, once per path and storage (every path and mode if `every`)."""
    texts: dict[str, str] = {}
    seen: set[tuple[str, bool]] = set()
    by_key = {(f.figure, f.mode): f for f in figures}
    for node in nodes:
        async with opened(node) as nvml:
            paths: list[tuple[str, Callable[[], Awaitable[object]]]] = [(inventory_name(), nvml.gpus)]
            paths += [(mig_name(style), functools.partial(fn, nvml)) for style, fn in MIG_STYLES.items()]
            for name, path in paths:
                fig = by_key[name, node.mode.label]
                kind = name.split(":")[0]
                if not every and (fig.verdict != "FAIL" or (kind, node.mode.shared) in seen):
                    continue
                seen.add((kind, node.mode.shared))
                key = f"{name} [{node.mode.label}]: {it.profile} runs on the NVML worker thread"
                texts[key] = await profile_path(nvml, path, it.profile)
    return texts


async def bench_async(
    nodes: list[Node], it: Iterations, every_profile: bool
) -> tuple[list[Figure], dict[str, str]]:
    figures = await bench_gpunode(nodes, it)
    return figures, await profile_misses(nodes, figures, it, every_profile)


# -- report --------------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    return machine_base(
        nvidia_ml_py=metadata.version("nvidia-ml-py"),
        timer_overhead_ns=timer_overhead_ns(),
        load_average_start=load_average(),
    )


def fmt(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def table(figures: list[Figure]) -> str:
    head = ("figure", "mode", "median", "p99", "target", "verdict")
    rows = [
        (
            f.figure,
            f.mode,
            f"{fmt(f.median)} {f.unit}",
            f"{fmt(f.p99)} {f.unit}",
            "-" if f.target is None else f"<= {fmt(f.target)} {f.unit}",
            f.verdict,
        )
        for f in figures
    ]
    widths = [max(len(r[c]) for r in (head, *rows)) for c in range(len(head))]
    right = {2, 3, 4}

    def line(r: tuple[str, ...]) -> str:
        cells = (r[c].rjust(widths[c]) if c in right else r[c].ljust(widths[c]) for c in range(len(r)))
        return "  ".join(cells).rstrip()

    out = [line(head), "  ".join("-" * w for w in widths)]
    previous = figures[0] if figures else None
    for f, r in zip(figures, rows, strict=True):
        if previous is not None and (f.section, f.mode) != (previous.section, previous.mode):
            out.append("")
        previous = f
        out.append(line(r))
    return "\n".join(out)


OTHER_PRESETS = ("dgx-b200", "l4x8", "gb200-nvl4", "h100-nvl", "l40sx4", "mixed-ada-ampere")


async def bench_other_presets(it: Iterations, tmp: str) -> list[Figure]:
    """Inventory snapshots of the other presets (strict; memory and state file), interleaved rounds."""
    nodes = []
    for preset in OTHER_PRESETS:
        for mode in (Mode(True, False), Mode(True, True)):
            state = Path(tmp) / f"{preset}.json" if mode.shared else None
            nodes.append((preset, Node(mode, sim.install(preset, state=state, strict=True))))
    samples: dict[tuple[str, Mode], list[int]] = defaultdict(list)
    for _ in range(it.rounds):
        for preset, node in nodes:
            async with opened(node) as nvml:
                samples[preset, node.mode] += await time_async(nvml.gpus, it.inventory, it.warmup)
    figures = []
    for preset, node in nodes:
        gpus = len(sim.get_preset(preset).gpus)
        name = f"inventory: {preset} ({gpus} GPUs)"
        figures.append(
            summarise(samples[preset, node.mode], "other presets", name, node.mode, "ms", INVENTORY_TARGET_MS)
        )
    return figures


def measure(it: Iterations, every_profile: bool) -> tuple[list[Figure], dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="nvml-sim-bench-") as tmp:
        try:
            nodes = []
            for mode in MODES:
                state = Path(tmp) / f"{'strict' if mode.strict else 'lenient'}.json" if mode.shared else None
                nodes.append(Node(mode, sim.install(PRESET, state=state, strict=mode.strict)))
            figures = bench_pynvml(nodes, it)
            more, profiles = asyncio.run(bench_async(nodes, it, every_profile))
            more += asyncio.run(bench_other_presets(it, tmp))
        finally:
            sim.uninstall()
    return figures + more, profiles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--profile", action="store_true", help="cProfile every gpunode.nvml path and mode")
    args = parser.parse_args(argv)
    it = QUICK if args.quick else FULL

    started = time.perf_counter()
    host = machine()
    figures, profiles = measure(it, args.profile)
    host["load_average_end"] = load_average()
    elapsed = time.perf_counter() - started
    missed = [f for f in figures if f.verdict == "FAIL"]
    p99_over = [f for f in figures if f.p99_over]

    if args.json:
        doc = {
            "preset": PRESET,
            "machine": host,
            "iterations": asdict(it),
            "elapsed_s": round(elapsed, 2),
            "figures": [{**asdict(f), "verdict": f.verdict, "p99_over_target": f.p99_over} for f in figures],
            "missed": [f"{f.figure} [{f.mode}]" for f in missed],
            "p99_over_target": [f"{f.figure} [{f.mode}]" for f in p99_over],
            "profiles": profiles,
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0

    r = it.rounds
    print(f"NVML simulator benchmark: preset {PRESET}, {'quick' if args.quick else 'full'} run")
    print(f"machine: {host['platform']}; {host['cpu']}")
    print(
        f"         {host['python']}; {host['cpu_count']} CPUs ({host['cpus_usable']} usable); "
        f"nvidia-ml-py {host['nvidia_ml_py']}"
    )
    print(
        f"         load average {host['load_average_start']} at start, {host['load_average_end']} at end; "
        f"perf_counter_ns costs ~{host['timer_overhead_ns']:.0f} ns (not subtracted)"
    )
    print(
        f"samples: {r} interleaved rounds of {it.micro} per pynvml call, {it.inventory} per inventory, "
        f"{it.mig} per MIG figure; verdict: median vs target"
    )
    print()
    print(table(figures))
    print()
    if missed:
        print("MISSED TARGET (median): " + "; ".join(f"{f.figure} [{f.mode}]" for f in missed))
    else:
        print("All targets met (median).")
    if p99_over:
        print("p99 over target: " + "; ".join(f"{f.figure} [{f.mode}] {fmt(f.p99)} ms" for f in p99_over))
    for key, text in profiles.items():
        print(f"\n== cProfile: {key}\n{text.rstrip()}")
    print(f"\nelapsed {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

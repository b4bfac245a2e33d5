"""Exporter figures (issue 5), on the simulated dgx-a100 with 56 MIG devices (7 x 1g.5gb per GPU).

    .venv/bin/python benchmarks/exporter.py [--quick] [--json] [--preset dgx-h100] [--every-field]

--every-field enables every field the catalog knows (issue 18: dcgm-exporter's default and
dcp-metrics-included fields, violation counters, NVLink, InfoROM/VBIOS labels, GPM ratios); with
--preset dgx-h100 the node has HBM, NVLink and GPM, so every one of them is sampled and exported.

1. One sampling pass (NVML telemetry + MIG devices + memory), in-process: target <= 20 ms. Then the
   GPU series of that snapshot rendered in the text format, in-process, by the exporter and (for
   comparison, same bytes) by prometheus_client's encoder: done once a sample, never by a scrape.
2. Scrape latency of a real `gpunode-exporter` process, one client: p99 <= 5 ms. Its samples are 30 s
   apart, so these scrapes find the answer ready; the first scrape after each new sample (nearly every
   Prometheus scrape) is timed apart, in-process: what the exporter spends answering it.
3. 50 concurrent scrapers for 30 s (5 s with --quick): no error, p99 <= 50 ms.
4. The exporter's RSS after the load: <= 50 MB.

Full runs, every field on dgx-h100 (2 cores shared with other work; the load is printed with each run):
at load 1.9-2.7 every target is met: sampling p50 8.5 ms, the GPU series render 2.7 ms a sample
(prometheus_client's encoder: 10-27 ms, what a scrape used to pay after each sample and, for the self-metrics,
every second), one client p50 0.66 / p99 1.14 ms, the first scrape after a new sample 0.005 ms (11 ms p50,
33 ms p99 before), 50 scrapers back to back 4,939 req/s p99 21 ms, RSS 37.2 MB. At load 4-5.5 the one-client
p99 is 4.2-6.1 ms, and 1-13 ms with the code before these changes: the machine's scheduling of a 0.7 ms
request-response, not the exporter (which then only writes a ready answer).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, generate_latest

from benchlib import build_56_mig, load_average, machine_base, percentile
from gpunode.exporter.catalog import CATALOG
from gpunode.exporter.collector import ExporterCollector, Options, type_counters
from gpunode.exporter.counters import load_counters
from gpunode.exporter.exposition import TEXT, render
from gpunode.exporter.sampler import Sampler
from gpunode.exporter.service import Exporter, ExporterOptions
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim

EXPORTER = str(Path(sys.executable).with_name("gpunode-exporter"))


def every_field_counters(path: Path) -> Path:
    """A counters file enabling every catalog field (the throttle-reasons alias once)."""
    lines = [
        f"{s.name}, {s.kind}, {s.help}"
        for s in CATALOG.values()
        if s.name != "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


async def sampling_ms(state: Path, rounds: int) -> list[float]:
    times, _ = await sampling_and_render_ms(state, rounds, None)
    return times


async def sampling_and_render_ms(
    state: Path, rounds: int, counters_file: Path | None
) -> tuple[list[float], dict[str, list[float]]]:
    """Sampling passes; then the GPU series of the last snapshot rendered in the text format `rounds`
    times by the exporter (gpunode.exporter.exposition) and by prometheus_client's encoder."""
    sim.install(state=state)
    nvml = await RealNvml.open()
    sampler = Sampler(nvml, interval=30)
    times = []
    try:
        for _ in range(rounds):
            snap = await sampler.sample()
            times.append(snap.duration_s * 1000)
        assert sum(len(g.migs) for g in snap.gpus) == 56
    finally:
        await nvml.close()
        sim.uninstall()
    collector = ExporterCollector(load_counters(counters_file), Options(None), lambda: snap)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    renders: dict[str, list[float]] = {"exporter": [], "prometheus_client": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        fast = render(registry, TEXT, collector.counter_names)
        t1 = time.perf_counter()
        slow = type_counters(generate_latest(registry), collector.counter_names)
        t2 = time.perf_counter()
        renders["exporter"].append((t1 - t0) * 1000)
        renders["prometheus_client"].append((t2 - t1) * 1000)
    assert fast == slow
    return times, renders


async def first_scrape_ms(state: Path, rounds: int, counters_file: Path | None) -> list[float]:
    """What the first scrape after each new sample spends answering, in-process: the exporter as its
    run() wires it (sampler, collector, the hook called after each sample), no HTTP. With Prometheus
    scraping every 15-30 s and the exporter sampling every 30 s, nearly every scrape is such a one."""
    sim.install(state=state)
    nvml = await RealNvml.open()

    async def opened() -> RealNvml:
        return nvml

    counters = load_counters(counters_file)
    exporter = Exporter(ExporterOptions("127.0.0.1", 0, 30, counters, None), opened)
    exporter.sampler = Sampler(nvml, interval=30)
    exporter.collector = ExporterCollector(counters, Options(None), exporter.latest)
    exporter.gpu_registry.register(exporter.collector)
    times = []
    try:
        exporter.render("")  # the text format scraped once before
        for _ in range(rounds):
            snap = await exporter.sampler.sample()
            exporter._sampled(snap)  # what run() calls after each sample
            t0 = time.perf_counter()
            body, _ = exporter.render("")
            times.append((time.perf_counter() - t0) * 1000)
            assert b"DCGM_FI_DEV_FB_USED" in body
    finally:
        await nvml.close()
        sim.uninstall()
    return times


def one_scrape(port: int, conn: http.client.HTTPConnection | None = None) -> float:
    """One GET /metrics; with `conn`, over that kept-alive connection (as Prometheus scrapes)."""
    t0 = time.perf_counter()
    own = conn is None
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10) if conn is None else conn
    c.request("GET", "/metrics")
    resp = c.getresponse()
    body = resp.read()
    if own:
        c.close()
    if resp.status != 200 or b"DCGM_FI_DEV_FB_USED" not in body:
        raise RuntimeError(f"bad scrape: {resp.status}")
    return (time.perf_counter() - t0) * 1000


def _scrapers(port: int, clients: int, seconds: float, pause: float) -> tuple[list[float], int]:
    """`clients` scraper threads in this process, each on its own kept-alive connection."""
    times: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker() -> None:
        nonlocal errors
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while time.monotonic() < stop:
            try:
                ms = one_scrape(port, conn)
            except Exception:
                with lock:
                    errors += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                continue
            with lock:
                times.append(ms)
            if pause:
                time.sleep(pause)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times, errors


def concurrent(port: int, clients: int, seconds: float, pause: float = 0.0) -> tuple[list[float], int]:
    """`clients` scrapers spread over 5 processes, so the clients' own GIL does not inflate the timings."""
    from concurrent.futures import ProcessPoolExecutor

    procs = 5
    with ProcessPoolExecutor(procs) as pool:
        parts = list(
            pool.map(
                _scrapers, [port] * procs, [clients // procs] * procs, [seconds] * procs, [pause] * procs
            )
        )
    return [t for times, _ in parts for t in times], sum(e for _, e in parts)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--preset", default="dgx-a100", help="8-GPU simulator preset (dgx-a100, dgx-h100)")
    parser.add_argument("--every-field", action="store_true", help="enable every field the catalog knows")
    args = parser.parse_args()
    load_at_start = load_average()
    rounds, scrapes, load_s = (30, 300, 5.0) if args.quick else (200, 2000, 30.0)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "node.json"
        build_56_mig(state, args.preset)
        counters_file = every_field_counters(Path(tmp) / "every-field.csv") if args.every_field else None
        passes, renders = asyncio.run(sampling_and_render_ms(state, rounds, counters_file))
        firsts = asyncio.run(first_scrape_ms(state, min(rounds, 50), counters_file))
        fields = ["-f", str(counters_file)] if counters_file is not None else []
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        proc = subprocess.Popen(
            [EXPORTER, "--sim-state", str(state), "-a", f"127.0.0.1:{port}", "-c", "30000", *fields],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    one_scrape(port)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            for _ in range(50):
                one_scrape(port)
            single = [one_scrape(port) for _ in range(scrapes)]
            loaded, errors = concurrent(port, 50, load_s, pause=0.2)  # 50 scrapers, 5 scrapes/s each
            saturated, sat_errors = concurrent(port, 50, min(load_s, 5.0))  # closed loop: no pause
            rss = psutil.Process(proc.pid).memory_full_info()
        finally:
            proc.terminate()
            proc.wait(10)
    figures: dict[str, Any] = {
        "sampling_ms": {"p50": statistics.median(passes), "p99": percentile(sorted(passes), 99)},
        "render_ms": {
            who: {"p50": statistics.median(t), "p99": percentile(sorted(t), 99)} for who, t in renders.items()
        },
        "scrape_ms": {"p50": statistics.median(single), "p99": percentile(sorted(single), 99)},
        "first_scrape_answer_ms": {"p50": statistics.median(firsts), "p99": percentile(sorted(firsts), 99)},
        "concurrent_ms": {
            "p50": statistics.median(loaded),
            "p99": percentile(sorted(loaded), 99),
            "requests": len(loaded),
            "errors": errors,
        },
        "saturation": {
            "p50": statistics.median(saturated),
            "p99": percentile(sorted(saturated), 99),
            "rps": len(saturated) / min(load_s, 5.0),
            "errors": sat_errors,
        },
        "rss_mb": rss.rss / 1e6,
        "uss_mb": rss.uss / 1e6,
        "pss_mb": rss.pss / 1e6,
    }
    info = machine_base(load_at_start=load_at_start, load_average=load_average())
    if args.json:
        print(json.dumps({"machine": info, "figures": figures}, indent=2))
        return 0
    c, sat = figures["concurrent_ms"], figures["saturation"]
    rows = [
        (
            "sampling pass (56 MIG devices)",
            figures["sampling_ms"]["p50"],
            figures["sampling_ms"]["p99"],
            "p50 <= 20 ms",
            figures["sampling_ms"]["p50"] <= 20,
        ),
        (
            "GPU series render, once a sample (prometheus_client: "
            f"{figures['render_ms']['prometheus_client']['p50']:.1f} ms)",
            figures["render_ms"]["exporter"]["p50"],
            figures["render_ms"]["exporter"]["p99"],
            "(off the scrape path)",
            True,
        ),
        (
            "scrape, one client",
            figures["scrape_ms"]["p50"],
            figures["scrape_ms"]["p99"],
            "p99 <= 5 ms",
            figures["scrape_ms"]["p99"] <= 5,
        ),
        (
            "first scrape after each new sample: its answer, in-process",
            figures["first_scrape_answer_ms"]["p50"],
            figures["first_scrape_answer_ms"]["p99"],
            "(within the 5 ms)",
            figures["first_scrape_answer_ms"]["p99"] <= 5,
        ),
        (
            f"50 scrapers back to back ({sat['rps']:.0f} req/s, {sat['errors']} err)",
            sat["p50"],
            sat["p99"],
            "p99 <= 50 ms, 0 errors",
            sat["p99"] <= 50 and sat["errors"] == 0,
        ),
        (
            f"50 scrapers x 5/s for {load_s:.0f} s ({c['requests']} req, {c['errors']} err)",
            c["p50"],
            c["p99"],
            "p99 <= 50 ms, 0 errors",
            c["p99"] <= 50 and c["errors"] == 0,
        ),
    ]
    mode = (
        ("quick" if args.quick else "full")
        + f", {args.preset}"
        + (", every field" if args.every_field else "")
    )
    print(
        f"Exporter benchmark ({mode} run); {info['cpu']}, {info['cpus_usable']} CPUs, {info['python']}, "
        f"load {info['load_at_start']} at the start, {info['load_average']} at the end"
    )
    print(f"{'figure':<58}{'median':>10}{'p99':>10}  target")
    for name, p50, p99, target, ok in rows:
        print(f"{name:<58}{p50:>8.2f}ms{p99:>8.2f}ms  {target:<24}{'PASS' if ok else 'FAIL'}")
    rss_ok = figures["rss_mb"] <= 50
    print(
        f"{'exporter RSS after the load':<58}{figures['rss_mb']:>8.1f}MB{'':>10}  {'<= 50 MB':<24}"
        f"{'PASS' if rss_ok else 'FAIL'}  (USS {figures['uss_mb']:.1f}, PSS {figures['pss_mb']:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the Kubernetes layer costs an agent (issue 6): start-up time and memory.

    .venv/bin/python benchmarks/kube_layer.py [--quick] [--json]

1. Import: a fresh interpreter importing an agent's stack (the feature discovery agent's modules),
   then the same plus `gpunode.kube.client` (lightkube); the difference of the medians.
2. Start-up in use: in a fresh interpreter that has loaded the agent's stack, the time to import the
   layer, connect, get the node and patch it, against the test API server on loopback. Target: import +
   use <= 300 ms.
3. Memory: a real `gpunode-feature-discovery` process (simulated dgx-a100, 1 s interval), once writing
   the feature file and once publishing a NodeFeature through the test API server; steady-state RSS of
   each after several passes; the difference. Target <= 10 MB. Measured twice: without a config file
   (the worst case: the Kubernetes client alone brings in PyYAML) and with one, as the GPU Operator
   deploys feature discovery.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchlib import load_average, machine_base
from gpunode.sim import nvml as sim
from gpunode.sim.apiserver import FakeApiServer

FD = str(Path(sys.executable).with_name("gpunode-feature-discovery"))
STACK = "import gpunode.feature_discovery.cli, gpunode.feature_discovery.loop, gpunode.nvml.real"

TIMED = """
import time, sys
t0 = time.perf_counter()
{stmt}
t1 = time.perf_counter()
print((t1 - t0) * 1000)
"""

USE = f"""
import asyncio, time
{STACK}
t0 = time.perf_counter()
from gpunode.kube.client import Kube
async def main():
    kube = Kube.connect("node-1", {{kubeconfig!r}})
    node = await kube.get_node()
    await kube.patch_node(labels={{{{"bench": "1"}}}})
    await kube.aclose()
    return node
asyncio.run(main())
print((time.perf_counter() - t0) * 1000)
"""


def fresh_ms(code: str, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        out.append(float(r.stdout.strip().splitlines()[-1]))
    return out


def steady_rss_mb(args: list[str], settle_s: float) -> float:
    p = subprocess.Popen([FD, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(settle_s)
        assert p.poll() is None, f"feature discovery exited {p.returncode}"
        samples = []
        for _ in range(5):
            samples.append(psutil.Process(p.pid).memory_info().rss / 1e6)
            time.sleep(0.4)
        return statistics.median(samples)
    finally:
        p.terminate()
        p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer runs (a smoke test)")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    runs = 3 if opts.quick else 9
    settle = 3.0 if opts.quick else 6.0

    fresh_ms(TIMED.format(stmt=STACK + "\nimport gpunode.kube.client"), 1)  # warm the bytecode caches
    base = fresh_ms(TIMED.format(stmt=STACK), runs)
    with_kube = fresh_ms(TIMED.format(stmt=STACK + "\nimport gpunode.kube.client"), runs)

    with tempfile.TemporaryDirectory() as tmp, FakeApiServer() as api:
        d = Path(tmp)
        api.add_node("node-1")
        kubeconfig = api.write_kubeconfig(d / "kubeconfig")
        use = fresh_ms(USE.format(kubeconfig=str(kubeconfig)), runs)
        state = d / "node.json"
        sim.init_state_file(state, "dgx-a100")
        common = [
            "--sim-state",
            str(state),
            "--sleep-interval",
            "1s",
            "--http-port",
            "-1",
            "--node-name",
            "node-1",
        ]
        nf = ["--use-node-feature-api", "--kubeconfig", str(kubeconfig), "--namespace", "default"]
        rss_file = steady_rss_mb([*common, "-o", str(d / "gfd")], settle)
        rss_kube = steady_rss_mb([*common, *nf], settle)
        # As the GPU Operator deploys it: with the device plugin's config file (YAML already loaded).
        config = d / "config.yaml"
        config.write_text("version: v1\nflags:\n  migStrategy: none\n")
        rss_file_cfg = steady_rss_mb([*common, "--config-file", str(config), "-o", str(d / "gfd2")], settle)
        rss_kube_cfg = steady_rss_mb([*common, "--config-file", str(config), *nf], settle)
        published = api.get("nodefeatures", "nvidia-features-for-node-1", "default")
        assert published is not None
        assert published["spec"]["labels"]["nvidia.com/gpu.count"] == "8"

    import_delta = statistics.median(with_kube) - statistics.median(base)
    result: dict[str, Any] = {
        "machine": machine_base(load=load_average()),
        "import_stack_ms": round(statistics.median(base), 1),
        "import_stack_plus_kube_ms": round(statistics.median(with_kube), 1),
        "import_delta_ms": round(import_delta, 1),
        "import_connect_get_patch_ms": round(statistics.median(use), 1),
        "rss_file_mb": round(rss_file, 1),
        "rss_nodefeature_mb": round(rss_kube, 1),
        "rss_delta_mb": round(rss_kube - rss_file, 1),
        "rss_file_with_config_mb": round(rss_file_cfg, 1),
        "rss_nodefeature_with_config_mb": round(rss_kube_cfg, 1),
        "rss_delta_with_config_mb": round(rss_kube_cfg - rss_file_cfg, 1),
    }
    if opts.json:
        print(json.dumps(result, indent=2))
        return 0
    m = result["machine"]
    print(f"# kube layer  ({m['cpu']}, {m['cpus_usable']} CPUs usable, {m['python']}, load {m['load']})")
    print(f"{'figure':<56} {'value':>10} {'target':>10}")
    rows = [
        ("import: agent stack (median of fresh interpreters)", f"{result['import_stack_ms']} ms", ""),
        ("import: agent stack + gpunode.kube.client", f"{result['import_stack_plus_kube_ms']} ms", ""),
        ("import: added by the kube layer", f"{result['import_delta_ms']} ms", "<= 300 ms"),
        (
            "agent loaded, then import kube + connect + get + patch",
            f"{result['import_connect_get_patch_ms']} ms",
            "<= 300 ms",
        ),
        ("RSS: feature discovery, feature file", f"{result['rss_file_mb']} MB", ""),
        ("RSS: feature discovery, NodeFeature API", f"{result['rss_nodefeature_mb']} MB", ""),
        ("RSS: added by the kube layer in use", f"{result['rss_delta_mb']} MB", "<= 10 MB"),
        ("RSS: feature file, with a config file", f"{result['rss_file_with_config_mb']} MB", ""),
        ("RSS: NodeFeature API, with a config file", f"{result['rss_nodefeature_with_config_mb']} MB", ""),
        ("RSS: added, as deployed (config file)", f"{result['rss_delta_with_config_mb']} MB", "<= 10 MB"),
    ]
    for name, value, target in rows:
        print(f"{name:<56} {value:>10} {target:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the driver upgrade controller costs (issue 17): a rolling driver upgrade of 1,000 GPU nodes.

    .venv/bin/python benchmarks/driver_upgrade.py [--nodes 1000] [--max-parallel 0] [--max-unavailable 10%]
                                                  [--gpu-pods-every 4] [--json]

The test API server (in this process, its own threads) holds the GPU nodes, a driver DaemonSet
(OnDelete) whose pods its miniature controller replaces and which become Ready at once, one GPU
workload pod on every ``--gpu-pods-every``-th node (evicted by the upgrade), and the ClusterPolicy with
``driver.upgradePolicy``. The controller (``gpunode.operator.upgrade``, the code the operator runs) runs
on the event loop of this process's main thread against it over HTTP; then the driver's template
changes (a new DRIVER_VERSION) and the clock runs until every node is ``upgrade-done``.

Reported: wall time; API writes per node (node patches, Events, evictions, pod deletions, status
patches, counted by the server); the controller's CPU per node: the main thread's CPU time over the
run (the passes, the watches' decoding, the HTTP client: everything the controller does; the server's
threads are not counted), and of that the passes alone; the limits checker (every recorded node write:
upgrades in progress <= maxParallelUpgrades, nodes cordoned by the upgrade or NotReady <=
maxUnavailable) and its violations. Targets: controller CPU <= 50 ms per node; 0 violations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from benchlib import machine_base
from gpunode.common.logging import configure_logging
from helpers.upgrades import set_driver_env, upgrade_cluster


async def run(args: argparse.Namespace) -> dict[str, Any]:
    upgrade = {
        "autoUpgrade": True,
        "maxParallelUpgrades": args.max_parallel,
        "maxUnavailable": args.max_unavailable,
    }

    def workloads(api: Any) -> None:
        if args.gpu_pods_every:
            for i in range(0, args.nodes, args.gpu_pods_every):
                api.add_pod(
                    "ml",
                    f"train-{i}",
                    node=f"gpu-{i:04}",
                    requests={"nvidia.com/gpu": "1"},
                    owner_kind="ReplicaSet",
                    owner_name="trainer",
                )

    setup = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        async with upgrade_cluster(
            Path(tmp), args.nodes, upgrade, prepare=workloads, history=args.nodes * 40
        ) as c:
            await c.until(lambda: bool(c.passes) and c.controller.synced(), 300)
            setup_s = time.monotonic() - setup
            before = Counter(c.api.request_counts)
            stats = c.controller.stats
            pass_cpu0, passes0 = stats.cpu_s, stats.passes
            cpu0, wall0 = time.thread_time(), time.monotonic()
            set_driver_env(c.api, "DRIVER_VERSION", "580.2")
            await c.until(lambda: all(s == "upgrade-done" for s in c.states().values()), args.timeout)
            wall = time.monotonic() - wall0
            # the pass that wrote the last transitions ends with its Events and the status: counted too
            await c.until(lambda: c.controller.stats.transitions >= 8 * args.nodes, 60)
            await c.until(lambda: (c.controller.status or {}).get("nodes", {}).get("done") == args.nodes, 60)
            cpu = time.thread_time() - cpu0
            served = Counter(c.api.request_counts)
            served.subtract(before)
            writes = {f"{verb} {res}": n for (verb, res), n in sorted(served.items()) if verb != "get" and n}
            writes = {k: v for k, v in writes.items() if not k.startswith(("list", "watch"))}
            total_writes = sum(writes.values())
            return {
                "nodes": args.nodes,
                "upgrade_policy": upgrade,
                "gpu_workload_pods": len(range(0, args.nodes, args.gpu_pods_every))
                if args.gpu_pods_every
                else 0,
                "setup_s": round(setup_s, 1),
                "wall_s": round(wall, 2),
                "writes": writes,
                "writes_per_node": round(total_writes / args.nodes, 2),
                "controller_cpu_ms_per_node": round(cpu * 1000 / args.nodes, 2),
                "passes_cpu_ms_per_node": round((stats.cpu_s - pass_cpu0) * 1000 / args.nodes, 2),
                "passes": stats.passes - passes0,
                "transitions": stats.transitions,
                "evictions": stats.evictions,
                "limits": {
                    "max_parallel": c.checker.max_parallel,
                    "max_unavailable": c.checker.max_unavailable,
                    "peak_upgrading": c.checker.peak_active,
                    "peak_unavailable": c.checker.peak_unavailable,
                    "node_writes_checked": c.checker.writes,
                    "violations": len(c.checker.violations),
                    "first_violations": c.checker.violations[:5],
                },
                "target_cpu_ms_per_node": 50,
            }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--max-parallel", type=int, default=0)
    p.add_argument("--max-unavailable", default="10%")
    p.add_argument(
        "--gpu-pods-every", type=int, default=4, help="one GPU workload pod on every Nth node (0: none)"
    )
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.max_unavailable.isdigit():
        args.max_unavailable = int(args.max_unavailable)
    configure_logging(level="warning", fmt="json")
    result = asyncio.run(run(args))
    result["machine"] = machine_base()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    ok = result["limits"]["violations"] == 0 and result["controller_cpu_ms_per_node"] <= 50
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What the MPS control daemon agent costs: start to ready, resident memory, CPU while idle.

    .venv/bin/python benchmarks/mps.py            # 60 s idle window
    .venv/bin/python benchmarks/mps.py --quick    # 15 s idle window
    .venv/bin/python benchmarks/mps.py --json     # machine-readable output on stdout

The agent runs as a real, separate process (``gpunode-mps-control-daemon --sim-state ...``) on the simulated
``dgx-a100`` preset (8x A100-SXM4-40GB) with the fake ``nvidia-cuda-mps-control`` of the simulated host in
a scratch driver root, sharing ``nvidia.com/gpu`` with MPS, 4 replicas: one control daemon for 8 GPUs (the
case of every file written for NVIDIA's plugin), then 8 daemons (gpunode's extension: one renamed resource
per GPU), then the first case again with the config chosen by the node label (``--config-file`` naming a
directory of named configs, ``--node-name`` and a kubeconfig for a test API server started here, the node
labelled ``nvidia.com/device-plugin.config``): the agent then loads the Kubernetes client (lightkube,
httpx2) and watches its node; and last with ``--follow-device-plugin``, as the rendered DaemonSet runs
it: the config the device plugin serves (from its own label and ConfigMap), as the plugin publishes it
under the MPS root (written here before the start, as a running plugin has). Measured per case, with the
agent's default ``--watch-interval`` (5 s) and its HTTP endpoint (``/healthz``, ``/readyz``, ``/metrics``)
on, as the systemd unit runs it:

1. start to ready: from the exec until ``<root>/.ready`` exists (NVML opened, the daemons started, the
   limits set through the control binary, the readiness file written);
2. the agent's RSS (VmRSS, 10^6 bytes) once ready and again after the idle window: target <= 40 MB;
3. the agent's CPU (utime + stime from /proc) over the idle window, in % of one core: target ~0
   (<= 0.2 %). The fake control daemons' own CPU and memory are not the agent's and are shown apart.

A report, not a test: it exits 0 unless something crashes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import machine_base
from gpunode.sim import mps_control
from gpunode.sim import nvml as sim
from gpunode.sim.apiserver import FakeApiServer

AGENT = str(Path(sys.executable).parent / "gpunode-mps-control-daemon")
TICKS = os.sysconf("SC_CLK_TCK")
NODE = "node-1"
LABEL = "nvidia.com/device-plugin.config"
RSS_TARGET_MB = 40.0
CPU_TARGET_PCT = 0.2
ONE = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
EIGHT = (
    "version: v1\nflags:\n  gpunode: {timeSlicingExtensions: true}\nsharing:\n  mps:\n    resources:\n"
    + "".join(
        f"    - {{name: nvidia.com/gpu, replicas: 4, devices: [{i}], rename: gpu-mps-{i}}}\n"
        for i in range(8)
    )
)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    return 0.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def daemons(root: Path) -> list[int]:
    return [int(p.read_text()) for p in root.rglob("nvidia-cuda-mps-control.pid")]


def run_case(
    name: str, config: str, idle: float, *, labelled: bool = False, follow: bool = False
) -> dict[str, Any]:
    """One agent; ``labelled``: --config-file names a directory of named configs and the node label
    chooses one, through a test API server started here (the agent then loads the Kubernetes client);
    ``follow``: --follow-device-plugin, the config as the device plugin publishes it."""
    base = Path(tempfile.mkdtemp(prefix="mpsb", dir="/tmp"))
    api: FakeApiServer | None = None
    try:
        state = base / "node.json"
        sim.init_state_file(state, "dgx-a100")
        mps_control.install(base / "drv")
        config_arg = base / "config.yaml"
        config_arg.write_text(config)
        extra: list[str] = []
        if labelled:
            config_arg = base / "available-configs"
            config_arg.mkdir()
            (config_arg / "mps-4").write_text(config)
            (config_arg / "other").write_text(config.replace("replicas: 4", "replicas: 2"))
            api = FakeApiServer().__enter__()
            api.add_node(NODE, labels={LABEL: "mps-4"})
            kubeconfig = api.write_kubeconfig(base / "kubeconfig")
            extra = ["--node-name", NODE, "--kubeconfig", str(kubeconfig), "--default-config", "other"]
        root = base / "mps"
        source = ["--config-file", str(config_arg)]
        if follow:
            root.mkdir()
            (root / ".device-plugin-config.yaml").write_text(config)  # as the device plugin publishes it
            source = ["--follow-device-plugin"]
        start = time.monotonic()
        proc = subprocess.Popen(
            [
                AGENT,
                "--sim-state",
                str(state),
                "--driver-root",
                str(base / "drv"),
                "--mps-root",
                str(root),
                *source,
                *extra,
                "--http-address",
                "127.0.0.1",
                "--http-port",
                "0",
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not (root / ".ready").exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name}: the agent exited with {proc.returncode}")
                if time.monotonic() - start > 60:
                    raise RuntimeError(f"{name}: not ready after 60 s")
                time.sleep(0.01)
            ready_s = time.monotonic() - start
            time.sleep(1.0)  # let the start's last work settle
            if labelled or follow:
                threads = json.loads((root / ".ready").read_text())["resources"]["nvidia.com/gpu"]
                if float(threads["activeThreadPercentage"]) != 25.0:
                    raise RuntimeError(f"{name}: the labelled config (4 replicas) was not taken: {threads}")
            rss_ready = rss_mb(proc.pid)
            fake = daemons(root)
            cpu0, fake0, t0 = cpu_s(proc.pid), sum(cpu_s(p) for p in fake), time.monotonic()
            time.sleep(idle)
            cpu1, fake1, t1 = cpu_s(proc.pid), sum(cpu_s(p) for p in fake), time.monotonic()
            rss_idle = rss_mb(proc.pid)
            fake_rss = sum(rss_mb(p) for p in fake)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        return {
            "case": name,
            "daemons": len(fake),
            "ready_s": round(ready_s, 3),
            "rss_ready_mb": round(rss_ready, 1),
            "rss_idle_mb": round(rss_idle, 1),
            "idle_window_s": round(t1 - t0, 1),
            "idle_cpu_pct": round(100 * (cpu1 - cpu0) / (t1 - t0), 3),
            "fake_daemons_rss_mb": round(fake_rss, 1),
            "fake_daemons_cpu_pct": round(100 * (fake1 - fake0) / (t1 - t0), 3),
            "exit_code": proc.returncode,
        }
    finally:
        if api is not None:
            api.__exit__(None, None, None)
        unmount_shm(base / "mps" / "shm")
        shutil.rmtree(base, ignore_errors=True)


def unmount_shm(path: Path) -> None:
    """The agent mounts a tmpfs at <root>/shm when it may (root): never leave it behind."""
    import ctypes
    import ctypes.util

    from gpunode.mps.shm import is_mountpoint

    if is_mountpoint(str(path)) is not None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.umount2(os.fsencode(path), 2)  # MNT_DETACH


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="15 s idle window instead of 60 s")
    parser.add_argument("--json", action="store_true", help="JSON on stdout")
    args = parser.parse_args()
    idle = 15.0 if args.quick else 60.0
    rows = [
        run_case("1 daemon (8 GPUs)", ONE, idle),
        run_case("8 daemons (1 GPU each)", EIGHT, idle),
        run_case("1 daemon, node label", ONE, idle, labelled=True),
        run_case("1 daemon, plugin config", ONE, idle, follow=True),
    ]
    if args.json:
        print(json.dumps({"machine": machine_base(), "rows": rows}, indent=2))
        return 0
    print(f"MPS control daemon agent, dgx-a100 simulated, 4 replicas per GPU, idle window {idle:.0f} s")
    header = (
        f"{'case':<24} {'ready s':>8} {'RSS ready':>10} {'RSS idle':>9} {'idle CPU %':>11} {'targets':>22}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ok = r["rss_idle_mb"] <= RSS_TARGET_MB and r["idle_cpu_pct"] <= CPU_TARGET_PCT
        target = f"<={RSS_TARGET_MB:.0f} MB, ~0 % {'met' if ok else 'MISSED'}"
        print(
            f"{r['case']:<24} {r['ready_s']:>8.2f} {r['rss_ready_mb']:>8.1f}MB {r['rss_idle_mb']:>7.1f}MB "
            f"{r['idle_cpu_pct']:>11.3f} {target:>22}"
        )
    print()
    for r in rows:
        print(
            f"{r['case']}: the fake control daemons (not the agent): {r['fake_daemons_rss_mb']:.1f} MB, "
            f"{r['fake_daemons_cpu_pct']:.3f} % CPU; agent exit code on SIGTERM {r['exit_code']}"
        )
    print(json.dumps(machine_base()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

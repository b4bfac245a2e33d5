"""What gpunode-operator costs (issue 15): convergence, API writes, label latency, memory and idle CPU.

    .venv/bin/python benchmarks/operator_bench.py [--quick] [--json]

The test API server runs in its own process (this script with ``--serve``, driven over stdin/stdout), so
the operator's RSS and CPU are its own; the operator is a real ``gpunode-operator`` process (from the
venv's bin directory) with JSON logs to a file. API writes are counted on the server (PATCH, POST, PUT,
DELETE as the verbs patch, create, update, delete) by resource.

1. Converge: 1,000 GPU nodes (NFD labels only) and 200 others, the CRD and a ClusterPolicy already
   there; the operator started; until every object is applied, every GPU node carries its deploy labels
   and the policy is ``ready`` (DaemonSet status from the server's miniature controller). Wall time from
   the operator's exec, and its writes. Targets: exactly one label patch per GPU node; at most 60 writes
   for the policy's objects (reported with and without the policy's status writes).
2. Unchanged: the operator restarted with nothing changed; until it has listed the nodes, reconciled
   and been quiet for 3 s. Target: 0 writes.
3. New GPU node: 100 of the other nodes, one at a time, get NFD's GPU label; the time until the node
   carries its deploy labels (seen by the server). Target: p99 <= 1 s.
4. Size: 5,000 nodes of realistic size (about 15 KB each: images, conditions, many labels), one in ten
   a GPU node (NFD labels), and a ClusterPolicy; setup (the server creating them) is measured apart
   from the operator converging.
   Operator RSS once converged (and its high-water mark), then idle CPU over 60 s (30 s with --quick).
   Targets: RSS <= 120 MB; idle CPU <= 0.5 % of a core.

The test server runs the DaemonSets: its miniature controller indexes pods by owner and node and keeps
each node's share of the status counts, so a node write costs O(DaemonSets) (about 7 ms with 7
DaemonSets); it honours list `limit`/`continue`, so the operator reads nodes a page (100) at a time.

Last full run (`.venv/bin/python benchmarks/operator_bench.py`, 2026-12-01 19:58 UTC, 2 AMD EPYC cores at
load 0.3-0.9, the operator with its object caches and the driver upgrade controller): converge 9.8 s wall,
1,000 label patches, 42 object writes (+4 status writes); restart 0 writes; new GPU node p99 266 ms, none
missed; 5,000 nodes of 14.6 KB: operator converged 12.3 s from exec, RSS 116.1 MB (high-water mark
118.7 MB), idle CPU 0.02 % over 60 s, no writes while idle. (The upgrade controller had listed and kept
every node a second time: 130.7 MB; it now reads the labeller's watch.) Earlier, before the object caches
and the upgrade controller, at load 7.6-8.0: converge 20.8 s, RSS 102.2 MB.

Where the operator's memory goes: about 46 MB after imports, 62 MB
once it has rendered (the renderer imports every agent's CLI module, grpc and prometheus_client
included); the node cache of 5,000 slim nodes is about 11 MB of objects (label strings interned: 50 MB
without); the rest is pages and watch events come and gone. Before this (one unpaginated list, labels not
interned, daemon pods listed as full JSON): 170 MB RSS, 202 MB high-water mark with 2,000 such nodes.

--quick: 300 GPU nodes + 60 others, 30 new GPU nodes, 1,500 big nodes, 30 s idle (a smoke test; the
targets are the full run's).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

OPERATOR = str(Path(sys.executable).with_name("gpunode-operator"))
NAMESPACE = "gpunode"
POLICY = "cluster-policy"
NFD_GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
NFD_OTHER = {"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"}
WRITE_VERBS = ("create", "update", "patch", "delete")
DEPLOY_MARK = "nvidia.com/gpu.deploy.device-plugin"


# -- the server process ------------------------------------------------------------------------------------


def big_node(name: str, i: int, *, gpu: bool) -> dict[str, Any]:
    """A node about the size of a real GPU node: many labels, 5 conditions, ~50 images."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": f"us-east-1{'abcd'[i % 4]}",
        **(NFD_GPU if gpu else NFD_OTHER),
    }
    for k in range(40):
        labels[f"feature.node.kubernetes.io/cpu-cpuid.FEATURE{k:02d}"] = "true"
    for k in range(10):
        labels[f"example.com/team-{k}"] = f"value-{i % 7}-{k}"
    images = [
        {
            "names": [
                f"registry.example.com/team{k % 9}/image-{k}@sha256:{(i * 131 + k) % 10**12:064x}",
                f"registry.example.com/team{k % 9}/image-{k}:v1.{k}.{i % 13}",
            ],
            "sizeBytes": 100_000_000 + k * 1_234_567,
        }
        for k in range(50)
    ]
    conditions = [
        {
            "type": t,
            "status": "True" if t == "Ready" else "False",
            "lastHeartbeatTime": "2026-12-01T16:00:00Z",
            "lastTransitionTime": "2026-11-01T08:00:00Z",
            "reason": f"Kubelet{t}",
            "message": f"kubelet reports {t} as expected on this node",
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "Ready")
    ]
    resources = {"cpu": "192", "memory": "2097152Mi", "nvidia.com/gpu": "8", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-{i:017x}"}),
            },
        },
        "spec": {"providerID": f"aws:///us-east-1a/i-{i:017x}", "podCIDR": f"10.{i // 256}.{i % 256}.0/24"},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{i // 256}.{i % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "images": images,
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": f"{i:032x}",
                "containerRuntimeVersion": "containerd://1.7.20",
                "kernelVersion": "6.8.0-gpunode",
                "kubeProxyVersion": "v1.31.0",
                "kubeletVersion": "v1.31.0",
                "machineID": f"{i:032x}",
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04 LTS",
                "systemUUID": f"{i:032x}",
            },
        },
    }


def is_gpu(node: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in NFD_GPU.items())


def labelled(node: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    return labels.get("nvidia.com/gpu.present") == "true" and labels.get(DEPLOY_MARK) == "true"


def serve() -> int:
    """Answer one JSON command a line on stdin with one JSON line on stdout."""
    from gpunode.api.clusterpolicy_crd import crd
    from gpunode.sim.apiserver import FakeApiServer

    api = FakeApiServer(poll_interval=0.5).start()

    def counts() -> dict[str, Any]:
        with api._lock:  # a consistent snapshot
            rows = [[v, r, n] for (v, r), n in api.request_counts.items()]
            return {"requests": len(api.requests), "counts": rows}

    def state() -> str | None:
        obj = api.get("ClusterPolicy", POLICY)
        return ((obj or {}).get("status") or {}).get("state")

    def handle(cmd: dict[str, Any]) -> Any:
        op = cmd["op"]
        if op == "setup":
            t0 = time.monotonic()
            size = 0
            for i in range(cmd["gpu"] + cmd.get("big", 0)):
                name = f"gpu-{i:05d}" if i < cmd["gpu"] else f"big-{i:05d}"
                if cmd.get("big"):
                    node = big_node(name, i, gpu=i < cmd["gpu"])
                    size = size or len(json.dumps(node))
                    api.create("Node", node)
                else:
                    api.add_node(name, labels={"kubernetes.io/hostname": name, **NFD_GPU})
            for i in range(cmd["other"]):
                name = f"cpu-{i:05d}"
                api.add_node(name, labels={"kubernetes.io/hostname": name, **NFD_OTHER})
            api.apply("CustomResourceDefinition", crd(), manager="user")
            policy = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": POLICY}}
            api.apply("ClusterPolicy", {**policy, "spec": {}}, manager="user")
            api.write_kubeconfig(Path(cmd["kubeconfig"]))
            return {"setup_s": time.monotonic() - t0, "node_bytes": size}
        if op == "counts":
            return counts()
        if op == "converged":  # the policy ready and every GPU node labelled
            if state() != "ready":
                return {"done": False, "state": state()}
            with api._lock:  # no deep copy of every node: that would load the server more than the operator
                nodes = [n for n in api._bucket(api.resource_type("Node")).values() if is_gpu(n)]
                done = sum(labelled(n) for n in nodes)
            return {"done": done == len(nodes), "state": "ready", "labelled": done}
        if op == "nfd_appears":  # one node at a time: label it, wait until the operator has labelled it
            latencies = []
            for name in cmd["names"]:
                t0 = time.monotonic()
                api.patch_node(name, {"metadata": {"labels": NFD_GPU}})
                ok = api.wait_for(lambda n=name: labelled(api.node(n)), timeout=cmd["timeout"])
                latencies.append(time.monotonic() - t0 if ok else None)
            return {"latencies": latencies}
        if op == "stop":
            api.stop()
            return {}
        raise ValueError(f"unknown op {op!r}")

    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            reply = {"ok": handle(cmd)}
        except Exception as exc:  # reported to the driver, which fails loudly
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
        if cmd["op"] == "stop":
            break
    return 0


# -- the driver ---------------------------------------------------------------------------------------------


class Server:
    """The test API server's process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, op: str, **args: Any) -> Any:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"test API server exited ({self.proc.wait()}) during {op}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"test API server: {op}: {reply['error']}")
        return reply["ok"]

    def writes(self) -> dict[str, int]:
        """Writes served so far, by resource."""
        out: dict[str, int] = {}
        for verb, resource, n in self.call("counts")["counts"]:
            if verb in WRITE_VERBS:
                out[resource] = out.get(resource, 0) + n
        return out

    def close(self) -> None:
        try:
            self.call("stop")
        finally:
            self.proc.wait(30)


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    out = {k: n - before.get(k, 0) for k, n in after.items()}
    return {k: n for k, n in sorted(out.items()) if n}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Operator:
    """A gpunode-operator process, its JSON log in a file."""

    running: list["Operator"] = []  # every one started: main() stops those left, whatever happened

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        Operator.running.append(self)
        self.log = log
        self.port = free_port()
        self.t0 = time.monotonic()
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    OPERATOR,
                    "--kubeconfig",
                    str(kubeconfig),
                    "--namespace",
                    NAMESPACE,
                    "--http-address",
                    "127.0.0.1",
                    "--http-port",
                    str(self.port),
                    "--log-format",
                    "json",
                    # the test server serialises every request under one lock and, with many daemon pods,
                    # answers slowly: a client-side timeout and retry would count as a second write
                    "--kube-api-timeout",
                    "120",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.offset = log.stat().st_size if log.exists() else 0

    def events(self) -> list[dict[str, Any]]:
        with self.log.open("rb") as f:
            f.seek(self.offset)
            lines = f.read().decode(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"gpunode-operator exited {self.proc.returncode}: {self.log.read_text()[-3000:]}"
            )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait(predicate: Any, timeout: float, what: str, op: Operator, interval: float = 0.1) -> float:
    """Poll until predicate() holds; the time it took from the operator's exec."""
    deadline = time.monotonic() + timeout
    while not predicate():
        op.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - op.t0


def quiet(server: Server, seconds: float, timeout: float) -> None:
    """Wait until the server has served no write for `seconds`."""
    deadline = time.monotonic() + timeout
    last = server.writes()
    since = time.monotonic()
    while time.monotonic() - since < seconds and time.monotonic() < deadline:
        time.sleep(0.5)
        now = server.writes()
        if now != last:
            last, since = now, time.monotonic()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def split_writes(writes: dict[str, int]) -> dict[str, int]:
    nodes = writes.get("nodes", 0)
    status = sum(n for r, n in writes.items() if r.startswith("clusterpolicies") and r.endswith("/status"))
    objects = sum(writes.values()) - nodes - status
    return {"node_patches": nodes, "policy_status": status, "objects": objects, "total": sum(writes.values())}


def converge_and_restart(tmp: Path, gpu: int, other: int, new: int) -> dict[str, Any]:
    server = Server()
    try:
        kubeconfig = tmp / "kubeconfig-1"
        setup = server.call("setup", gpu=gpu, other=other, kubeconfig=str(kubeconfig))
        log = tmp / "operator-1.log"
        before = server.writes()
        op = Operator(kubeconfig, log)
        wait(op.healthy, 60, "/healthz", op)
        started = time.monotonic() - op.t0
        converged = wait(lambda: server.call("converged")["done"], 1800, "convergence", op)
        quiet(server, 2.0, 60)
        writes = diff(server.writes(), before)
        small_rss = rss_mb(op.proc.pid)
        op.stop()

        # 2. restart with nothing changed
        before = server.writes()
        op = Operator(kubeconfig, log)

        def settled() -> bool:
            names = {e.get("event") for e in op.events()}
            return "labeller_synced" in names and "reconciled" in names

        wait(settled, 120, "labeller_synced and reconciled", op)
        quiet(server, 3.0, 60)
        again = diff(server.writes(), before)

        # 3. new GPU nodes, one at a time
        before = server.writes()
        names = [f"cpu-{i:05d}" for i in range(other - new, other)]
        latencies = server.call("nfd_appears", names=names, timeout=10.0)["latencies"]
        quiet(server, 2.0, 30)
        new_writes = diff(server.writes(), before)
        op.check()
        op.stop()
    finally:
        server.close()
    done = sorted(x for x in latencies if x is not None)
    from benchlib import percentile

    return {
        "gpu_nodes": gpu,
        "other_nodes": other,
        "setup_s": setup["setup_s"],
        "healthz_s": started,
        "rss_mb": small_rss,
        "converge_s": converged,
        "writes": writes,
        "split": split_writes(writes),
        "restart_writes": again,
        "new_nodes": new,
        "new_missed": len(latencies) - len(done),
        "new_p50_s": percentile(done, 50) if done else None,
        "new_p99_s": percentile(done, 99) if done else None,
        "new_max_s": done[-1] if done else None,
        "new_writes": new_writes,
    }


def size_and_idle(tmp: Path, nodes: int, idle_s: float) -> dict[str, Any]:
    import psutil

    server = Server()
    try:
        kubeconfig = tmp / "kubeconfig-2"
        gpu = nodes // 10
        setup = server.call("setup", gpu=gpu, other=0, big=nodes - gpu, kubeconfig=str(kubeconfig))
        op = Operator(kubeconfig, tmp / "operator-2.log")
        converged = wait(lambda: server.call("converged")["done"], 900, "convergence", op, interval=1.0)
        quiet(server, 3.0, 120)
        proc = psutil.Process(op.proc.pid)
        rss = proc.memory_info().rss
        hwm = rss
        with open(f"/proc/{op.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
        before = server.writes()
        c0 = proc.cpu_times()
        t0 = time.monotonic()
        time.sleep(idle_s)
        c1 = proc.cpu_times()
        elapsed = time.monotonic() - t0
        idle_writes = diff(server.writes(), before)
        rss_after = proc.memory_info().rss
        op.check()
        op.stop()
    finally:
        server.close()
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    return {
        "nodes": nodes,
        "gpu_nodes": gpu,
        "node_bytes": setup["node_bytes"],
        "setup_s": setup["setup_s"],
        "converge_s": converged,
        "rss_mb": rss / 2**20,
        "rss_after_idle_mb": rss_after / 2**20,
        "hwm_mb": hwm / 2**20,
        "idle_s": elapsed,
        "idle_cpu_pct": 100 * cpu / elapsed,
        "idle_writes": idle_writes,
    }


def ok(good: bool) -> str:
    return "ok" if good else "MISSED"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke test)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve()
    from benchlib import load_average, machine_base

    gpu, other, new, big, idle = (300, 60, 30, 1500, 30.0) if args.quick else (1000, 200, 100, 5000, 60.0)
    try:
        with tempfile.TemporaryDirectory(prefix="gpunode-bench-operator-") as d:
            a = converge_and_restart(Path(d), gpu, other, new)
            b = size_and_idle(Path(d), big, idle)
    finally:
        for op in Operator.running:
            op.stop()
    result = {
        "machine": machine_base(load_average=load_average()),
        "quick": args.quick,
        "converge": a,
        "size": b,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    s = a["split"]
    print(f"gpunode-operator benchmark{' (--quick: targets are for the full sizes)' if args.quick else ''}")
    print(f"machine: {result['machine']['cpu']} x{result['machine']['cpus_usable']}, load {load_average()}")
    rows = [
        (f"converge: {gpu} GPU + {other} other nodes, wall (from exec)", f"{a['converge_s']:.2f} s", ""),
        ("  of which to /healthz (process start-up)", f"{a['healthz_s']:.2f} s", ""),
        ("  server setup (not counted)", f"{a['setup_s']:.2f} s", ""),
        ("  node label patches", f"{s['node_patches']}", ok(s["node_patches"] == gpu) + f" (= {gpu})"),
        ("  policy object writes (no status)", f"{s['objects']}", ok(s["objects"] <= 60) + " (<= 60)"),
        ("  policy object writes + status writes", f"{s['objects'] + s['policy_status']}", ""),
        ("  all writes", f"{s['total']}", json.dumps(a["writes"])),
        ("  operator RSS, converged", f"{a['rss_mb']:.1f} MB", ""),
        (
            "restart, nothing changed: writes",
            f"{sum(a['restart_writes'].values())}",
            ok(not a["restart_writes"])
            + " (= 0) "
            + (json.dumps(a["restart_writes"]) if a["restart_writes"] else ""),
        ),
        (f"new GPU node -> deploy labels, p50 ({new} nodes)", f"{a['new_p50_s'] * 1000:.0f} ms", ""),
        (
            "  p99",
            f"{a['new_p99_s'] * 1000:.0f} ms",
            ok(a["new_p99_s"] <= 1.0 and not a["new_missed"]) + " (<= 1 s)",
        ),
        ("  max / missed (10 s)", f"{a['new_max_s'] * 1000:.0f} ms / {a['new_missed']}", ""),
        ("  writes meanwhile", f"{sum(a['new_writes'].values())}", json.dumps(a["new_writes"])),
        (
            f"size: {b['nodes']} nodes of {b['node_bytes'] / 1024:.1f} KB, server setup (not counted)",
            f"{b['setup_s']:.2f} s",
            "",
        ),
        ("  operator converge (from exec)", f"{b['converge_s']:.2f} s", ""),
        ("  operator RSS, converged", f"{b['rss_mb']:.1f} MB", ok(b["rss_mb"] <= 120) + " (<= 120 MB)"),
        (
            "  operator RSS after idle / high-water mark",
            f"{b['rss_after_idle_mb']:.1f} / {b['hwm_mb']:.1f} MB",
            "",
        ),
        (
            f"  idle CPU over {b['idle_s']:.0f} s",
            f"{b['idle_cpu_pct']:.2f} %",
            ok(b["idle_cpu_pct"] <= 0.5) + " (<= 0.5 % of a core)",
        ),
        (
            "  writes while idle",
            f"{sum(b['idle_writes'].values())}",
            json.dumps(b["idle_writes"]) if b["idle_writes"] else "",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>16}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

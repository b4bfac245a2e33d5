"""`gpunode test-apiserver`: the test Kubernetes API server as a command, to rehearse on a laptop.

Serves nodes, pods, NodeFeatures, DaemonSets, Leases, CRDs and their resources (see
gpunode.sim.apiserver) on 127.0.0.1 until interrupted, with a kubeconfig written for the agents
(`--kubeconfig` / `KUBECONFIG`). Nothing is persisted; it is the same server the tests use.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from gpunode.sim.apiserver import FakeApiServer


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `gpunode test-apiserver`."""
    p.add_argument("--kubeconfig", required=True, type=Path, help="where to write its kubeconfig")
    p.add_argument(
        "--node", action="append", default=[], metavar="NAME", help="a node to create (repeatable)"
    )
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="a label on every node")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: any free port)")


def run(args: argparse.Namespace) -> int:
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"gpunode test-apiserver: error: --label {item!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        labels[key] = value
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with FakeApiServer(port=args.port, poll_interval=0.5) as api:
        for name in args.node or ["node-1"]:
            api.add_node(name, labels=dict(labels))
        api.write_kubeconfig(args.kubeconfig)
        print(
            f"serving {api.url} (nodes: {', '.join(args.node or ['node-1'])}); kubeconfig: {args.kubeconfig}"
        )
        print("Ctrl-C to stop", flush=True)
        stop.wait()
    return 0

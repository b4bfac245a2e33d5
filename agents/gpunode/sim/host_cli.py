"""`gpunode fake-host DIR`: a fake host tree with fake kmod and NVIDIA tools, to rehearse the driver
loader on a machine without NVIDIA GPUs (the tree the tests use)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from gpunode.sim.host import FakeHost


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `gpunode fake-host`."""
    p.add_argument("dir", type=Path, help="where to build it (created; must be empty or absent)")
    p.add_argument("--gpus", type=int, default=2, help="number of GPUs (default 2)")
    p.add_argument("--precompiled", action="store_true", help="ship precompiled modules for its kernel")
    p.add_argument("--headers", action="store_true", help="install kernel headers (modules get built)")
    p.add_argument("--nouveau", action="store_true", help="load nouveau first")


def run(args: argparse.Namespace) -> int:
    if args.dir.exists() and any(args.dir.iterdir()):
        print(f"gpunode fake-host: error: {args.dir} is not empty")
        return 2
    host = FakeHost(args.dir, gpus=args.gpus)
    if args.precompiled:
        host.add_precompiled()
    if args.headers:
        host.add_headers()
    if args.nouveau:
        host.load_nouveau()
    init = " ".join(shlex.quote(a) for a in host.cli_args(nodes=False))
    root = shlex.quote(str(host.root))
    print(f"fake host at {host.root} (kernel {host.kernel}, {args.gpus} GPUs); tools in {host.bin}")
    print(f"  gpunode-driver-loader init --oneshot {init}")
    print(f"  gpunode-driver-loader status --host-root {root}")
    print(f"  gpunode-driver-loader unload --host-root {root} --bin-dir {shlex.quote(str(host.bin))}")
    print(f"(device nodes are only reported; the tools log their calls to {host.state}/calls.log)")
    return 0

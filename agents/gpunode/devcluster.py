"""`gpunode dev cluster --nodes N`: rehearse gpunode-operator on a simulated cluster.

Starts the test API server with N fake GPU nodes that carry only NFD's labels and `--other-nodes` nodes
without a GPU, creates the ClusterPolicy CRD and the policy (`--policy`, `--values`, or every component
on), runs `gpunode-operator` against it as a process of its own, and prints the policy's state as it
changes, the node labels the operator set and the DaemonSets scheduled per node. Then it serves until
Ctrl-C, or with `--oneshot` exits 0 once the policy is ready (1 if not within `--timeout`).

The simulated side (nodes, reporting) is `gpunode.sim.cluster_cli`; this module joins it with the policy
loading and the operator, which the simulation layer may not import.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gpunode.api.clusterpolicy import ClusterPolicy, LoadedPolicy, load_policy, parse_policy_text
from gpunode.api.clusterpolicy_crd import crd
from gpunode.common.errors import ConfigError
from gpunode.deploy.operator_install import clusterpolicy_object
from gpunode.deploy.render import render
from gpunode.sim import cluster_cli
from gpunode.sim.apiserver import FakeApiServer

__all__ = ["main"]

PROG = "gpunode dev cluster"
NAMESPACE = "gpunode"
MANAGER = "gpunode-dev-cluster"
# containers/policies/default.yaml: every agent, gpunode's driver loader, MIG strategy single.
DEFAULT_POLICY = """\
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata:
  name: cluster-policy
spec:
  operator:
    defaultRuntime: containerd
  daemonsets:
    priorityClassName: system-node-critical
    tolerations:
    - key: nvidia.com/gpu
      operator: Exists
      effect: NoSchedule
  driver:
    enabled: true
  toolkit:
    enabled: true
  devicePlugin:
    enabled: true
  dcgmExporter:
    enabled: true
  gfd:
    enabled: true
  migManager:
    enabled: true
  mig:
    strategy: single
  nfd:
    enabled: true
"""
OPERATOR = "import sys; from gpunode.deploy.operator_cli import main; sys.exit(main())"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    cluster_cli.add_arguments(p)
    return p


def _load(args: argparse.Namespace) -> ClusterPolicy:
    """The policy to create; warnings on stderr; ConfigError for a bad file."""
    if args.values is not None:
        from gpunode.api.helm_values import load_values

        values = load_values(args.values)
        warnings, source = values.warnings, args.values
        policy = values.policy
    else:
        loaded: LoadedPolicy = (
            load_policy(args.policy)
            if args.policy is not None
            else parse_policy_text(DEFAULT_POLICY, "default")
        )
        warnings, source, policy = loaded.warnings, args.policy or "default", loaded.policy
    for warning in warnings:
        print(f"{PROG}: warning: {source}: {warning}", file=sys.stderr)
    return policy


def _operator_failed(proc: subprocess.Popen[bytes], log: Path) -> str | None:
    code = proc.poll()
    if code is None:
        return None
    tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
    return f"exit status {code}; its log ({log}) ends:\n{tail}"


def run(args: argparse.Namespace, workdir: Path) -> int:
    """The rehearsal; `workdir` holds the operator's log (and the kubeconfig without `--kubeconfig`)."""
    try:
        policy = _load(args)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    kubeconfig: Path = args.kubeconfig or workdir / "kubeconfig"
    log = workdir / "operator.log"
    with FakeApiServer(poll_interval=0.1) as api:
        gpu, other = cluster_cli.add_nodes(api, args.nodes, args.other_nodes)
        api.write_kubeconfig(kubeconfig)
        print(
            f"test API server {api.url}: {len(gpu)} GPU nodes, {len(other)} others; kubeconfig {kubeconfig}"
        )
        api.apply("CustomResourceDefinition", crd(), manager=MANAGER)
        if any(o.get("kind") == "ServiceMonitor" for o in render(policy, namespace=NAMESPACE)):
            for monitoring_crd in cluster_cli.MONITORING_CRDS:
                api.apply("CustomResourceDefinition", monitoring_crd, manager=MANAGER)
            print("the policy asks for a ServiceMonitor: created stand-ins of the Prometheus operator's CRDs")
        obj = clusterpolicy_object(policy)
        name = str(obj["metadata"]["name"])
        api.apply("ClusterPolicy", obj, manager=MANAGER)
        print(f"created clusterpolicy/{name}; starting gpunode-operator (log: {log})", flush=True)
        progress = cluster_cli.Progress(name)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    OPERATOR,
                    "--kubeconfig",
                    str(kubeconfig),
                    "--namespace",
                    NAMESPACE,
                    "--http-port",
                    "-1",
                    "--log-format",
                    "json",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            return cluster_cli.watch(
                api,
                progress,
                namespace=NAMESPACE,
                gpu=gpu,
                other=other,
                oneshot=args.oneshot,
                timeout=args.timeout,
                failed=lambda: _operator_failed(proc, log),
            )
        except KeyboardInterrupt:
            print("stopping", flush=True)
            return 0
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    # Ctrl-C or SIGTERM: stop the operator and the server (even where SIGINT was inherited ignored).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    with tempfile.TemporaryDirectory(prefix="gpunode-dev-cluster-") as workdir:
        return run(args, Path(workdir))

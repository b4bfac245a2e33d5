"""`gpunode dev cluster --nodes N`: rehearse gpunode-operator on a simulated cluster.

Starts the test API server with N fake GPU nodes that carry only NFD's labels and `--other-nodes` nodes
without a GPU, creates the ClusterPolicy CRD and applies the policy (`--policy`, `--values`, or every
component on) as the install carries it, in the ConfigMap `gpunode-operator-clusterpolicy`; runs
`gpunode-operator` against it as a process of its own (it creates the policy from that), and prints the
policy's state as it changes, the node labels the operator set and the DaemonSets scheduled per node.
Then it serves until Ctrl-C, or with `--oneshot` exits 0 once the policy is ready (1 if not within
`--timeout`).

With `--upgrade` it then rehearses a rolling driver upgrade (docs/upgrades.md): the policy's
`driver.upgradePolicy` gets `autoUpgrade: true` (its limits as given), a validator DaemonSet runs beside
the driver (its pods, like every daemon pod here, become Ready at once), and once the policy is ready the
driver version changes (`--upgrade-to`); the operator's upgrade controller walks every GPU node through
`nvidia.com/gpu-driver-upgrade-state` while the test API server replaces the driver pods, and each
node's state is printed as it moves. With `--oneshot` it exits 0 once every GPU node is `upgrade-done`
(1 if one failed or the time ran out).

The simulated side (nodes, reporting) is `gpunode.sim.cluster_cli`; this module joins it with the policy
loading and the operator, which the simulation layer may not import.
"""

from __future__ import annotations

import argparse
import queue
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gpunode.api.clusterpolicy import ClusterPolicy, LoadedPolicy, load_policy, parse_policy_text
from gpunode.api.clusterpolicy_crd import crd
from gpunode.common.errors import ConfigError
from gpunode.deploy.operator_install import clusterpolicy_object, render_operator_by_part
from gpunode.deploy.render import render
from gpunode.operator.seed import SEED_NAME
from gpunode.sim import cluster_cli
from gpunode.sim.apiserver import FakeApiServer, WatchEvent

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
    p.add_argument(
        "--upgrade",
        action="store_true",
        help="then rehearse a rolling driver upgrade of the GPU nodes, printing each node's state",
    )
    p.add_argument(
        "--upgrade-to",
        default="580.95.05",
        metavar="VERSION",
        help="with --upgrade: the driver version rolled out (default: %(default)s)",
    )
    return p


STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
REASON_ANNOTATION = "gpunode.io/driver-upgrade-reason"
VALIDATOR = {"app.kubernetes.io/name": "gpunode-validator"}


def _with_auto_upgrade(policy: ClusterPolicy) -> ClusterPolicy:
    driver = policy.spec.driver
    up = driver.upgrade_policy.model_copy(update={"auto_upgrade": True})
    spec = policy.spec.model_copy(update={"driver": driver.model_copy(update={"upgrade_policy": up})})
    return policy.model_copy(update={"spec": spec})


def _validator_daemonset() -> dict[str, object]:
    """A validator on every node the driver runs on (the upgrade waits for it to be Ready again)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "gpunode-validator", "namespace": NAMESPACE, "labels": dict(VALIDATOR)},
        "spec": {
            "selector": {"matchLabels": dict(VALIDATOR)},
            "template": {
                "metadata": {"labels": dict(VALIDATOR)},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
                    "containers": [{"name": "validator", "image": "gpunode:dev"}],
                },
            },
        },
    }


def _ready(pod: dict[str, object]) -> dict[str, object]:
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def _driver_nodes(api: FakeApiServer) -> set[str]:
    """The nodes with a pod of the driver DaemonSet."""
    return {
        str(p["spec"].get("nodeName"))
        for p in api.objects("Pod", NAMESPACE)
        if str(p["metadata"].get("name", "")).startswith("gpunode-driver-loader-")
    }


def rehearse_upgrade(
    api: FakeApiServer, name: str, gpu: Sequence[str], version: str, *, timeout: float
) -> int:
    """Roll the driver to ``version`` and print each GPU node's state as it moves; 0 when every node
    is ``upgrade-done``, 1 when one failed or ``timeout`` seconds passed."""
    moves: queue.SimpleQueue[tuple[str, str, str]] = queue.SimpleQueue()
    last: dict[str, str] = {}

    def observe(event: WatchEvent) -> None:  # under the server's lock: only note it
        if event.resource != "nodes" or event.type == "DELETED":
            return
        meta = event.obj.get("metadata") or {}
        state = str((meta.get("labels") or {}).get(STATE_LABEL, ""))
        node = str(meta.get("name"))
        if last.get(node, "") != state:
            last[node] = state
            moves.put((node, state, str((meta.get("annotations") or {}).get(REASON_ANNOTATION, ""))))

    deadline = time.monotonic() + timeout
    # every GPU node runs the driver first: a node labelled after the policy went ready would otherwise
    # get the new driver straight away, never pass through the states, and be waited for in vain
    while not set(gpu) <= _driver_nodes(api):
        if time.monotonic() > deadline:
            print(f"{PROG}: error: no driver on every GPU node within {timeout:g} s", file=sys.stderr)
            return 1
        time.sleep(0.05)
    api.observers.append(observe)
    print(f"rolling the driver to {version} (spec.driver.version); upgrade states as they move:", flush=True)
    api.patch("ClusterPolicy", name, {"spec": {"driver": {"version": version}}})
    states: dict[str, str] = {}
    started = time.monotonic()
    while time.monotonic() < deadline:
        try:
            node, state, reason = moves.get(timeout=0.2)
        except queue.Empty:
            continue
        if node not in gpu:
            continue
        states[node] = state
        print(
            f"  {time.monotonic() - started:6.1f} s  {node:<12} {state or '(none)':<24} {reason}", flush=True
        )
        if len(states) == len(gpu) and all(s in ("upgrade-done", "upgrade-failed") for s in states.values()):
            failed = sorted(n for n, s in states.items() if s == "upgrade-failed")
            if failed:
                print(f"upgrade finished with failed nodes: {', '.join(failed)}", flush=True)
                return 1
            print(f"every GPU node upgraded to {version} in {time.monotonic() - started:.1f} s", flush=True)
            return 0
    print(f"{PROG}: error: the upgrade did not finish within {timeout:g} s: {states}", file=sys.stderr)
    return 1


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
    if args.upgrade:
        policy = _with_auto_upgrade(policy)
    kubeconfig: Path = args.kubeconfig or workdir / "kubeconfig"
    log = workdir / "operator.log"
    with FakeApiServer(poll_interval=0.1) as api:
        gpu, other = cluster_cli.add_nodes(api, args.nodes, args.other_nodes)
        api.write_kubeconfig(kubeconfig)
        if args.upgrade:
            api.daemon_pod_status = _ready
            api.create(
                "Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            )
            api.create("DaemonSet", _validator_daemonset())
        print(
            f"test API server {api.url}: {len(gpu)} GPU nodes, {len(other)} others; kubeconfig {kubeconfig}"
        )
        api.apply("CustomResourceDefinition", crd(), manager=MANAGER)
        if any(o.get("kind") == "ServiceMonitor" for o in render(policy, namespace=NAMESPACE)):
            for monitoring_crd in cluster_cli.MONITORING_CRDS:
                api.apply("CustomResourceDefinition", monitoring_crd, manager=MANAGER)
            print("the policy asks for a ServiceMonitor: created stand-ins of the Prometheus operator's CRDs")
        name = str(clusterpolicy_object(policy)["metadata"]["name"])
        # the policy as `gpunode render --operator | kubectl apply -f -` carries it: in its ConfigMap, from
        # which the operator creates it (kubectl cannot, in the apply that creates the CRD)
        for carrier in render_operator_by_part(policy, namespace=NAMESPACE)["clusterpolicy"]:
            api.apply(carrier["kind"], carrier, manager=MANAGER)
        print(
            f"applied the install's ConfigMap {SEED_NAME} (clusterpolicy/{name} inside); starting "
            f"gpunode-operator, which creates the policy from it (log: {log})",
            flush=True,
        )
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
            if args.upgrade:
                code = cluster_cli.watch(
                    api,
                    progress,
                    namespace=NAMESPACE,
                    gpu=gpu,
                    other=other,
                    oneshot=True,
                    timeout=args.timeout,
                    failed=lambda: _operator_failed(proc, log),
                )
                if code != 0:
                    return code
                code = rehearse_upgrade(api, name, gpu, args.upgrade_to, timeout=args.timeout)
                if args.oneshot or code != 0:
                    return code
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

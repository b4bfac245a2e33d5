"""`gpunode dev cluster`: a rehearsal of gpunode-operator without a cluster (the simulated side).

The test API server with N fake GPU nodes that carry only Node Feature Discovery's labels (as NFD labels a
node with an NVIDIA PCI device) and M nodes without a GPU; then, while the operator works, the ClusterPolicy's
state as it changes, the node labels the operator set and the DaemonSets scheduled per node.

This module knows nothing of the operator or of rendering (the simulation layer sits below both): the
command that starts the operator and creates the ClusterPolicy is `gpunode.devcluster`, which uses the
flags, the nodes and the reporting defined here.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.sim.apiserver import FakeApiServer

__all__ = [
    "GPU_NODE_LABELS",
    "MONITORING_CRDS",
    "OTHER_NODE_LABELS",
    "SERVICE_MONITOR_CRD",
    "Progress",
    "add_arguments",
    "add_nodes",
    "daemonset_table",
    "node_labels_text",
    "watch",
]

NFD = "feature.node.kubernetes.io/"
# What NFD (with NVIDIA's worker settings) puts on every node, and on a node with an NVIDIA 3D controller.
OTHER_NODE_LABELS = {
    NFD + "cpu-model.vendor_id": "Intel",
    NFD + "kernel-version.major": "6",
    NFD + "system-os_release.ID": "ubuntu",
    NFD + "system-os_release.VERSION_ID": "24.04",
}
GPU_NODE_LABELS = {
    **OTHER_NODE_LABELS,
    NFD + "pci-10de.present": "true",
    NFD + "pci-0302_10de.present": "true",
}
OPERATOR_LABEL_PREFIX = "nvidia.com/"


# Stand-ins for the Prometheus operator's CRDs, for a policy that asks for the exporter's ServiceMonitor
# (and with it the PodMonitor and the PrometheusRule); a real cluster needs the Prometheus operator.
def _monitoring_crd(kind: str) -> dict[str, Any]:
    plural = kind.lower() + "s"
    open_spec = {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": open_spec}},
                }
            ],
        },
    }


SERVICE_MONITOR_CRD: dict[str, Any] = _monitoring_crd("ServiceMonitor")
MONITORING_CRDS: tuple[dict[str, Any], ...] = tuple(
    _monitoring_crd(kind) for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
)


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: not a count (0 or more)")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be positive")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `gpunode dev cluster`."""
    p.add_argument(
        "--nodes", type=_positive, required=True, metavar="N", help="fake GPU nodes (NFD labels only)"
    )
    p.add_argument(
        "--other-nodes", type=_count, default=2, metavar="M", help="fake nodes without a GPU (default: 2)"
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--policy",
        metavar="FILE",
        help="the ClusterPolicy to create (default: every component on, as containers/policies/default.yaml)",
    )
    source.add_argument(
        "--values", metavar="FILE", help="the GPU Operator Helm chart's values, mapped to a ClusterPolicy"
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="where to write the test API server's kubeconfig (default: a temporary directory)",
    )
    p.add_argument(
        "--oneshot",
        action="store_true",
        help="exit 0 once the ClusterPolicy is ready (1 if it is not within --timeout) instead of serving",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="with --oneshot: how long to wait for ready (default: 60)",
    )


def add_nodes(api: FakeApiServer, gpu: int, other: int) -> tuple[list[str], list[str]]:
    """Create `gpu` GPU nodes (gpu-0...) and `other` nodes without one (cpu-0...): NFD's labels and the
    kubelet's own, nothing of NVIDIA's."""
    made: tuple[list[str], list[str]] = ([], [])
    for names, count, prefix, labels in (
        (made[0], gpu, "gpu", GPU_NODE_LABELS),
        (made[1], other, "cpu", OTHER_NODE_LABELS),
    ):
        for i in range(count):
            name = f"{prefix}-{i}"
            api.add_node(
                name,
                labels={
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **labels,
                },
            )
            names.append(name)
    return made


def _ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond
    return {}


@dataclass
class Progress:
    """The ClusterPolicy's state as last printed (a line whenever the state or the Ready reason changes)."""

    name: str
    started: float = field(default_factory=time.monotonic)
    last: tuple[str, str, str] | None = None

    def poll(self, api: FakeApiServer) -> str | None:
        """The policy's state now, or None if it has none yet; prints a line when it changed."""
        obj = api.get("ClusterPolicy", self.name) if _has_crd(api) else None
        status = (obj or {}).get("status") or {}
        state = str(status.get("state") or "")
        if not state:
            return None
        cond = _ready_condition(status)
        now = (state, str(cond.get("reason") or ""), str(cond.get("message") or ""))
        if now != self.last:
            self.last = now
            detail = f" ({now[1]}: {now[2]})" if now[1] and now[2] else (f" ({now[1]})" if now[1] else "")
            _say(f"[{time.monotonic() - self.started:6.1f}s] clusterpolicy/{self.name}: {state}{detail}")
        return state


def _has_crd(api: FakeApiServer) -> bool:
    return api.get("CustomResourceDefinition", "clusterpolicies.nvidia.com") is not None


def _say(text: str) -> None:
    print(text, flush=True)


def node_labels_text(api: FakeApiServer, nodes: Sequence[str]) -> str:
    """The nvidia.com/ labels of each node, nodes with the same labels together."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in nodes:
        labels = (api.get("Node", name) or {}).get("metadata", {}).get("labels") or {}
        ours = tuple(sorted((k, str(v)) for k, v in labels.items() if k.startswith(OPERATOR_LABEL_PREFIX)))
        groups.setdefault(ours, []).append(name)
    lines = ["node labels (nvidia.com/):"]
    for labels, names in groups.items():
        lines.append(f"  {', '.join(names)}:")
        lines.extend(f"    {k}={v}" for k, v in labels) if labels else lines.append("    (none)")
    return "\n".join(lines)


def _owner(pod: dict[str, Any]) -> str | None:
    for ref in pod.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == "DaemonSet":
            return str(ref.get("name"))
    return None


def daemonset_table(api: FakeApiServer, namespace: str, gpu: Iterable[str], other: Iterable[str]) -> str:
    """A table: per node, whether it has a GPU and the DaemonSets with a pod on it."""
    per_node: dict[str, set[str]] = {}
    for pod in api.objects("Pod", namespace):
        owner, node = _owner(pod), pod.get("spec", {}).get("nodeName")
        if owner and node:
            per_node.setdefault(str(node), set()).add(owner)
    rows = [("NODE", "GPU", "PODS", "DAEMONSETS")]
    for names, has_gpu in ((gpu, "yes"), (other, "no")):
        for name in names:
            owners = sorted(per_node.get(name, set()))
            rows.append((name, has_gpu, str(len(owners)), ", ".join(owners) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"DaemonSets scheduled per node (namespace {namespace}):"]
    lines.extend(
        "  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3] for r in rows
    )
    return "\n".join(lines)


def watch(
    api: FakeApiServer,
    progress: Progress,
    *,
    namespace: str,
    gpu: Sequence[str],
    other: Sequence[str],
    oneshot: bool,
    timeout: float,
    failed: Callable[[], str | None],
    interval: float = 0.2,
) -> int:
    """Print the policy's state changes; once ready, the node labels and the DaemonSet table. With
    `oneshot` return 0 then (1 after `timeout` seconds without ready); otherwise keep printing state changes
    until interrupted (KeyboardInterrupt propagates). `failed()` says why the operator stopped, if it did:
    then return 1."""
    deadline = time.monotonic() + timeout
    shown = False
    while True:
        why = failed()
        if why is not None:
            _say(f"the operator stopped: {why}")
            return 1
        state = progress.poll(api)
        if state == "ready" and not shown:
            shown = True
            _say(node_labels_text(api, [*gpu, *other]))
            _say(daemonset_table(api, namespace, gpu, other))
            if oneshot:
                return 0
            _say("serving until Ctrl-C")
        if oneshot and time.monotonic() > deadline:
            _say(f"not ready after {timeout:g} s")
            return 1
        time.sleep(interval)

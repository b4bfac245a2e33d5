"""gpunode-operator, as a process, converging a clean cluster: every operand scheduled on every GPU node
(the MIG manager on the MIG-capable ones) and on no other node, the ClusterPolicy ``ready``.

Runs against the test API server (GPU nodes carrying only NFD's labels, one of them an A100, and nodes
without a GPU) and, marked ``cluster``, against a real cluster when ``GPUNODE_TEST_KUBECONFIG`` is set
and ``GPUNODE_TEST_OPERATOR=1`` says the operator may be installed there: it applies the ClusterPolicy
CRD, a ClusterPolicy ``gpunode-test-policy`` with the operator's objects in the namespace
``GPUNODE_TEST_OPERATOR_NAMESPACE`` (default ``gpunode-test-operator``), labels the GPU nodes as the
operator does, and deletes the policy (its objects go with it) and the namespace afterwards. It is
skipped where another ClusterPolicy exists (that one would be honoured, not ours). The other tests here
inject faults and labels, so they use the test API server only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpunode.api.clusterpolicy_crd import crd
from gpunode.kube.api import KubeError, KubeNotFound
from gpunode.kube.client import Kube
from gpunode.kube.cluster import CLUSTER_POLICY, DAEMON_SET, POD, resource_kind
from gpunode.operator.labels import is_gpu_node, mig_capable
from gpunode.sim.apiserver import FakeApiServer
from helpers.waiting import wait_until

OPERATOR = [
    sys.executable,
    "-c",
    "import sys; from gpunode.deploy.operator_cli import main; sys.exit(main())",
]
NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
CPU_NFD = {"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"}
A100 = {**NFD, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
D = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-mig-change"
# DaemonSet -> the deploy label that places it (NFD's worker runs on every node: not one of ours)
OPERANDS = {
    "gpunode-driver-loader": "driver",
    "gpunode-toolkit": "container-toolkit",
    "gpunode-device-plugin": "device-plugin",
    "gpunode-feature-discovery": "gpu-feature-discovery",
    "gpunode-exporter": "dcgm-exporter",
    "gpunode-mig-manager": "mig-manager",
}


@dataclass
class Target:
    kubeconfig: Path
    namespace: str
    policy: str
    api: FakeApiServer | None  # None on a real cluster
    timeout: float


def _sim_nodes(api: FakeApiServer) -> None:
    for name, labels in (
        ("gpu-0", NFD),
        ("gpu-1", NFD),
        ("gpu-a100", A100),
        ("cpu-0", CPU_NFD),
        ("cpu-1", {}),
    ):
        api.add_node(name, labels={"kubernetes.io/hostname": name, **labels})


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Target]:
    with FakeApiServer() as api:
        _sim_nodes(api)
        api.write_kubeconfig(tmp_path / "kubeconfig")
        yield Target(tmp_path / "kubeconfig", "gpunode", "cluster-policy", api, 60.0)


@pytest.fixture(params=["test-api-server", "cluster"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "cluster":
        kubeconfig = os.environ.get("GPUNODE_TEST_KUBECONFIG")
        if not kubeconfig or os.environ.get("GPUNODE_TEST_OPERATOR") != "1":
            pytest.skip("no cluster for the operator (GPUNODE_TEST_KUBECONFIG, GPUNODE_TEST_OPERATOR=1)")
        namespace = os.environ.get("GPUNODE_TEST_OPERATOR_NAMESPACE", "gpunode-test-operator")
        timeout = float(os.environ.get("GPUNODE_TEST_OPERATOR_TIMEOUT", "600"))
        yield Target(Path(kubeconfig), namespace, "gpunode-test-policy", None, timeout)
        return
    yield request.getfixturevalue("sim")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _kube(t: Target) -> Kube:
    return Kube.connect_cluster(str(t.kubeconfig), namespace=t.namespace)


async def _install(t: Target, spec: dict[str, Any] | None = None) -> None:
    kube = await _kube(t)
    try:
        policies: list[dict[str, Any]] = []
        if t.api is None:
            with contextlib.suppress(KubeNotFound):  # no ClusterPolicy CRD yet: no policy either
                policies, _ = await kube.list_objects(CLUSTER_POLICY)
        others = [p["metadata"]["name"] for p in policies if p["metadata"]["name"] != t.policy]
        if others:
            pytest.skip(f"the cluster has another ClusterPolicy ({', '.join(others)}): it would be honoured")
        await kube.apply(crd(), field_manager="gpunode-test")
        body = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": t.policy}}
        for _ in range(50):  # a real API server serves the kind once the CRD is established
            try:
                await kube.apply({**body, "spec": spec or {}}, field_manager="gpunode-test")
                return
            except KubeError as exc:
                if exc.status != 404:
                    raise
                await asyncio.sleep(0.2)
        raise AssertionError("the ClusterPolicy kind was never served")
    finally:
        await kube.aclose()


async def _uninstall(t: Target) -> None:
    kube = await _kube(t)
    try:
        await kube.delete_object(CLUSTER_POLICY, t.policy)
        await kube.delete_object(resource_kind("v1", "Namespace"), t.namespace)
    finally:
        await kube.aclose()


def _start(t: Target, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                *OPERATOR,
                "--kubeconfig",
                str(t.kubeconfig),
                "--namespace",
                t.namespace,
                "--http-port",
                "-1",
                "--log-format",
                "json",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return int(proc.returncode)


def _state(t: Target) -> str:
    async def get() -> str:
        kube = await _kube(t)
        try:
            obj = await kube.get_object(CLUSTER_POLICY, t.policy)
        finally:
            await kube.aclose()
        return str(((obj or {}).get("status") or {}).get("state") or "")

    return str(run(get()))


def _placement(t: Target) -> tuple[dict[str, dict[str, str]], dict[str, set[str]]]:
    """(node -> labels, our DaemonSet -> the nodes holding its pods), read from the API."""

    async def read() -> tuple[dict[str, dict[str, str]], dict[str, set[str]]]:
        kube = await _kube(t)
        try:
            nodes, _ = await kube.list_nodes()
            daemonsets, _ = await kube.list_objects(DAEMON_SET, namespace=t.namespace)
            pods, _ = await kube.list_objects(POD, namespace=t.namespace)
        finally:
            await kube.aclose()
        uids = {d["metadata"]["uid"]: d["metadata"]["name"] for d in daemonsets}
        placed: dict[str, set[str]] = {d["metadata"]["name"]: set() for d in daemonsets}
        for p in pods:
            for ref in p["metadata"].get("ownerReferences") or []:
                if ref.get("uid") in uids and p["spec"].get("nodeName"):
                    placed[uids[ref["uid"]]].add(p["spec"]["nodeName"])
        return {n.name: dict(n.labels) for n in nodes}, placed

    result: tuple[dict[str, dict[str, str]], dict[str, set[str]]] = run(read())
    return result


@pytest.mark.cluster
def test_a_clean_cluster_converges_every_operand_on_every_gpu_node_and_none_elsewhere(
    target: Target, tmp_path: Path
) -> None:
    t = target
    run(_install(t))
    proc = _start(t, tmp_path / "operator.log")
    try:
        wait_until(lambda: _state(t) == "ready" or proc.poll() is not None, t.timeout, interval=0.2)
        assert proc.poll() is None, (tmp_path / "operator.log").read_text()[-3000:]
        labels, placed = _placement(t)
        gpu = {n for n, ls in labels.items() if is_gpu_node(ls)}
        if t.api is not None:
            assert gpu == {"gpu-0", "gpu-1", "gpu-a100"}
        for ds, operand in OPERANDS.items():
            assert ds in placed, f"DaemonSet {ds} missing"
            expected = {n for n in gpu if operand != "mig-manager" or mig_capable(labels[n])}
            assert placed[ds] == expected, ds
            for n in expected:
                assert labels[n][D + operand] == "true", (n, operand)
        for n in set(labels) - gpu:
            assert not [k for k in labels[n] if k.startswith(D)], n
            assert labels[n].get("nvidia.com/gpu.present") != "true", n
        if t.api is not None:
            assert placed["gpunode-mig-manager"] == {"gpu-a100"}
            assert labels["gpu-a100"]["nvidia.com/mig.config"] == "all-disabled"
    finally:
        code = _stop(proc)
        if t.api is None:
            run(_uninstall(t))
    assert code == 0, (tmp_path / "operator.log").read_text()[-3000:]


def _passes(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if '"event": "reconciled"' in line)


def test_a_users_false_and_a_mig_pause_survive_every_reconcile_a_gpu_lost_and_hand_edits(
    sim: Target, tmp_path: Path
) -> None:
    t = sim
    api = t.api
    assert api is not None
    log = tmp_path / "operator.log"
    api.patch_node("gpu-0", {"metadata": {"labels": {D + "device-plugin": "false"}}})  # the user's choice
    run(_install(t))
    proc = _start(t, log)
    try:
        wait_until(lambda: _state(t) == "ready" or proc.poll() is not None, t.timeout, interval=0.1)
        assert proc.poll() is None, log.read_text()[-3000:]
        # the MIG manager pauses the device plugin on its node while it changes the layout
        api.patch_node("gpu-a100", {"metadata": {"labels": {D + "device-plugin": PAUSED}}})
        for i in range(3):  # three more full passes (each ClusterPolicy event brings one)
            before = _passes(log)
            api.patch("ClusterPolicy", t.policy, {"metadata": {"annotations": {"test/touch": str(i)}}})
            wait_until(lambda: _passes(log) > before, 20, interval=0.05)  # noqa: B023
        wait_until(lambda: _state(t) == "ready", 20, interval=0.1)
        labels, placed = _placement(t)
        assert labels["gpu-0"][D + "device-plugin"] == "false"
        assert labels["gpu-a100"][D + "device-plugin"] == PAUSED
        assert placed["gpunode-device-plugin"] == {"gpu-1"}
        assert placed["gpunode-toolkit"] == {"gpu-0", "gpu-1", "gpu-a100"}

        # gpu-1 loses its GPU (NFD's label goes): gpu.present=false, the operator's labels and the
        # agents go, the policy stays ready (no operand wants the node any more)
        api.patch_node(
            "gpu-1", {"metadata": {"labels": {"feature.node.kubernetes.io/pci-10de.present": None}}}
        )

        def gone() -> bool:
            labels, placed = _placement(t)
            return labels["gpu-1"].get("nvidia.com/gpu.present") == "false" and not any(
                "gpu-1" in nodes for ds, nodes in placed.items() if ds in OPERANDS
            )

        wait_until(gone, 20, interval=0.1)
        wait_until(lambda: _state(t) == "ready", 20, interval=0.1)
        labels, _ = _placement(t)
        assert not [k for k in labels["gpu-1"] if k.startswith(D)]
        assert labels["gpu-0"][D + "device-plugin"] == "false"  # still, after every pass since
        assert labels["gpu-a100"][D + "device-plugin"] == PAUSED

        # hand edits of what the operator owns are put right by the running operator, on the watch event
        ds = api.get("DaemonSet", "gpunode-device-plugin", t.namespace)
        assert ds is not None
        image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        containers = [{**ds["spec"]["template"]["spec"]["containers"][0], "image": "example.com/other:1"}]
        api.patch(
            "DaemonSet",
            "gpunode-device-plugin",
            {"spec": {"template": {"spec": {"containers": containers}}}},
            t.namespace,
            manager="kubectl-edit",
        )
        api.delete("ConfigMap", "gpunode-nfd-worker-conf", t.namespace)

        def put_right() -> bool:
            now = api.get("DaemonSet", "gpunode-device-plugin", t.namespace) or {}
            spec = now.get("spec", {}).get("template", {}).get("spec", {})
            return (
                spec.get("containers", [{}])[0].get("image") == image
                and api.get("ConfigMap", "gpunode-nfd-worker-conf", t.namespace) is not None
            )

        wait_until(put_right, 20, interval=0.1)
        assert '"event": "drift_corrected"' in log.read_text()
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text()[-3000:]


def test_an_operator_killed_mid_reconcile_converges_on_restart(sim: Target, tmp_path: Path) -> None:
    t = sim
    api = t.api
    assert api is not None
    run(_install(t))
    api.stall(3.0, path_contains="daemonsets", count=1)  # the first DaemonSet call hangs: mid-pass
    proc = _start(t, tmp_path / "first.log")
    try:

        def stuck() -> bool:  # the pre-requisites' Deployments are written, no DaemonSet yet
            return (
                any(r.method == "PATCH" and "/deployments/" in r.path for r in api.requests)
                or proc.poll() is not None
            )

        wait_until(stuck, 30, interval=0.02)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)  # no clean-up of any kind
        proc.wait(10)
        assert not [d for d in api.objects("DaemonSet", t.namespace) if d["metadata"]["name"] in OPERANDS]
        assert _state(t) == ""  # no status written yet
        proc = _start(t, tmp_path / "second.log")
        wait_until(lambda: _state(t) == "ready" or proc.poll() is not None, t.timeout, interval=0.1)
        assert proc.poll() is None, (tmp_path / "second.log").read_text()[-3000:]
        _, placed = _placement(t)
        for ds in OPERANDS:
            assert ds in placed, ds
        assert placed["gpunode-device-plugin"] == {"gpu-0", "gpu-1", "gpu-a100"}
    finally:
        code = _stop(proc)
    assert code == 0, (tmp_path / "second.log").read_text()[-3000:]

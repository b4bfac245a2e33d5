"""Operand pausing against the test API server, whose DaemonSet controller really removes and recreates
operand pods as their deploy labels change: pause, wait, restore, after success, failure, timeout,
cancellation and a killed process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpunode.kube.client import Kube, load_kubeconfig
from gpunode.kube.operands import RECORD_ANNOTATION, OperandPauser, OperandsBusy, OperandsNotStopped
from gpunode.sim.apiserver import FakeApiServer

NODE = "node-1"
NS = "gpu-operator"
DP = "nvidia.com/gpu.deploy.device-plugin"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
EXP = "nvidia.com/gpu.deploy.dcgm-exporter"
DCGM = "nvidia.com/gpu.deploy.dcgm"


@pytest.fixture
def cluster(api: FakeApiServer) -> FakeApiServer:
    """The operator's operands as DaemonSets on node-1; dcgm is disabled (false), nvsm is not deployed."""
    api.patch_node(NODE, {"metadata": {"labels": {DP: "true", GFD: "true", EXP: "true", DCGM: "false"}}})
    api.add_daemonset(
        NS, "nvidia-device-plugin-daemonset", {DP: "true"}, {"app": "nvidia-device-plugin-daemonset"}
    )
    api.add_daemonset(NS, "gpu-feature-discovery", {GFD: "true"}, {"app": "gpu-feature-discovery"})
    api.add_daemonset(NS, "nvidia-dcgm-exporter", {EXP: "true"}, {"app": "nvidia-dcgm-exporter"})
    assert api.wait_for(lambda: len(api.pods(NODE)) == 3)
    return api


def kube(tmp_path: Path) -> Kube:
    return Kube(NODE, load_kubeconfig(str(tmp_path / "kubeconfig")), backoff=(0.01, 0.05))


def labels(api: FakeApiServer) -> dict[str, str]:
    return dict(api.node(NODE)["metadata"].get("labels", {}))


def annotations(api: FakeApiServer) -> dict[str, str]:
    return dict(api.node(NODE)["metadata"].get("annotations", {}))


async def test_pause_waits_for_the_pods_then_restores_exactly(cluster: FakeApiServer, tmp_path: Path) -> None:
    cluster.pod_deletion_delay = 0.3  # pods take a moment to terminate, as real ones do
    before = labels(cluster)
    k = kube(tmp_path)
    pauser = OperandPauser(k, "mig-manager", poll=0.05)
    try:
        async with pauser.paused("mig-change", timeout=10) as state:
            now = labels(cluster)
            assert now[DP] == now[GFD] == now[EXP] == "paused-for-mig-change"
            assert now[DCGM] == "false"  # false stays false
            assert "nvidia.com/gpu.deploy.nvsm" not in now  # absent is not created
            assert cluster.pods(NODE) == []  # the body runs only once the operands are gone
            assert state.waited_s >= 0.25
            record = json.loads(annotations(cluster)[RECORD_ANNOTATION])
            assert record["owner"] == "mig-manager"
            assert record["previous"] == {DP: "true", GFD: "true", EXP: "true"}
        assert labels(cluster) == before
        assert RECORD_ANNOTATION not in annotations(cluster)
        assert cluster.wait_for(lambda: len(cluster.pods(NODE)) == 3)  # the DaemonSets bring them back
    finally:
        await k.aclose()


async def test_the_record_is_written_with_the_labels_in_one_patch(
    cluster: FakeApiServer, tmp_path: Path
) -> None:
    k = kube(tmp_path)
    try:
        async with OperandPauser(k, "mig-manager", poll=0.05).paused("mig-change", timeout=10):
            pass
        patches = [r for r in cluster.requests if r.method == "PATCH" and r.path.endswith(f"/nodes/{NODE}")]
        assert len(patches) == 2  # pause (labels + record), restore (labels + record removed)
    finally:
        await k.aclose()


async def test_a_failing_body_restores_and_its_error_reaches_the_caller(
    cluster: FakeApiServer, tmp_path: Path
) -> None:
    before = labels(cluster)
    k = kube(tmp_path)
    try:
        with pytest.raises(RuntimeError, match="apply failed"):
            async with OperandPauser(k, "mig-manager", poll=0.05).paused("mig-change", timeout=10):
                raise RuntimeError("apply failed")
        assert labels(cluster) == before
        assert RECORD_ANNOTATION not in annotations(cluster)
    finally:
        await k.aclose()


async def test_pods_that_outlive_the_deadline_restore_the_labels(
    cluster: FakeApiServer, tmp_path: Path
) -> None:
    # A pod pinned to the deploy label that no controller removes (say, a stuck terminating pod).
    cluster.add_pod(NS, "stubborn", node=NODE, labels={"app": "nvidia-device-plugin-daemonset"})
    before = labels(cluster)
    k = kube(tmp_path)
    ran = False
    try:
        with pytest.raises(OperandsNotStopped) as info:
            async with OperandPauser(k, "mig-manager", poll=0.05).paused("mig-change", timeout=0.8):
                ran = True
        assert not ran
        assert info.value.pods == (f"{NS}/stubborn",)
        assert labels(cluster) == before  # never left paused: NVIDIA's wedge
        assert RECORD_ANNOTATION not in annotations(cluster)
    finally:
        await k.aclose()


async def test_cancellation_restores(cluster: FakeApiServer, tmp_path: Path) -> None:
    before = labels(cluster)
    k = kube(tmp_path)
    inside = asyncio.Event()

    async def work() -> None:
        async with OperandPauser(k, "mig-manager", poll=0.05).paused("mig-change", timeout=10):
            inside.set()
            await asyncio.sleep(60)

    try:
        task = asyncio.create_task(work())
        await asyncio.wait_for(inside.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert labels(cluster) == before
        assert RECORD_ANNOTATION not in annotations(cluster)
    finally:
        await k.aclose()


async def test_restore_rides_out_an_api_server_hiccup(cluster: FakeApiServer, tmp_path: Path) -> None:
    before = labels(cluster)
    k = kube(tmp_path)
    try:
        async with OperandPauser(k, "mig-manager", poll=0.05).paused("mig-change", timeout=10):
            cluster.fail_next(3, status=503, method="PATCH")
        assert labels(cluster) == before
        assert RECORD_ANNOTATION not in annotations(cluster)
    finally:
        await k.aclose()


async def test_an_admins_change_during_the_pause_is_kept(cluster: FakeApiServer, tmp_path: Path) -> None:
    k = kube(tmp_path)
    try:
        async with OperandPauser(k, "mig-manager", poll=0.05).paused("mig-change", timeout=10):
            cluster.patch_node(NODE, {"metadata": {"labels": {EXP: "false"}}})
        now = labels(cluster)
        assert now[EXP] == "false"
        assert now[DP] == now[GFD] == "true"
    finally:
        await k.aclose()


async def test_a_second_agent_waits_for_the_first(cluster: FakeApiServer, tmp_path: Path) -> None:
    k1, k2 = kube(tmp_path), kube(tmp_path)
    try:
        async with OperandPauser(k1, "mig-manager", poll=0.05).paused("mig-change", timeout=10):
            with pytest.raises(OperandsBusy, match="mig-manager"):
                async with OperandPauser(k2, "driver-manager", poll=0.05).paused(
                    "driver-upgrade", timeout=0.5
                ):
                    pass
            assert labels(cluster)[DP] == "paused-for-mig-change"
        assert labels(cluster)[DP] == "true"
    finally:
        await k1.aclose()
        await k2.aclose()


CRASHER = textwrap.dedent(
    """
    import asyncio, sys
    from gpunode.kube.client import Kube, load_kubeconfig
    from gpunode.kube.operands import OperandPauser

    async def main():
        kube = Kube("node-1", load_kubeconfig(sys.argv[1]))
        pauser = OperandPauser(kube, "mig-manager", poll=0.05, lease=float(sys.argv[2]))
        async with pauser.paused("mig-change"):
            print("paused", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def pause_and_kill(api: FakeApiServer, tmp_path: Path, lease: float) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHER, str(tmp_path / "kubeconfig"), str(lease)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "paused", proc.stderr.read() if proc.stderr else ""
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no finally blocks, no restore: a crash
        proc.wait(10)
    assert labels(api)[DP] == "paused-for-mig-change"
    assert RECORD_ANNOTATION in annotations(api)


async def test_after_a_crash_the_next_start_restores(cluster: FakeApiServer, tmp_path: Path) -> None:
    before = labels(cluster)
    pause_and_kill(cluster, tmp_path, lease=60)
    k = kube(tmp_path)
    try:
        restored = await OperandPauser(k, "mig-manager").recover()  # the same agent, restarted
        assert restored == {DP: "true", GFD: "true", EXP: "true"}
        assert labels(cluster) == before
        assert RECORD_ANNOTATION not in annotations(cluster)
        assert cluster.wait_for(lambda: len(cluster.pods(NODE)) == 3)
    finally:
        await k.aclose()


async def test_another_agent_restores_a_crashed_pause_once_its_lease_ran_out(
    cluster: FakeApiServer, tmp_path: Path
) -> None:
    before = labels(cluster)
    pause_and_kill(cluster, tmp_path, lease=0.5)
    k = kube(tmp_path)
    try:
        other = OperandPauser(k, "driver-manager")
        await asyncio.sleep(0.6)
        assert await other.recover() == {DP: "true", GFD: "true", EXP: "true"}
        assert labels(cluster) == before
    finally:
        await k.aclose()


async def test_another_agent_leaves_a_live_pause_alone(cluster: FakeApiServer, tmp_path: Path) -> None:
    k1, k2 = kube(tmp_path), kube(tmp_path)
    try:
        async with OperandPauser(k1, "mig-manager", poll=0.05).paused("mig-change", timeout=10):
            assert await OperandPauser(k2, "driver-manager").recover() == {}
            assert labels(cluster)[DP] == "paused-for-mig-change"
    finally:
        await k1.aclose()
        await k2.aclose()


async def test_a_garbled_record_is_dropped(cluster: FakeApiServer, tmp_path: Path) -> None:
    cluster.patch_node(NODE, {"metadata": {"annotations": {RECORD_ANNOTATION: "{not json"}}})
    k = kube(tmp_path)
    try:
        assert await OperandPauser(k, "mig-manager").recover() == {}
        assert RECORD_ANNOTATION not in annotations(cluster)
    finally:
        await k.aclose()

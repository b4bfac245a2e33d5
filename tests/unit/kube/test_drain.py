"""kubectl drain's rules, pure: which pods count as GPU pods, what a drain does with each pod, the plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gpunode.kube.api import OwnerRef, PodInfo
from gpunode.kube.drain import decide_pod, is_gpu_pod, plan_drain


@dataclass(frozen=True)
class PodWithVolumes(PodInfo):
    """A PodInfo that knows its emptyDir volumes (the attribute decide_pod reads when present)."""

    empty_dirs: tuple[str, ...] = ()


def pod(
    name: str = "p",
    *,
    requests: tuple[str, ...] = (),
    owner: str | None = "ReplicaSet",
    controller: bool = True,
    phase: str = "Running",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    empty_dirs: tuple[str, ...] | None = None,
) -> PodInfo:
    owners = (OwnerRef("apps/v1", owner, f"{name}-owner", "uid-o", controller),) if owner else ()
    fields: dict[str, Any] = {
        "namespace": "ns",
        "name": name,
        "uid": f"uid-{name}",
        "node_name": "node-1",
        "labels": labels or {},
        "phase": phase,
        "deleting": deleting,
        "owners": owners,
        "requests": frozenset(requests),
    }
    if empty_dirs is None:
        return PodInfo(**fields)
    return PodWithVolumes(**fields, empty_dirs=empty_dirs)


# -- GPU pods ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requests", "gpu"),
    [
        pytest.param(("nvidia.com/gpu",), True, id="whole-gpu"),
        pytest.param(("nvidia.com/gpu.shared",), True, id="time-sliced-renamed"),
        pytest.param(("nvidia.com/mig-1g.5gb",), True, id="mig-mixed"),
        pytest.param(("nvidia.com/mig-3g.20gb.shared",), True, id="mig-shared"),
        pytest.param(("example.com/fpga", "nvidia.com/gpu"), True, id="one-of-several"),
        pytest.param((), False, id="cpu-only"),
        pytest.param(("amd.com/gpu",), False, id="other-vendor"),
        pytest.param(("gpu.intel.com/i915",), False, id="intel"),
        pytest.param(("nvidia.com/GA100_A100_PCIE_40GB",), False, id="vfio-passthrough-name"),
        pytest.param(("nvidia.com/hostdev",), False, id="nvidia-non-gpu"),
        pytest.param(("example.com/nvidia.com/gpu",), False, id="prefix-only-at-start"),
    ],
)
def test_gpu_pods_are_those_requesting_gpus_or_mig_devices(requests: tuple[str, ...], gpu: bool) -> None:
    assert is_gpu_pod(pod(requests=requests)) is gpu


# -- what a drain does with a pod ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "force", "emptydir_ok", "action", "why"),
    [
        pytest.param({}, False, False, "evict", "ReplicaSet p-owner", id="replicaset"),
        pytest.param({"owner": "Job"}, False, False, "evict", "Job p-owner", id="job"),
        pytest.param({"owner": "DaemonSet"}, True, True, "ignore", "DaemonSet", id="daemonset-never"),
        pytest.param(
            {"owner": "DaemonSet", "deleting": True},
            False,
            False,
            "ignore",
            "DaemonSet",
            id="daemonset-deleting",
        ),
        pytest.param({"owner": "Node"}, True, True, "ignore", "static pod", id="static-pod"),
        pytest.param({"owner": None}, False, False, "block", "DRAIN_USE_FORCE=true", id="bare-pod"),
        pytest.param({"owner": None}, True, False, "evict", "not managed", id="bare-pod-force"),
        pytest.param(
            {"controller": False}, False, False, "block", "not managed", id="owner-but-no-controller"
        ),
        pytest.param(
            {"owner": None, "phase": "Succeeded"}, False, False, "evict", "finished", id="bare-finished"
        ),
        pytest.param({"owner": None, "phase": "Failed"}, False, False, "evict", "finished", id="bare-failed"),
        pytest.param({"deleting": True}, False, False, "wait", "terminating", id="terminating"),
        pytest.param(
            {"owner": None, "deleting": True}, False, False, "wait", "terminating", id="bare-terminating"
        ),
        pytest.param(
            {"empty_dirs": ("scratch",)}, False, False, "block", "DRAIN_DELETE_EMPTYDIR_DATA", id="emptydir"
        ),
        pytest.param({"empty_dirs": ("scratch",)}, False, True, "evict", "ReplicaSet", id="emptydir-allowed"),
        pytest.param(
            {"owner": None, "empty_dirs": ("a", "b")}, True, False, "block", "a, b", id="bare-emptydir-force"
        ),
        pytest.param(
            {"empty_dirs": ("scratch",), "phase": "Succeeded"},
            False,
            False,
            "evict",
            "finished",
            id="emptydir-done",
        ),
        pytest.param({"empty_dirs": ()}, False, False, "evict", "ReplicaSet", id="volumes-known-none"),
    ],
)
def test_a_drain_decides_each_pod_as_kubectl_drain(
    kwargs: dict[str, Any], force: bool, emptydir_ok: bool, action: str, why: str
) -> None:
    decision = decide_pod(pod(**kwargs), force=force, delete_emptydir_data=emptydir_ok)
    assert decision.action == action
    assert why in decision.why
    assert str(decision).startswith("ns/p (")


def test_a_plan_takes_only_the_selected_pods_sorted() -> None:
    pods = [
        pod("z-trainer", requests=("nvidia.com/gpu",)),
        pod("a-mig", requests=("nvidia.com/mig-1g.5gb",), owner="Job"),
        pod("web", requests=()),
        pod("monitor", requests=("nvidia.com/gpu",), owner="DaemonSet"),
        pod("notebook", requests=("nvidia.com/gpu",), owner=None),
        pod("leaving", requests=("nvidia.com/gpu",), deleting=True),
    ]
    plan = plan_drain(pods, select=is_gpu_pod, force=False, delete_emptydir_data=False)
    assert [p.name for p in plan.evict] == ["a-mig", "z-trainer"]
    assert [p.name for p in plan.wait] == ["leaving"]
    assert [d.pod.name for d in plan.blocked] == ["notebook"]
    assert [d.pod.name for d in plan.ignored] == ["monitor"]
    assert [p.name for p in plan.targets] == ["a-mig", "z-trainer", "leaving"]

    everything = plan_drain(pods, select=lambda p: True, force=True, delete_emptydir_data=False)
    assert [p.name for p in everything.evict] == ["a-mig", "notebook", "web", "z-trainer"]
    assert everything.blocked == ()

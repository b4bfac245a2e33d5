"""Every agent container that opens the GPUs can reach the device nodes on a real node, on both paths and
through both renderers (``gpunode render`` and the operator's).

Which containers open the GPUs is stated here from what each command does, not read back from the
renderer: the NVML agents, the MPS control daemon, the toolkit's ``cdi generate`` (NVML lists the devices
and watches MIG changes), the validator's ``--component`` checks; not ``--wait-for`` (readiness files)
nor ``runtime configure`` (configuration files). How each may reach the devices:

* ``privileged: true``: the runtime puts the host's devices in the container and opens the device
  cgroup. The only generic way without NVIDIA's runtime (docs/cdi.md, "How the agents reach the GPU").
* the legacy path only: a RuntimeClass that the same render creates (NVIDIA's runtime as its handler)
  and ``NVIDIA_VISIBLE_DEVICES=all`` in the container, which that runtime reads.

Nothing else counts: ``NVIDIA_VISIBLE_DEVICES`` alone does nothing under runc, and a hostPath ``/dev``
does not pass the device cgroup.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml

from gpunode.api.clusterpolicy import parse_policy_text
from gpunode.deploy import operator_cli
from gpunode.deploy.render import render_by_agent
from gpunode.operator.controller import parse_cluster_policy

Obj = dict[str, Any]

GPU_AGENTS = {
    "gpunode-device-plugin",
    "gpunode-feature-discovery",
    "gpunode-exporter",
    "gpunode-mps-control-daemon",
    "gpunode-mig-manager",
    "gpunode-driver-loader",
}
#: Privileged on both paths whatever else: they load drivers and reset GPUs (driver loader, MIG manager),
#: or run before any RuntimeClass handler exists (the toolkit registers the legacy one itself).
ALWAYS_PRIVILEGED = {"gpunode-driver-loader", "gpunode-mig-manager", "gpunode-toolkit"}


def opens_gpu(container: Obj) -> bool:
    cmd = container["command"]
    if cmd[0] == "gpunode-validator":
        return "--component" in cmd
    if cmd[0] == "gpunode-toolkit":
        return cmd[1:3] == ["cdi", "generate"]
    return cmd[0] in GPU_AGENTS


def _env(container: Obj, name: str) -> str | None:
    return next((e.get("value") for e in container.get("env", []) if e["name"] == name), None)


def _policy_doc(cdi: bool, driver: bool, mig: str, runtime: str, exporter_pods: bool) -> Obj:
    spec: Obj = {
        "cdi": {"enabled": cdi},
        "driver": {"enabled": driver},
        "mig": {"strategy": mig},
        "operator": {"defaultRuntime": runtime},
        "dcgmExporter": {"env": [{"name": "DCGM_EXPORTER_KUBERNETES", "value": str(exporter_pods).lower()}]},
    }
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": spec}


CASES = [
    pytest.param(cdi, driver, mig, runtime, pods, id=f"cdi={cdi}-driver={driver}-{mig}-{runtime}-pods={pods}")
    for cdi, driver, mig, runtime, pods in itertools.product(
        (True, False), (True, False), ("single", "mixed", "none"), ("containerd", "crio"), (True, False)
    )
    # keep it small: every mig strategy and runtime with the default exporter, each flag once elsewhere
    if (mig, runtime) in (("single", "containerd"), ("mixed", "crio"), ("none", "containerd")) or not pods
]


def _both_renders(doc: Obj) -> dict[str, list[Obj]]:
    plain = render_by_agent(parse_policy_text(yaml.safe_dump(doc), "p").policy, namespace="gpunode")
    operator = operator_cli.render(parse_cluster_policy(doc), "gpunode")
    return {
        "render": [o for objs in plain.values() for o in objs],
        "operator": [o for objs in operator.values() for o in objs],
    }


def _pods(objs: list[Obj]) -> list[tuple[str, Obj]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objs if o["kind"] == "DaemonSet"]


@pytest.mark.parametrize(("cdi", "driver", "mig", "runtime", "pods"), CASES)
def test_every_gpu_container_reaches_the_devices(
    cdi: bool, driver: bool, mig: str, runtime: str, pods: bool
) -> None:
    doc = _policy_doc(cdi, driver, mig, runtime, pods)
    for how, objs in _both_renders(doc).items():
        classes = {o["metadata"]["name"] for o in objs if o["kind"] == "RuntimeClass"}
        assert bool(classes) is not cdi, how  # a RuntimeClass on the legacy path only
        gpu_containers = 0
        for name, pod in _pods(objs):
            for c in pod.get("initContainers", []) + pod["containers"]:
                where = (how, name, c["name"])
                sc = c["securityContext"]
                privileged = sc.get("privileged", False) is True
                # the API refuses allowPrivilegeEscalation: false with privileged: true
                assert not (privileged and sc.get("allowPrivilegeEscalation") is False), where
                if c["name"] == "mps-control-daemon-mounts":  # opens no GPU; mounts the MPS shm tmpfs on
                    assert privileged, where  # the host through a Bidirectional volume: privileged only
                    continue
                if not opens_gpu(c):
                    assert not privileged, where  # least privilege: wait-for-*, runtime-configure
                    continue
                gpu_containers += 1
                if cdi or name in ALWAYS_PRIVILEGED:
                    assert privileged, where
                    continue
                # legacy: NVIDIA's runtime through the rendered RuntimeClass, unprivileged
                assert not privileged, where
                assert pod.get("runtimeClassName") in classes, where
                assert _env(c, "NVIDIA_VISIBLE_DEVICES") == "all", where
                assert sc["allowPrivilegeEscalation"] is False, where
                assert sc["capabilities"]["drop"] == ["ALL"], where
        # toolkit (cdi-generate, toolkit-validation, watch; driver-validation without the driver DaemonSet),
        # device plugin, GFD, exporter, MPS, MIG manager; the driver loader's two
        assert gpu_containers == (10 if driver else 9), how


@pytest.mark.parametrize("cdi", [True, False])
def test_the_two_renderers_agree(cdi: bool) -> None:
    both = _both_renders(_policy_doc(cdi, True, "single", "containerd", True))
    assert both["render"] == both["operator"]


def test_privileged_gpu_containers_keep_what_they_can() -> None:
    """With CDI the NVML agents are privileged, but keep their user and a read-only root file system;
    nothing that the runtime ignores for a privileged container (capabilities, seccomp) is written as
    if it applied."""
    objs = _both_renders(_policy_doc(True, True, "single", "containerd", False))["render"]
    by_name = dict(_pods(objs))
    gfd = by_name["gpunode-feature-discovery"]["containers"][0]["securityContext"]
    exporter = by_name["gpunode-exporter"]["containers"][0]["securityContext"]
    for sc in (gfd, exporter):  # the exporter without pod labels needs no root either
        assert sc == {
            "privileged": True,
            "readOnlyRootFilesystem": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "runAsNonRoot": True,
        }
    plugin = by_name["gpunode-device-plugin"]["containers"][0]["securityContext"]
    assert plugin == {
        "privileged": True,
        "readOnlyRootFilesystem": True,
        "runAsUser": 0,
        "runAsNonRoot": False,
    }
    for name, pod in by_name.items():
        assert "runtimeClassName" not in pod, name


def test_legacy_gpu_pods_keep_their_capabilities_and_use_the_runtime_class() -> None:
    objs = _both_renders(_policy_doc(False, True, "mixed", "containerd", True))["render"]
    by_name = dict(_pods(objs))
    plugin = by_name["gpunode-device-plugin"]
    assert plugin["runtimeClassName"] == "nvidia"
    assert plugin["containers"][0]["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["SYS_ADMIN"],
    }
    mps = by_name["gpunode-mps-control-daemon"]["containers"][0]["securityContext"]
    assert sorted(mps["capabilities"]["add"]) == ["SETGID", "SETUID", "SYS_ADMIN"]  # SYS_ADMIN: compute mode
    for name in ("gpunode-toolkit", "gpunode-driver-loader", "gpunode-mig-manager"):
        assert "runtimeClassName" not in by_name[name], name  # privileged; the toolkit makes the handler

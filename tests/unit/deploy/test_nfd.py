"""Node Feature Discovery as `gpunode render` deploys it (spec.nfd.enabled), and the RuntimeClass rule:
no pod asks for a RuntimeClass that is not rendered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpunode.api.clusterpolicy import load_policy
from gpunode.deploy.nfd import DEFAULT_IMAGE, WORKER_CONFIG
from gpunode.deploy.operator_install import render_operator
from gpunode.deploy.render import render, render_by_agent
from gpunode.deploy.render_cli import main

ROOT = Path(__file__).resolve().parents[3]
POLICIES = ROOT / "containers" / "policies"
DEFAULT = POLICIES / "default.yaml"
K8S_VERSION = "1.33"
BASE = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\n"

# NFD's own least privilege (its manifests): name -> kind -> [(group, resource, verbs)]
NFD_RBAC = {
    "gpunode-nfd-master": {
        "ClusterRole": [
            ("", "nodes", ["get", "list", "patch", "update"]),
            ("", "nodes/status", ["get", "list", "patch", "update"]),
            ("nfd.k8s-sigs.io", "nodefeatures", ["get", "list", "watch"]),
            ("nfd.k8s-sigs.io", "nodefeaturerules", ["get", "list", "watch"]),
        ]
    },
    "gpunode-nfd-worker": {
        "Role": [("nfd.k8s-sigs.io", "nodefeatures", ["create", "get", "update"]), ("", "pods", ["get"])]
    },
    "gpunode-nfd-gc": {
        "ClusterRole": [
            ("", "nodes", ["list", "watch"]),
            ("nfd.k8s-sigs.io", "nodefeatures", ["delete", "list"]),
        ]
    },
}


def _policy(tmp_path: Path, body: str) -> Any:
    path = tmp_path / "policy.yaml"
    path.write_text(BASE + body, encoding="utf-8")
    return load_policy(path, strict=True).policy


def _nfd(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in objs
        if o["metadata"]["name"].startswith("gpunode-nfd-")
        or o["metadata"]["name"].endswith(".nfd.k8s-sigs.io")
    ]


def _pods(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"])
        for o in objs
        if o["kind"] in ("DaemonSet", "Deployment")
    ]


def test_nfd_is_deployed_by_default_with_nvidias_worker_settings() -> None:
    by_part = render_by_agent(load_policy(DEFAULT).policy)
    assert list(by_part)[:2] == ["common", "nfd"]  # applied before the agents
    objs = by_part["nfd"]
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert ("CustomResourceDefinition", "nodefeatures.nfd.k8s-sigs.io") in kinds
    assert ("CustomResourceDefinition", "nodefeaturerules.nfd.k8s-sigs.io") in kinds
    assert ("Deployment", "gpunode-nfd-master") in kinds
    assert ("DaemonSet", "gpunode-nfd-worker") in kinds
    assert ("Deployment", "gpunode-nfd-gc") in kinds
    assert ("ConfigMap", "gpunode-nfd-worker-conf") in kinds
    for role in ("master", "worker", "gc"):
        assert ("ServiceAccount", f"gpunode-nfd-{role}") in kinds
    conf = next(o for o in objs if o["kind"] == "ConfigMap")
    assert yaml.safe_load(conf["data"]["nfd-worker.conf"]) == {
        "sources": {
            "pci": {
                "deviceClassWhitelist": ["02", "0200", "0207", "0300", "0302"],
                "deviceLabelFields": ["vendor"],
            }
        }
    }
    assert conf["data"]["nfd-worker.conf"] == WORKER_CONFIG
    pods = dict(_pods(objs))
    assert pods["gpunode-nfd-master"]["containers"][0]["command"] == [
        "nfd-master",
        "-extra-label-ns=nvidia.com",
    ]
    assert pods["gpunode-nfd-worker"]["containers"][0]["command"] == ["nfd-worker"]
    assert pods["gpunode-nfd-gc"]["containers"][0]["command"] == ["nfd-gc"]
    worker = pods["gpunode-nfd-worker"]
    # on every node: GPU nodes (tainted nvidia.com/gpu) and the control plane too; no node selector
    assert "nodeSelector" not in worker
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in worker["tolerations"]
    assert {
        "key": "node-role.kubernetes.io/control-plane",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in worker["tolerations"]
    conf_volume = next(v for v in worker["volumes"] if v["name"] == "nfd-worker-conf")
    assert conf_volume["configMap"]["name"] == "gpunode-nfd-worker-conf"
    for _, pod in _pods(objs):
        for c in pod["containers"]:
            assert c["image"] == DEFAULT_IMAGE == "registry.k8s.io/nfd/node-feature-discovery:v0.17.4"


def test_the_agents_select_on_the_label_nfd_sets() -> None:
    objs = render(load_policy(DEFAULT).policy)
    for name, pod in _pods(objs):
        if not name.startswith("gpunode-nfd-"):
            assert pod["nodeSelector"]["feature.node.kubernetes.io/pci-10de.present"] == "true", name


def test_nfd_rbac_is_nfds_own_least_privilege() -> None:
    found: dict[str, dict[str, list[tuple[str, str, list[str]]]]] = {}
    objs = _nfd(render(load_policy(DEFAULT).policy))
    for o in objs:
        if o["kind"] in ("ClusterRole", "Role"):
            found.setdefault(o["metadata"]["name"], {})[o["kind"]] = [
                (g, r, rule["verbs"])
                for rule in o["rules"]
                for g in rule["apiGroups"]
                for r in rule["resources"]
            ]
    assert found == NFD_RBAC
    for o in objs:
        if o["kind"].endswith("Binding"):
            assert o["roleRef"]["name"] == o["metadata"]["name"] == o["subjects"][0]["name"]
            assert o["subjects"][0]["namespace"] == "gpunode"


def test_nfd_containers_are_unprivileged_with_read_only_host_paths() -> None:
    for name, pod in _pods(_nfd(render(load_policy(DEFAULT).policy))):
        host = {v["name"] for v in pod.get("volumes", []) if "hostPath" in v}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["runAsNonRoot"] is True, name
            assert c["resources"]["requests"], name
            assert c["resources"]["limits"], name
            for m in c.get("volumeMounts", []):
                assert m["readOnly"] is True, (name, m)
        assert not pod.get("hostNetwork"), name
        assert not pod.get("hostPID"), name
        if name == "gpunode-nfd-worker":
            assert {"host-sys", "host-boot"} <= host


@pytest.mark.parametrize("operator", [False, True])
def test_nfd_objects_validate(operator: bool) -> None:
    policy = load_policy(DEFAULT).policy
    objs = render_operator(policy) if operator else render(policy)
    nfd = _nfd(objs)
    assert len(nfd) == 15  # 2 CRDs, 3 accounts, 3 roles, 3 bindings, the ConfigMap, 3 workloads
    for o in nfd:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_nfd_disabled_renders_nothing_of_nfd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = _policy(tmp_path, "spec:\n  nfd:\n    enabled: false\n")
    assert "nfd" not in render_by_agent(policy)
    assert _nfd(render(policy)) == []
    assert _nfd(render_operator(policy)) == []
    for name, pod in _pods(render(policy)):  # an existing NFD, or a user's label, says which nodes
        assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true", name
    assert main(["--policy", str(tmp_path / "policy.yaml"), "--images"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_nfd_image_flag(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["--policy", str(DEFAULT), "--nfd-image", "reg.local/nfd:1", "-o", str(out)]) == 0
    docs = [d for d in yaml.safe_load_all((out / "nfd.yaml").read_text()) if d]
    images = {c["image"] for _, pod in _pods(docs) for c in pod["containers"]}
    assert images == {"reg.local/nfd:1"}
    agents = [
        d for f in out.glob("*.yaml") if f.name != "nfd.yaml" for d in yaml.safe_load_all(f.read_text()) if d
    ]
    assert all(c["image"] != "reg.local/nfd:1" for _, pod in _pods(agents) for c in pod["containers"])


# -- the RuntimeClass ------------------------------------------------------------------------------------


def _all_renders() -> list[tuple[str, list[dict[str, Any]]]]:
    out = []
    for path in sorted(POLICIES.glob("*.yaml")):
        try:
            policy = load_policy(path).policy
        except Exception:  # a seed another format (Helm values) reads: not a ClusterPolicy
            continue
        out.append((path.stem, render(policy)))
        out.append((f"{path.stem} --operator", render_operator(policy)))
    return out


def test_no_pod_asks_for_a_runtime_class_that_is_not_rendered() -> None:
    renders = _all_renders()
    assert renders
    for name, objs in renders:
        classes = {o["metadata"]["name"] for o in objs if o["kind"] == "RuntimeClass"}
        for pod_name, pod in _pods(objs):
            wanted = pod.get("runtimeClassName")
            assert wanted is None or wanted in classes, (name, pod_name, wanted)


def test_the_agents_do_not_depend_on_nvidias_runtime() -> None:
    """They load NVML from the mounted driver root, under the cluster's default runtime."""
    for name, objs in _all_renders():
        for pod_name, pod in _pods(objs):
            assert "runtimeClassName" not in pod, (name, pod_name)


def test_runtime_class_rendered_only_on_the_legacy_path(tmp_path: Path) -> None:
    assert not [o for o in render(load_policy(DEFAULT).policy) if o["kind"] == "RuntimeClass"]
    # CDI (the default): workloads need no RuntimeClass, even where the policy names one
    named = _policy(tmp_path, "spec:\n  operator:\n    runtimeClass: nvidia-gpu\n")
    assert not [o for o in render(named) if o["kind"] == "RuntimeClass"]
    legacy = "spec:\n  cdi:\n    enabled: false\n"
    default_name = [o for o in render(_policy(tmp_path, legacy)) if o["kind"] == "RuntimeClass"]
    assert [(c["metadata"]["name"], c["handler"]) for c in default_name] == [("nvidia", "nvidia")]
    policy = _policy(tmp_path, legacy + "  operator:\n    runtimeClass: nvidia-gpu\n")
    classes = [o for o in render(policy) if o["kind"] == "RuntimeClass"]
    assert [(c["metadata"]["name"], c["handler"]) for c in classes] == [("nvidia-gpu", "nvidia-gpu")]
    kubernetes_validate.validate(classes[0], K8S_VERSION, strict=True)
    assert render_by_agent(policy)["common"][1] == classes[0]  # with the namespace, before any workload

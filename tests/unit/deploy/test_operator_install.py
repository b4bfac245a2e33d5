"""`gpunode render --operator`: the whole install of gpunode-operator, as one `kubectl apply -f -`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpunode.api.clusterpolicy import load_policy, parse_policy_text
from gpunode.api.clusterpolicy_crd import crd
from gpunode.deploy.operator_install import (
    KINDS,
    operator_rules,
    render_operator,
    render_operator_by_part,
)
from gpunode.deploy.render import dump_yaml, render
from gpunode.deploy.render_cli import main
from gpunode.operator.seed import parse_seed

ROOT = Path(__file__).resolve().parents[3]
POLICIES = ROOT / "containers" / "policies"
DEFAULT = POLICIES / "default.yaml"
GOLDEN = ROOT / "tests" / "golden" / "render" / "operator-default.yaml"
K8S_VERSION = "1.33"
UPDATE = os.environ.get("GPUNODE_UPDATE_GOLDEN") == "1"


def _install() -> dict[str, list[dict[str, Any]]]:
    return render_operator_by_part(load_policy(DEFAULT, strict=True).policy)


def test_golden() -> None:
    text = dump_yaml(render_operator(load_policy(DEFAULT, strict=True).policy))
    if UPDATE:
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.read_text(encoding="utf-8") == text, "GPUNODE_UPDATE_GOLDEN=1 rewrites the golden"


def test_the_crd_comes_first() -> None:
    parts = _install()
    assert list(parts) == ["crds", "operator", "nfd", "clusterpolicy"]  # apply order
    assert parts["crds"] == [crd()]
    assert parts["crds"][0]["spec"]["names"]["kind"] == "ClusterPolicy"


def test_every_object_validates() -> None:
    for o in render_operator(load_policy(DEFAULT).policy):
        if o["kind"] == "ClusterPolicy":
            continue  # a custom resource: tests/unit/api/test_clusterpolicy_crd.py holds the seeds to it
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_namespace_is_privileged_for_pod_security() -> None:
    ns = _install()["operator"][0]
    assert ns["kind"] == "Namespace"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    plain = render(load_policy(DEFAULT).policy)[0]  # the plain render's namespace too
    assert plain == ns


def test_the_operator_deployment() -> None:
    objs = _install()["operator"]
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpunode-operator"
    (c,) = pod["containers"]
    assert c["command"] == ["gpunode-operator", "--leader-elect"]
    assert c["image"].startswith("ghcr.io/gpunode/gpunode:")  # the one gpunode image
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert "runtimeClassName" not in pod


def test_the_cluster_policy_is_the_one_given() -> None:
    """Carried in the ConfigMap the operator applies it from (kubectl cannot create it in the apply that
    creates its CRD): the policy as written, and its digest as the annotation the operator records."""
    parts = _install()
    (cm,) = parts["clusterpolicy"]
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == (
        "ConfigMap",
        "gpunode-operator-clusterpolicy",
        "gpunode",
    )
    cp, digest = parse_seed(cm) or ({}, "")
    assert cp["metadata"]["annotations"].pop("gpunode.io/install-digest") == digest
    if not cp["metadata"]["annotations"]:
        del cp["metadata"]["annotations"]
    assert cp == yaml.safe_load(DEFAULT.read_text())
    policy = parse_policy_text("apiVersion: nvidia.com/v1\nkind: ClusterPolicy\n", "p").policy
    (bare_cm,) = render_operator_by_part(policy)["clusterpolicy"]
    bare, _ = parse_seed(bare_cm) or ({}, "")
    del bare["metadata"]["annotations"]
    assert bare == {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
    }


def _covers(
    rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str | None = None
) -> bool:
    for r in rules:
        if group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]:
            names = r.get("resourceNames")
            if names is None or (name is not None and name in names):
                return True
    return False


def test_operator_rbac_is_least_privilege() -> None:
    cluster, ns = operator_rules("gpunode")
    everything = cluster + ns
    for r in everything:
        assert "*" not in r["verbs"]
        assert "*" not in r["resources"]
        assert "*" not in r["apiGroups"]
        assert "secrets" not in r["resources"]
        assert "escalate" not in r["verbs"]
        assert "bind" not in r["verbs"]
    # what the operator itself does
    assert _covers(cluster, "", "nodes", "patch")
    assert _covers(cluster, "", "nodes", "watch")
    assert _covers(cluster, "nvidia.com", "clusterpolicies", "watch")
    assert _covers(cluster, "nvidia.com", "clusterpolicies/status", "update")
    assert not _covers(cluster, "nvidia.com", "clusterpolicies", "update")
    assert _covers(ns, "coordination.k8s.io", "leases", "update")
    assert not _covers(cluster, "coordination.k8s.io", "leases", "update")  # its namespace only
    assert _covers(cluster, "", "namespaces", "patch", "gpunode")
    assert not _covers(cluster, "", "namespaces", "patch", "kube-system")


def test_operator_can_apply_every_kind_and_grant_every_rule_it_renders() -> None:
    """Any policy's objects (all components on): the operator may write each kind, and holds every rule it
    grants (Kubernetes refuses a role its writer does not hold)."""
    cluster, ns = operator_rules("gpunode")
    text = (
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nspec:\n  operator:\n    runtimeClass: nvidia\n"
        "  devicePlugin:\n    config:\n      name: c\n"
        "  dcgmExporter:\n    serviceMonitor:\n      enabled: true\n"
    )
    for driver in ("true", "false"):
        policy = parse_policy_text(text + f"  driver:\n    enabled: {driver}\n", "p").policy
        for o in render(policy):
            if o["kind"] == "Namespace":
                continue
            group, resource, namespaced = KINDS[o["kind"]]
            rules = ns if namespaced else cluster
            for verb in ("create", "patch", "delete"):
                assert _covers(rules, group, resource, verb, o["metadata"]["name"]), (o["kind"], verb)
            for rule in o.get("rules", []):
                granted = ns if o["kind"] == "Role" else cluster
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        for v in rule["verbs"]:
                            assert _covers(granted, g, r, v), (o["metadata"]["name"], g, r, v)


def test_cli_operator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policy", str(DEFAULT), "--operator"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert docs == render_operator(load_policy(DEFAULT).policy)
    assert parse_seed(docs[-1]) is not None  # the policy, in the operator's ConfigMap
    out = tmp_path / "out"
    assert main(["--policy", str(DEFAULT), "--operator", "-o", str(out)]) == 0
    expected = [f"{i}-{p}.yaml" for i, (p, objs) in enumerate(_install().items(), 1) if objs]
    assert sorted(f.name for f in out.iterdir()) == expected  # file names sort in apply order
    assert main(["--policy", str(DEFAULT), "--operator", "--images", "--image", "r/g:1"]) == 0
    assert capsys.readouterr().out == "r/g:1\nregistry.k8s.io/nfd/node-feature-discovery:v0.17.4\n"


def test_cli_operator_alone_installs_the_gpu_operators_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text(
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata:\n  name: cluster-policy\nspec: {}\n"
    )
    assert main(["--operator"]) == 0
    alone = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert alone == render_operator(load_policy(empty).policy)
    assert (parse_seed(alone[-1]) or ({}, ""))[0]["metadata"]["name"] == "cluster-policy"
    assert main(["--operator", "--images"]) == 0
    assert "registry.k8s.io/nfd/node-feature-discovery:v0.17.4" in capsys.readouterr().out.splitlines()
    assert main([]) == 2  # without --operator a policy or values file is still required

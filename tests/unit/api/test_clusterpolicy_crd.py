"""gpunode.api.clusterpolicy_crd: the ClusterPolicy CRD is valid for Kubernetes, structural, covers every
field of NVIDIA's CRD, accepts every seed policy, and equals containers/crd/clusterpolicy.yaml."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpunode.api.clusterpolicy import field_table_markdown
from gpunode.api.clusterpolicy_crd import crd
from gpunode.api.clusterpolicy_fields import ANY_STRING, leaf_paths, nvidia_spec_schema, schema_at
from gpunode.deploy.render import dump_yaml

ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = ROOT / "containers" / "crd" / "clusterpolicy.yaml"
POLICIES = ROOT / "containers" / "policies"
DOCS = ROOT / "docs" / "clusterpolicy.md"
K8S_VERSION = "1.33"
UPDATE = os.environ.get("GPUNODE_UPDATE_GOLDEN") == "1"


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_containers_crd_is_the_generated_crd() -> None:
    text = dump_yaml([crd()])
    if UPDATE:
        CRD_FILE.parent.mkdir(parents=True, exist_ok=True)
        CRD_FILE.write_text(text, encoding="utf-8")
    assert CRD_FILE.read_text(encoding="utf-8") == text, "GPUNODE_UPDATE_GOLDEN=1 rewrites it"


def test_docs_field_table_is_the_generated_table() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    start, end = "<!-- field-table:start -->\n", "<!-- field-table:end -->"
    head, rest = docs.split(start)
    _, tail = rest.split(end)
    if UPDATE:
        DOCS.write_text(head + start + field_table_markdown() + end + tail, encoding="utf-8")
        docs = DOCS.read_text(encoding="utf-8")
    assert docs.split(start)[1].split(end)[0] == field_table_markdown()


def test_crd_validates_against_kubernetes_schema() -> None:
    kubernetes_validate.validate(crd(), K8S_VERSION, strict=True)


def test_schema_validation_catches_a_typo() -> None:
    bad = crd()
    bad["spec"]["versions"][0]["subresource"] = {"status": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_identity_scope_status_and_printer_columns() -> None:
    obj = crd()
    assert obj["metadata"]["name"] == "clusterpolicies.nvidia.com"
    spec = obj["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"]) == ("nvidia.com", "Cluster", "ClusterPolicy")
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {"State": ".status.state", "Age": ".metadata.creationTimestamp"}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["state"]["enum"] == ["ignored", "ready", "notReady"]
    assert {"namespace", "conditions"} <= set(status)


def test_schema_is_structural() -> None:
    """The rules the API server checks for a structural schema, as far as they can be checked offline."""
    for path, node in _nodes(_schema()):
        assert "x-kubernetes-preserve-unknown-fields" not in node, path  # NVIDIA's CRD has none
        assert "default" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert "type" in node, path
        assert not {"anyOf", "oneOf", "allOf", "not"} & set(node), path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "array":
            assert isinstance(node["items"], dict), path
        if node["type"] == "object" and path not in (".metadata",):
            assert "properties" in node or "additionalProperties" in node, path
        for name in node.get("required", []):
            assert name in node["properties"], path


def test_every_field_of_nvidias_crd_is_in_the_schema() -> None:
    spec = _schema()["properties"]["spec"]
    nvidia = nvidia_spec_schema()
    for path, _ in leaf_paths(nvidia, "spec"):
        parts = tuple(path.replace("[]", ".[]").split(".")[1:])
        node = schema_at(spec, parts)
        assert node is not None, path
        ours = node.get("type", "int-or-string" if node.get("x-kubernetes-int-or-string") else None)
        theirs = schema_at(nvidia, parts)
        assert theirs is not None
        assert ours == theirs.get("type", ours), path
        # Never stricter than NVIDIA: an enum keeps every value NVIDIA allows.
        assert ("enum" not in node) == (path in ANY_STRING) or "enum" not in theirs, path
        assert set(theirs.get("enum", [])) <= set(node.get("enum", theirs.get("enum", []))), path


def test_seed_policies_include_the_nvidia_sample() -> None:
    assert {"default.yaml", "nvidia-sample.yaml"} <= set(_cluster_policies())


def _validator() -> jsonschema.protocols.Validator:
    schema = _schema()
    return jsonschema.Draft4Validator(schema)


def _cluster_policies() -> list[str]:
    """The seed ClusterPolicies (``containers/policies/`` also holds Helm values files)."""
    return sorted(
        p.name
        for p in POLICIES.glob("*.yaml")
        if (yaml.safe_load(p.read_text(encoding="utf-8")) or {}).get("kind") == "ClusterPolicy"
    )


@pytest.mark.parametrize("policy", _cluster_policies())
def test_every_seed_policy_is_valid_for_the_crd(policy: str) -> None:
    doc = yaml.safe_load((POLICIES / policy).read_text(encoding="utf-8"))
    errors = [e.message for e in _validator().iter_errors(doc)]
    assert errors == []
    assert _undeclared(doc["spec"], _schema()["properties"]["spec"], "spec") == []


def _undeclared(value: object, schema: dict[str, Any], path: str) -> list[str]:
    """Paths of ``value`` the schema does not declare (what the API server would prune)."""
    out: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in value.items():
            child = schema["properties"].get(key)
            if child is None:
                out.append(f"{path}.{key}")
            else:
                out += _undeclared(sub, child, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            out += _undeclared(item, schema["items"], f"{path}[{index}]")
    return out


def test_a_field_outside_the_crd_is_found() -> None:
    doc = {"driver": {"enabled": True, "frobnicate": 1}, "daemonsets": {"tolerations": [{"keys": "x"}]}}
    assert _undeclared(doc, _schema()["properties"]["spec"], "spec") == [
        "spec.driver.frobnicate",
        "spec.daemonsets.tolerations[0].keys",
    ]


def test_status_with_every_field_is_valid() -> None:
    status = {
        "state": "notReady",
        "namespace": "gpunode",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "OperandNotReady",
                "message": "device-plugin: 1 of 3 pods unavailable",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 2,
            }
        ],
        "states": [
            {
                "name": "device-plugin",
                "state": "notReady",
                "desired": 3,
                "ready": 2,
                "unavailable": 1,
                "nodes": ["gpu-node-7"],
                "message": "ImagePullBackOff",
            }
        ],
    }
    doc = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "p"},
        "status": status,
    }
    assert [e.message for e in _validator().iter_errors(doc)] == []
    bad = {**doc, "status": {**status, "state": "Ready"}}
    assert [e.message for e in _validator().iter_errors(bad)] != []

"""gpunode.api.clusterpolicy: the ClusterPolicy subset gpunode reads, and what it warns about."""

from __future__ import annotations

from gpunode.api.clusterpolicy import parse_policy_text

BASE = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\n"


def test_unknown_and_unsupported_fields_warn() -> None:
    text = (
        BASE
        + "spec:\n  nodeStatusExporter: {enabled: true}\n  driver:\n    repository: x\n    frobnicate: 1\n"
    )
    loaded = parse_policy_text(text, "p.yaml")
    assert loaded.warnings == (
        "spec.nodeStatusExporter: not supported by gpunode (ignored)",
        "spec.driver.repository: not supported by gpunode (ignored)",
        "spec.driver.frobnicate: unknown field (ignored)",
    )

"""gpunode.api.clusterpolicy: every field of NVIDIA's CRD accepted (ignored ones named with the reason),
only fields outside it unknown; the sample policy with every field; the field table."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode.api.clusterpolicy import field_table, load_policy, parse_policy_text
from gpunode.api.clusterpolicy_fields import (
    EXTENSIONS,
    REASONS,
    leaf_paths,
    nvidia_spec_schema,
    schema_at,
    spec_schema,
)
from gpunode.common.config import ConfigError
from gpunode.deploy.render import dump_yaml, render
from gpunode.deploy.render_cli import main

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "containers" / "policies" / "nvidia-sample.yaml"
BASE = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\n"


def _parts(path: str) -> list[str]:
    return path.replace("[]", ".[]").split(".")


def _present(value: object, parts: list[str]) -> bool:
    if not parts:
        return value is not None
    head, rest = parts[0], parts[1:]
    if head == "[]":
        return isinstance(value, list) and any(_present(v, rest) for v in value)
    return isinstance(value, dict) and head in value and _present(value[head], rest)


def test_ignored_and_unknown_fields_warn() -> None:
    text = (
        BASE
        + "spec:\n  nodeStatusExporter: {enabled: true}\n  driver:\n    repository: x\n    frobnicate: 1\n"
    )
    loaded = parse_policy_text(text, "p.yaml")
    assert loaded.warnings == (
        "spec.nodeStatusExporter: accepted, ignored: not implemented; gpunode's agents serve their own "
        "/metrics",
        "spec.driver.repository: accepted, ignored: every agent runs from the one gpunode image "
        "(spec.gpunode, or --image)",
        "spec.driver.frobnicate: unknown field (ignored)",
    )
    assert loaded.unknown == ("spec.driver.frobnicate: unknown field (ignored)",)


def test_strict_accepts_nvidia_fields_and_refuses_unknown_ones_with_their_path() -> None:
    loaded = parse_policy_text(BASE + "spec:\n  validator:\n    plugin: {env: []}\n", "p.yaml", strict=True)
    assert loaded.unknown == ()
    assert loaded.warnings == (
        "spec.validator.plugin: accepted, ignored: per-check env is not split; spec.validator.env reaches "
        "every validation container",
    )
    text = BASE + "spec:\n  daemonsets:\n    tolerations:\n    - key: a\n      tolerationSecs: 5\n"
    with pytest.raises(ConfigError) as info:
        parse_policy_text(text, "p.yaml", strict=True)
    where = "spec.daemonsets.tolerations[0].tolerationSecs"
    assert f"{where}: unknown field (ignored) (--strict)" in str(info.value)


@pytest.mark.parametrize(
    "path",
    [
        "spec.validator.plugin",
        "spec.operator.initContainer",
        "spec.migManager.gpuClientsConfig",
        "spec.daemonsets.updateStrategy",
        "spec.dcgmExporter.enablePodLabels",
    ],
)
def test_fields_the_issue_names_are_accepted_under_strict(path: str) -> None:
    *parents, leaf = path.split(".")[1:]
    body = "spec:\n"
    for depth, part in enumerate(parents):
        body += "  " * (depth + 1) + f"{part}:\n"
    body += "  " * (len(parents) + 1) + f"{leaf}: {{}}\n"
    loaded = parse_policy_text(BASE + body, "p.yaml", strict=True)
    assert [w.split(":")[0] for w in loaded.warnings] == [path]


def test_sample_sets_every_field_of_nvidias_crd() -> None:
    doc = yaml.safe_load(SAMPLE.read_text(encoding="utf-8"))
    missing = [p for p, _ in leaf_paths(nvidia_spec_schema(), "spec") if not _present(doc, _parts(p))]
    assert missing == []


def test_sample_renders_under_strict_as_without_its_ignored_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = load_policy(SAMPLE, strict=True)
    assert loaded.unknown == ()
    assert all(": accepted, ignored: " in w for w in loaded.warnings)
    # The same policy with every ignored field removed renders byte for byte the same.
    doc = yaml.safe_load(SAMPLE.read_text(encoding="utf-8"))
    stripped = copy.deepcopy(doc)
    for warning in loaded.warnings:
        parts = warning.split(":")[0].split(".")
        node: Any = stripped
        for part in parts[:-1]:
            node = node[part]
        del node[parts[-1]]
    path = tmp_path / "stripped.yaml"
    path.write_text(yaml.safe_dump(stripped), encoding="utf-8")
    plain = load_policy(path, strict=True)
    assert plain.warnings == ()
    assert dump_yaml(render(plain.policy)) == dump_yaml(render(loaded.policy))
    # The command line: exit 0 under --strict, each ignored field named once on stderr.
    assert main(["--policy", str(SAMPLE), "--strict"]) == 0
    out = capsys.readouterr()
    assert out.out == dump_yaml(render(loaded.policy))
    assert out.err.count(": accepted, ignored: ") == len(loaded.warnings)


def test_unknown_field_exits_2_under_strict_with_its_yaml_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(BASE + "spec:\n  driver:\n    manager:\n      envs: []\n", encoding="utf-8")
    assert main(["--policy", str(path), "--strict"]) == 2
    assert "spec.driver.manager.envs: unknown field" in capsys.readouterr().err


def test_every_field_is_classified_with_a_reason() -> None:
    rows = field_table()
    leaves = [p for p, _ in leaf_paths(spec_schema(), "spec")]
    assert [r.path for r in rows] == leaves
    for row in rows:
        if row.honoured:
            continue
        assert row.note, row.path
        assert row.note != "not implemented by gpunode", row.path
    # gpunode's own fields are all honoured, and none of them is in NVIDIA's CRD.
    nvidia = nvidia_spec_schema()
    for path in EXTENSIONS:
        assert schema_at(nvidia, tuple(path.split(".")[1:])) is None, path
    for row in rows:
        if any(row.path == p or row.path.startswith(p + ".") for p in EXTENSIONS):
            assert row.honoured, row.path
            assert row.note == "gpunode extension", row.path


def test_every_reason_names_a_field_of_nvidias_crd() -> None:
    nvidia = nvidia_spec_schema()
    components = nvidia["properties"]
    for path in REASONS:
        parts = path.split(".")[1:]
        if parts[0] == "*":
            assert any(schema_at(c, tuple(parts[1:])) is not None for c in components.values()), path
        else:
            assert schema_at(nvidia, tuple(parts)) is not None, path


def test_every_field_the_model_declares_is_in_the_crd() -> None:
    """The other direction: the model accepts nothing the CRD would prune."""
    from gpunode.api.clusterpolicy import Spec

    def walk(model: Any, prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
        out = []
        for name, field in model.model_fields.items():
            key = field.alias or name
            path = (*prefix, key)
            out.append(path)
            annotation = field.annotation
            sub = annotation if isinstance(annotation, type) and hasattr(annotation, "model_fields") else None
            args = getattr(annotation, "__args__", ())
            if sub is None and args and hasattr(args[0], "model_fields"):
                out += walk(args[0], (*path, "[]"))
            elif sub is not None:
                out += walk(sub, path)
        return out

    schema = spec_schema()
    assert [p for p in walk(Spec, ()) if schema_at(schema, p) is None] == []


@pytest.mark.parametrize(
    ("monitor", "error"),
    [
        ("{enabled: true, interval: 30s, scrapeTimeout: 10s}", None),
        ("{enabled: true, interval: 15s, scrapeTimeout: 15s}", None),
        ("{enabled: true, interval: 1m, scrapeTimeout: 500ms}", None),
        (
            "{enabled: true, interval: 15s, scrapeTimeout: 20s}",
            "scrapeTimeout 20s is longer than interval 15s",
        ),
        ("{enabled: true, scrapeTimeout: ten}", "spec.dcgmExporter.serviceMonitor.scrapeTimeout"),
    ],
)
def test_service_monitor_scrape_timeout_is_honoured_and_checked(monitor: str, error: str | None) -> None:
    text = BASE + f"spec:\n  dcgmExporter:\n    serviceMonitor: {monitor}\n"
    if error is None:
        loaded = parse_policy_text(text, "p.yaml", strict=True)
        assert not loaded.warnings
        return
    with pytest.raises(ConfigError) as info:
        parse_policy_text(text, "p.yaml", strict=True)
    assert error in str(info.value)
    assert "p.yaml" in str(info.value)

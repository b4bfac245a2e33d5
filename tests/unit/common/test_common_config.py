"""gpunode.common.config: strict YAML models and readable, complete error reports."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import ValidationError

from gpunode.common.cli import UsageError
from gpunode.common.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    ConfigModel,
    load_config,
    max_config_bytes,
    parse_config_text,
    parse_yaml,
)
from gpunode.common.runtime import exit_code_for


class Flags(ConfigModel):
    mig_strategy: Literal["none", "single", "mixed"] = "none"
    fail_on_init_error: bool = True
    sleep_interval: float = 60.0
    device_list_strategy: tuple[str, ...] = ("envvar",)


class Resource(ConfigModel):
    name: str
    replicas: int = 1


class Config(ConfigModel):
    version: Literal["v1"]
    flags: Flags = Flags()
    resources: tuple[Resource, ...] = ()
    sharing: dict[str, Resource] = {}
    path: Path | None = None


# --------------------------------------------------------------------------------------- successes


def test_valid_file_loads_with_camel_case_keys(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\n"
        "flags:\n"
        "  migStrategy: mixed\n"
        "  failOnInitError: false\n"
        "  sleepInterval: 30\n"
        "  deviceListStrategy: [envvar, cdi-annotations]\n"
        "resources:\n"
        "  - name: nvidia.com/gpu\n"
        "    replicas: 4\n"
        "path: /etc/x\n"
    )
    config = load_config(path, Config)
    assert config.flags == Flags(
        mig_strategy="mixed",
        fail_on_init_error=False,
        sleep_interval=30.0,
        device_list_strategy=("envvar", "cdi-annotations"),
    )
    assert config.resources == (Resource(name="nvidia.com/gpu", replicas=4),)
    assert config.path == Path("/etc/x")
    assert isinstance(config.flags.sleep_interval, float)


def test_python_names_are_accepted_too() -> None:
    config = parse_config_text("version: v1\nflags: {mig_strategy: single}\n", "inline", Config)
    assert config.flags.mig_strategy == "single"


def test_models_are_frozen() -> None:
    config = parse_config_text("version: v1\n", "inline", Config)
    with pytest.raises(ValidationError):
        config.version = "v2"  # type: ignore[assignment]


def test_load_config_accepts_str_path(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\n")
    assert load_config(str(path), Config).version == "v1"


# ------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        pytest.param(
            "version: v1\nflags:\n  migStrategy: all\n",
            ['flags.migStrategy: must be one of none, single, mixed (got "all")'],
            id="literal-lists-allowed-values",
        ),
        pytest.param("version: v2\n", ['version: must be v1 (got "v2")'], id="single-literal"),
        pytest.param("{}\n", ["version: required key is missing"], id="missing-required"),
        pytest.param("", ["version: required key is missing"], id="empty-document"),
        pytest.param(
            "version: v1\nflags:\n  migStrategie: single\n",
            ["flags.migStrategie: unknown key (did you mean migStrategy?)"],
            id="unknown-key-with-suggestion",
        ),
        pytest.param("version: v1\ncolour: red\n", ["colour: unknown key"], id="unknown-top-level-key"),
        pytest.param(
            "version: v1\nflags: {failOnInitError: 'yes'}\n",
            ["flags.failOnInitError: must be a boolean (true or false), not a string"],
            id="strict-no-string-to-bool",
        ),
        pytest.param(
            "version: v1\nresources: [{name: a, replicas: '4'}]\n",
            ["resources[0].replicas: must be an integer, not a string"],
            id="strict-no-string-to-int-in-list",
        ),
        pytest.param(
            "version: v1\nflags: {sleepInterval: [1]}\n",
            ["flags.sleepInterval: must be a number, not a list"],
            id="number-got-list",
        ),
        pytest.param(
            "version: v1\nflags: []\n", ["flags: must be a mapping, not a list"], id="mapping-got-list"
        ),
        pytest.param(
            "version: v1\nsharing: {gpu: {nme: x}}\n",
            [
                "sharing.gpu.name: required key is missing",
                "sharing.gpu.nme: unknown key (did you mean name?)",
            ],
            id="dict-of-models-path",
        ),
        pytest.param(
            "version: v9\nflags:\n  migStrategy: both\n  bogus: 1\nresources:\n  - {name: 5}\n",
            [
                'version: must be v1 (got "v9")',
                'flags.migStrategy: must be one of none, single, mixed (got "both")',
                "flags.bogus: unknown key",
                "resources[0].name: must be a string, not an integer",
            ],
            id="several-errors-at-once",
        ),
    ],
)
def test_validation_problems(text: str, problems: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config_text(text, "/etc/gpunode/plugin.yaml", Config)
    assert list(err.value.problems) == problems
    assert err.value.path == "/etc/gpunode/plugin.yaml"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "version: v1\nflags: {a: 1\n", "YAML syntax error at line 3, column 1", id="unclosed-flow"
        ),
        pytest.param("version: v1\n  flags: x\n", "YAML syntax error at line 2, column 8", id="bad-indent"),
        pytest.param(
            "version: v1\nversion: v1\n", "invalid YAML at line 2, column 1: found duplicate key", id="dup"
        ),
        pytest.param(
            "- a\n- b\n", "top level must be a mapping of keys to values, not a list", id="list-top"
        ),
        pytest.param(
            "just text\n", "top level must be a mapping of keys to values, not a string", id="scalar-top"
        ),
        pytest.param(
            "version: v1\nflags: {sleepInterval: .inf}\n", "values must be finite numbers", id="infinity"
        ),
    ],
)
def test_document_problems(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config_text(text, "cfg.yaml", Config)
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(problem)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(path, Config)
    assert str(err.value) == f"{path}: file not found"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, Config)


def test_unreadable_file_reports_os_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text("version: v1\n")
    real_open = open

    def deny(file: object, *args: object, **kwargs: object) -> object:
        if file == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", deny)
    with pytest.raises(ConfigError) as err:
        load_config(path, Config)
    assert str(err.value) == f"{path}: cannot read: Permission denied"


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"version: v1\nname: caf\xe9\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config(path, Config)


def test_str_lists_one_problem_per_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\nflags: {migStrategy: x, extra: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, Config)
    assert str(err.value).splitlines() == [
        f"{path}: 2 problems:",
        '  flags.migStrategy: must be one of none, single, mixed (got "x")',
        "  flags.extra: unknown key",
    ]


def test_single_problem_is_one_line() -> None:
    err = ConfigError("a.yaml", ["x: bad"])
    assert str(err) == "a.yaml: x: bad"
    assert err.problems == ("x: bad",)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(ConfigError("a.yaml", ["x: bad"]), 2, id="config-error"),
        pytest.param(UsageError("bad flag"), 2, id="usage-error"),
        pytest.param(ExceptionGroup("g", [ConfigError("a", ["b"])]), 2, id="group-of-config-errors"),
    ],
)
def test_config_and_usage_errors_map_to_exit_2(exc: BaseException, code: int) -> None:
    assert exit_code_for(exc) == code


# ------------------------------------------------------------------------- the safe loader's limits


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "version: v1\nflags: &f {}\n", "line 2, column 8: aliases/anchors are not allowed", id="anchor"
        ),
        pytest.param("a: 1\nversion: *x\n", "line 2, column 10: aliases/anchors are not allowed", id="alias"),
        pytest.param(
            "version: v1\nbase: &b {x: 1}\nflags:\n  <<: *b\n",
            "aliases/anchors are not allowed",
            id="merge-key",
        ),
        pytest.param(
            "x: " + "[" * 65 + "]" * 65, "line 1, column 67: nested deeper than 64 levels", id="flow-depth"
        ),
        pytest.param(
            "x:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 70)), "nested deeper than 64", id="block"
        ),
        pytest.param("x: " + "1" * 4301, "line 1, column 4: integer with more than 4300 digits", id="digits"),
        pytest.param("x: 0x" + "f" * 4000, "integer with more than 4300 digits", id="hex-value"),
        pytest.param(
            "x: \x00\n", "YAML syntax error at character 4: unacceptable character #x0000", id="nul"
        ),
    ],
)
def test_loader_limits(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config_text(text, "cfg.yaml", Config)
    assert err.value.problems == (f"invalid YAML at {problem}",) or problem in err.value.problems[0]


def test_nesting_up_to_the_limit_loads() -> None:
    assert parse_yaml("x: " + "[" * 63 + "]" * 63, "cfg.yaml") == {"x": _nested(62)}
    assert parse_yaml("x: " + "1" * 4300, "cfg.yaml") == {"x": int("1" * 4300)}


def _nested(depth: int) -> list[object]:
    out: list[object] = []
    for _ in range(depth):
        out = [out]
    return out


def test_the_node_budget_scales_with_the_size_limit() -> None:
    text = "x: [" + ",".join(["1"] * 2000) + "]\n"
    with pytest.raises(ConfigError, match="more than 1000 values in one file"):
        parse_yaml(text, "cfg.yaml", max_bytes=20_000)
    assert len(parse_yaml(text, "cfg.yaml", max_bytes=100_000)["x"]) == 2000  # type: ignore[index]


def test_the_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\n" + "#" * 2000 + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, Config, max_bytes=1024)
    assert str(err.value) == (
        f"{path}: file too large: is 2013 bytes, more than the limit of 1024 bytes "
        "(GPUNODE_MAX_CONFIG_BYTES raises it)"
    )
    assert load_config(path, Config, max_bytes=4096).version == "v1"
    with pytest.raises(ConfigError, match=r"too large: more than the limit of 1024 bytes"):
        parse_config_text(path.read_text(), "configmap", Config, max_bytes=1024)
    monkeypatch.setenv("GPUNODE_MAX_CONFIG_BYTES", "1000")
    assert max_config_bytes() == 1000
    with pytest.raises(ConfigError, match="more than the limit of 1000 bytes"):
        load_config(path, Config)
    monkeypatch.setenv("GPUNODE_MAX_CONFIG_BYTES", "4_096")
    assert load_config(path, Config).version == "v1"
    monkeypatch.delenv("GPUNODE_MAX_CONFIG_BYTES")
    assert max_config_bytes() == MAX_CONFIG_BYTES == 1 << 20


@pytest.mark.parametrize("value", ["0", "-5", "lots", "1.5"])
def test_a_bad_size_limit_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("GPUNODE_MAX_CONFIG_BYTES", value)
    with pytest.raises(ConfigError) as err:
        parse_config_text("version: v1\n", "cfg.yaml", Config)
    assert err.value.path == "GPUNODE_MAX_CONFIG_BYTES"
    assert exit_code_for(err.value) == 2


def test_redacted_messages_give_position_and_kind_only() -> None:
    text = "user:\n  token: hunter2\n  : x\nkey: 'hunter2\n"
    with pytest.raises(ConfigError) as err:
        parse_yaml(text, "kubeconfig", redact=True)
    assert err.value.problems == ("YAML syntax error at line 3, column 3",)
    with pytest.raises(ConfigError) as err:
        parse_yaml("a: 1\na: hunter2\n", "kubeconfig", redact=True)
    assert err.value.problems == ("invalid YAML at line 2, column 1",)
    with pytest.raises(ConfigError) as err:
        parse_yaml("a: 1\na: hunter2\n", "kubeconfig")
    assert "duplicate key 'a'" in err.value.problems[0]


def test_at_most_20_problems_are_listed() -> None:
    err = ConfigError("a.yaml", [f"k{i}: bad" for i in range(25)])
    assert err.count == 25
    assert err.problems[-1] == "... and 5 more problems"
    assert len(err.problems) == 21
    lines = str(err).splitlines()
    assert lines[0] == "a.yaml: 25 problems:"
    assert lines[-1] == "  ... and 5 more problems"


def test_a_long_problem_is_cut() -> None:
    err = ConfigError("a.yaml", ["x" * 1500])
    assert err.problems == ("x" * 500 + "... (1000 more characters)",)


def test_a_huge_key_is_not_echoed_whole() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config_text("version: v1\n" + "k" * 100_000 + ": 1\n", "cfg.yaml", Config)
    assert len(str(err.value)) < 600

"""gpunode.common.cli: flags with env vars, the precedence function, usage errors (exit 2)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from gpunode.common.cli import (
    Flag,
    FlagSet,
    UsageError,
    add_common_flags,
    log_effective_config,
    parse_bool,
    resolve,
    values_from_model,
)
from gpunode.common.config import ConfigError, ConfigModel
from gpunode.common.logging import configure_logging, get_logger

# ------------------------------------------------------------------------------------------ parse_bool


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("True", True),
        ("1", True),
        ("yes", True),
        ("Yes", True),
        ("on", True),
        (" true ", True),
        ("false", False),
        ("FALSE", False),
        ("0", False),
        ("no", False),
        ("NO", False),
        ("off", False),
    ],
    ids=lambda v: repr(v),
)
def test_parse_bool_accepts(text: str, expected: bool) -> None:
    assert parse_bool(text) is expected


@pytest.mark.parametrize("text", ["", "maybe", "2", "y", "enabled", "truee"])
def test_parse_bool_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="true/false"):
        parse_bool(text)


# ------------------------------------------------------------------------------------------- resolve

FLAGS = (
    Flag("--level", "level", envs=("LEVEL",), default="info", choices=("debug", "info", "error")),
    Flag("--enabled", "enabled", envs=("ENABLED",), is_bool=True, default=False),
    Flag("--count", "count", envs=("COUNT", "LEGACY_COUNT"), type=int, default=3),
    Flag("--name", "name", envs=("NAME",)),
)


def _case(
    id: str,
    argv: dict[str, Any],
    env: dict[str, str],
    file: dict[str, Any] | None,
    dest: str,
    value: Any,
    source: str,
) -> Any:
    return pytest.param(argv, env, file, dest, value, source, id=id)


@pytest.mark.parametrize(
    ("argv", "env", "file", "dest", "value", "source"),
    [
        _case("default-only", {}, {}, None, "level", "info", "default"),
        _case("default-none", {}, {}, None, "name", None, "default"),
        _case("file-over-default", {}, {}, {"level": "debug"}, "level", "debug", "file"),
        _case("env-over-file", {}, {"LEVEL": "error"}, {"level": "debug"}, "level", "error", "env"),
        _case("env-over-default", {}, {"LEVEL": "error"}, None, "level", "error", "env"),
        _case(
            "flag-wins", {"level": "info"}, {"LEVEL": "error"}, {"level": "debug"}, "level", "info", "flag"
        ),
        _case("flag-over-default", {"name": "n1"}, {}, None, "name", "n1", "flag"),
        _case("empty-env-is-unset", {}, {"LEVEL": ""}, {"level": "debug"}, "level", "debug", "file"),
        _case("file-none-is-unset", {}, {}, {"level": None}, "level", "info", "default"),
        _case("env-bool-TRUE", {}, {"ENABLED": "TRUE"}, None, "enabled", True, "env"),
        _case("env-bool-yes", {}, {"ENABLED": "yes"}, None, "enabled", True, "env"),
        _case("env-bool-1", {}, {"ENABLED": "1"}, None, "enabled", True, "env"),
        _case("env-bool-No", {}, {"ENABLED": "No"}, {"enabled": True}, "enabled", False, "env"),
        _case("env-bool-0", {}, {"ENABLED": "0"}, None, "enabled", False, "env"),
        _case("file-bool-false-is-set", {}, {}, {"enabled": False}, "enabled", False, "file"),
        _case("flag-false-wins", {"enabled": False}, {"ENABLED": "1"}, None, "enabled", False, "flag"),
        _case("env-int-parsed", {}, {"COUNT": "7"}, None, "count", 7, "env"),
        _case("env-alias-used", {}, {"LEGACY_COUNT": "9"}, None, "count", 9, "env"),
        _case("env-first-name-wins", {}, {"COUNT": "5", "LEGACY_COUNT": "9"}, None, "count", 5, "env"),
        _case("file-int", {}, {}, {"count": 11}, "count", 11, "file"),
    ],
)
def test_resolve_precedence(
    argv: dict[str, Any], env: dict[str, str], file: dict[str, Any] | None, dest: str, value: Any, source: str
) -> None:
    effective, sources = resolve(FLAGS, argv, env, file)
    assert effective[dest] == value
    assert type(effective[dest]) is type(value)
    assert sources[dest] == source
    assert set(effective) == set(sources) == {f.dest for f in FLAGS}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({"ENABLED": "maybe"}, "ENABLED='maybe' (for --enabled) is invalid", id="bool"),
        pytest.param({"COUNT": "three"}, "COUNT='three' (for --count) is invalid", id="int"),
        pytest.param({"LEGACY_COUNT": "x"}, "LEGACY_COUNT='x'", id="int-alias-named"),
        pytest.param({"LEVEL": "loud"}, "must be one of debug, info, error", id="choice"),
    ],
)
def test_resolve_bad_env_value_is_usage_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match="environment variable") as err:
        resolve(FLAGS, {}, env, None)
    assert message in str(err.value)


def test_resolve_bad_env_value_ignored_when_flag_given() -> None:
    effective, sources = resolve(FLAGS, {"count": 1}, {"COUNT": "junk"}, None)
    assert (effective["count"], sources["count"]) == (1, "flag")


def test_resolve_secret_env_value_not_echoed() -> None:
    token = Flag("--token", "token", envs=("TOKEN",), type=int, secret=True)
    with pytest.raises(UsageError) as err:
        resolve([token], {}, {"TOKEN": "s3cret"}, None)
    assert "s3cret" not in str(err.value)
    assert "<redacted>" in str(err.value)


def test_resolve_is_pure() -> None:
    env = {"LEVEL": "error"}
    argv: dict[str, Any] = {"name": "x"}
    file = {"count": 4}
    resolve(FLAGS, argv, env, file)
    assert env == {"LEVEL": "error"}
    assert argv == {"name": "x"}
    assert file == {"count": 4}


# ------------------------------------------------------------------------------------------ FlagSet


def _flagset() -> FlagSet:
    flags = FlagSet(prog="gpunode-test")
    flags.add("--fail-on-init-error", env="FAIL_ON_INIT_ERROR", type=bool, default=True)
    flags.add("--interval", env="INTERVAL", type=float, default=60.0)
    flags.add("--mode", env="MODE", choices=("a", "b"), default="a")
    return flags


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param([], {}, id="nothing-given"),
        pytest.param(["--fail-on-init-error"], {"fail_on_init_error": True}, id="bool-bare"),
        pytest.param(["--no-fail-on-init-error"], {"fail_on_init_error": False}, id="bool-negated"),
        pytest.param(["--fail-on-init-error=false"], {"fail_on_init_error": False}, id="bool-eq-false"),
        pytest.param(["--fail-on-init-error=YES"], {"fail_on_init_error": True}, id="bool-eq-yes"),
        pytest.param(["--interval", "2.5"], {"interval": 2.5}, id="float"),
        pytest.param(["--interval=10"], {"interval": 10.0}, id="float-eq"),
        pytest.param(["--mode", "b"], {"mode": "b"}, id="choice"),
    ],
)
def test_flagset_parse_args_returns_only_given(argv: list[str], expected: dict[str, Any]) -> None:
    assert _flagset().parse_args(argv) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--fail-on-init-error=maybe"], "invalid value 'maybe'", id="bool-bad-value"),
        pytest.param(["--interval", "soon"], "invalid value 'soon'", id="float-bad"),
        pytest.param(["--mode", "c"], "invalid choice", id="choice-bad"),
        pytest.param(["--bogus"], "unrecognized arguments", id="unknown-flag"),
        pytest.param(["--inter", "1"], "unrecognized arguments", id="no-abbreviations"),
    ],
)
def test_flagset_bad_argv_exits_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _flagset().parse(argv, environ={})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "gpunode-test: error:" in err
    assert message in err


def test_flagset_bad_env_exits_2_naming_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _flagset().parse([], environ={"INTERVAL": "soon"})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: gpunode-test" in err
    assert "environment variable INTERVAL='soon' (for --interval) is invalid" in err


def test_flagset_bad_env_raises_without_exit() -> None:
    with pytest.raises(UsageError, match="FAIL_ON_INIT_ERROR"):
        _flagset().parse([], environ={"FAIL_ON_INIT_ERROR": "perhaps"}, exit_on_error=False)


def test_flagset_declaring_twice_is_an_error() -> None:
    flags = _flagset()
    with pytest.raises(ValueError, match="declared twice"):
        flags.add("--mode", dest="mode")


def test_help_lists_env_vars_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    flags = _flagset()
    add_common_flags(flags)
    with pytest.raises(SystemExit) as exit_info:
        flags.parse_args(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in (
        "$FAIL_ON_INIT_ERROR",
        "(default: true)",
        "$LOG_FORMAT",
        "$NVIDIA_DRIVER_ROOT",
        "(default: /)",
    ):
        assert text in out
    assert "--no-fail-on-init-error" in out


# ------------------------------------------------------------------------------------- common flags


@pytest.mark.parametrize(
    ("dest", "env", "raw", "value"),
    [
        pytest.param("log_format", "LOG_FORMAT", "console", "console", id="LOG_FORMAT"),
        pytest.param("log_level", "LOG_LEVEL", "DEBUG", "debug", id="LOG_LEVEL-case"),
        pytest.param("log_level", "LOG_LEVEL", "warn", "warning", id="LOG_LEVEL-warn"),
        pytest.param("node_name", "NODE_NAME", "gpu-node-7", "gpu-node-7", id="NODE_NAME"),
        pytest.param("simulate", "GPUNODE_SIMULATE", "dgx-a100", "dgx-a100", id="GPUNODE_SIMULATE"),
        pytest.param("sim_state", "GPUNODE_SIM_STATE", "/tmp/s.json", "/tmp/s.json", id="GPUNODE_SIM_STATE"),
        pytest.param(
            "driver_root", "NVIDIA_DRIVER_ROOT", "/run/nvidia/driver", "/run/nvidia/driver", id="DRIVER_ROOT"
        ),
        pytest.param("config_file", "CONFIG_FILE", "/etc/x.yaml", "/etc/x.yaml", id="CONFIG_FILE"),
    ],
)
def test_common_flags_read_their_env_vars(dest: str, env: str, raw: str, value: str) -> None:
    flags = FlagSet(prog="agent")
    add_common_flags(flags)
    settings = flags.parse([], environ={env: raw})
    assert settings[dest] == value
    assert settings.sources[dest] == "env"


def test_common_flags_defaults() -> None:
    flags = FlagSet(prog="agent")
    add_common_flags(flags)
    settings = flags.parse([], environ={})
    assert settings.values == {
        "log_format": None,
        "log_level": "info",
        "node_name": None,
        "simulate": None,
        "sim_state": None,
        "driver_root": "/",
        "config_file": None,
    }
    assert set(settings.sources.values()) == {"default"}
    assert settings.config is None


def test_common_flags_without_config_file() -> None:
    flags = FlagSet(prog="agent")
    add_common_flags(flags, config_file=False)
    assert "config_file" not in flags.flags
    with pytest.raises(SystemExit):
        flags.parse_args(["--config-file", "x"])


def test_common_flag_log_format_rejects_other_values() -> None:
    flags = FlagSet(prog="agent")
    add_common_flags(flags)
    with pytest.raises(UsageError, match="must be one of json, console"):
        flags.parse([], environ={"LOG_FORMAT": "xml"}, exit_on_error=False)


# ------------------------------------------------------------------------------ with a config file


class _Flags(ConfigModel):
    mig_strategy: Literal["none", "single", "mixed"] | None = None
    fail_on_init_error: bool = True  # a model default must not shadow the flag's default


class _Config(ConfigModel):
    version: Literal["v1"]
    flags: _Flags = _Flags()


def _plugin_flags() -> FlagSet:
    flags = FlagSet(prog="gpunode-device-plugin")
    add_common_flags(flags)
    flags.add(
        "--mig-strategy",
        env="MIG_STRATEGY",
        choices=("none", "single", "mixed"),
        default="none",
        file_key="flags.migStrategy",
    )
    flags.add(
        "--fail-on-init-error",
        env="FAIL_ON_INIT_ERROR",
        type=bool,
        default=False,
        file_key="flags.fail_on_init_error",
    )
    return flags


@pytest.mark.parametrize(
    ("yaml_text", "argv", "env", "expected", "source"),
    [
        pytest.param("version: v1\nflags: {migStrategy: mixed}\n", [], {}, "mixed", "file", id="file"),
        pytest.param("version: v1\n", [], {}, "none", "default", id="file-without-key"),
        pytest.param(
            "version: v1\nflags: {migStrategy: mixed}\n",
            [],
            {"MIG_STRATEGY": "single"},
            "single",
            "env",
            id="env-over-file",
        ),
        pytest.param(
            "version: v1\nflags: {migStrategy: mixed}\n",
            ["--mig-strategy", "none"],
            {"MIG_STRATEGY": "single"},
            "none",
            "flag",
            id="flag-over-env",
        ),
    ],
)
def test_parse_with_config_file(
    tmp_path: Path, yaml_text: str, argv: list[str], env: dict[str, str], expected: str, source: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml_text)
    settings = _plugin_flags().parse(argv, environ={**env, "CONFIG_FILE": str(path)}, config_model=_Config)
    assert settings["mig_strategy"] == expected
    assert settings.sources["mig_strategy"] == source
    assert settings.config is not None
    assert settings.config.version == "v1"
    # the model's own default (True) was not written in the file, so the flag default (False) stands
    assert (settings["fail_on_init_error"], settings.sources["fail_on_init_error"]) == (False, "default")


def test_parse_config_file_from_flag(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\nflags:\n  failOnInitError: true\n")
    settings = _plugin_flags().parse(["--config-file", str(path)], environ={}, config_model=_Config)
    assert (settings["fail_on_init_error"], settings.sources["fail_on_init_error"]) == (True, "file")
    assert settings.sources["config_file"] == "flag"


def test_parse_invalid_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: all\n")
    with pytest.raises(SystemExit) as exit_info:
        _plugin_flags().parse(["--config-file", str(path)], environ={}, config_model=_Config)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert str(path) in err
    assert "flags.migStrategy: must be one of none, single, mixed" in err


def test_parse_missing_config_file_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        _plugin_flags().parse(
            [],
            environ={"CONFIG_FILE": str(tmp_path / "nope.yaml")},
            config_model=_Config,
            exit_on_error=False,
        )


def test_values_from_model_only_counts_keys_written_in_the_file() -> None:
    flags = _plugin_flags().flags.values()
    written = _Config.model_validate({"version": "v1", "flags": {"migStrategy": "single"}})
    assert values_from_model(flags, written) == {"mig_strategy": "single"}
    assert values_from_model(flags, _Config(version="v1")) == {}
    assert values_from_model(flags, None) == {}


# ----------------------------------------------------------------------------- effective config log


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("json", "info", "test-agent", "node-a", stream=stream)
    yield stream
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_gpunode_handler", False):
            root.removeHandler(handler)


def test_log_effective_config_is_one_json_event(log_stream: io.StringIO) -> None:
    flags = FlagSet(prog="agent")
    add_common_flags(flags)
    token = flags.add("--token", env="TOKEN", secret=True)
    settings = flags.parse(["--log-level", "debug"], environ={"TOKEN": "hunter2", "NODE_NAME": "n1"})
    log_effective_config(settings.values, settings.sources, flags=[token], log=get_logger("t"))
    lines = log_stream.getvalue().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["event"] == "effective_config"
    assert event["agent"] == "test-agent"
    assert event["config"]["log_level"] == "debug"
    assert event["config"]["node_name"] == "n1"
    assert event["config"]["token"] == "<redacted>"
    assert event["sources"] == {
        "log_format": "default",
        "log_level": "flag",
        "node_name": "env",
        "simulate": "default",
        "sim_state": "default",
        "driver_root": "default",
        "config_file": "default",
        "token": "env",
    }
    assert "hunter2" not in log_stream.getvalue()


def test_log_effective_config_renders_paths_as_strings(log_stream: io.StringIO) -> None:
    log_effective_config({"p": Path("/x/y"), "t": ("a", 1)}, {"p": "default", "t": "file"})
    event = json.loads(log_stream.getvalue())
    assert event["config"] == {"p": "/x/y", "t": ["a", 1]}
    assert event["logger"] == "gpunode.config"


def test_a_bool_flag_named_no_something_is_positive() -> None:
    from gpunode.common.cli import FlagSet

    f = FlagSet(prog="x")
    f.add("--no-timestamp", type=bool, default=False)
    assert f.parse_args(["--no-timestamp"]) == {"no_timestamp": True}
    assert f.parse_args(["--no-no-timestamp"]) == {"no_timestamp": False}
    assert f.parse_args(["--no-timestamp=false"]) == {"no_timestamp": False}

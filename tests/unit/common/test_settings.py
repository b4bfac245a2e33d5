"""Typed settings: one declaration per field, flag > env > file > default, groups flattened."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass

import pytest

from gpunode.common.errors import UsageError
from gpunode.common.settings import (
    CommonSettings,
    KubeSettings,
    SettingsParser,
    flags_of,
    flat_values,
    group,
    resolve,
    setting,
)


@dataclass(frozen=True)
class Demo:
    common: CommonSettings = group(CommonSettings)
    strategy: str = setting(
        "--strategy", env=("STRATEGY", "OLD_STRATEGY"), choices=("a", "b"), default="a", file_key="flags.s"
    )
    count: int = setting("--count", env="COUNT", type=int, default=3)
    on: bool = setting("--on", env="ON", type=bool, default=False, aliases=("--enable",))
    token: str | None = setting("--token", env="TOKEN", secret=True)
    kube: KubeSettings = group(KubeSettings, help={"namespace": "where the demo writes"})


@pytest.mark.parametrize(
    ("argv", "env", "file", "want", "source"),
    [
        pytest.param({}, {}, {}, "a", "default", id="default"),
        pytest.param({}, {}, {"strategy": "b"}, "b", "file", id="file-over-default"),
        pytest.param({}, {"STRATEGY": "b"}, {"strategy": "a"}, "b", "env", id="env-over-file"),
        pytest.param({}, {"OLD_STRATEGY": "b"}, {}, "b", "env", id="second-env-name"),
        pytest.param({}, {"STRATEGY": ""}, {"strategy": "b"}, "b", "file", id="empty-env-is-unset"),
        pytest.param({"strategy": "a"}, {"STRATEGY": "b"}, {"strategy": "b"}, "a", "flag", id="flag-wins"),
    ],
)
def test_precedence(
    argv: dict[str, str], env: dict[str, str], file: dict[str, str], want: str, source: str
) -> None:
    settings, sources = resolve(Demo, argv, env, file)
    assert settings.strategy == want
    assert sources["strategy"] == source


def test_groups_are_built_typed_and_frozen() -> None:
    settings, sources = resolve(Demo, {}, {"COUNT": "7", "NODE_NAME": "n1", "KUBE_API_TIMEOUT": "2.5"})
    assert settings.count == 7
    assert settings.common.node_name == "n1"
    assert settings.kube.kube_api_timeout == 2.5
    assert sources["node_name"] == "env"
    with pytest.raises(FrozenInstanceError):
        settings.count = 1  # type: ignore[misc]


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(UsageError, match=r"COUNT='x' \(for --count\) is invalid"):
        resolve(Demo, {}, {"COUNT": "x"})


def test_flags_keep_declaration_order_with_groups_in_place() -> None:
    options = [f.option for f in flags_of(Demo)]
    assert options[:6] == [
        "--log-format",
        "--log-level",
        "--node-name",
        "--simulate",
        "--sim-state",
        "--driver-root",
    ]
    assert options[6:] == [
        "--strategy",
        "--count",
        "--on",
        "--token",
        "--kubeconfig",
        "--namespace",
        "--kube-api-timeout",
    ]


def test_group_help_override_applies_to_that_class_only() -> None:
    by_dest = {f.dest: f for f in flags_of(Demo)}
    assert by_dest["namespace"].help == "where the demo writes"
    assert {f.dest: f for f in flags_of(KubeSettings)}["namespace"].help.startswith(
        "namespace of the objects"
    )


def test_parser_bool_forms_and_aliases() -> None:
    parser = SettingsParser(Demo, prog="demo")
    assert parser.parse(["--on"], {}).settings.on is True
    assert parser.parse(["--on=false"], {"ON": "true"}).settings.on is False
    assert parser.parse(["--enable"], {}).settings.on is True
    parsed = parser.parse(["--no-on"], {"ON": "true"})
    assert (parsed.settings.on, parsed.sources["on"]) == (False, "flag")


def test_parser_extra_alias_maps_to_field() -> None:
    parser = SettingsParser(Demo, prog="demo", aliases={"--nvidia-driver-root": "driver_root"})
    assert parser.parse(["--nvidia-driver-root", "/d"], {}).settings.common.driver_root == "/d"


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    parser = SettingsParser(Demo, prog="demo")
    with pytest.raises(SystemExit) as exc:
        parser.parse(["--strategy", "z"], {})
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_flat_values_has_one_key_per_flag() -> None:
    settings, _ = resolve(Demo, {"token": "s3cret"}, {})
    flat = flat_values(settings)
    assert set(flat) == {f.dest for f in flags_of(Demo)}
    assert flat["token"] == "s3cret"


def test_effective_config_redacts_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    from gpunode.common.logging import configure_logging

    configure_logging("json", "info", agent="demo")
    parser = SettingsParser(Demo, prog="demo")
    parser.parse(["--token", "s3cret"], {}).log_effective_config()
    err = capsys.readouterr().err
    assert "effective_config" in err
    assert "s3cret" not in err
    assert "<redacted>" in err


def test_undeclared_field_is_refused() -> None:
    @dataclass(frozen=True)
    class Bad:
        plain: int = 3

    with pytest.raises(TypeError, match=r"Bad\.plain: declare it with setting\(\) or group\(\)"):
        flags_of(Bad)

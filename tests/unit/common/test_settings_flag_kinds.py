"""Typed settings: required flags, plain switches, repeatable flags, the default shown in --help, aliases
listed after a group, and parser options (what gpunode render, gpunode-validator and gpunode-toolkit need)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from gpunode.common.settings import SettingsParser, group, setting


@dataclass(frozen=True)
class Inner:
    path: str = setting("--path", env="THE_PATH", default="/p", help="a path")
    root: str = setting("--root", default="/", help="a root")


@dataclass(frozen=True)
class Kinds:
    policy: str = setting("--policy", required=True, metavar="FILE", help="needed")
    strict: bool = setting("--strict", type=bool, default=False, negatable=False, default_help="", help="s")
    wait: tuple[str, ...] = setting("--wait", env="WAITS", repeatable=True, metavar="X", help="repeatable")
    dirs: tuple[str, ...] = setting(
        "--dirs", type=lambda t: tuple(t.split(",")), default=("a", "b"), default_help="a,b", help="d"
    )
    output: str = setting("--output", short="-o", default="-", default_help="", help="where")
    inner: Inner = group(Inner, aliases={"--old-path": "path"})
    last: int = setting("--last", type=int, default=1, help="after the group")


def parser(**kwargs: object) -> SettingsParser[Kinds]:
    return SettingsParser(Kinds, prog="kinds", **kwargs)  # type: ignore[arg-type]


def test_required_flag_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse([], {})
    assert exc.value.code == 2
    assert "the following arguments are required: --policy" in capsys.readouterr().err


def test_plain_switch_has_no_negation(capsys: pytest.CaptureFixture[str]) -> None:
    assert parser().parse(["--policy", "p", "--strict"], {}).settings.strict is True
    assert parser().parse(["--policy", "p"], {}).settings.strict is False
    with pytest.raises(SystemExit):
        parser().parse(["--policy", "p", "--no-strict"], {})
    with pytest.raises(SystemExit):
        parser().parse(["--policy", "p", "--strict=true"], {})
    assert "ignored explicit argument 'true'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "want", "source"),
    [
        pytest.param([], {}, (), "default", id="default-empty"),
        pytest.param(["--wait", "a", "--wait", "b,c"], {"WAITS": "x"}, ("a", "b,c"), "flag", id="flags"),
        pytest.param([], {"WAITS": "a, ,b ,"}, ("a", "b"), "env", id="env-comma-list"),
    ],
)
def test_repeatable(argv: list[str], env: dict[str, str], want: tuple[str, ...], source: str) -> None:
    parsed = parser().parse(["--policy", "p", *argv], env)
    assert parsed.settings.wait == want
    assert parsed.sources["wait"] == source


def test_help_texts_and_alias_order(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse(["--help"], {})
    out = " ".join(capsys.readouterr().out.split())
    assert "--strict s " in out  # no "(default: false)", no --no-strict
    assert "--no-strict" not in out
    assert "repeatable [env $WAITS, comma list] " in out  # no "(default: ())"
    assert "d (default: a,b)" in out
    assert "-o OUTPUT, --output OUTPUT where " in out
    assert out.index("--root") < out.index("--old-path") < out.index("--last")
    assert parser().parse(["--policy", "p", "--old-path", "/q"], {}).settings.inner.path == "/q"


def test_parser_options_and_an_existing_parser() -> None:
    abbreviating = parser(allow_abbrev=True, formatter_class=argparse.HelpFormatter)
    assert abbreviating.parse(["--pol", "p"], {}).settings.policy == "p"
    top = argparse.ArgumentParser(prog="top")
    sub = top.add_subparsers(dest="command").add_parser("kinds")
    on_sub = SettingsParser(Kinds, prog="unused", parser=sub)
    args = vars(top.parse_args(["kinds", "--policy", "p", "--last", "5"]))
    settings, sources = on_sub.resolve(args, {}, None)
    assert (settings.policy, settings.last, sources["last"], sources["output"]) == ("p", 5, "flag", "default")

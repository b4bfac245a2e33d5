"""The shared HTTP settings group: per-use defaults and metavars, --http-address and its default host."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpunode.common.errors import UsageError
from gpunode.common.settings import (
    CommonSettings,
    HttpSettings,
    SettingsParser,
    flags_of,
    group,
    listen_address,
    resolve,
    setting,
)


@dataclass(frozen=True)
class Plugin:
    common: CommonSettings = group(CommonSettings)
    http: HttpSettings = group(HttpSettings, defaults={"http_port": 9451})
    after: int = setting("--after", type=int, default=1)


@dataclass(frozen=True)
class Manager:
    http: HttpSettings = group(
        HttpSettings,
        defaults={"http_port": 9453},
        help={"http_port": "/healthz /readyz /metrics; -1: off"},
        metavars={"http_port": "HTTP_PORT"},
    )


def test_each_use_has_its_own_default_port() -> None:
    assert resolve(Plugin, {}, {})[0].http.http_port == 9451
    assert resolve(Manager, {}, {})[0].http.http_port == 9453
    assert Plugin().http.http_port == 9451  # the dataclass default too
    assert Manager().http == HttpSettings(http_port=9453)
    assert HttpSettings().http_port == -1  # the group's own default: off
    assert [f.default for f in flags_of(Plugin) if f.dest == "http_port"] == [9451]


def test_the_override_stays_with_its_use() -> None:
    plugin = {f.dest: f for f in flags_of(Plugin)}
    manager = {f.dest: f for f in flags_of(Manager)}
    assert plugin["http_port"].help == "port of /healthz, /readyz and /metrics (0: any free port, -1: off)"
    assert manager["http_port"].help == "/healthz /readyz /metrics; -1: off"
    assert plugin["http_address"].help == manager["http_address"].help


def test_flags_in_place_address_right_before_port() -> None:
    dests = [f.dest for f in flags_of(Plugin)]
    assert dests[-3:] == ["http_address", "http_port", "after"]


def test_help_lines() -> None:
    manager = SettingsParser(Manager, prog="m").flagset.parser.format_help()
    assert "--http-port HTTP_PORT" in manager
    plugin = " ".join(SettingsParser(Plugin, prog="p").flagset.parser.format_help().split())
    assert "--http-port PORT" in plugin
    assert "(default: 9451)" in plugin
    assert "--http-address ADDRESS" in plugin
    assert "$GPUNODE_HTTP_ADDRESS" in plugin


@pytest.mark.parametrize(
    ("argv", "env", "address", "host"),
    [
        pytest.param({}, {}, None, "0.0.0.0", id="pod"),
        pytest.param({}, {"INVOCATION_ID": "x"}, None, "127.0.0.1", id="systemd"),
        pytest.param({}, {"GPUNODE_HTTP_ADDRESS": "10.0.0.7"}, "10.0.0.7", "10.0.0.7", id="env"),
        pytest.param(
            {"http_address": "::1"},
            {"GPUNODE_HTTP_ADDRESS": "10.0.0.7", "INVOCATION_ID": "x"},
            "::1",
            "::1",
            id="flag-over-env",
        ),
        pytest.param(
            {}, {"GPUNODE_HTTP_ADDRESS": "0.0.0.0", "INVOCATION_ID": "x"}, "0.0.0.0", "0.0.0.0", id="sd"
        ),
    ],
)
def test_listen_host(argv: dict[str, str], env: dict[str, str], address: str | None, host: str) -> None:
    settings, _ = resolve(Plugin, argv, env)
    assert settings.http.http_address == address
    assert settings.http.listen_host(env) == host


def test_the_flag_on_the_command_line() -> None:
    parsed = SettingsParser(Plugin, prog="p").parse(["--http-address", "[::]", "--http-port", "0"], {})
    assert parsed.settings.http == HttpSettings(http_address="::", http_port=0)
    assert parsed.sources["http_address"] == "flag"


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0"),
        ("::", "::"),
        ("[::1]", "::1"),
        ("fe80:0:0::1", "fe80::1"),
        ("localhost", "localhost"),
        ("node-1.example.com", "node-1.example.com"),
    ],
)
def test_listen_address_accepts(raw: str, want: str) -> None:
    assert listen_address(raw) == want


@pytest.mark.parametrize(
    "raw", ["", "300.1.1.1", "127.0.0.1:9451", "host name", "-bad.example", "a" * 64, "--host=x"]
)
def test_listen_address_refuses(raw: str) -> None:
    with pytest.raises(ValueError, match="not an IP address or host name"):
        listen_address(raw)


def test_bad_env_address_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="GPUNODE_HTTP_ADDRESS"):
        resolve(Plugin, {}, {"GPUNODE_HTTP_ADDRESS": "1.2.3.4:80"})


def test_unknown_override_field_is_refused() -> None:
    with pytest.raises(TypeError, match="unknown fields"):
        group(HttpSettings, defaults={"port": 1})

"""Every YAML loader function, in process, against hostile files: the usual error (a ConfigError naming
the file and the line, or the loader's own error type), never a hang, a RecursionError or a traceback."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpunode.api.clusterpolicy import load_policy, parse_policy_text
from gpunode.api.gpu_clients import load_gpu_clients
from gpunode.api.mig_config import load_spec, parse_spec
from gpunode.api.mig_hooks import load_hooks, parse_hooks
from gpunode.api.plugin_config import PluginConfig
from gpunode.common.config import load_config, parse_config_text, parse_yaml, read_config_text
from gpunode.common.errors import ConfigError, UsageError
from helpers.hostile import INPUTS, TOKEN, kubeconfig_syntax_error

QUICK = 2.0  # seconds; in process every case but the 50,000-item list takes milliseconds


def _text(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # non-UTF-8 input: only the file loaders see it


FILE_LOADERS: dict[str, Callable[[Path], object]] = {
    "load_config": lambda p: load_config(p, PluginConfig),
    "load_spec (mig -f)": load_spec,
    "load_hooks (mig -k)": load_hooks,
    "load_gpu_clients": load_gpu_clients,
    "load_policy (render)": load_policy,
}
TEXT_LOADERS: dict[str, Callable[[str, str], object]] = {
    "parse_yaml": parse_yaml,
    "parse_config_text": lambda t, s: parse_config_text(t, s, PluginConfig),
    "parse_spec": parse_spec,
    "parse_hooks": parse_hooks,
    "parse_policy_text": parse_policy_text,
}


@pytest.mark.parametrize("loader", list(FILE_LOADERS))
@pytest.mark.parametrize("hostile", list(INPUTS))
def test_file_loaders_raise_config_error(tmp_path: Path, loader: str, hostile: str) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(INPUTS[hostile]())
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        FILE_LOADERS[loader](path)
    assert time.monotonic() - start < QUICK
    assert err.value.path == str(path)
    assert len(err.value.problems) == 1


@pytest.mark.parametrize("loader", list(TEXT_LOADERS))
@pytest.mark.parametrize("hostile", [h for h in INPUTS if h != "non-utf8"])
def test_text_loaders_raise_config_error(loader: str, hostile: str) -> None:
    text = INPUTS[hostile]().decode()
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        TEXT_LOADERS[loader](text, "configmap/key")
    assert time.monotonic() - start < QUICK
    assert err.value.path == "configmap/key"
    problem = err.value.problems[0]
    assert "line " in problem or "too large" in problem, problem


def test_read_config_text_reads_no_more_than_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a" * 5000)
    with pytest.raises(ConfigError, match="file too large: is 5000 bytes, more than the limit of 4096 bytes"):
        read_config_text(path, max_bytes=4096)
    assert read_config_text(path, max_bytes=5000) == "a" * 5000


@pytest.mark.parametrize("hostile", list(INPUTS))
def test_kubeconfig_is_a_usage_error(tmp_path: Path, hostile: str) -> None:
    from gpunode.kube.client import load_kubeconfig

    path = tmp_path / "kubeconfig"
    path.write_bytes(INPUTS[hostile]())
    start = time.monotonic()
    with pytest.raises(UsageError, match=f"kubeconfig {path} is not usable"):
        load_kubeconfig(str(path))
    assert time.monotonic() - start < QUICK


def test_kubeconfig_error_names_position_and_kind_only(tmp_path: Path) -> None:
    from gpunode.kube.client import load_kubeconfig

    path = tmp_path / "kubeconfig"
    path.write_bytes(kubeconfig_syntax_error())
    with pytest.raises(UsageError) as err:
        load_kubeconfig(str(path))
    assert str(err.value) == f"kubeconfig {path} is not usable: YAML syntax error at line 9, column 42"
    assert TOKEN not in str(err.value)


@pytest.mark.parametrize("hostile", list(INPUTS))
def test_cdi_spec_loaders(tmp_path: Path, hostile: str) -> None:
    from gpunode.toolkit.cdi import load_spec as load_cdi_spec
    from gpunode.validator.checks import parse_cdi_spec

    path = tmp_path / "nvidia.yaml"
    path.write_bytes(INPUTS[hostile]())
    with pytest.raises(ValueError, match=str(path)):
        load_cdi_spec(path)
    if hostile != "non-utf8":  # the validator reads text (a decoding error is reported there)
        spec = parse_cdi_spec(path, _text(path))
        assert spec.error is not None
        assert spec.error.startswith(f"cannot parse {path}: ")


def test_a_deeply_nested_json_cdi_spec_is_an_error(tmp_path: Path) -> None:
    from gpunode.toolkit.cdi import load_spec as load_cdi_spec

    path = tmp_path / "nvidia.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        load_cdi_spec(path)


# ------------------------------------------------------------------------------- bounds on what a file says


def test_mig_counts_beyond_any_gpu_are_refused_at_load() -> None:
    for count in ("50000000", "2000000000", "1e23"):
        text = (
            "version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n"
            f"    mig-devices: {{1g.5gb: {count}}}\n"
        )
        start = time.monotonic()
        with pytest.raises(ConfigError, match=r'mig-configs\.x\[0\]\.mig-devices: "1g\.5gb": '):
            parse_spec(text, "mig.yaml")
        assert time.monotonic() - start < QUICK
    with pytest.raises(ConfigError, match=r'"1g\.5gb": 8 is more than any GPU holds'):
        parse_spec(text.replace("1e23", "8"), "mig.yaml")
    assert parse_spec(text.replace("1e23", "7"), "mig.yaml").configs["x"][0].mig_devices == {"1g.5gb": 7}


# Parsing the 50,000-item YAML list alone takes about 1 s on these machines (a loaded CI run saw 2.2 s);
# a duplicate check that compared every pair would take minutes. The bound tells the two apart.
LINEAR_50K = 15.0


def test_a_long_list_of_repeated_gpu_indices_is_checked_quickly() -> None:
    devices = ",".join(["0"] * 50_000)
    text = f"version: v1\nmig-configs:\n  x:\n  - devices: [{devices}]\n    mig-enabled: false\n"
    start = time.monotonic()
    with pytest.raises(ConfigError, match="lists GPU 0 more than once"):
        parse_spec(text, "mig.yaml")
    assert time.monotonic() - start < LINEAR_50K


def test_thousands_of_problems_are_listed_20_then_counted() -> None:
    keys = "".join(f"  unknown{i}: 1\n" for i in range(5000))
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        parse_config_text(f"version: v1\nflags:\n{keys}", "plugin.yaml", PluginConfig)
    assert time.monotonic() - start < QUICK
    assert err.value.count == 5000
    assert len(err.value.problems) == 21
    assert err.value.problems[-1] == "... and 4980 more problems"
    assert str(err.value).startswith("plugin.yaml: 5000 problems:\n  flags.unknown0: unknown key")

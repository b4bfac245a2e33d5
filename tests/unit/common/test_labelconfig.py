"""gpunode.common.labelconfig: which named config a node label selects, and listing a ConfigMap mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpunode.common.labelconfig import (
    DEFAULT_FALLBACKS,
    Selection,
    is_config_name,
    list_configs,
    parse_fallback_strategies,
    select_config,
)

WHERE = "/available-configs"
NAMED_SINGLE = ("named", "single")

# (files present, label value, default config, fallbacks) -> (chosen name, source, error or None)
CASES = [
    # the label wins when it names a file
    pytest.param(
        ("default", "big"), "big", None, NAMED_SINGLE, "big", "label", None, id="label-names-a-file"
    ),
    pytest.param(
        ("default", "big"), "big", "default", NAMED_SINGLE, "big", "label", None, id="label-beats-default"
    ),
    pytest.param(("only",), "only", None, (), "only", "label", None, id="label-needs-no-fallbacks"),
    # no label: default config, then the fallbacks in order
    pytest.param(("default", "big"), None, None, NAMED_SINGLE, "default", "named", None, id="no-label-named"),
    pytest.param(("default", "big"), "", None, NAMED_SINGLE, "default", "named", None, id="empty-label"),
    pytest.param(
        ("a", "big"), None, "big", NAMED_SINGLE, "big", "default-config", None, id="no-label-default-config"
    ),
    pytest.param(("solo",), None, None, NAMED_SINGLE, "solo", "single", None, id="single-file"),
    pytest.param(
        ("default", "solo"), None, None, ("single", "named"), "default", "named", None, id="order-matters"
    ),
    pytest.param(("solo",), None, None, ("named",), None, None, "no node label", id="named-only-no-default"),
    pytest.param(("a", "b"), None, None, ("single", "empty"), None, "empty", None, id="empty-fallback"),
    pytest.param(("a", "b"), None, None, ("empty", "named"), None, "empty", None, id="empty-first"),
    pytest.param(
        ("a", "b"),
        None,
        None,
        NAMED_SINGLE,
        None,
        None,
        "no config selected in /available-configs: no node label, fallbacks named, single matched "
        "nothing (have: a, b)",
        id="nothing-matches",
    ),
    pytest.param((), None, None, NAMED_SINGLE, None, None, "have: no config files", id="empty-directory"),
    pytest.param((), None, None, (), None, None, "no fallbacks", id="no-fallbacks-at-all"),
    # a label naming a missing file: reported, and the rest of the chain still chooses
    pytest.param(
        ("default", "small"),
        "big",
        None,
        NAMED_SINGLE,
        "default",
        "named",
        'config "big" not found in /available-configs (have: default, small)',
        id="missing-label-falls-back-named",
    ),
    pytest.param(
        ("small",),
        "big",
        None,
        NAMED_SINGLE,
        "small",
        "single",
        'config "big" not found in /available-configs (have: small)',
        id="missing-label-falls-back-single",
    ),
    pytest.param(
        ("a", "b"),
        "big",
        None,
        NAMED_SINGLE,
        None,
        None,
        'config "big" not found in /available-configs (have: a, b); fallbacks named, single matched nothing',
        id="missing-label-nothing-else",
    ),
    pytest.param(
        ("a", "b"),
        "big",
        None,
        ("empty",),
        None,
        "empty",
        'config "big" not found in /available-configs (have: a, b)',
        id="missing-label-empty",
    ),
    # a default config naming a missing file: reported, fallbacks still apply
    pytest.param(
        ("default", "a"),
        None,
        "gone",
        NAMED_SINGLE,
        "default",
        "named",
        'default config "gone" not found in /available-configs (have: a, default)',
        id="missing-default-config",
    ),
    pytest.param(
        ("default",),
        "nope",
        "gone",
        NAMED_SINGLE,
        "default",
        "named",
        'config "nope" not found in /available-configs (have: default); '
        'default config "gone" not found in /available-configs (have: default)',
        id="missing-label-and-default-config",
    ),
    # ConfigMap internals and hidden files are never configs, not even when a label names them
    pytest.param(
        ("..data", "..2026_01_01_00_00_00.000000001", ".hidden", "solo"),
        None,
        None,
        NAMED_SINGLE,
        "solo",
        "single",
        None,
        id="internals-ignored-for-single",
    ),
    pytest.param(
        ("..data", "default"),
        "..data",
        None,
        NAMED_SINGLE,
        "default",
        "named",
        'config "..data" not found in /available-configs (have: default)',
        id="label-naming-internals",
    ),
    pytest.param(
        ("Default",), None, None, ("named",), None, None, "matched nothing", id="named-is-case-sensitive"
    ),
]


@pytest.mark.parametrize(
    ("files", "label", "default", "fallbacks", "name", "source", "error"),
    CASES,
)
def test_select_config(
    files: tuple[str, ...],
    label: str | None,
    default: str | None,
    fallbacks: tuple[str, ...],
    name: str | None,
    source: str | None,
    error: str | None,
) -> None:
    got = select_config(files, label, default_config=default, fallbacks=fallbacks, where=WHERE)
    assert (got.name, got.source) == (name, source), got.why
    assert got.chosen is (source is not None)
    if error is None:
        assert got.error is None
    else:
        assert got.error is not None
        assert error in got.error
        assert "\n" not in got.error  # reported in a node annotation: one line
    assert got.why


def test_select_config_is_pure_and_deterministic() -> None:
    files = ["b", "default", "a"]
    first = select_config(files, "x", where=WHERE)
    assert files == ["b", "default", "a"]  # input untouched
    assert select_config(reversed(files), "x", where=WHERE) == first  # type: ignore[arg-type]
    assert first == Selection(first.name, first.source, first.why, first.error)


def test_default_fallbacks_are_named_then_single() -> None:
    assert DEFAULT_FALLBACKS == ("named", "single")
    assert select_config(["solo"], None).source == "single"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("named,single", ("named", "single")),
        (" named , single ,", ("named", "single")),
        ("EMPTY", ("empty",)),
        ("single,named,single", ("single", "named")),
        ("", ()),
        (["named", "empty"], ("named", "empty")),
    ],
)
def test_parse_fallback_strategies(text: str | list[str], expected: tuple[str, ...]) -> None:
    assert parse_fallback_strategies(text) == expected


def test_parse_fallback_strategies_names_the_bad_one() -> None:
    with pytest.raises(ValueError, match=r"'newest'.*named, single, empty"):
        parse_fallback_strategies("named,newest")


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("default", True),
        ("time-sliced.yaml", True),
        ("a", True),
        ("..data", False),
        ("..data_tmp", False),
        ("..2026_05_01_12_00_00.123456789", False),
        (".hidden", False),
        ("", False),
        ("a/b", False),
    ],
)
def test_is_config_name(name: str, ok: bool) -> None:
    assert is_config_name(name) is ok


def configmap_mount(root: Path, files: dict[str, str], stamp: str = "..2026_01_01_00_00_00.1") -> Path:
    """A directory laid out as the kubelet lays out a ConfigMap volume."""
    root.mkdir(exist_ok=True)
    (root / stamp).mkdir()
    for name, text in files.items():
        (root / stamp / name).write_text(text)
    os.symlink(stamp, root / "..data")
    for name in files:
        os.symlink(f"..data/{name}", root / name)
    return root


def test_list_configs_in_a_configmap_mount(tmp_path: Path) -> None:
    mount = configmap_mount(tmp_path / "cm", {"default": "version: v1\n", "sliced": "version: v1\n"})
    (mount / ".dotfile").write_text("x")
    (mount / "subdir").mkdir()
    (mount / "subdir" / "inner").write_text("x")
    os.symlink("..data/gone", mount / "dangling")
    assert list_configs(mount) == ("default", "sliced")


def test_list_configs_in_a_plain_directory(tmp_path: Path) -> None:
    for name in ("zeta", "alpha", "mid"):
        (tmp_path / name).write_text("version: v1\n")
    os.symlink(tmp_path / "alpha", tmp_path / "link-to-alpha")
    assert list_configs(tmp_path) == ("alpha", "link-to-alpha", "mid", "zeta")


def test_list_configs_of_a_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No such file"):
        list_configs(tmp_path / "absent")


def test_listing_feeds_selection(tmp_path: Path) -> None:
    mount = configmap_mount(tmp_path / "cm", {"small": "version: v1\n"})
    got = select_config(list_configs(mount), "big", where=mount)
    assert (got.name, got.source) == ("small", "single")
    assert got.error == f'config "big" not found in {mount} (have: small)'

"""gpunode.api.mig_config: the mig-parted v1 config file, strictly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpunode.api.mig_config import (
    DeviceFilter,
    MigEntry,
    UnknownConfig,
    load_spec,
    parse_device_filter,
    parse_spec,
)
from gpunode.common.errors import ConfigError
from helpers.migspec import EXAMPLE, one_config


def problems(text: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse_spec(text, "mig.yaml")
    assert info.value.path == "mig.yaml"
    return info.value.problems


# ----------------------------------------------------------------------------------------- parsing


def test_example_parses_in_file_order() -> None:
    spec = parse_spec(EXAMPLE, "mig.yaml")
    assert list(spec.configs) == [
        "all-disabled",
        "all-enabled",
        "all-balanced",
        "custom-config",
        "per-model",
        "board",
        "split",
    ]
    custom = spec.select("custom-config")
    assert [e.path for e in custom] == [f"mig-configs.custom-config[{i}]" for i in range(3)]
    assert custom[0] == MigEntry("mig-configs.custom-config[0]", (0, 1, 2, 3), (), False, {})
    assert custom[2].mig_devices == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}  # the zero count dropped
    assert spec.select("all-enabled")[0].mig_devices == {}
    assert spec.select("all-enabled")[0].mig_enabled is True
    per_model = spec.select("per-model")
    assert per_model[0].filters == (DeviceFilter(0x20B2, 0x10DE), DeviceFilter(0x20B5, 0x10DE))
    assert per_model[1].filters == (DeviceFilter(0x20B0, 0x10DE),)
    assert spec.select("board")[0].filters == (DeviceFilter(0x20B5, 0x10DE, 0x1533, 0x10DE),)
    assert spec.select("split")[0].mig_devices == {"1c.3g.20gb": 6, "1g.5gb+me": 1}


def test_json_is_accepted() -> None:
    doc = {
        "version": "v1",
        "mig-configs": {"a": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}}]},
    }
    spec = parse_spec(json.dumps(doc), "mig.json")
    assert spec.select(None) == (MigEntry("mig-configs.a[0]", (0,), (), True, {"7g.40gb": 1}),)


def test_profile_keys_are_canonical() -> None:
    text = one_config('devices: all\nmig-enabled: true\nmig-devices: {"1c.1g.5gb": 3, "1g.5gb+me": 1}')
    assert parse_spec(text, "x").select("custom")[0].mig_devices == {"1g.5gb": 3, "1g.5gb+me": 1}


def test_zero_counts_never_make_layouts_differ() -> None:
    a = one_config('devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 7, "2g.10gb": 0}')
    b = one_config('devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 7}')
    assert parse_spec(a, "x").configs == parse_spec(b, "x").configs


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 1}\ndevice-filter: ["0x20B0"]',
            "mig-configs.custom[0].device-filter[0]: "
            "0x20B0 is not a PCI ID (expected 0xDDDDVVVV[:0xSSSSWWWW])",
            id="short-filter",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 1}\ndevice-filter: "20B010DE"',
            "mig-configs.custom[0].device-filter[0]: 20B010DE is not a PCI ID",
            id="filter-without-0x",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 1}\n'
            'device-filter: ["0x20B010DE", "0x20B510DE:0x1533"]',
            "mig-configs.custom[0].device-filter[1]: 0x20B510DE:0x1533 is not a PCI ID",
            id="short-subsystem",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 1}\ndevice-filter: 0x20B010DE',
            'mig-configs.custom[0].device-filter[0]: must be a quoted string such as "0x20B010DE"',
            id="unquoted-filter",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 1}\ndevice-filter: {a: 1}',
            "mig-configs.custom[0].device-filter: must be a PCI ID string or a list of them",
            id="filter-mapping",
        ),
        pytest.param(
            "devices: some\nmig-enabled: false",
            'mig-configs.custom[0].devices: must be "all" or a list of GPU indices',
            id="devices-word",
        ),
        pytest.param(
            "devices: [0, -1, true]\nmig-enabled: false",
            'mig-configs.custom[0].devices: must be "all" or a list of GPU indices (non-negative integers): '
            "[1] is -1, [2] is true",
            id="devices-negative",
        ),
        pytest.param(
            "devices: [1, 1]\nmig-enabled: false",
            "mig-configs.custom[0].devices: lists GPU 1 more than once",
            id="devices-repeated",
        ),
        pytest.param(
            "mig-enabled: false", "mig-configs.custom[0].devices: required key is missing", id="no-devices"
        ),
        pytest.param(
            "devices: all", "mig-configs.custom[0].mig-enabled: required key is missing", id="no-mode"
        ),
        pytest.param(
            'devices: all\nmig-enabled: "true"',
            "mig-configs.custom[0].mig-enabled: must be a boolean (true or false), not a string",
            id="mode-string",
        ),
        pytest.param(
            "devices: all\nmig-enabled: true",
            "mig-configs.custom[0].mig-devices: required when mig-enabled is true",
            id="enabled-without-devices",
        ),
        pytest.param(
            'devices: all\nmig-enabled: false\nmig-devices: {"1g.5gb": 1}',
            "mig-configs.custom[0].mig-devices: must be absent or empty when mig-enabled is false",
            id="disabled-with-devices",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 0}',
            "mig-configs.custom[0].mig-devices: every count is 0; use {} for MIG enabled without MIG devices",
            id="all-zero",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g5gb": 1}',
            "mig-configs.custom[0].mig-devices: '1g5gb' is not a MIG profile",
            id="bad-profile",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"2c.1g.5gb": 1}',
            "mig-configs.custom[0].mig-devices: "
            "'2c.1g.5gb': compute slices (2c) exceed the GPU instance (1g)",
            id="ci-bigger-than-gi",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": -1}',
            'mig-configs.custom[0].mig-devices: "1g.5gb": the count must be a non-negative integer, not -1',
            id="negative-count",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 1.5}',
            'mig-configs.custom[0].mig-devices: "1g.5gb": the count must be a non-negative integer, not 1.5',
            id="fractional-count",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"2g.10gb": 1, "2c.2g.10gb": 1}',
            'mig-configs.custom[0].mig-devices: "2g.10gb" and "2c.2g.10gb" name the same profile; merge them',
            id="same-profile-twice",
        ),
        pytest.param(
            'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb+me,gfx": 1, "1g.5gb+gfx,me": 1}',
            'mig-configs.custom[0].mig-devices: "1g.5gb+me,gfx" and "1g.5gb+gfx,me" name the same profile',
            id="same-attributes-reordered",
        ),
        pytest.param(
            "devices: all\nmig-enabled: true\nmig-devices: [1g.5gb]",
            "mig-configs.custom[0].mig-devices: must be a mapping of MIG profile to count, not a list",
            id="devices-list",
        ),
        pytest.param(
            "devices: all\nmig_enabled: false",
            "mig-configs.custom[0].mig_enabled: unknown key",
            id="underscore-key",
        ),
        pytest.param(
            "devices: all\nmig-enabled: false\nmig-devies: {}",
            "mig-configs.custom[0].mig-devies: unknown key",
            id="typo-key",
        ),
    ],
)
def test_entry_problems(entry: str, expected: str) -> None:
    found = problems(one_config(entry))
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "", ["version: required key is missing", "mig-configs: required key is missing"], id="empty"
        ),
        pytest.param(
            "version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}",
            ['version: must be v1 (got "v2")'],
            id="version",
        ),
        pytest.param("version: v1\nmig-configs: {}", ["mig-configs: must define at least"], id="no-configs"),
        pytest.param(
            "version: v1\nmig-configs: {a: []}",
            ["mig-configs.a: must list at least one entry"],
            id="empty-list",
        ),
        pytest.param(
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false}]}\nextra: 1",
            ["extra: unknown key"],
            id="top-level-key",
        ),
        pytest.param("- a\n- b\n", ["top level must be a mapping"], id="top-level-list"),
        pytest.param("version: v1\nversion: v1\n", ["found duplicate key 'version'"], id="duplicate-key"),
        pytest.param("version: [v1\n", ["YAML syntax error"], id="syntax"),
    ],
)
def test_document_problems(text: str, expected: list[str]) -> None:
    found = problems(text)
    for want in expected:
        assert any(want in p for p in found), found


def test_every_problem_is_reported_at_once() -> None:
    text = one_config(
        'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 1}\ndevice-filter: ["0x20B0", "bad"]',
        "devices: [-1]\nmig-enabled: true",
        "devices: all\nmig-enabled: false\nflavour: x",
    )
    found = problems(text)
    assert found == (
        "mig-configs.custom[0].device-filter[0]: 0x20B0 is not a PCI ID (expected 0xDDDDVVVV[:0xSSSSWWWW])",
        "mig-configs.custom[0].device-filter[1]: bad is not a PCI ID (expected 0xDDDDVVVV[:0xSSSSWWWW])",
        "mig-configs.custom[1].devices: "
        'must be "all" or a list of GPU indices (non-negative integers): [0] is -1',
        "mig-configs.custom[1].mig-devices: "
        "required when mig-enabled is true ({} means MIG on without devices)",
        "mig-configs.custom[2].flavour: unknown key",
    )
    with pytest.raises(ConfigError) as info:
        parse_spec(text, "mig.yaml")
    assert str(info.value).startswith("mig.yaml: 5 problems:")


def test_load_spec_reads_files_and_names_them(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(EXAMPLE)
    spec = load_spec(path)
    assert spec.source == str(path)
    assert len(spec.configs) == 7
    with pytest.raises(ConfigError) as info:
        load_spec(tmp_path / "missing.yaml")
    assert info.value.problems == ("file not found",)
    bad = tmp_path / "bad.yaml"
    bad.write_text(one_config("devices: all"))
    with pytest.raises(ConfigError) as info:
        load_spec(bad)
    assert info.value.path == str(bad)


def test_select() -> None:
    spec = parse_spec(EXAMPLE, "cm/config.yaml")
    assert spec.select("all-disabled")[0].mig_enabled is False
    with pytest.raises(UnknownConfig) as info:
        spec.select("all-1g.5gbb")
    assert info.value.name == "all-1g.5gbb"
    assert info.value.available[:2] == ("all-disabled", "all-enabled")
    assert str(info.value) == (
        'unknown MIG config "all-1g.5gbb" in cm/config.yaml; the configs are: '
        "all-disabled, all-enabled, all-balanced, custom-config, per-model, board, split"
    )
    with pytest.raises(UnknownConfig, match="no MIG config selected"):
        spec.select(None)
    single = parse_spec(one_config("devices: all\nmig-enabled: false"), "x")
    assert single.select(None) == single.select("custom")


# ------------------------------------------------------------------------------------------ filters


@pytest.mark.parametrize(
    ("text", "expected", "shown"),
    [
        ("0x20B010DE", DeviceFilter(0x20B0, 0x10DE), "0x20B010DE"),
        ("0x20b010de", DeviceFilter(0x20B0, 0x10DE), "0x20B010DE"),
        ("0X20B010DE", DeviceFilter(0x20B0, 0x10DE), "0x20B010DE"),
        (" 0x20B510DE:0x153310de ", DeviceFilter(0x20B5, 0x10DE, 0x1533, 0x10DE), "0x20B510DE:0x153310DE"),
    ],
)
def test_parse_device_filter(text: str, expected: DeviceFilter, shown: str) -> None:
    assert parse_device_filter(text) == expected
    assert str(expected) == shown


@pytest.mark.parametrize(
    "text", ["", "0x20B0", "20B010DE", "0x20B010DEFF", "0x20B010DE:", "0x20B010DE:0x1533", "0xGGGG10DE"]
)
def test_malformed_filters(text: str) -> None:
    with pytest.raises(ValueError, match="is not a PCI ID"):
        parse_device_filter(text)


@pytest.mark.parametrize(
    ("flt", "device_id", "subsystem_id", "matches"),
    [
        ("0x20B510DE", 0x20B510DE, 0x153310DE, True),
        ("0x20B510DE", 0x20B510DE, 0x145F10DE, True),  # no subsystem part: every board
        ("0x20B510DE:0x153310DE", 0x20B510DE, 0x153310DE, True),
        ("0x20B510DE:0x153310DE", 0x20B510DE, 0x145F10DE, False),
        ("0x20B510DE:0x153310DE", 0x20B010DE, 0x153310DE, False),
        ("0x20B010DE", 0x20B510DE, 0x153310DE, False),
    ],
)
def test_filter_matching(flt: str, device_id: int, subsystem_id: int, matches: bool) -> None:
    assert parse_device_filter(flt).matches(device_id, subsystem_id) is matches

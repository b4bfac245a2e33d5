"""gpunode.mig.layouts: the shipped default layouts, generate-config, export and rendering."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest

from gpunode.api.mig_config import GpuIdentity, MigSpec, parse_spec
from gpunode.api.mig_profiles import parse_profile
from gpunode.mig.layouts import (
    GENERATED_HEADER,
    NoProfilesDiscovered,
    config_name,
    default_spec,
    export,
    generate,
    render,
)
from gpunode.mig.selection import desired_per_gpu
from gpunode.nvml import mig
from gpunode.nvml.api import GiProfile, Placement
from gpunode.sim.nvml import presets
from gpunode.sim.nvml.presets import Product

# The GPU Operator's default MIG config names (shared/reference/mig.md §4), in its order.
OPERATOR_NAMES = [
    "all-disabled",
    "all-enabled",
    "all-1g.5gb",
    "all-1g.5gb.me",
    "all-2g.10gb",
    "all-3g.20gb",
    "all-4g.20gb",
    "all-7g.40gb",
    "all-1g.24gb.gfx",
    "all-1g.24gb.me.all",
    "all-1g.24gb-me",
    "all-2g.48gb",
    "all-2g.48gb.gfx",
    "all-2g.48gb.me.all",
    "all-2g.48gb-me",
    "all-4g.96gb",
    "all-4g.96gb.gfx",
    "all-1g.10gb",
    "all-1g.10gb.me",
    "all-1g.20gb",
    "all-1g.23gb",
    "all-1g.23gb.me",
    "all-1g.24gb.me",
    "all-2g.20gb",
    "all-3g.40gb",
    "all-4g.40gb",
    "all-7g.80gb",
    "all-1g.6gb",
    "all-1g.6gb.me",
    "all-2g.12gb",
    "all-2g.12gb.me",
    "all-4g.24gb",
    "all-1g.12gb",
    "all-1g.12gb.me",
    "all-1g.24gb",
    "all-1g.45gb",
    "all-1g.47gb",
    "all-2g.24gb",
    "all-2g.45gb",
    "all-2g.47gb",
    "all-3g.47gb",
    "all-4g.47gb",
    "all-7g.94gb",
    "all-3g.48gb",
    "all-3g.90gb",
    "all-3g.93gb",
    "all-3g.95gb",
    "all-4g.48gb",
    "all-4g.90gb",
    "all-4g.93gb",
    "all-4g.95gb",
    "all-7g.96gb",
    "all-7g.180gb",
    "all-7g.186gb",
    "all-7g.189gb",
    "all-balanced",
    "all-1g.18gb",
    "all-1g.18gb.me",
    "all-1g.35gb",
    "all-2g.35gb",
    "all-3g.71gb",
    "all-4g.71gb",
    "all-7g.141gb",
    "all-1g.36gb",
    "all-2g.36gb",
    "all-3g.72gb",
    "all-4g.72gb",
    "all-7g.144gb",
    "all-1g.34gb",
    "all-1g.34gb.me",
    "all-1g.67gb",
    "all-2g.67gb",
    "all-3g.135gb",
    "all-4g.135gb",
    "all-7g.269gb",
    "all-1g.35gb.me",
    "all-1g.70gb",
    "all-2g.70gb",
    "all-3g.139gb",
    "all-4g.139gb",
    "all-7g.278gb",
]

A100_40 = 0x20B010DE
A100_80 = 0x20B210DE
A100_80_PCIE = 0x20B510DE
H100 = 0x233010DE
H200 = 0x233510DE
A30 = 0x20B710DE
T4 = 0x1EB810DE
GB300 = 0x31C210DE

Node = list[tuple[GpuIdentity, list[GiProfile]]]


def gi_profiles(product: Product) -> list[GiProfile]:
    """What NVML reports for a simulated product (names computed the way go-nvlib does)."""
    total = product.memory_mib * 2**20
    return [
        GiProfile(
            enum=spec.enum,
            id=spec.profile_id,
            name=mig.gi_profile_name(spec.enum, total, spec.memory_mib),
            slices=spec.compute_slices,
            instance_count=spec.max_count,
            sm_count=spec.sm_count,
            memory_mib=spec.memory_mib,
            copy_engines=spec.copy_engines,
            decoders=spec.decoders,
            encoders=spec.encoders,
            jpeg=spec.jpeg,
            ofa=spec.ofa,
            placements=tuple(Placement(start, spec.memory_slices) for start in spec.starts),
        )
        for spec in product.gi_profiles
    ]


def identity(index: int, product: Product) -> GpuIdentity:
    return GpuIdentity(
        index, product.pci_device_id, product.pci_subsystem_id, product.name, product.mig_capable
    )


def node_of(*products: Product) -> Node:
    return [(identity(i, p), gi_profiles(p)) for i, p in enumerate(products)]


def preset_node(name: str) -> Node:
    return node_of(*(slot.product for slot in presets.PRESETS[name].gpus))


def gpus(node: Node) -> list[GpuIdentity]:
    return [gpu for gpu, _ in node]


def layout_for(spec: MigSpec, name: str, gpu: GpuIdentity) -> dict[str, int] | None:
    chosen = desired_per_gpu(name, spec.select(name), [gpu])
    return dict(chosen[gpu.index].devices) if gpu.index in chosen else None


def entry_summary(spec: MigSpec, name: str) -> list[tuple[list[str], dict[str, int]]]:
    return [([str(f) for f in e.filters], dict(e.mig_devices)) for e in spec.select(name)]


# ------------------------------------------------------------------------------------ default config


def test_default_config_has_the_operator_names() -> None:
    assert len(OPERATOR_NAMES) == 81
    spec = default_spec()
    assert list(spec.configs) == OPERATOR_NAMES


def test_default_config_shape() -> None:
    spec = default_spec()
    assert entry_summary(spec, "all-disabled") == [([], {})]
    assert spec.select("all-disabled")[0].mig_enabled is False
    assert entry_summary(spec, "all-enabled") == [([], {})]
    assert spec.select("all-enabled")[0].mig_enabled is True
    for name, entries in spec.configs.items():
        assert all(e.devices == "all" for e in entries), name
        if name.startswith("all-") and name not in ("all-disabled", "all-enabled", "all-balanced"):
            # the name is the profile (`+` written as `.`), the one profile the entries ask for
            profiles = {p for e in entries for p in e.mig_devices}
            assert len(profiles) == 1, name
            assert config_name(profiles.pop()) == name
    filtered = sorted(name for name, entries in spec.configs.items() if any(e.filters for e in entries))
    assert filtered == ["all-1g.10gb", "all-1g.35gb", "all-balanced"]


@pytest.mark.parametrize(
    ("pci_id", "expected"),
    [
        pytest.param(A100_40, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}, id="A100-40GB"),
        pytest.param(0x20F610DE, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}, id="A800-40GB"),
        pytest.param(A100_80, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, id="A100-80GB"),
        pytest.param(A100_80_PCIE, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, id="A100-80GB-PCIe"),
        pytest.param(H100, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, id="H100"),
        pytest.param(H200, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}, id="H200"),
        pytest.param(0x233B10DE, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}, id="H200-NVL"),
        pytest.param(A30, {"1g.6gb": 2, "2g.12gb": 1}, id="A30"),
        pytest.param(0x232110DE, {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}, id="H100-NVL"),
        pytest.param(0x290110DE, {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}, id="B200"),
        pytest.param(0x294110DE, {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}, id="GB200"),
        pytest.param(0x2BB510DE, {"1g.24gb": 2, "2g.48gb": 1}, id="RTX-PRO-6000"),
    ],
)
def test_default_all_balanced(pci_id: int, expected: dict[str, int]) -> None:
    gpu = GpuIdentity(0, pci_id, 0x000010DE, "GPU", True)
    assert layout_for(default_spec(), "all-balanced", gpu) == expected


@pytest.mark.parametrize(
    ("name", "pci_id", "expected"),
    [
        pytest.param("all-1g.10gb", A100_40, {"1g.10gb": 4}, id="1g.10gb-A100-40GB"),
        pytest.param("all-1g.10gb", A100_80, {"1g.10gb": 7}, id="1g.10gb-A100-80GB"),
        pytest.param("all-1g.10gb", H100, {"1g.10gb": 7}, id="1g.10gb-H100"),
        pytest.param("all-1g.35gb", H200, {"1g.35gb": 4}, id="1g.35gb-H200"),
        pytest.param("all-1g.35gb", GB300, {"1g.35gb": 7}, id="1g.35gb-GB300"),
        pytest.param("all-1g.5gb", A100_40, {"1g.5gb": 7}, id="unfiltered"),
        pytest.param("all-1g.24gb.me.all", 0x2BB510DE, {"1g.24gb+me.all": 1}, id="me.all"),
        pytest.param("all-1g.24gb-me", 0x2BB510DE, {"1g.24gb-me": 4}, id="no-me"),
    ],
)
def test_default_filtered_names(name: str, pci_id: int, expected: dict[str, int]) -> None:
    gpu = GpuIdentity(0, pci_id, 0x000010DE, "GPU", True)
    assert layout_for(default_spec(), name, gpu) == expected


@pytest.mark.parametrize(
    "preset",
    [
        "dgx-a100",
        "dgx-a100-80gb",
        "dgx-h100",
        "hgx-h200",
        "a30x4",
        "mixed",
        "h100-nvl",
        "dgx-b200",
        "gb200-nvl4",
    ],
)
def test_generated_layouts_agree_with_the_defaults(preset: str) -> None:
    """Every config generate-config writes for a simulated node is in the defaults, with the same layout."""
    node = preset_node(preset)
    generated = generate(node)
    defaults = default_spec()
    for name in generated.configs:
        assert name in defaults.configs, name
        for gpu in gpus(node):
            if gpu.mig_capable:
                assert layout_for(generated, name, gpu) == layout_for(defaults, name, gpu), (name, gpu.index)


# -------------------------------------------------------------------------------------------- generate

GENERATED_NAMES = {
    "dgx-a100": [
        "all-disabled",
        "all-enabled",
        "all-balanced",
        "all-1g.5gb",
        "all-1g.5gb.me",
        "all-1g.10gb",
        "all-2g.10gb",
        "all-3g.20gb",
        "all-4g.20gb",
        "all-7g.40gb",
    ],
    "hgx-h200": [
        "all-disabled",
        "all-enabled",
        "all-balanced",
        "all-1g.18gb",
        "all-1g.18gb.me",
        "all-1g.35gb",
        "all-2g.35gb",
        "all-3g.71gb",
        "all-4g.71gb",
        "all-7g.141gb",
    ],
    "dgx-b200": [
        "all-disabled",
        "all-enabled",
        "all-balanced",
        "all-1g.23gb",
        "all-1g.23gb.me",
        "all-1g.45gb",
        "all-2g.45gb",
        "all-3g.90gb",
        "all-4g.90gb",
        "all-7g.180gb",
    ],
    "gb200-nvl4": [
        "all-disabled",
        "all-enabled",
        "all-balanced",
        "all-1g.23gb",
        "all-1g.23gb.me",
        "all-1g.47gb",
        "all-2g.47gb",
        "all-3g.93gb",
        "all-4g.93gb",
        "all-7g.186gb",
    ],
    "a30x4": [
        "all-disabled",
        "all-enabled",
        "all-balanced",
        "all-1g.6gb",
        "all-1g.6gb.me",
        "all-2g.12gb",
        "all-2g.12gb.me",
        "all-4g.24gb",
    ],
    "mixed": [
        "all-disabled",
        "all-enabled",
        "all-balanced",
        "all-1g.10gb",
        "all-1g.10gb.me",
        "all-1g.20gb",
        "all-2g.20gb",
        "all-3g.40gb",
        "all-4g.40gb",
        "all-7g.80gb",
    ],
}

GENERATED_LAYOUTS = {
    "dgx-a100": {
        "all-balanced": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        "all-1g.5gb": {"1g.5gb": 7},
        "all-1g.5gb.me": {"1g.5gb+me": 1},
        "all-1g.10gb": {"1g.10gb": 4},
        "all-7g.40gb": {"7g.40gb": 1},
    },
    "hgx-h200": {
        "all-balanced": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
        "all-1g.18gb.me": {"1g.18gb+me": 1},
        "all-1g.35gb": {"1g.35gb": 4},
        "all-3g.71gb": {"3g.71gb": 2},  # 70.5 rounds away from zero, as Go does
        "all-4g.71gb": {"4g.71gb": 1},
    },
    "dgx-b200": {
        "all-balanced": {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1},
        "all-1g.23gb": {"1g.23gb": 7},
        "all-1g.23gb.me": {"1g.23gb+me": 1},
        "all-1g.45gb": {"1g.45gb": 4},
        "all-7g.180gb": {"7g.180gb": 1},
    },
    "gb200-nvl4": {
        "all-balanced": {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1},
        "all-1g.47gb": {"1g.47gb": 4},  # 46.5 rounds away from zero, as Go does
        "all-2g.47gb": {"2g.47gb": 3},
        "all-7g.186gb": {"7g.186gb": 1},
    },
    "a30x4": {
        "all-balanced": {"1g.6gb": 2, "2g.12gb": 1},
        "all-1g.6gb": {"1g.6gb": 4},
        "all-2g.12gb.me": {"2g.12gb+me": 1},
    },
    "mixed": {
        "all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        "all-1g.10gb": {"1g.10gb": 7},
        "all-1g.20gb": {"1g.20gb": 4},
    },
}


@pytest.mark.parametrize("preset", sorted(GENERATED_NAMES))
def test_generate_on_presets(preset: str) -> None:
    spec = generate(preset_node(preset))
    assert list(spec.configs) == GENERATED_NAMES[preset]
    for name, entries in spec.configs.items():
        assert len(entries) == 1, name  # one MIG-capable GPU type: one entry, no filter
        assert entries[0].filters == (), name
        assert entries[0].devices == "all", name
    for name, layout in GENERATED_LAYOUTS[preset].items():
        assert entry_summary(spec, name) == [([], layout)], name
    assert spec.select("all-disabled")[0].mig_enabled is False
    assert entry_summary(spec, "all-enabled") == [([], {})]


def test_generate_skips_gpus_without_mig() -> None:
    spec = generate(preset_node("mixed"))  # 2x A100 80GB PCIe + 2x T4
    chosen = desired_per_gpu("all-balanced", spec.select("all-balanced"), gpus(preset_node("mixed")))
    assert sorted(chosen) == [0, 1]
    only_t4 = generate(preset_node("t4x4"))
    assert list(only_t4.configs) == ["all-disabled", "all-enabled"]


def test_generate_a30_uses_fixed_counts() -> None:
    (gpu, profiles), *_ = preset_node("a30x4")
    misreported = [dataclasses.replace(p, instance_count=1) for p in profiles]  # NVML's A30 mistake
    spec = generate([(gpu, misreported)])
    assert entry_summary(spec, "all-1g.6gb") == [([], {"1g.6gb": 4})]
    assert entry_summary(spec, "all-2g.12gb") == [([], {"2g.12gb": 2})]


def test_generate_filters_when_gpu_types_differ() -> None:
    node = node_of(presets.A100_SXM4_40GB, presets.A100_SXM4_40GB, presets.H100_SXM5_80GB, presets.TESLA_T4)
    spec = generate(node)
    assert entry_summary(spec, "all-balanced") == [
        (["0x20B010DE"], {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        (["0x233010DE"], {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
    ]
    # the same name with different counts: one entry per count
    assert entry_summary(spec, "all-1g.10gb") == [
        (["0x20B010DE"], {"1g.10gb": 4}),
        (["0x233010DE"], {"1g.10gb": 7}),
    ]
    assert entry_summary(spec, "all-7g.80gb") == [(["0x233010DE"], {"7g.80gb": 1})]
    assert entry_summary(spec, "all-disabled") == [([], {})]
    chosen = desired_per_gpu("all-1g.10gb", spec.select("all-1g.10gb"), gpus(node))
    assert {i: dict(d.devices) for i, d in chosen.items()} == {
        0: {"1g.10gb": 4},
        1: {"1g.10gb": 4},
        2: {"1g.10gb": 7},
    }


def test_generate_merges_types_with_equal_counts() -> None:
    node = node_of(presets.A100_SXM4_80GB, presets.H100_SXM5_80GB)
    spec = generate(node)
    assert entry_summary(spec, "all-1g.10gb") == [(["0x20B210DE", "0x233010DE"], {"1g.10gb": 7})]
    assert entry_summary(spec, "all-balanced") == [
        (["0x20B210DE", "0x233010DE"], {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
    ]


def test_generate_is_deterministic() -> None:
    node = node_of(presets.H200_SXM_141GB, presets.A30, presets.A100_SXM4_40GB)
    assert render(generate(node)) == render(generate(list(reversed(node))))


def test_generate_without_profiles() -> None:
    gpu = identity(0, presets.H200_SXM_141GB)
    with pytest.raises(NoProfilesDiscovered, match="GPU 0 \\(NVIDIA H200\\)"):
        generate([(gpu, [])])


# ----------------------------------------------------------------------------------------------- render


@pytest.mark.parametrize("preset", ["dgx-a100", "hgx-h200", "a30x4", "mixed"])
def test_render_round_trips(preset: str) -> None:
    spec = generate(preset_node(preset))
    text = render(spec)
    assert text.startswith("# generated by gpunode-mig generate-config")
    assert "DO NOT EDIT" in text.splitlines()[1]
    assert text.startswith(GENERATED_HEADER)
    assert parse_spec(text, "generated.yaml").configs == spec.configs
    assert parse_spec(render(spec, "json"), "generated.json").configs == spec.configs


def test_render_filters_and_indices() -> None:
    node = node_of(presets.A100_SXM4_40GB, presets.H100_SXM5_80GB)
    spec = generate(node)
    text = render(spec)
    assert '    - device-filter: "0x20B010DE"\n      devices: all\n' in text
    assert parse_spec(text, "x").configs == spec.configs
    exported = export(
        [(gpus(node)[0], True, {"7g.40gb": 1}), (gpus(node)[1], False, {})],
        label="odd label: 1",
    )
    exported_text = render(exported)
    assert not exported_text.startswith("#")
    assert '"odd label: 1":' in exported_text
    assert parse_spec(exported_text, "x").configs == exported.configs


def test_render_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="yaml or json"):
        render(generate(preset_node("a30x4")), "toml")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- export

BALANCED_40 = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


def states_of(
    node: Node, layouts: Sequence[Mapping[str, int] | None]
) -> list[tuple[GpuIdentity, bool, Mapping[str, int]]]:
    """None: MIG disabled."""
    return [
        (gpu, layout is not None, dict(layout or {})) for gpu, layout in zip(gpus(node), layouts, strict=True)
    ]


def summary(spec: MigSpec, label: str = "current") -> list[tuple[object, list[str], bool, dict[str, int]]]:
    return [
        (e.devices, [str(f) for f in e.filters], e.mig_enabled, dict(e.mig_devices))
        for e in spec.select(label)
    ]


EXPORT_CASES = [
    pytest.param(
        [presets.A100_SXM4_40GB] * 8,
        [BALANCED_40] * 8,
        [("all", [], True, BALANCED_40)],
        id="uniform",
    ),
    pytest.param(
        [presets.A100_SXM4_40GB] * 4,
        [BALANCED_40, BALANCED_40, None, None],
        [((0, 1), [], True, BALANCED_40), ((2, 3), [], False, {})],
        id="one-type-two-states",
    ),
    pytest.param(
        [presets.A100_SXM4_40GB] * 3,
        [{"1g.5gb": 7}, None, {"1g.5gb": 7}],
        [((0, 2), [], True, {"1g.5gb": 7}), ((1,), [], False, {})],
        id="merge-non-adjacent",
    ),
    pytest.param(
        [presets.A100_PCIE_80GB, presets.A100_PCIE_80GB, presets.TESLA_T4, presets.TESLA_T4],
        [{"7g.80gb": 1}, {"7g.80gb": 1}, None, None],
        [("all", ["0x20B510DE"], True, {"7g.80gb": 1}), ("all", ["0x1EB810DE"], False, {})],
        id="mixed-node",
    ),
    pytest.param(
        [presets.A100_SXM4_40GB, presets.H100_SXM5_80GB],
        [None, None],
        [("all", [], False, {})],
        id="single-entry-drops-filter",
    ),
    pytest.param(
        [presets.A100_SXM4_40GB, presets.A100_SXM4_40GB, presets.H100_SXM5_80GB, presets.H100_SXM5_80GB],
        [None, {"7g.40gb": 1}, None, None],
        [((0, 2, 3), ["0x20B010DE", "0x233010DE"], False, {}), ((1,), ["0x20B010DE"], True, {"7g.40gb": 1})],
        id="two-types-partial",
    ),
    pytest.param(
        [presets.A100_SXM4_40GB, presets.A100_SXM4_40GB],
        [{"1c.1g.5gb": 2, "2g.10gb": 0, "1g.5gb+me": 1}, {"1g.5gb+me": 1, "1g.5gb": 2}],
        [("all", [], True, {"1g.5gb": 2, "1g.5gb+me": 1})],
        id="canonical-names-and-zero-counts",
    ),
]


@pytest.mark.parametrize(("products", "layouts", "expected"), EXPORT_CASES)
def test_export(
    products: list[Product],
    layouts: list[Mapping[str, int] | None],
    expected: list[tuple[object, list[str], bool, dict[str, int]]],
) -> None:
    node = node_of(*products)
    states = states_of(node, layouts)
    spec = export(states)
    assert summary(spec) == expected
    # what it says reads back and selects exactly the live state
    again = parse_spec(render(spec), "export.yaml")
    assert again.configs == spec.configs
    chosen = desired_per_gpu("current", again.select("current"), gpus(node))
    live = {
        gpu.index: dict(devices) if enabled else {} for gpu, enabled, devices in states if gpu.mig_capable
    }
    assert {i: dict(d.devices) for i, d in chosen.items()} == {
        i: {str(parse_profile(k)): v for k, v in d.items() if v} for i, d in live.items()
    }


def test_export_label_and_order() -> None:
    node = node_of(*[presets.A100_SXM4_40GB] * 2)
    states = states_of(node, [None, BALANCED_40])
    spec = export(list(reversed(states)), label="before-upgrade")
    assert list(spec.configs) == ["before-upgrade"]
    assert summary(spec, "before-upgrade") == [((0,), [], False, {}), ((1,), [], True, BALANCED_40)]
    assert spec.select("before-upgrade")[1].path == "mig-configs.before-upgrade[1]"


def test_export_gpu_without_mig_counts_as_disabled() -> None:
    node = node_of(presets.TESLA_T4)
    assert summary(export([(gpus(node)[0], True, {"1g.5gb": 1})])) == [("all", [], False, {})]


def test_export_nothing() -> None:
    with pytest.raises(ValueError, match="no GPUs"):
        export([])

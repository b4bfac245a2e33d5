"""gpunode.mig.selection: what a mig-parted v1 config asks of each GPU."""

from __future__ import annotations

import pytest

from gpunode.api.mig_config import MigEntry, parse_spec
from gpunode.mig.selection import SelectedLayout, SelectionError, desired_per_gpu, no_gpu_matched
from helpers.migspec import A100_40, A100_80_PCIE, EXAMPLE, T4, gpu, one_config

# -------------------------------------------------------------------------------- desired per GPU


def entries(text: str, name: str = "custom") -> tuple[MigEntry, ...]:
    return parse_spec(text, "x").select(name)


def test_later_entries_override_earlier_ones() -> None:
    chosen = desired_per_gpu(
        "custom",
        entries(
            one_config(
                'devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 7}',
                'devices: [1]\nmig-enabled: true\nmig-devices: {"7g.40gb": 1}',
                "devices: [2]\nmig-enabled: false",
            )
        ),
        [gpu(0), gpu(1), gpu(2)],
    )
    assert chosen == {
        0: SelectedLayout(True, {"1g.5gb": 7}, "mig-configs.custom[0]"),
        1: SelectedLayout(True, {"7g.40gb": 1}, "mig-configs.custom[1]"),
        2: SelectedLayout(False, {}, "mig-configs.custom[2]"),
    }


def test_filters_choose_per_model_layouts() -> None:
    node = [
        gpu(0, A100_40),
        gpu(1, A100_80_PCIE, 0x153310DE),
        gpu(2, A100_80_PCIE, 0x145F10DE),
        gpu(3, T4, mig=False),
    ]
    spec = parse_spec(EXAMPLE, "x")
    per_model = desired_per_gpu("per-model", spec.select("per-model"), node)
    assert {i: dict(d.devices) for i, d in per_model.items()} == {
        0: {"1g.10gb": 4},
        1: {"1g.10gb": 7},
        2: {"1g.10gb": 7},
    }
    board = desired_per_gpu("board", spec.select("board"), node)
    assert list(board) == [1]  # only that board; the others are left alone
    assert board[1].entry == "mig-configs.board[0]"


def test_gpus_no_entry_covers_are_left_alone() -> None:
    spec = parse_spec(EXAMPLE, "x")
    chosen = desired_per_gpu("custom-config", spec.select("custom-config"), [gpu(i) for i in range(8)])
    assert sorted(chosen) == [0, 1, 2, 3, 4, 7]


def test_gpus_without_mig() -> None:
    node = [gpu(0, A100_40), gpu(1, T4, mig=False)]
    # devices: all skips them silently, whatever the mode
    chosen = desired_per_gpu(
        "c", entries(one_config('devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 7}')), node
    )
    assert list(chosen) == [0]
    # by index with MIG off: skipped
    assert desired_per_gpu("c", entries(one_config("devices: [1]\nmig-enabled: false")), node) == {}
    # all-disabled on a node without MIG at all: nothing to do, not an error
    assert (
        desired_per_gpu("c", entries(one_config("devices: all\nmig-enabled: false")), [gpu(0, T4, mig=False)])
        == {}
    )
    # by index with MIG on: an error naming the config, the entry and the GPU
    with pytest.raises(SelectionError) as info:
        desired_per_gpu("c", entries(one_config("devices: [1]\nmig-enabled: true\nmig-devices: {}")), node)
    text = str(info.value)
    assert 'config "c"' in text
    assert "mig-configs.custom[0]" in text
    assert "GPU 1: GPU-1EB810DE" in text
    assert "does not support MIG" in text


def test_mig_wanted_but_only_gpus_without_mig_match() -> None:
    with pytest.raises(SelectionError, match="matches only GPUs without MIG support"):
        desired_per_gpu(
            "all-1g.5gb",
            entries(one_config('devices: all\nmig-enabled: true\nmig-devices: {"1g.5gb": 7}')),
            [gpu(0, T4, mig=False)],
        )


def test_missing_index_is_an_error() -> None:
    with pytest.raises(SelectionError) as info:
        desired_per_gpu("c", entries(one_config("devices: [0, 9]\nmig-enabled: false")), [gpu(0), gpu(1)])
    assert str(info.value) == (
        'config "c", mig-configs.custom[0]: GPU 9 does not exist on this node (GPU indices: 0, 1)'
    )


def test_config_matching_no_gpu_changes_nothing_and_says_why() -> None:
    """mig-parted's rule (issue 18): nothing matched, nothing changed, success; the reason is a warning."""
    text = one_config(
        'devices: all\nmig-enabled: true\nmig-devices: {"1g.18gb": 7}\n'
        'device-filter: ["0x233510DE", "0x233B10DE"]',
        'devices: all\nmig-enabled: true\nmig-devices: {"1g.23gb": 7}\ndevice-filter: "0x290110DE"',
    )
    gpus = [gpu(0, A100_40, 0x134F10DE)]
    assert desired_per_gpu("all-h200", entries(text), gpus) == {}
    assert no_gpu_matched("all-h200", entries(text), gpus) == (
        'config "all-h200" matches no GPU on this node, so nothing was changed: '
        "GPUs are 0: GPU-20B010DE (0x20B010DE:0x134F10DE); "
        "its entries filter for 0x233510DE, 0x233B10DE, 0x290110DE"
    )


def test_a_config_matching_a_gpu_has_no_no_match_reason() -> None:
    spec = parse_spec(EXAMPLE, "x")
    assert no_gpu_matched("per-model", spec.select("per-model"), [gpu(0, A100_40)]) is None


def test_entries_for_other_products_are_fine() -> None:
    spec = parse_spec(EXAMPLE, "x")
    chosen = desired_per_gpu("per-model", spec.select("per-model"), [gpu(0, A100_40)])
    assert chosen == {0: SelectedLayout(True, {"1g.10gb": 4}, "mig-configs.per-model[1]")}


def test_no_gpus_at_all() -> None:
    config = entries(one_config("devices: all\nmig-enabled: false"))
    assert desired_per_gpu("c", config, []) == {}
    reason = no_gpu_matched("c", config, [])
    assert reason is not None
    assert "GPUs are none" in reason

"""`gpunode sim ...` and `gpunode demo` as real processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest


def run(cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def state(tmp_path: Path, gpunode_cmd: list[str]) -> Path:
    path = tmp_path / "node.json"
    assert run(gpunode_cmd, "sim", "init", "dgx-a100", "--state", str(path)).returncode == 0
    return path


def test_presets_lists_every_preset(gpunode_cmd: list[str]) -> None:
    out = run(gpunode_cmd, "sim", "presets")
    assert out.returncode == 0
    names = [line.split()[0] for line in out.stdout.splitlines()]
    assert names == [
        "a10x4",
        "a2x2",
        "a30x4",
        "dgx-a100",
        "dgx-a100-80gb",
        "dgx-b200",
        "dgx-h100",
        "gb200-nvl4",
        "h100-nvl",
        "hgx-h200",
        "l40sx4",
        "l4x8",
        "mixed",
        "mixed-ada-ampere",
        "t4x4",
    ]


def test_unknown_preset_exits_2_listing_the_presets(gpunode_cmd: list[str], tmp_path: Path) -> None:
    out = run(gpunode_cmd, "sim", "init", "dgx-b300", "--state", str(tmp_path / "s.json"))
    assert out.returncode == 2
    assert "unknown simulator preset 'dgx-b300'" in out.stderr
    assert "dgx-a100" in out.stderr
    assert "t4x4" in out.stderr
    assert not (tmp_path / "s.json").exists()


def test_init_refuses_to_overwrite_without_force(gpunode_cmd: list[str], state: Path) -> None:
    before = state.read_bytes()
    out = run(gpunode_cmd, "sim", "init", "t4x4", "--state", str(state))
    assert out.returncode == 2
    assert "--force" in out.stderr
    assert state.read_bytes() == before
    assert run(gpunode_cmd, "sim", "init", "t4x4", "--state", str(state), "--force").returncode == 0
    assert json.loads(state.read_text())["preset"] == "t4x4"


def test_faults_show_up_and_clear(gpunode_cmd: list[str], state: Path) -> None:
    assert run(gpunode_cmd, "sim", "xid", "--state", str(state), "--gpu", "2", "--xid", "48").returncode == 0
    assert run(gpunode_cmd, "sim", "lose", "--state", str(state), "--gpu", "5").returncode == 0
    assert (
        run(gpunode_cmd, "sim", "ecc", "--state", str(state), "--gpu", "1", "--type", "dbe").returncode == 0
    )
    shown = run(gpunode_cmd, "sim", "show", "--state", str(state)).stdout
    rows = {line.split()[0]: line for line in shown.splitlines() if line[:1].isdigit()}
    assert "LOST" in rows["5"]
    assert "LOST" not in rows["4"]
    assert "dbe=1" in rows["1"]
    assert "GPU 2 XID 48" in shown
    assert run(gpunode_cmd, "sim", "restore", "--state", str(state), "--gpu", "5").returncode == 0
    data = json.loads(run(gpunode_cmd, "sim", "show", "--state", str(state), "--json").stdout)
    assert not any(g["lost"] for g in data["gpus"])


def test_fail_init_then_restore(gpunode_cmd: list[str], state: Path) -> None:
    assert run(gpunode_cmd, "sim", "fail-init", "driver-not-loaded", "--state", str(state)).returncode == 0
    assert (
        "NVML init fails (driver-not-loaded)" in run(gpunode_cmd, "sim", "show", "--state", str(state)).stdout
    )
    assert run(gpunode_cmd, "sim", "restore", "--state", str(state)).returncode == 0
    assert json.loads(state.read_text())["init_fault"] is None


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["xid", "--gpu", "8", "--xid", "79"], id="xid-gpu-out-of-range"),
        pytest.param(["lose", "--gpu", "-1"], id="lose-negative-gpu"),
        pytest.param(["reset", "--gpu", "99"], id="reset-gpu-out-of-range"),
    ],
)
def test_invalid_gpu_index_is_an_error_and_leaves_the_state_untouched(
    gpunode_cmd: list[str], state: Path, args: list[str]
) -> None:
    before = state.read_bytes()
    out = run(gpunode_cmd, "sim", args[0], "--state", str(state), *args[1:])
    assert out.returncode == 2
    assert "no GPU with index" in out.stderr
    assert "0-7" in out.stderr
    assert state.read_bytes() == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("{truncated", "not valid JSON", id="corrupt"),
        pytest.param('{"kind": "something else"}', "not a gpunode simulator state file", id="foreign"),
        pytest.param(
            '{"format": "gpunode-sim/v1", "preset": "dgx-a100"}', "corrupt simulator state", id="partial"
        ),
    ],
)
def test_bad_state_files_are_named_and_never_reset(
    gpunode_cmd: list[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "node.json"
    path.write_text(content)
    for args in (["show"], ["xid", "--gpu", "0", "--xid", "79"]):
        out = run(gpunode_cmd, "sim", args[0], "--state", str(path), *args[1:])
        assert out.returncode == 2
        assert str(path) in out.stderr
        assert message in out.stderr
    assert path.read_text() == content


def test_missing_state_file_says_how_to_create_it(gpunode_cmd: list[str], tmp_path: Path) -> None:
    out = run(gpunode_cmd, "sim", "show", "--state", str(tmp_path / "none.json"))
    assert out.returncode == 2
    assert "gpunode sim init" in out.stderr


def test_reset_applies_a_pending_mig_mode_and_refuses_while_in_use(
    gpunode_cmd: list[str], state: Path
) -> None:
    from gpunode.sim.nvml import SimNode

    node = SimNode.open(state)
    with node.mutate() as st:
        st.set_mig_mode(0, 1)
    assert run(gpunode_cmd, "sim", "proc", "--state", str(state), "--gpu", "0", "--pid", "77").returncode == 0
    busy = run(gpunode_cmd, "sim", "reset", "--state", str(state), "--gpu", "0")
    assert busy.returncode == 2
    assert "In use" in busy.stderr
    assert (
        run(
            gpunode_cmd, "sim", "proc", "--state", str(state), "--gpu", "0", "--pid", "77", "--stop"
        ).returncode
        == 0
    )
    ok = run(gpunode_cmd, "sim", "reset", "--state", str(state), "--gpu", "0")
    assert ok.returncode == 0
    assert "MIG mode now enabled" in ok.stdout

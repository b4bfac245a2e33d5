"""`gpunode-mig` as a real process on a shared simulated node: apply, assert, export, dry runs, resets,
hooks, checkpoints and crashes at every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpunode.sim import nvml as sim
from helpers import mig_crash

MIG = str(Path(sys.executable).parent / "gpunode-mig")

CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  one-changed:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    - devices: [3]
      mig-enabled: true
      mig-devices: {"1g.5gb": 4, "3g.20gb": 1}
  split-3g:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1c.3g.20gb": 6}
  impossible:
    - devices: [2]
      mig-enabled: true
      mig-devices: {"3g.20gb": 3}
  wrong-profile:
    - devices: [1]
      mig-enabled: true
      mig-devices: {"2g.20gb": 1}
"""


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


def mig(
    node: Path,
    *args: str,
    env: dict[str, str] | None = None,
    journal: Path | None = None,
    kill_after: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """``gpunode-mig ARGS``; ``kill_after``: through the crash helper, SIGKILLed after that step."""
    if journal is None:  # never the real /var/lib/gpunode: one beside the state file
        journal = node.parent / "journal.json"
    extra = ["--journal-file", str(journal)] if args and args[0] == "apply" else []
    command = [MIG] if kill_after is None else [*mig_crash.COMMAND, str(kill_after), "gpunode-mig"]
    return subprocess.run(
        [*command, *args, "--sim-state", str(node), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def layout(node: Path) -> dict[int, tuple[int, list[tuple[int, int, int, int]]]]:
    """Per GPU: (MIG mode, sorted (gi profile, gi start, ci count, ci slices sum))."""
    st = sim.SimNode.open(node).state
    out = {}
    for i, g in enumerate(st.gpus):
        out[i] = (
            g.mig_current,
            sorted((gi.profile, gi.start, len(gi.cis), sum(1 for _ in gi.cis)) for gi in g.gis),
        )
    return out


def mig_devices(node: Path, gpu: int) -> int:
    return sum(len(gi.cis) for gi in sim.SimNode.open(node).state.gpus[gpu].gis)


def test_apply_then_assert_then_nothing_to_do(node: Path, config: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal.json"
    r = mig(node, "apply", "-f", str(config), "-c", "all-balanced", journal=journal)
    assert r.returncode == 0, r.stderr
    assert "MIG configuration applied successfully" in r.stdout
    assert all(mig_devices(node, g) == 4 for g in range(8))
    assert not journal.exists()  # cleared on success
    a = mig(node, "assert", "-f", str(config), "-c", "all-balanced")
    assert a.returncode == 0, a.stdout + a.stderr
    assert "Selected MIG configuration currently applied" in a.stdout
    dry = mig(node, "apply", "-f", str(config), "-c", "all-balanced", "--dry-run")
    assert dry.returncode == 0
    assert "nothing to change" in dry.stdout


def test_assert_fails_and_says_what_differs(node: Path, config: Path) -> None:
    r = mig(node, "assert", "-f", str(config), "-c", "all-balanced")
    assert r.returncode == 1
    assert "Assertion failure: selected configuration not currently applied" in r.stdout
    assert "GPU 0" in r.stdout


def test_changing_one_gpu_touches_only_that_gpu(node: Path, config: Path) -> None:
    assert mig(node, "apply", "-f", str(config), "-c", "all-balanced").returncode == 0
    before = layout(node)
    dry = mig(node, "apply", "-f", str(config), "-c", "one-changed", "--dry-run")
    assert dry.returncode == 0
    assert all("GPU 3" in line for line in dry.stdout.splitlines() if line.startswith("GPU")), dry.stdout
    r = mig(node, "apply", "-f", str(config), "-c", "one-changed", "--debug")
    assert r.returncode == 0, r.stderr
    after = layout(node)
    assert {g for g in range(8) if before[g] != after[g]} == {3}
    assert mig_devices(node, 3) == 5
    # the 3g.20gb GPU instance stayed where it was
    gi3 = [gi for gi in before[3][1] if gi[0] == 2]
    assert gi3
    assert gi3[0] in after[3][1]


def test_compute_instance_sub_profiles(node: Path, config: Path) -> None:
    r = mig(node, "apply", "-f", str(config), "-c", "split-3g")
    assert r.returncode == 0, r.stderr
    gis = sim.SimNode.open(node).state.gpus[0].gis
    assert len(gis) == 2
    assert sorted(len(gi.cis) for gi in gis) == [3, 3]


def test_infeasible_layout_fails_before_any_change(node: Path, config: Path) -> None:
    before = layout(node)
    r = mig(node, "apply", "-f", str(config), "-c", "impossible")
    assert r.returncode == 1
    assert "GPU 2" in r.stderr
    assert "3g.20gb" in r.stderr
    assert layout(node) == before  # nothing touched, not even MIG mode


def test_a_profile_the_gpu_does_not_know_is_an_error(node: Path, config: Path) -> None:
    r = mig(node, "apply", "-f", str(config), "-c", "wrong-profile")
    assert r.returncode == 1
    assert "2g.20gb" in r.stderr
    assert "1g.5gb" in r.stderr  # what the GPU does offer
    assert mig_devices(node, 1) == 0


def test_unknown_config_name_exits_2_listing_the_names(node: Path, config: Path) -> None:
    r = mig(node, "apply", "-f", str(config), "-c", "nope")
    assert r.returncode == 2
    assert "all-balanced" in r.stderr
    assert "split-3g" in r.stderr


def test_bad_config_file_exits_2_naming_the_yaml_path(node: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n"
        "      mig-devices: {'1g.5': 1}\n"
    )
    r = mig(node, "apply", "-f", str(bad), "-c", "x")
    assert r.returncode == 2
    assert str(bad) in r.stderr
    assert "mig-configs.x[0]" in r.stderr


def test_ampere_mode_change_resets_only_the_gpus_that_change(
    node: Path, config: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "two.yaml"
    cfg.write_text(
        "version: v1\nmig-configs:\n  two:\n    - devices: [1, 4]\n      mig-enabled: true\n"
        "      mig-devices: {}\n"
    )
    r = mig(node, "apply", "-f", str(cfg), "-c", "two", "--debug")
    assert r.returncode == 0, r.stderr
    resets = [line for line in r.stderr.splitlines() if "resetting" in line]
    assert len(resets) == 2
    modes = {i: g[0] for i, g in layout(node).items()}
    assert modes == {i: int(i in (1, 4)) for i in range(8)}


def test_skip_reset_leaves_the_mode_pending_and_fails_the_device_step(node: Path, config: Path) -> None:
    r = mig(node, "apply", "-f", str(config), "-c", "all-enabled", "--skip-reset", "--mode-only")
    assert r.returncode == 0, r.stderr
    st = sim.SimNode.open(node).state
    assert all(g.mig_pending == 1 and g.mig_current == 0 for g in st.gpus)
    r = mig(node, "apply", "-f", str(config), "-c", "all-balanced", "--skip-reset")
    assert r.returncode == 1
    assert "pending" in r.stderr
    assert all(not g.gis for g in sim.SimNode.open(node).state.gpus)


def test_processes_on_a_gpu_block_a_disruptive_change_unless_forced(node: Path, config: Path) -> None:
    from gpunode.sim.nvml.state import ProcessState

    assert mig(node, "apply", "-f", str(config), "-c", "all-balanced").returncode == 0
    with sim.SimNode.open(node).mutate() as st:
        gi = st.gpus[3].gis[0]
        st.gpus[3].processes.append(ProcessState(4242, 1024, gi.id, gi.cis[0].id))
    before = layout(node)
    r = mig(node, "apply", "-f", str(config), "-c", "one-changed")
    assert r.returncode == 1
    assert "4242" in r.stderr
    assert "--force" in r.stderr
    assert layout(node) == before
    # a change that does not touch GPU 3 goes ahead
    assert mig(node, "assert", "-f", str(config), "-c", "all-balanced").returncode == 0


def test_export_round_trips_through_apply(node: Path, config: Path, tmp_path: Path) -> None:
    assert mig(node, "apply", "-f", str(config), "-c", "one-changed").returncode == 0
    r = mig(node, "export")
    assert r.returncode == 0, r.stderr
    exported = yaml.safe_load(r.stdout)
    assert exported["version"] == "v1"
    (tmp_path / "exported.yaml").write_text(r.stdout)
    a = mig(node, "assert", "-f", str(tmp_path / "exported.yaml"), "-c", "current")
    assert a.returncode == 0, a.stdout
    j = mig(node, "export", "-o", "json")
    assert json.loads(j.stdout)["mig-configs"]["current"]


def test_checkpoint_and_restore_put_back_exact_placements(node: Path, config: Path, tmp_path: Path) -> None:
    assert mig(node, "apply", "-f", str(config), "-c", "all-balanced").returncode == 0
    before = layout(node)
    ckpt = tmp_path / "ckpt.json"
    assert mig(node, "checkpoint", "-f", str(ckpt)).returncode == 0
    assert mig(node, "apply", "-f", str(config), "-c", "all-disabled").returncode == 0
    assert layout(node) != before
    r = mig(node, "restore", "-f", str(ckpt))
    assert r.returncode == 0, r.stderr
    assert layout(node) == before


def test_generate_config_is_a_valid_config_that_applies(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "generated.yaml"
    r = mig(node, "generate-config", "-f", str(out))
    assert r.returncode == 0, r.stderr
    names = yaml.safe_load(out.read_text())["mig-configs"]
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.5gb", "all-7g.40gb"} <= set(names)
    a = mig(node, "apply", "-f", str(out), "-c", "all-balanced")
    assert a.returncode == 0, a.stderr


def test_hooks_run_in_order_and_a_failing_hook_stops_before_any_change(
    node: Path, config: Path, tmp_path: Path
) -> None:
    log = tmp_path / "hooks.log"
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(
        "version: v1\nhooks:\n"
        + "".join(
            f"  {name}:\n    - command: /bin/sh\n"
            f"      args: ['-c', 'echo {name} $MIG_PARTED_SELECTED_CONFIG >> {log}']\n"
            for name in ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
        )
    )
    r = mig(node, "apply", "-f", str(config), "-c", "all-balanced", "-k", str(hooks))
    assert r.returncode == 0, r.stderr
    assert log.read_text().split("\n")[:4] == [
        "apply-start all-balanced",
        "pre-apply-mode all-balanced",
        "pre-apply-config all-balanced",
        "apply-exit all-balanced",
    ]
    failing = tmp_path / "failing.yaml"
    failing.write_text("version: v1\nhooks:\n  pre-apply-config:\n    - command: /bin/false\n")
    before = layout(node)
    r = mig(node, "apply", "-f", str(config), "-c", "one-changed", "-k", str(failing))
    assert r.returncode == 1
    assert "pre-apply-config" in r.stderr
    assert layout(node) == before  # as it was, never half


@pytest.mark.parametrize("kill_after", [1, 2, 4, 6, 8, 9, 10, 12, 15])
def test_killed_at_any_step_the_next_apply_converges(
    node: Path, config: Path, tmp_path: Path, kill_after: int
) -> None:
    journal = tmp_path / "journal.json"
    assert mig(node, "apply", "-f", str(config), "-c", "all-balanced", journal=journal).returncode == 0
    r = mig(node, "apply", "-f", str(config), "-c", "split-3g", journal=journal, kill_after=kill_after)
    assert r.returncode == -9, "the change takes 16 NVML steps: it must die at the kill point"
    assert journal.exists()
    r = mig(node, "apply", "-f", str(config), "-c", "split-3g", journal=journal)
    assert r.returncode == 0, r.stderr
    assert not journal.exists()
    assert mig(node, "assert", "-f", str(config), "-c", "split-3g").returncode == 0
    gis = sim.SimNode.open(node).state.gpus[0].gis
    assert all(gi.cis for gi in gis)  # no orphaned GPU instance without compute instances


H200_ONLY = """\
version: v1
mig-configs:
  all-1g.18gb:
    - device-filter: ["0x233510DE", "0x233B10DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
"""


def test_a_config_matching_no_gpu_succeeds_with_a_warning(node: Path, tmp_path: Path) -> None:
    """mig-parted's rule (issue 18): an H200 layout on an A100 node changes nothing and succeeds."""
    config = tmp_path / "h200.yaml"
    config.write_text(H200_ONLY)
    before = layout(node)
    r = mig(node, "apply", "-f", str(config), "-c", "all-1g.18gb")
    assert r.returncode == 0, r.stderr
    assert "MIG configuration applied successfully" in r.stdout
    assert 'warning: config "all-1g.18gb" matches no GPU on this node, so nothing was changed' in r.stderr
    assert "0x233510DE, 0x233B10DE" in r.stderr
    assert layout(node) == before
    a = mig(node, "assert", "-f", str(config), "-c", "all-1g.18gb")
    assert a.returncode == 0, a.stdout + a.stderr
    assert "Selected MIG configuration currently applied" in a.stdout
    assert "matches no GPU on this node" in a.stderr

"""`gpunode dev hw-check` as a user runs it: with no driver it says so (exit 2); with a simulated node
standing in for the real machine (--real-sim) it runs every agent on both sides and prints the differences."""

from __future__ import annotations

import ctypes.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GPUNODE = str(Path(sys.executable).parent / "gpunode")


def hw_check(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "HOME": "/tmp"}
    return subprocess.run(
        [GPUNODE, "dev", "hw-check", *args], capture_output=True, text=True, timeout=170, env=env
    )


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
def test_without_a_driver_exit_2_saying_so() -> None:
    out = hw_check()
    assert out.returncode == 2
    assert "no NVIDIA driver: " in out.stderr
    assert "--real-sim" in out.stderr


def test_a_stand_in_node_of_another_product_shows_the_differences() -> None:
    out = hw_check("--real-sim", "dgx-h100", "--preset", "dgx-a100", "--keep")
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout
    kept = Path(re.findall(r"\(kept (.+)\)", text)[0])
    try:  # read-only: neither node's state was ever changed (no MIG mode, layout, reset: generation 0)
        for side in ("real", "preset"):
            state = json.loads((kept / f"{side}.json").read_text())
            assert state["generation"] == 0, side
    finally:
        shutil.rmtree(kept)
    assert "preset: dgx-a100" in text
    assert "nvidia.com/gpu.product: real NVIDIA-H100-80GB-HBM3 | preset NVIDIA-A100-SXM4-40GB" in text
    assert "nvidia.com/gpu.family: real hopper | preset ampere" in text
    for same in ("exporter", "device-plugin", "cdi", "mig", "doctor"):
        assert f"== {same}: same" in text, text
    assert "could not check" not in text, text
    assert not re.search(r"(GPU|MIG)-[0-9a-f]{8}-", text)  # UUIDs masked
    assert "not compared: telemetry values" in text
    assert re.search(r"hw-check finished in [\d.]+ s: 1 step\(s\) differ", text)


def test_unknown_preset_exit_2_listing_presets() -> None:
    out = hw_check("--real-sim", "t4x4", "--preset", "dgx-z9")
    assert out.returncode == 2
    assert "dgx-a100" in out.stderr


def test_the_budget_cuts_steps_short_and_leaves_no_agent_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import psutil

    from gpunode import hwcheck

    steps = dict(hwcheck.STEPS)
    monkeypatch.setattr(hwcheck, "STEPS", (("device-plugin", steps["device-plugin"]), ("mig", steps["mig"])))
    monkeypatch.setattr(hwcheck, "PLUGIN_WATCH", 600.0)  # the device plugins would serve far past the budget
    monkeypatch.setattr(hwcheck, "TOTAL_BUDGET", 10.0)
    for key in ("GPUNODE_SIM_STATE", "GPUNODE_SIMULATE", "GPUNODE_HOST_ROOT"):
        monkeypatch.delenv(key, raising=False)
    # Other tests of this session may have children of their own still exiting: only hw-check's count.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert hwcheck.main(["--real-sim", "t4x4"]) == 1
    text = capsys.readouterr().out
    assert "== device-plugin: could not check" in text
    assert "== mig: could not check" in text
    assert "budget ran out" in text
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert left == []  # both device plugins were stopped (hw-check waits for them: no grace period)

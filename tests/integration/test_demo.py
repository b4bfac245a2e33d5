"""`gpunode demo` as a user runs it, and `gpunode dev kubelet` with a real device plugin registering."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

SECTIONS = [
    "== 1. A simulated dgx-a100 node",
    "== 2. Node labels: gpunode-feature-discovery --oneshot",
    "== 3. MIG layout all-balanced: gpunode-mig apply, then export",
    "== 4. Device plugin, registered with the kubelet emulator",
    "== 5. Allocate one MIG device (the kubelet's Allocate RPC)",
    "== 6. Metrics: gpunode-exporter",
    "== 7. XID 79 (fell off the bus) on GPU 3: its devices go Unhealthy",
    "== 8. gpunode doctor",
    "== 9. Stopping everything",
]


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("GPUNODE_SIM_STATE", "GPUNODE_SIMULATE", "GPUNODE_HOST_ROOT", "KUBECONFIG"):
        env.pop(key, None)
    return env


class _Descendants:
    """Every descendant process seen while a process runs (sampled every 50 ms)."""

    def __init__(self, proc: psutil.Popen) -> None:
        self.proc = proc
        self.seen: dict[int, psutil.Process] = {}
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while self.proc.poll() is None:
            try:
                for child in self.proc.children(recursive=True):
                    self.seen.setdefault(child.pid, child)
            except psutil.Error:
                pass
            time.sleep(0.05)

    def alive(self) -> list[str]:
        self._thread.join(5)
        left = []
        for child in self.seen.values():
            try:
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{child.pid} {' '.join(child.cmdline())}")
            except psutil.Error:
                pass
        return left


@pytest.mark.timeout(120)
def test_demo_runs_by_itself_and_cleans_up(gpunode_cmd: list[str]) -> None:
    started = time.monotonic()
    proc = psutil.Popen(
        [*gpunode_cmd, "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_env(),
    )
    watch = _Descendants(proc)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - started
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert wall < 60, f"demo took {wall:.1f} s"

    positions = [out.find(s) for s in SECTIONS]
    assert all(p >= 0 for p in positions), [s for s, p in zip(SECTIONS, positions, strict=True) if p < 0]
    assert positions == sorted(positions), "sections out of order"

    assert "nvidia.com/gpu.count=8" in out  # the feature discovery labels
    assert 'mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}' in out  # the all-balanced export
    assert re.search(r"nvidia\.com/mig-1g\.5gb\s+16\s+16", out)  # advertised by the plugin, all healthy
    assert "32 MIG devices advertised in all" in out
    assert "NVIDIA_VISIBLE_DEVICES=MIG-" in out  # the container edits of the Allocate answer
    assert re.search(r"cdi\.k8s\.io/\S+=k8s\.device-plugin\.nvidia\.com/gpu=MIG-", out)
    assert re.search(r"^DCGM_FI_DEV_GPU_TEMP\{.*\} \d", out, re.MULTILINE)  # a scraped series
    xid_part = out[out.find(SECTIONS[6]) :]
    assert re.search(r"nvidia\.com/mig-\S+ MIG-\S+ Unhealthy", xid_part)
    doctor = out[out.find(SECTIONS[7]) : out.find(SECTIONS[8])]
    assert re.search(r"^CHECK\s+STATUS\s+DETAIL", doctor, re.MULTILINE)  # the doctor table
    assert re.search(r"^mig\s+OK", doctor, re.MULTILINE)
    assert re.search(r"^cdi\s+OK", doctor, re.MULTILINE)
    assert re.search(r"^xid\s+FAIL\s+XID 79 on GPU 3", doctor, re.MULTILINE), doctor
    assert "gpunode-device-plugin stopped (exit code 0)" in out
    assert "gpunode-exporter stopped (exit code 0)" in out

    assert len(watch.seen) >= 8, "the agents should have run as child processes"
    assert watch.alive() == []
    temp = re.search(r"^DEMO=(\S+)", out, re.MULTILINE)
    assert temp is not None
    assert not Path(temp.group(1)).exists()


@pytest.mark.timeout(60)
def test_dev_kubelet_prints_registrations_and_stops_on_sigterm(
    gpunode_cmd: list[str], tmp_path: Path
) -> None:
    state = tmp_path / "node.json"
    subprocess.run([*gpunode_cmd, "sim", "init", "t4x4", "--state", str(state)], check=True)
    plugin_dir = tmp_path / "dp"
    kubelet = subprocess.Popen(
        [*gpunode_cmd, "dev", "kubelet", "--dir", str(plugin_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_env(),
    )
    plugin_cmd = [str(Path(gpunode_cmd[0]).parent / "gpunode-device-plugin")]
    plugin: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 20
        while not (plugin_dir / "kubelet.sock").exists():
            assert kubelet.poll() is None, kubelet.communicate()
            assert time.monotonic() < deadline, "kubelet.sock never appeared"
            time.sleep(0.05)
        socket = str(plugin_dir / "kubelet.sock")
        plugin = subprocess.Popen(
            [*plugin_cmd, "--sim-state", str(state), "--kubelet-socket", socket, "--http-port", "-1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=_clean_env(),
        )
        assert kubelet.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 20
        while not any("ListAndWatch nvidia.com/gpu: 4 devices, 4 Healthy" in x for x in lines):
            assert time.monotonic() < deadline, lines
            line = kubelet.stdout.readline()
            assert line, f"kubelet emulator ended early: {lines}"
            lines.append(line)
        assert any(x.startswith("registered nvidia.com/gpu (endpoint nvidia-gpu.sock)") for x in lines)
    finally:
        if plugin is not None:
            plugin.send_signal(signal.SIGTERM)
            plugin.wait(15)
        kubelet.send_signal(signal.SIGTERM)
        try:
            rest, err = kubelet.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            kubelet.kill()
            raise
    assert kubelet.returncode == 0, err
    assert "kubelet emulator stopped" in rest
    assert not (plugin_dir / "kubelet.sock").exists()

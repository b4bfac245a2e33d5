"""Starting containers on a simulated node and checking what they see: the spec from
`gpunode-toolkit cdi generate`, `gpunode-mig apply`, the node's inventory through NVML, and
:func:`run_and_check`, which asserts a container sees exactly the expected devices."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpunode.nvml.api import GpuInfo, MigDevice
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim
from helpers import podman
from helpers.fakedriver import CAPS_MAJOR, CONTROL_NODES, NVIDIA_MAJOR, FakeDriver

BIN = Path(sys.executable).parent
TOOLKIT = str(BIN / "gpunode-toolkit")
MIG = str(BIN / "gpunode-mig")


def tool_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUNODE_", "NVIDIA_"))}
    env["LOG_FORMAT"] = "json"
    return env


def generate_spec(state: Path, driver: FakeDriver, hook: str, output: Path, *extra: str) -> dict[str, Any]:
    """`gpunode-toolkit cdi generate` for the simulated node and the fake driver, its hooks running
    gpunode's hook program at ``hook`` (which generate installs there); the spec document."""
    out = subprocess.run(
        [
            TOOLKIT,
            "cdi",
            "generate",
            "--sim-state",
            str(state),
            "--host-root",
            str(driver.host_root),
            "--driver-root",
            str(driver.root),
            "--hook-path",
            hook,
            "--output",
            str(output),
            *extra,
        ],
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert os.access(hook, os.X_OK), f"generate did not install the hook program at {hook}"
    doc = yaml.safe_load(output.read_text())
    assert isinstance(doc, dict)
    paths = {h["path"] for e in _edits(doc) for h in e.get("hooks") or ()}
    assert paths <= {hook}, f"the spec's hooks run {sorted(paths)}, not only gpunode's {hook}"
    return doc


def _edits(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [doc.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in doc["devices"])]


def mig_apply(state: Path, config: str, config_file: Path | None = None) -> None:
    """`gpunode-mig apply -c CONFIG` on the simulated node (the shipped layouts unless ``config_file``)."""
    args = [MIG, "apply", "--sim-state", str(state), "-c", config, "--journal-file", ""]
    if config_file is not None:
        args += ["-f", str(config_file)]
    out = subprocess.run(args, env=tool_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


async def inventory(state: Path) -> tuple[list[GpuInfo], dict[int, list[MigDevice]]]:
    """The simulated node's GPUs and MIG devices, through NVML."""
    sim.install(state=state)
    nvml = await RealNvml.open()
    try:
        gpus = list(await nvml.gpus())
        migs = {g.index: list(await nvml.mig_devices(g.index)) for g in gpus if g.mig_enabled}
    finally:
        await nvml.close()
        sim.uninstall()
    return gpus, migs


@dataclass(frozen=True)
class Expected:
    """What a container given some devices must see: these GPU device minors and MIG capability minors
    (plus the control nodes), nothing else."""

    gpu_minors: frozenset[int]
    cap_minors: frozenset[int] = frozenset()


def expect_gpus(*minors: int) -> Expected:
    return Expected(frozenset(minors))


def expect_mig(driver: FakeDriver, gpu: GpuInfo, mig: MigDevice) -> Expected:
    table = driver.cap_minors()
    gi = table[f"gpu{gpu.minor}/gi{mig.gi_id}/access"]
    ci = table[f"gpu{gpu.minor}/gi{mig.gi_id}/ci{mig.ci_id}/access"]
    return Expected(frozenset({gpu.minor}), frozenset({gi, ci}))


def probes(driver: FakeDriver, expected: Expected) -> list[str]:
    """major:minor pairs to try from inside the container: every GPU, the expected capabilities and two
    that must not be allowed."""
    out = [f"{NVIDIA_MAJOR}:{m}" for m in range(driver.gpus)]
    others = sorted(set(driver.cap_minors().values()) - expected.cap_minors)[:2]
    out += [f"{CAPS_MAJOR}:{m}" for m in sorted(expected.cap_minors | set(others))]
    return out


def run_and_check(
    devices: Sequence[str], driver: FakeDriver, spec: dict[str, Any], expected: Expected
) -> dict[str, Any]:
    """Start a container with ``devices`` and assert it sees exactly ``expected``; what it saw."""
    tried = probes(driver, expected)
    seen = podman.inspect_container(devices, probes=tried)
    want_nodes = {path: list(mm) for path, mm in CONTROL_NODES.items()}
    for m in expected.gpu_minors:
        path, mm = driver.gpu_node(m)
        want_nodes[path] = list(mm)
    for m in expected.cap_minors:
        path, mm = driver.cap_node(m)
        want_nodes[path] = list(mm)
    assert seen["nodes"] == want_nodes, f"{devices}: device nodes differ"
    # each node is allowed by the devices cgroup; no driver answers behind it
    assert set(seen["open_errno"].values()) == {errno.ENXIO}, seen["open_errno"]
    # a node made inside the container opens only for the allowed devices
    allowed = {f"{NVIDIA_MAJOR}:{m}" for m in expected.gpu_minors} | {
        f"{CAPS_MAJOR}:{m}" for m in expected.cap_minors
    }
    want_probe = {p: errno.ENXIO if p in allowed else errno.EPERM for p in tried}
    assert seen["probe"] == want_probe, f"{devices}: the devices cgroup allows other devices"
    if seen["cgroup"] is not None:  # cgroup v1: the allow list itself
        ours = {f"c {mm[0]}:{mm[1]} rwm" for mm in want_nodes.values()}
        majors = {str(NVIDIA_MAJOR), str(CAPS_MAJOR), *(str(mm[0]) for mm in CONTROL_NODES.values())}
        listed = {line for line in seen["cgroup"] if _major(line) in majors}
        assert listed == ours, f"{devices}: devices cgroup {sorted(listed)}"
    env = seen["env"]
    for item in (spec.get("containerEdits") or {}).get("env") or ():
        key, _, value = item.partition("=")
        assert env.get(key) == value, f"{devices}: env {key}={env.get(key)!r}, the spec says {value!r}"
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void"
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= set(seen["ldconfig"]), seen["ldconfig"]
    assert seen["nvml"] == 9, f"nvmlInit_v2 through libnvidia-ml.so.1: {seen['nvml']}"
    assert seen["cuda"] == 100, f"cuInit through libcuda.so.1: {seen['cuda']}"
    return seen


def _major(line: str) -> str:
    """``c 195:0 rwm`` -> ``195``."""
    parts = line.split()
    return parts[1].split(":")[0] if len(parts) == 3 else ""

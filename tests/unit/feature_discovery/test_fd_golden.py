"""GFD label sets through the real path, compared with golden files in tests/golden/feature_discovery/.

Path: ``sim.install(preset)`` -> ``RealNvml.open()`` (pynvml over the simulated library) -> MIG layout made
with the NVML calls the MIG manager uses -> ``gather_facts`` over the simulated node's host tree under
``tmp_path`` (``gpunode.sim.hosttree``: PCI class ``0x030200`` for every GPU; machine file ``DGX A100``)
-> ``compute_labels(..., timestamp=None)``.
Sharing comes from a ``version: v1`` config file read by the device plugin's own loader.

The golden files hold one ``key=value`` per line, sorted; they are compared as sets. They were generated
with this code and then reviewed line by line against shared/reference/feature-discovery.md: §3.4 (a) no
MIG, (b) MIG single all-1g.5gb, (c) MIG mixed all-balanced and (d) time-slicing, for the 8 x A100-SXM4-40GB
node (``REFERENCE_3_4`` below re-checks those figures mechanically), §1.5 for the H100/T4 families and
§1.4 for the heterogeneous ``mixed`` preset (our deterministic rule: the model with the most GPUs, ties to
the lowest index -> the two A100 80GB PCIe). ``gpu.machine`` is ``DGX-A100`` in every case because that is
what the fake machine file says.

To change them on purpose: ``GPUNODE_UPDATE_GOLDEN=1 pytest tests/unit/feature_discovery``, then review
the diff.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpunode.api.plugin_config import PluginConfig
from gpunode.api.plugin_types import TimeSlicing
from gpunode.common.config import load_config
from gpunode.common.hostpaths import HostPaths
from gpunode.feature_discovery.facts import (
    gather_facts,
    has_vgpu_capability,
    read_machine_type,
    read_pci_class,
)
from gpunode.feature_discovery.labels import compute_labels
from gpunode.nvml.real import RealNvml
from gpunode.sim import hosttree
from gpunode.sim import nvml as sim

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "feature_discovery"
UPDATE_ENV = "GPUNODE_UPDATE_GOLDEN"
N = "nvidia.com/"

TIME_SLICING_4 = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
TIME_SLICING_4_RENAMED = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""

ALL_1G_5GB = ("1g.5gb",) * 7
ALL_BALANCED = ("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")  # biggest first, as placements require


@dataclass(frozen=True)
class Case:
    preset: str
    strategy: str = "none"
    layout: tuple[str, ...] = ()  # GI profiles created on every GPU (MIG enabled when non-empty)
    config: str | None = None


CASES = {
    "dgx-a100-none": Case("dgx-a100"),
    "dgx-a100-single-all-1g.5gb": Case("dgx-a100", "single", ALL_1G_5GB),
    "dgx-a100-mixed-all-balanced": Case("dgx-a100", "mixed", ALL_BALANCED),
    "dgx-a100-time-slicing-4": Case("dgx-a100", config=TIME_SLICING_4),
    "dgx-a100-time-slicing-4-renamed": Case("dgx-a100", config=TIME_SLICING_4_RENAMED),
    "dgx-h100-none": Case("dgx-h100"),
    "t4x4-none": Case("t4x4"),
    "mixed-none": Case("mixed"),
    # issue 19: Ada, Ampere PCIe, H100 NVL and Blackwell (gb200-nvl4 carries gpu.clique)
    "dgx-b200-none": Case("dgx-b200"),
    "dgx-b200-single-all-1g.23gb": Case("dgx-b200", "single", ("1g.23gb",) * 7),
    "dgx-b200-mixed-all-balanced": Case("dgx-b200", "mixed", ("3g.90gb", "2g.45gb", "1g.23gb", "1g.23gb")),
    "gb200-nvl4-none": Case("gb200-nvl4"),
    "gb200-nvl4-mixed-all-balanced": Case(
        "gb200-nvl4", "mixed", ("3g.93gb", "2g.47gb", "1g.23gb", "1g.23gb")
    ),
    "h100-nvl-none": Case("h100-nvl"),
    "l4x8-none": Case("l4x8"),
    "l40sx4-none": Case("l40sx4"),
    "a10x4-none": Case("a10x4"),
    "a2x2-none": Case("a2x2"),
    "mixed-ada-ampere-none": Case("mixed-ada-ampere"),
}

# shared/reference/feature-discovery.md §3.4, block B (minus timestamp and machine) and cases (a)-(d)
_B = {
    "cuda.driver.major": "550",
    "cuda.driver.minor": "54",
    "cuda.driver.rev": "15",
    "cuda.driver-version.major": "550",
    "cuda.driver-version.minor": "54",
    "cuda.driver-version.revision": "15",
    "cuda.driver-version.full": "550.54.15",
    "cuda.runtime.major": "12",
    "cuda.runtime.minor": "4",
    "cuda.runtime-version.major": "12",
    "cuda.runtime-version.minor": "4",
    "cuda.runtime-version.full": "12.4",
    "gpu.family": "ampere",
    "gpu.compute.major": "8",
    "gpu.compute.minor": "0",
    "gpu.mode": "compute",
    "mig.capable": "true",
    "mps.capable": "false",
    "vgpu.present": "false",
}
_A = {
    "gpu.count": "8",
    "gpu.replicas": "1",
    "gpu.sharing-strategy": "none",
    "gpu.product": "NVIDIA-A100-SXM4-40GB",
    "gpu.memory": "40960",
}


def _mig_group(
    profile: str, count: int, memory: int, mp: int, gi: int, copy: int, dec: int
) -> dict[str, str]:
    values = {
        "count": count,
        "replicas": 1,
        "sharing-strategy": "none",
        "product": f"NVIDIA-A100-SXM4-40GB-MIG-{profile}",
        "memory": memory,
        "multiprocessors": mp,
        "slices.gi": gi,
        "slices.ci": gi,
        "engines.copy": copy,
        "engines.decoder": dec,
        "engines.encoder": 0,
        "engines.jpeg": 0,
        "engines.ofa": 0,
    }
    return {f"mig-{profile}.{k}": str(v) for k, v in values.items()}


REFERENCE_3_4: dict[str, dict[str, str]] = {
    "dgx-a100-none": {**_B, **_A},
    "dgx-a100-single-all-1g.5gb": {
        **_B,
        "mig.strategy": "single",
        "gpu.count": "56",
        "gpu.replicas": "1",
        "gpu.sharing-strategy": "none",
        "gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "gpu.memory": "4864",
        "gpu.multiprocessors": "14",
        "gpu.slices.gi": "1",
        "gpu.slices.ci": "1",
        "gpu.engines.copy": "1",
        "gpu.engines.decoder": "0",
        "gpu.engines.encoder": "0",
        "gpu.engines.jpeg": "0",
        "gpu.engines.ofa": "0",
    },
    "dgx-a100-mixed-all-balanced": {
        **_B,
        "mig.strategy": "mixed",
        "gpu.count": "8",
        "gpu.replicas": "0",
        "gpu.sharing-strategy": "none",
        "gpu.product": "NVIDIA-A100-SXM4-40GB",
        "gpu.memory": "40960",
        **_mig_group("1g.5gb", 16, 4864, 14, 1, 1, 0),
        **_mig_group("2g.10gb", 8, 9856, 28, 2, 2, 1),
        **_mig_group("3g.20gb", 8, 19968, 42, 3, 3, 2),
    },
    "dgx-a100-time-slicing-4": {
        **_B,
        **_A,
        "gpu.replicas": "4",
        "gpu.sharing-strategy": "time-slicing",
        "gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED",
    },
    "dgx-a100-time-slicing-4-renamed": {
        **_B,
        **_A,
        "gpu.replicas": "4",
        "gpu.sharing-strategy": "time-slicing",
    },
}


# ------------------------------------------------------------------------------------------ helpers


def render_golden(labels: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def read_golden(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not key=value: {line!r}"
            assert key not in out, f"{path}: {key} twice"
            out[key] = value
    return out


def check_golden(path: Path, labels: Mapping[str, str]) -> None:
    """Compare ``labels`` with the golden file as sets; with GPUNODE_UPDATE_GOLDEN=1 rewrite it first."""
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_golden(labels), encoding="utf-8")
    expected = read_golden(path)
    got = set(labels.items())
    want = set(expected.items())
    assert got == want, f"{path.name}: missing {sorted(want - got)}, unexpected {sorted(got - want)}"


def fake_sysfs(root: Path, bus_ids: Sequence[str], pci_class: str = "0x030200\n") -> HostPaths:
    host = HostPaths(root=root)
    for bus_id in bus_ids:
        device = host.pci_device(bus_id)
        device.mkdir(parents=True, exist_ok=True)
        (device / "class").write_text(pci_class, encoding="ascii")
    return host


async def apply_layout(nvml: RealNvml, lib: sim.FakeNvmlLib, layout: Sequence[str]) -> None:
    """Enable MIG on every GPU (resetting where the GPU needs it) and create ``layout`` on each."""
    for g in await nvml.gpus():
        result = await nvml.set_mig_mode(g.index, True)
        if result.needs_reset:  # Ampere: the mode change applies at the next GPU reset
            with lib.node.mutate() as state:
                state.reset_gpu(g.index)
        profiles = {p.name: p for p in await nvml.gi_profiles(g.index)}
        for name in layout:
            profile = profiles[name]
            gi = await nvml.create_gpu_instance(g.index, profile.enum)
            cis = await nvml.ci_profiles(g.index, profile.enum)
            full = next(c for c in cis if c.slices == profile.slices)
            await nvml.create_compute_instance(g.index, gi.id, full.enum)


def sharing_from(text: str | None, tmp_path: Path) -> TimeSlicing | None:
    if text is None:
        return None
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, PluginConfig).time_slicing()


async def labels_for(case: Case, tmp_path: Path) -> dict[str, str]:
    lib = sim.install(case.preset)
    nvml = await RealNvml.open()
    try:
        if case.layout:
            await apply_layout(nvml, lib, case.layout)
        hosttree.build(tmp_path / "host", lib.node.state)  # the simulated node's own /sys
        host = HostPaths(root=tmp_path / "host")
        machine = tmp_path / "product_name"
        machine.write_text("DGX A100\n", encoding="utf-8")
        facts = await gather_facts(nvml, host, machine)
    finally:
        await nvml.close()
    result = compute_labels(
        facts, mig_strategy=case.strategy, sharing=sharing_from(case.config, tmp_path), timestamp=None
    )
    assert result.adjusted == ()
    return result.labels


# -------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", sorted(CASES))
async def test_golden(name: str, tmp_path: Path) -> None:
    check_golden(GOLDEN_DIR / f"{name}.txt", await labels_for(CASES[name], tmp_path))


@pytest.mark.parametrize("name", sorted(REFERENCE_3_4))
def test_golden_files_agree_with_reference_3_4(name: str) -> None:
    golden = read_golden(GOLDEN_DIR / f"{name}.txt")
    expected = {N + k: v for k, v in REFERENCE_3_4[name].items()}
    assert {k: golden.get(k) for k in expected} == expected
    assert N + "gfd.timestamp" not in golden
    assert golden[N + "gpu.machine"] == "DGX-A100"


def test_golden_files_are_sorted_and_complete() -> None:
    files = {p.stem for p in GOLDEN_DIR.glob("*.txt")}
    assert files == set(CASES)
    for path in GOLDEN_DIR.glob("*.txt"):
        text = path.read_text(encoding="utf-8")
        assert text == render_golden(read_golden(path)), f"{path.name} is not sorted key=value lines"


def test_update_env_rewrites_the_golden_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "case.txt"
    path.write_text("nvidia.com/gpu.count=1\n", encoding="utf-8")
    labels = {N + "gpu.product": "Tesla-T4", N + "gpu.count": "4"}
    with pytest.raises(AssertionError, match=r"gpu\.count"):
        check_golden(path, labels)
    monkeypatch.setenv(UPDATE_ENV, "1")
    check_golden(path, labels)
    assert path.read_text(encoding="utf-8") == "nvidia.com/gpu.count=4\nnvidia.com/gpu.product=Tesla-T4\n"


# ---------------------------------------------------------------------------------- facts from sysfs


async def test_facts_missing_class_machine_and_lost_gpu(tmp_path: Path) -> None:
    lib = sim.install("t4x4")
    nvml = await RealNvml.open()
    try:
        bus_ids = [g.pci.bus_id for g in await nvml.gpus()]
        host = fake_sysfs(tmp_path, bus_ids[1:])  # GPU 0 has no class file
        with lib.node.mutate() as state:
            state.lose(3)
        facts = await gather_facts(nvml, host, tmp_path / "no-such-file")
    finally:
        await nvml.close()
    assert [g.index for g in facts.gpus] == [0, 1, 2]
    assert facts.pci_classes == {0: None, 1: 0x030200, 2: 0x030200}
    assert facts.machine is None
    assert facts.vgpu_present is False
    result = compute_labels(facts, mig_strategy="none", sharing=None, timestamp=None)
    assert result.labels[N + "gpu.mode"] == "unknown"
    assert result.labels[N + "gpu.machine"] == "unknown"
    assert result.labels[N + "gpu.count"] == "3"


async def test_facts_mig_devices_only_for_mig_enabled_gpus(tmp_path: Path) -> None:
    sim.install("dgx-h100")
    nvml = await RealNvml.open()
    try:
        result = await nvml.set_mig_mode(2, True)
        assert not result.needs_reset  # Hopper applies MIG mode at once
        facts = await gather_facts(nvml, HostPaths(root=tmp_path), None)
    finally:
        await nvml.close()
    assert facts.mig_devices == {2: ()}
    labels = compute_labels(facts, mig_strategy="single", sharing=None, timestamp=None).labels
    assert labels[N + "gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0x030200\n", 0x030200), ("0x030000", 0x030000), ("030200", 0x030200), ("garbage", None)],
)
def test_read_pci_class(tmp_path: Path, text: str, expected: int | None) -> None:
    host = fake_sysfs(tmp_path, ["00000000:07:00.0"], text)
    assert read_pci_class(host, "00000000:07:00.0") == expected
    assert read_pci_class(host, "00000000:08:00.0") is None
    assert read_pci_class(host, "not-a-bus-id") is None


def test_read_machine_type(tmp_path: Path) -> None:
    path = tmp_path / "product_name"
    path.write_text("  DGX A100 920-23687-2530-000\n", encoding="utf-8")
    assert read_machine_type(path) == "DGX A100 920-23687-2530-000"
    assert read_machine_type(tmp_path / "missing") is None
    assert read_machine_type(None) is None


def _config_space(*caps: tuple[int, bytes], size: int = 256, cap_list: bool = True) -> bytes:
    """A type-0 PCI config space with the capabilities chained from 0x40, 0x20 bytes apart."""
    space = bytearray(size)
    space[0:4] = bytes([0xDE, 0x10, 0xB0, 0x20])
    if cap_list:
        space[0x06] = 0x10
    space[0x34] = 0x40 if caps else 0
    for i, (cap_id, body) in enumerate(caps):
        at = 0x40 + 0x20 * i
        nxt = at + 0x20 if i + 1 < len(caps) else 0
        space[at : at + 2 + len(body)] = bytes([cap_id, nxt]) + body
    return bytes(space)


VGPU_CAP = (0x09, bytes([0x14, ord("V"), ord("F")]))


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(_config_space((0x01, b"\x03"), (0x10, b"\x02"), VGPU_CAP), True, id="vgpu-third"),
        pytest.param(_config_space(VGPU_CAP), True, id="vgpu-first"),
        pytest.param(_config_space((0x09, bytes([0x14, ord("X"), ord("F")]))), False, id="other-vendor-cap"),
        pytest.param(_config_space((0x01, b"\x03"), (0x10, b"\x02")), False, id="no-vendor-cap"),
        pytest.param(_config_space(VGPU_CAP, cap_list=False), False, id="no-cap-list-bit"),
        pytest.param(_config_space(VGPU_CAP)[:64], False, id="unprivileged-64-bytes"),
        pytest.param(b"", False, id="empty"),
    ],
)
def test_vgpu_capability(tmp_path: Path, config: bytes, expected: bool) -> None:
    host = HostPaths(root=tmp_path)
    device = host.pci_device("0000:07:00.0")
    device.mkdir(parents=True)
    (device / "config").write_bytes(config)
    assert has_vgpu_capability(host, "00000000:07:00.0") is expected
    assert has_vgpu_capability(host, "00000000:08:00.0") is False


def test_vgpu_capability_pointer_loop_terminates(tmp_path: Path) -> None:
    space = bytearray(_config_space((0x01, b"\x03")))
    space[0x41] = 0x40  # the capability points at itself
    host = HostPaths(root=tmp_path)
    device = host.pci_device("0000:07:00.0")
    device.mkdir(parents=True)
    (device / "config").write_bytes(bytes(space))
    assert has_vgpu_capability(host, "0000:07:00.0") is False

"""`gpunode demo`: a walkthrough on the embedded simulated GPU node."""

from __future__ import annotations

import asyncio

from gpunode.nvml import errors, mig, sim
from gpunode.nvml.api import GpuInfo, Nvml
from gpunode.nvml.real import RealNvml


def _inventory(gpus: list[GpuInfo]) -> str:
    rows = [f"{'GPU':<4}{'name':<24}{'uuid':<42}{'bus id':<18}{'memory':>11}  {'CC':<4} {'NUMA':<5} MIG"]
    for g in gpus:
        mode = "n/a" if g.mig is None else ("on" if g.mig.current else "off")
        rows.append(
            f"{g.index:<4}{g.name:<24}{g.uuid:<42}{g.pci.bus_id:<18}{g.memory_total_mib:>7} MiB  "
            f"{g.compute_capability[0]}.{g.compute_capability[1]:<2} {g.numa_node!s:<5} {mode}"
        )
    return "\n".join(rows)


async def _walkthrough(nvml: Nvml, node: sim.SimNode, preset: str) -> None:
    system = await nvml.system()
    cuda = ".".join(map(str, system.cuda_version))
    print(f"== Simulated node: {preset}, driver {system.driver_version}, CUDA {cuda}")
    print(_inventory(await nvml.gpus()))
    print("\n== Topology (like `nvidia-smi topo -m`)")
    print((await nvml.topology()).matrix())

    print("\n== MIG on GPU 0")
    result = await nvml.set_mig_mode(0, True)
    state_text = f"current={_on(result.current)} pending={_on(result.pending)}"
    print(f"enable MIG: {state_text} ({result.activation})")
    if result.needs_reset:
        with node.mutate() as state:  # what `nvidia-smi -r` does on a real node
            state.reset_gpu(0)
        mode = await nvml.mig_mode(0)
        after = _on(bool(mode and mode.current))
        print(f"Ampere applies a MIG mode change at the next GPU reset; after it: MIG {after}")

    profiles = {p.name: p for p in await nvml.gi_profiles(0)}
    listing = ", ".join(f"{n} (id {p.id}, max {p.instance_count})" for n, p in profiles.items())
    print(f"GPU-instance profiles: {listing}")
    sizes = sorted(profiles.values(), key=lambda p: (p.slices, p.memory_mib))
    plain = [p for p in sizes if "+" not in p.name and p.slices in (1, 2, 3)]
    one, two, three = (next(p for p in plain if p.slices == s) for s in (1, 2, 3))
    layout = [three, two, one, one]
    print(f"creating {' + '.join(p.name for p in layout)} (biggest first)")
    for p in layout:
        gi = await nvml.create_gpu_instance(0, p.enum)
        full = next(c for c in await nvml.ci_profiles(0, p.enum) if c.slices == p.slices)
        await nvml.create_compute_instance(0, gi.id, full.enum)
    try:
        await nvml.create_gpu_instance(0, three.enum)
    except errors.InsufficientResources:
        print(f"a further {three.name} is refused: INSUFFICIENT_RESOURCES (its memory slices are taken)")
    print(f"\n{'MIG device':<44}{'profile':<10}{'GI':>3}{'CI':>3}{'memory':>11}{'SMs':>5}")
    for d in await nvml.mig_devices(0):
        print(f"{d.uuid:<44}{d.profile:<10}{d.gi_id:>3}{d.ci_id:>3}{d.memory_mib:>7} MiB{d.sm_count:>5}")
    gis = await nvml.gpu_instances(0)
    print(
        "placements: "
        + ", ".join(f"GI {g.id} {g.profile.name}@{g.placement.start}:{g.placement.size}" for g in gis)
    )
    await _labels(nvml)
    await _metrics(nvml)
    name = mig.parse_profile("1c.3g.20gb")
    print(f"\nprofile grammar: {name} = {name.c} compute slice of a {name.g}g GPU instance with {name.gb} GB")


async def _labels(nvml: Nvml) -> None:
    """What gpunode-feature-discovery would write for this node (mixed MIG strategy)."""
    import tempfile

    from gpunode.common.hostpaths import HostPaths
    from gpunode.feature_discovery.facts import gather_facts
    from gpunode.feature_discovery.labels import compute_labels

    with tempfile.TemporaryDirectory() as empty:  # simulated GPUs have no sysfs entries on this machine
        facts = await gather_facts(nvml, HostPaths(root=empty), None)
    result = compute_labels(facts, mig_strategy="mixed", sharing=None, timestamp=None)
    print("\n== Node labels (gpunode-feature-discovery --mig-strategy mixed)")
    for key, value in sorted(result.labels.items()):
        print(f"{key}={value}")


async def _metrics(nvml: Nvml) -> None:
    """One scrape of what gpunode-exporter serves for this node (dcgm-exporter's names and labels)."""
    import urllib.request

    from prometheus_client import CollectorRegistry

    from gpunode.common.http import HealthServer
    from gpunode.exporter.collector import ExporterCollector, Options
    from gpunode.exporter.counters import load_counters
    from gpunode.exporter.sampler import Sampler

    sampler = Sampler(nvml, interval=30)
    snap = await sampler.sample()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(load_counters(None), Options("demo-node"), lambda: snap))
    wanted = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED")
    async with HealthServer(registry, host="127.0.0.1", port=0) as http:  # a real HTTP scrape
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"{http.url}/metrics", timeout=5).read()
        )
    lines = [line for line in body.decode().splitlines() if line.startswith(wanted)]
    print("\n== A scrape of gpunode-exporter (a few series)")
    for line in [*lines[:2], *[x for x in lines if "GPU_I_PROFILE" in x][:2], *lines[-2:]]:
        print(line)


def _on(flag: bool) -> str:
    return "on" if flag else "off"


async def _main(preset: str) -> int:
    lib = sim.install(preset)
    nvml = await RealNvml.open()
    try:
        await _walkthrough(nvml, lib.node, preset)
    finally:
        await nvml.close()
        sim.uninstall()
    return 0


def run(preset: str = "dgx-a100") -> int:
    return asyncio.run(_main(preset))

"""End to end, as a kubelet with a CDI-enabled runtime does it: a simulated dgx-a100 (MIG on GPU 0 with
the all-balanced layout, GPUs 1-7 whole) -> `gpunode-device-plugin --device-list-strategy cdi-cri` as a
real process registered with the kubelet emulator -> `Allocate` -> the CDI names in the response ->
`podman run --device <name>` with the specs `gpunode-toolkit cdi generate` writes when run as the
rendered DaemonSet runs it (`--also-kind k8s.device-plugin.nvidia.com/gpu`: the kind of the plugin's
names) -> the container sees exactly the allocated GPU (for a MIG device: its GPU's node and its two
capability nodes only)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from gpunode.device_plugin.allocation import CDI_KIND as PLUGIN_CDI_KIND
from gpunode.sim import nvml as sim
from gpunode.sim.kubelet import FakeKubelet
from helpers.fakedriver import FakeDriver
from helpers.gpucontainers import (
    Expected,
    expect_gpus,
    expect_mig,
    generate_spec,
    inventory,
    mig_apply,
    run_and_check,
    tool_env,
)
from helpers.podman import SpecFile

# The first test may bootstrap the base image (containers/ci/base-image.sh, up to ~2 minutes on 2 busy
# cores) in its session fixture: more than the default per-test timeout.
pytestmark = pytest.mark.timeout(600)


PLUGIN = str(Path(sys.executable).parent / "gpunode-device-plugin")
MIG_LAYOUT = """\
version: v1
mig-configs:
  gpu0-balanced:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    - devices: [1, 2, 3, 4, 5, 6, 7]
      mig-enabled: false
"""


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(tmp_path / "device-plugins")
    await k.start()
    yield k
    await k.stop()


@pytest.fixture
async def plugin(tmp_path: Path, kubelet: FakeKubelet) -> AsyncIterator[Path]:
    """The node (MIG on GPU 0) and the device plugin serving it with cdi-cri, mixed MIG strategy."""
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    layout = tmp_path / "mig.yaml"
    layout.write_text(MIG_LAYOUT)
    mig_apply(state, "gpu0-balanced", layout)
    (tmp_path / "host").mkdir()
    proc = await asyncio.create_subprocess_exec(
        PLUGIN,
        "--sim-state",
        str(state),
        "--kubelet-socket",
        str(kubelet.socket),
        "--host-root",
        str(tmp_path / "host"),
        "--device-list-strategy",
        "cdi-cri",
        "--mig-strategy",
        "mixed",
        "--http-port",
        "-1",
        env=tool_env(),
        stdout=subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        for resource in ("nvidia.com/gpu", "nvidia.com/mig-3g.20gb"):
            try:
                await kubelet.wait_registered(resource, timeout=30)
            except TimeoutError:
                proc.kill()
                _, err = await proc.communicate()
                pytest.fail(f"{resource} not registered; the plugin said:\n{err.decode()[-3000:]}")
        yield state
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.communicate(), 15)


async def allocate(kubelet: FakeKubelet, resource: str) -> list[str]:
    """Allocate one healthy device of ``resource`` for one container; the CDI names it returned (and
    nothing else: no env, mounts or device specs with cdi-cri alone)."""
    device = sorted(kubelet.healthy(resource))[0]
    resp = await kubelet.allocate(resource, [device])
    (container,) = resp.container_responses
    assert not container.envs, container
    assert not container.mounts, container
    assert not container.devices, container
    names = [d.name for d in container.cdi_devices]
    assert names, f"no CDI devices in the response for {resource}"
    return names


async def test_allocated_gpu_and_mig_device_reach_the_container(
    plugin: Path, kubelet: FakeKubelet, driver: FakeDriver, hook: str, cdi_dir: SpecFile, tmp_path: Path
) -> None:
    gpus, migs = await inventory(plugin)
    by_uuid = {g.uuid: g for g in gpus}
    gpu_names = await allocate(kubelet, "nvidia.com/gpu")
    mig_names = await allocate(kubelet, "nvidia.com/mig-3g.20gb")
    # the toolkit as the rendered DaemonSet runs it: nvidia.yaml, and the same devices under the kind the
    # device plugin names them with, in a file of its own next to it
    out = tmp_path / "cdi"
    generate_spec(plugin, driver, hook, out / "nvidia.yaml", "--also-kind", PLUGIN_CDI_KIND)
    specs = {}
    for path in sorted(out.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        specs[doc["kind"]] = doc
        (
            cdi_dir if path.name == "nvidia.yaml" else cdi_dir.sibling(f"{cdi_dir.path.stem}-{path.name}")
        ).write(path.read_text())
    assert set(specs) == {"nvidia.com/gpu", PLUGIN_CDI_KIND}, sorted(specs)
    names_in_specs = {f"{kind}={d['name']}" for kind, doc in specs.items() for d in doc["devices"]}

    assert len(gpu_names) == 1, gpu_names
    assert gpu_names[0] in names_in_specs, (gpu_names, sorted(names_in_specs))
    kind, uuid = gpu_names[0].split("=", 1)
    assert uuid in by_uuid, f"{gpu_names[0]} is not a whole GPU of the node"
    assert by_uuid[uuid].index != 0, "GPU 0 is in MIG mode: not a whole-GPU resource"
    run_and_check(gpu_names, driver, specs[kind], expect_gpus(by_uuid[uuid].minor))

    assert len(mig_names) == 1, mig_names
    assert mig_names[0] in names_in_specs, (mig_names, sorted(names_in_specs))
    kind, mig_uuid = mig_names[0].split("=", 1)
    gpu0 = next(g for g in gpus if g.index == 0)
    (mig,) = [m for m in migs[0] if m.uuid == mig_uuid]
    expected: Expected = expect_mig(driver, gpu0, mig)
    run_and_check(mig_names, driver, specs[kind], expected)

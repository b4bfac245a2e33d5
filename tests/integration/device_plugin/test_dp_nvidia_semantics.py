"""Time slicing with NVIDIA's semantics by default: a file written for NVIDIA's plugin advertises what it
advertises (``rename`` / ``devices`` / ``resources`` ignored); gpunode's extension only when switched on."""

from __future__ import annotations

from typing import Any

from gpunode.sim.kubelet import FakeKubelet

Starter = Any  # the start_plugin fixture (see conftest.py)

GPU = "nvidia.com/gpu"

RENAMED = """
version: v1
{flags}resources:
  gpus: [{{pattern: "*T4*", name: t4}}]
sharing:
  timeSlicing:
    renameByDefault: {by_default}
    resources:
    - name: nvidia.com/gpu
      replicas: 3
      rename: gpu-shared
      devices: [0, "1", GPU-00000000-0000-0000-0000-000000000000]
"""


async def test_rename_and_devices_are_ignored_as_nvidia_does(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    await start_plugin("t4x4", config=RENAMED.format(flags="", by_default="false"), wait=GPU)
    await kubelet.wait_for(lambda: len(kubelet.healthy(GPU)) == 12)  # 4 GPUs x 3 replicas, all of them
    assert all("::" in device for device in kubelet.healthy(GPU))
    assert "nvidia.com/gpu-shared" not in kubelet.plugins
    assert "nvidia.com/t4" not in kubelet.plugins


async def test_rename_by_default_gives_nvidias_shared_name(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    await start_plugin(
        "t4x4", config=RENAMED.format(flags="", by_default="true"), wait="nvidia.com/gpu.shared"
    )
    await kubelet.wait_for(lambda: len(kubelet.healthy("nvidia.com/gpu.shared")) == 12)
    assert "nvidia.com/gpu-shared" not in kubelet.plugins


async def test_gpunode_extension_honours_rename_devices_and_resources(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    config = RENAMED.format(flags="flags:\n  gpunode:\n    timeSlicingExtensions: true\n", by_default="false")
    config = config.replace(", GPU-00000000-0000-0000-0000-000000000000", "").replace(
        "name: nvidia.com/gpu\n", "name: nvidia.com/t4\n"
    )
    await start_plugin("t4x4", config=config, wait="nvidia.com/gpu-shared")
    await kubelet.wait_for(lambda: len(kubelet.healthy("nvidia.com/gpu-shared")) == 6)  # GPUs 0 and 1
    await kubelet.wait_for(lambda: len(kubelet.healthy("nvidia.com/t4")) == 2)  # 2 and 3 stay whole

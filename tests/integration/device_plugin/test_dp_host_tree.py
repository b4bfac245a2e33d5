"""The device plugin on a simulated node with its host tree (`gpunode sim init --host-root`): NUMA from
the tree's sysfs, MIG device nodes from its capability table, following a MIG change at runtime."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpunode.common.hostpaths import HostPaths
from gpunode.nvml import mig
from gpunode.sim import hosttree
from gpunode.sim.kubelet import FakeKubelet
from gpunode.sim.nvml.node import SimNode, init_state_file
from gpunode.sim.nvml.presets import get_preset

Starter = Any  # the start_plugin fixture (see conftest.py)
GPU = "nvidia.com/gpu"


async def test_numa_and_mig_capability_nodes_come_from_the_tree(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    root = tmp_path / "tree"
    state = init_state_file(tmp_path / "node.json", "dgx-h100")
    hosttree.build(root, state, nodes=False)
    hosttree.link(tmp_path / "node.json", root)
    r = await start_plugin(
        "dgx-h100",
        host=HostPaths(root=root),
        overrides={"mig_strategy": "mixed", "pass_device_specs": True, "dev_root": str(root)},
    )
    slots = get_preset("dgx-h100").gpus
    numa = {g.uuid: [slots[g.index].numa_node] for g in r.plugin.gpus}
    assert kubelet.plugins[GPU].numa == numa
    with SimNode.open(tmp_path / "node.json").mutate() as st:  # as gpunode-mig would, from outside
        assert st.set_mig_mode(5, 1)[0] == 0
        ret, gi = st.create_gi(5, mig.GI_7_SLICE, None)
        assert ret == 0
        assert st.create_ci(5, gi, mig.CI_7_SLICE, None)[0] == 0
    await kubelet.wait_registered("nvidia.com/mig-7g.80gb", timeout=15)
    (mig_id,) = kubelet.plugins["nvidia.com/mig-7g.80gb"].devices
    resp = (await kubelet.allocate("nvidia.com/mig-7g.80gb", [mig_id])).container_responses[0]
    gi_minor, ci_minor = hosttree.cap_minor(5, gi), hosttree.cap_minor(5, gi, 0)
    specs = {d.container_path: d.host_path for d in resp.devices}
    assert list(specs)[-3:] == [
        "/dev/nvidia5",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
    ]
    missing = [c for c, h in specs.items() if not os.path.exists(h)]  # noqa: ASYNC240
    assert missing == []  # every node handed out exists in the tree
    assert kubelet.plugins["nvidia.com/mig-7g.80gb"].numa[mig_id] == [slots[5].numa_node]

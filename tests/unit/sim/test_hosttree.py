"""The simulated node's host tree: what `gpunode sim init --host-root` lays down, read back through the
agents' own readers, and its MIG capabilities following the simulator's layout."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from gpunode.common.devnode import char_device
from gpunode.common.hostpaths import HostPaths
from gpunode.driver_loader import devnodes, kmod
from gpunode.driver_loader.modules import parse_proc_devices
from gpunode.feature_discovery.facts import has_vgpu_capability, read_pci_class
from gpunode.nvml import mig
from gpunode.nvml.caps import mig_cap_keys, read_mig_minors
from gpunode.sim import hosttree
from gpunode.sim.nvml.node import SimNode, init_state_file
from gpunode.sim.nvml.presets import get_preset


def tree(
    tmp_path: Path, preset: str, *, nodes: bool = False, imex: tuple[int, ...] = ()
) -> tuple[Path, Path]:
    state_file, root = tmp_path / "node.json", tmp_path / "host"
    state = init_state_file(state_file, preset)
    hosttree.build(root, state, imex_channels=imex, nodes=nodes)
    hosttree.link(state_file, root)
    return state_file, root


@pytest.mark.parametrize("preset", ["dgx-a100", "gb200-nvl4", "t4x4", "mixed-ada-ampere"])
def test_sysfs_gives_class_numa_ids_and_driver_binding(tmp_path: Path, preset: str) -> None:
    _, root = tree(tmp_path, preset)
    host = HostPaths(root=root)
    for slot in get_preset(preset).gpus:
        assert read_pci_class(host, slot.bus_id) == hosttree.PCI_CLASS_3D  # gpu.mode=compute
        assert host.read_numa_node(slot.bus_id) == slot.numa_node
        device = host.pci_device(slot.bus_id)
        assert (device / "device").read_text() == f"0x{slot.product.pci_device_id >> 16:04x}\n"
        assert (device / "driver").resolve() == (root / "sys/bus/pci/drivers/nvidia").resolve()
        assert not has_vgpu_capability(host, slot.bus_id)


def test_proc_has_majors_driver_files_and_the_mig_minor_table(tmp_path: Path) -> None:
    _, root = tree(tmp_path, "dgx-a100")
    host = HostPaths(root=root)
    majors = parse_proc_devices(host.proc_devices.read_text())
    assert majors["nvidia-frontend"] == 195
    assert majors["nvidia-caps-imex-channels"] == hosttree.MAJORS["nvidia-caps-imex-channels"]
    assert "550.54.15" in (host.proc_driver_nvidia / "version").read_text()
    assert "ModifyDeviceFiles: 1" in (host.proc_driver_nvidia / "params").read_text()
    table = read_mig_minors(host)
    assert table is not None
    # the driver's numbering (the reference's example: gpu0/gi1/access 12, gpu0/gi1/ci0/access 13)
    assert (table["config"], table["monitor"]) == (1, 2)
    assert (table["gpu0/gi1/access"], table["gpu0/gi1/ci0/access"]) == (12, 13)
    assert table["gpu7/gi14/ci7/access"] == hosttree.cap_minor(7, 14, 7)
    assert len(table) == 2 + 8 * 15 * 9


def test_no_mig_capable_gpu_no_mig_entries(tmp_path: Path) -> None:
    _, root = tree(tmp_path, "t4x4")
    assert read_mig_minors(HostPaths(root=root)) == {"config": 1, "monitor": 2}


def test_dev_nodes_as_stand_ins_match_what_the_loader_plans(tmp_path: Path) -> None:
    _, root = tree(tmp_path, "dgx-a100", imex=(0,))
    host = HostPaths(root=root)
    planned = devnodes.plan_nodes(host, kmod.loaded_modules(host), imex_channels=(0,))
    missing = [str(n) for n in planned if not char_device(n.path, n.major, n.minor)]
    assert missing == []  # every node the driver loader would make is already there


def test_real_nodes_where_permitted(tmp_path: Path) -> None:
    if not hosttree.can_mknod(tmp_path):
        pytest.skip("this process may not mknod")
    _, root = tree(tmp_path, "t4x4", nodes=True)
    assert stat.S_ISCHR((root / "dev/nvidia3").stat().st_mode)


def test_mig_changes_through_the_state_file_are_followed(tmp_path: Path) -> None:
    state_file, root = tree(tmp_path, "dgx-a100")
    host = HostPaths(root=root)
    caps = host.proc_driver_nvidia / "capabilities"
    node = SimNode.open(state_file)
    with node.mutate() as st:
        st.gpus[2].mig_current = st.gpus[2].mig_pending = 1
        ret, gi_id = st.create_gi(2, mig.GI_3_SLICE, None)
        assert ret == 0
        assert st.create_ci(2, gi_id, mig.CI_3_SLICE, None)[0] == 0
    gi_key, ci_key = mig_cap_keys(2, gi_id, 0)
    table = read_mig_minors(host)
    assert table is not None
    gi_file = caps / f"gpu2/mig/gi{gi_id}/access"
    assert f"DeviceFileMinor: {table[gi_key]}\n" in gi_file.read_text()
    assert (caps / f"gpu2/mig/gi{gi_id}/ci0/access").exists()
    assert char_device(root / f"dev/nvidia-caps/nvidia-cap{table[ci_key]}", 235, table[ci_key])
    with node.mutate() as st:  # the layout goes: so do its capabilities
        st.gpus[2].gis.clear()
    assert not (caps / "gpu2").exists()
    assert sorted(p.name for p in (root / "dev/nvidia-caps").iterdir()) == ["nvidia-cap1", "nvidia-cap2"]


def test_a_tree_removed_under_the_simulator_is_unlinked(tmp_path: Path) -> None:
    state_file, root = tree(tmp_path, "t4x4")
    shutil.rmtree(root)
    with SimNode.open(state_file).mutate() as st:
        st.gpus[0].pcie_replay += 1
    assert hosttree.linked_root(state_file) is None

"""gpunode.device_plugin.devices: MIG strategies, time-slicing replicas and message sizes, from fixtures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gpunode.api.plugin_types import ResourcePattern, SharedResource, TimeSlicing
from gpunode.device_plugin.devices import (
    MAX_MESSAGE_BYTES,
    DeviceConfigError,
    Inventory,
    PluginDevice,
    Resource,
    build_inventory,
    build_resources,
    listandwatch_size_bytes,
    mig_resource_name,
)
from gpunode.device_plugin.settings import PluginSettings
from gpunode.nvml.api import GpuInfo, MigDevice, MigMode, PciInfo
from gpunode.nvml.caps import parse_mig_minors

# ------------------------------------------------------------------------------------------ fixtures

A100 = "NVIDIA A100-SXM4-40GB"
# profile -> (GI slices, CI slices, memory MiB)
PROFILES = {
    "1g.5gb": (1, 1, 4864),
    "2g.10gb": (2, 2, 9856),
    "3g.20gb": (3, 3, 19968),
    "4g.20gb": (4, 4, 19968),
    "7g.40gb": (7, 7, 40192),
    "1c.3g.20gb": (3, 1, 19968),
    "1g.10gb+me": (1, 1, 9856),
}


def uuid(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"


def gpu(i: int, *, mig: bool | None = False, name: str = A100, minor: int | None = None) -> GpuInfo:
    """GPU ``i`` of a DGX A100; ``mig=None`` means not MIG-capable."""
    return GpuInfo(
        index=i,
        minor=i if minor is None else minor,
        uuid=uuid(i),
        name=name,
        serial=None,
        pci=PciInfo(
            bus_id=f"00000000:{i + 7:02X}:00.0",
            domain=0,
            bus=i + 7,
            device=0,
            device_id=0x20B010DE,
            subsystem_id=0x134F10DE,
        ),
        numa_node=i // 4,
        memory_total_mib=40960,
        compute_capability=(8, 0),
        architecture="ampere",
        brand="nvidia",
        sm_count=108,
        mig=None if mig is None else MigMode(current=mig, pending=mig),
    )


def mig(parent: GpuInfo, j: int, profile: str, gi: int | None = None, ci: int = 0) -> MigDevice:
    gi_slices, ci_slices, memory = PROFILES[profile]
    return MigDevice(
        parent_index=parent.index,
        parent_uuid=parent.uuid,
        index=j,
        uuid=f"MIG-{parent.index:08d}-0000-0000-0000-{j:012d}",
        name=f"{A100} MIG {profile}",
        profile=profile,
        gi_id=gi if gi is not None else j + 1,
        ci_id=ci,
        memory_mib=memory,
        sm_count=14 * ci_slices,
        gi_slices=gi_slices,
        ci_slices=ci_slices,
        copy_engines=1,
        decoders=0,
        encoders=0,
        jpeg=0,
        ofa=0,
    )


def migs(parent: GpuInfo, *profiles: str) -> list[MigDevice]:
    return [mig(parent, j, p) for j, p in enumerate(profiles)]


def numa(g: GpuInfo) -> int | None:
    return g.numa_node


def mig_minors_text(gpus: int = 8) -> str:
    """What the driver writes: config, monitor, then 15 GIs x (access + 8 CIs) per GPU."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for g in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


MINORS = parse_mig_minors(mig_minors_text())


def build(
    gpus: Sequence[GpuInfo],
    mig_devices: Mapping[int, Sequence[MigDevice]] | None = None,
    minors: Mapping[str, int] | None = MINORS,
    **settings: Any,
) -> Inventory:
    return build_inventory(gpus, mig_devices or {}, PluginSettings(**settings), numa=numa, mig_minors=minors)


def names(inventory: Inventory | Sequence[Resource]) -> dict[str, int]:
    resources = inventory.resources if isinstance(inventory, Inventory) else inventory
    return {r.name: len(r.devices) for r in resources}


def by_name(inventory: Inventory, name: str) -> Resource:
    return next(r for r in inventory.resources if r.name == name)


def sharing(*entries: SharedResource, rename_by_default: bool = False, fail: bool = False) -> TimeSlicing:
    return TimeSlicing(
        rename_by_default=rename_by_default, fail_requests_greater_than_one=fail, resources=entries
    )


EIGHT = [gpu(i) for i in range(8)]
EIGHT_MIG = [gpu(i, mig=True) for i in range(8)]
SEVEN_SMALL = {g.index: migs(g, *["1g.5gb"] * 7) for g in EIGHT_MIG}


# ----------------------------------------------------------------------------------- whole GPUs


def test_strategy_none_advertises_every_gpu_whole() -> None:
    inventory = build(EIGHT)
    assert names(inventory) == {"nvidia.com/gpu": 8}
    resource = inventory.resources[0]
    assert not resource.shared
    assert resource.replicas == 1
    assert resource.devices[3] == PluginDevice(
        id=uuid(3),
        device_uuid=uuid(3),
        physical_uuid=uuid(3),
        gpu_index=3,
        index="3",
        mig=None,
        numa_node=0,
        replica=None,
        replicas=1,
        device_nodes=("/dev/nvidia3",),
        memory_mib=40960,
        profile=None,
    )
    assert inventory.warnings == ()


def test_devices_are_sorted_whatever_the_input_order() -> None:
    resource = build(list(reversed(EIGHT))).resources[0]
    assert [d.gpu_index for d in resource.devices] == list(range(8))


def test_device_node_uses_the_minor_not_the_index() -> None:
    resource = build([gpu(0, minor=5)]).resources[0]
    assert resource.devices[0].device_nodes == ("/dev/nvidia5",)


def test_strategy_none_ignores_mig_mode() -> None:
    inventory = build(EIGHT_MIG, SEVEN_SMALL, mig_strategy="none")
    assert names(inventory) == {"nvidia.com/gpu": 8}
    assert all(d.mig is None for d in inventory.resources[0].devices)


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_no_gpus_no_resources(strategy: str) -> None:
    assert build([], mig_strategy=strategy).resources == ()


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_no_mig_enabled_gpus_behave_like_none(strategy: str) -> None:
    gpus = [gpu(0), gpu(1, mig=None)]
    assert names(build(gpus, mig_strategy=strategy)) == {"nvidia.com/gpu": 2}


def test_numa_callback_is_used() -> None:
    inventory = build_inventory(EIGHT, {}, PluginSettings(), numa=lambda g: None, mig_minors=None)
    assert {d.numa_node for d in inventory.resources[0].devices} == {None}


# ------------------------------------------------------------------------------------------ single


def test_single_advertises_mig_devices_as_gpu() -> None:
    inventory = build(EIGHT_MIG, SEVEN_SMALL, mig_strategy="single")
    assert names(inventory) == {"nvidia.com/gpu": 56}
    device = inventory.resources[0].devices[9]  # GPU 1, MIG device 2
    gi_access = MINORS["gpu1/gi3/access"]
    assert device == PluginDevice(
        id="MIG-00000001-0000-0000-0000-000000000002",
        device_uuid="MIG-00000001-0000-0000-0000-000000000002",
        physical_uuid=uuid(1),
        gpu_index=1,
        index="1:2",
        mig=(3, 0),
        numa_node=0,
        replica=None,
        replicas=1,
        device_nodes=(
            "/dev/nvidia1",
            f"/dev/nvidia-caps/nvidia-cap{gi_access}",
            f"/dev/nvidia-caps/nvidia-cap{gi_access + 1}",
        ),
        memory_mib=4864,
        profile="1g.5gb",
        mig_index=2,
    )


@pytest.mark.parametrize(
    ("gpus", "mig_devices", "message"),
    [
        pytest.param(
            [gpu(0, mig=True), gpu(1, mig=True)],
            {0: migs(gpu(0), "1g.5gb"), 1: migs(gpu(1), "3g.20gb")},
            "mig-strategy single: more than one MIG profile on the node (1g.5gb, 3g.20gb)",
            id="two-profiles",
        ),
        pytest.param(
            [gpu(0, mig=True), gpu(1, mig=True)],
            {0: migs(gpu(0), "3g.20gb", "1g.5gb")},
            "mig-strategy single: MIG-enabled GPU(s) 1 have no MIG devices",
            id="mig-gpu-without-devices",
        ),
        pytest.param(
            [gpu(0, mig=True), gpu(1), gpu(2, mig=None)],
            {0: migs(gpu(0), "1g.5gb")},
            "mig-strategy single: MIG-enabled and non-MIG GPUs are mixed on the node "
            "(MIG enabled: 0; MIG disabled: 1, 2)",
            id="mixed-mig-and-whole",
        ),
        pytest.param(
            [gpu(0, mig=True)],
            {0: [mig(gpu(0), 0, "1c.3g.20gb")]},
            "mig-strategy single: MIG device MIG-00000000-0000-0000-0000-000000000000 (GPU 0, profile "
            "1c.3g.20gb) has a compute instance smaller than its GPU instance (1 of 3 slices); "
            "such profiles are unsupported",
            id="compute-sub-profile",
        ),
    ],
)
def test_single_rejects_what_nvidia_rejects(
    gpus: list[GpuInfo], mig_devices: dict[int, list[MigDevice]], message: str
) -> None:
    with pytest.raises(DeviceConfigError) as info:
        build(gpus, mig_devices, mig_strategy="single")
    assert str(info.value).startswith(message)


# ------------------------------------------------------------------------------------------- mixed


def mixed_node() -> tuple[list[GpuInfo], dict[int, list[MigDevice]]]:
    gpus = [gpu(0), gpu(1, mig=None), gpu(2, mig=True), gpu(3, mig=True), gpu(4, mig=True)]
    layout = {
        2: migs(gpus[2], "3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"),
        3: migs(gpus[3], "1g.10gb+me", "7g.40gb"),  # not a real layout; names only
    }
    return gpus, layout


def test_mixed_gives_one_resource_per_profile() -> None:
    gpus, layout = mixed_node()
    inventory = build(gpus, layout, mig_strategy="mixed")
    assert names(inventory) == {
        "nvidia.com/gpu": 2,
        "nvidia.com/mig-1g.10gb.me": 1,
        "nvidia.com/mig-1g.5gb": 2,
        "nvidia.com/mig-2g.10gb": 1,
        "nvidia.com/mig-3g.20gb": 1,
        "nvidia.com/mig-7g.40gb": 1,
    }
    assert [r.name for r in inventory.resources] == sorted(names(inventory))
    small = by_name(inventory, "nvidia.com/mig-1g.5gb")
    assert [(d.index, d.mig, d.profile) for d in small.devices] == [
        ("2:2", (3, 0), "1g.5gb"),
        ("2:3", (4, 0), "1g.5gb"),
    ]
    assert inventory.warnings == (
        f"GPU 4 ({uuid(4)}) has MIG enabled but no MIG devices; it is not advertised",
    )


def test_mixed_rejects_compute_sub_profiles() -> None:
    g = gpu(0, mig=True)
    with pytest.raises(DeviceConfigError, match=r"mig-strategy mixed: .*1c\.3g\.20gb.*unsupported"):
        build([g], {0: [mig(g, 0, "1c.3g.20gb")]}, mig_strategy="mixed")


def test_sub_profiles_on_gpus_without_mig_mode_are_ignored() -> None:
    g = gpu(0, mig=False)  # stale MIG list for a GPU whose MIG mode is now off
    assert names(build([g], {0: [mig(g, 0, "1c.3g.20gb")]}, mig_strategy="mixed")) == {"nvidia.com/gpu": 1}


@pytest.mark.parametrize(
    ("profile", "name"),
    [
        pytest.param("1g.5gb", "nvidia.com/mig-1g.5gb", id="plain"),
        pytest.param("1g.10gb+me", "nvidia.com/mig-1g.10gb.me", id="plus-me"),
        pytest.param("1g.24gb+gfx", "nvidia.com/mig-1g.24gb.gfx", id="plus-gfx"),
    ],
)
def test_mig_resource_name(profile: str, name: str) -> None:
    assert mig_resource_name(profile) == name


# ------------------------------------------------------------------------------------ device nodes


def test_parse_mig_minors_sample() -> None:
    text = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\nbroken line here\nx y\n"
    assert parse_mig_minors(text) == {
        "config": 1,
        "monitor": 2,
        "gpu0/gi1/access": 12,
        "gpu0/gi1/ci0/access": 13,
    }


@pytest.mark.parametrize(
    ("minors", "expected"),
    [
        pytest.param(
            {"gpu0/gi1/access": 12, "gpu0/gi1/ci0/access": 13},
            ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"),
            id="both",
        ),
        pytest.param(None, ("/dev/nvidia0",), id="no-file"),
        pytest.param({}, ("/dev/nvidia0",), id="no-entries"),
        pytest.param(
            {"gpu0/gi1/access": 12}, ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12"), id="gi-only"
        ),
        pytest.param({"gpu1/gi1/access": 12, "gpu1/gi1/ci0/access": 13}, ("/dev/nvidia0",), id="other-gpu"),
    ],
)
def test_mig_device_nodes(minors: dict[str, int] | None, expected: tuple[str, ...]) -> None:
    g = gpu(0, mig=True)
    inventory = build([g], {0: [mig(g, 0, "7g.40gb", gi=1)]}, minors, mig_strategy="single")
    assert inventory.resources[0].devices[0].device_nodes == expected


def test_mig_device_nodes_follow_the_parent_minor() -> None:
    g = gpu(0, mig=True, minor=2)
    inventory = build([g], {0: [mig(g, 0, "7g.40gb", gi=0)]}, mig_strategy="single")
    assert inventory.resources[0].devices[0].device_nodes == (
        "/dev/nvidia2",
        f"/dev/nvidia-caps/nvidia-cap{MINORS['gpu2/gi0/access']}",
        f"/dev/nvidia-caps/nvidia-cap{MINORS['gpu2/gi0/ci0/access']}",
    )


# ----------------------------------------------------------------------------------------- replicas


def test_replicas_multiply_devices_with_suffixed_ids() -> None:
    inventory = build(EIGHT[:2], sharing=sharing(SharedResource("nvidia.com/gpu", 4)))
    resource = inventory.resources[0]
    assert (resource.name, resource.shared, resource.replicas) == ("nvidia.com/gpu", True, 4)
    assert [d.id for d in resource.devices] == [f"{uuid(g)}::{n}" for g in range(2) for n in range(4)]
    assert {(d.device_uuid, d.replicas) for d in resource.devices} == {(uuid(0), 4), (uuid(1), 4)}
    assert [d.replica for d in resource.devices[:4]] == [0, 1, 2, 3]
    assert not resource.fail_requests_greater_than_one


@pytest.mark.parametrize(
    ("entries", "rename_by_default", "expected"),
    [
        pytest.param(
            [SharedResource("nvidia.com/gpu", 2)], True, {"nvidia.com/gpu.shared": 16}, id="rename-by-default"
        ),
        pytest.param(
            [SharedResource("nvidia.com/gpu", 2, rename="nvidia.com/gpu-shared-a")],
            True,
            {"nvidia.com/gpu-shared-a": 16},
            id="entry-rename-wins",
        ),
        pytest.param(
            [SharedResource("nvidia.com/gpu", 3, devices=2, rename="nvidia.com/gpu-shared-a")],
            False,
            {"nvidia.com/gpu": 6, "nvidia.com/gpu-shared-a": 6},
            id="count-selects-first-gpus",
        ),
        pytest.param(
            [SharedResource("nvidia.com/gpu", 2, devices=("1", uuid(5)), rename="nvidia.com/gpu-shared")],
            False,
            {"nvidia.com/gpu": 6, "nvidia.com/gpu-shared": 4},
            id="index-and-uuid-list",
        ),
        pytest.param(
            [
                SharedResource("nvidia.com/gpu", 2, devices=("0", "1"), rename="nvidia.com/gpu-x2"),
                SharedResource("nvidia.com/gpu", 4, devices=("2", "3")),
            ],
            True,
            {"nvidia.com/gpu": 4, "nvidia.com/gpu-x2": 4, "nvidia.com/gpu.shared": 8},
            id="per-gpu-replica-counts",
        ),
        pytest.param(
            [
                SharedResource("nvidia.com/gpu", 2, devices=4, rename="nvidia.com/gpu-mixed"),
                SharedResource(
                    "nvidia.com/gpu", 3, devices=("4", "5", "6", "7"), rename="nvidia.com/gpu-mixed"
                ),
            ],
            False,
            {"nvidia.com/gpu-mixed": 20},
            id="different-counts-one-name",
        ),
        pytest.param(
            [SharedResource("nvidia.com/gpu", 2, devices=100)], False, {"nvidia.com/gpu": 16}, id="count-over"
        ),
    ],
)
def test_sharing_names_and_selection(
    entries: list[SharedResource], rename_by_default: bool, expected: dict[str, int]
) -> None:
    inventory = build(EIGHT, sharing=sharing(*entries, rename_by_default=rename_by_default))
    assert names(inventory) == expected


def test_per_gpu_replica_counts_are_recorded() -> None:
    entries = [
        SharedResource("nvidia.com/gpu", 2, devices=1, rename="nvidia.com/gpu-mixed"),
        SharedResource("nvidia.com/gpu", 5, devices=("1",), rename="nvidia.com/gpu-mixed"),
    ]
    resource = build(EIGHT[:2], sharing=sharing(*entries)).resources[0]
    assert resource.replicas == 5
    assert [(d.gpu_index, d.replicas) for d in resource.devices] == [(0, 2)] * 2 + [(1, 5)] * 5


def test_unshared_devices_stay_whole_next_to_a_renamed_share() -> None:
    entry = SharedResource("nvidia.com/gpu", 2, devices=("0",), rename="nvidia.com/gpu-shared")
    inventory = build(EIGHT[:2], sharing=sharing(entry, fail=True))
    whole = by_name(inventory, "nvidia.com/gpu")
    shared = by_name(inventory, "nvidia.com/gpu-shared")
    assert [d.id for d in whole.devices] == [uuid(1)]
    assert (whole.shared, whole.fail_requests_greater_than_one) == (False, False)
    assert (shared.shared, shared.fail_requests_greater_than_one) == (True, True)
    assert shared.socket_name == "nvidia-gpu-shared.sock"


def test_mig_replicas_and_mig_index_selection() -> None:
    entry = SharedResource("nvidia.com/mig-1g.5gb", 3, devices=("2:3", "9:9"), rename="nvidia.com/small")
    gpus, layout = mixed_node()
    inventory = build(gpus, layout, mig_strategy="mixed", sharing=sharing(entry))
    small = by_name(inventory, "nvidia.com/small")
    assert [d.id for d in small.devices] == [
        f"MIG-00000002-0000-0000-0000-000000000003::{n}" for n in range(3)
    ]
    assert all(d.index == "2:3" and d.physical_uuid == uuid(2) for d in small.devices)
    assert [d.index for d in by_name(inventory, "nvidia.com/mig-1g.5gb").devices] == ["2:2"]
    assert "sharing.timeSlicing.resources[0]: devices 9:9 match no nvidia.com/mig-1g.5gb device" in (
        inventory.warnings
    )


def test_gpu_index_selects_its_mig_devices() -> None:
    entry = SharedResource("nvidia.com/gpu", 2, devices=("3",), rename="nvidia.com/gpu-s")
    inventory = build(EIGHT_MIG, SEVEN_SMALL, mig_strategy="single", sharing=sharing(entry))
    assert names(inventory) == {"nvidia.com/gpu": 49, "nvidia.com/gpu-s": 14}


def test_sharing_a_resource_the_node_lacks_is_a_warning() -> None:
    inventory = build(EIGHT, sharing=sharing(SharedResource("nvidia.com/mig-1g.5gb", 2)))
    assert names(inventory) == {"nvidia.com/gpu": 8}
    assert inventory.warnings == (
        "sharing.timeSlicing.resources[0]: no nvidia.com/mig-1g.5gb devices on this node; "
        "the entry has no effect",
    )


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        pytest.param(
            [SharedResource("nvidia.com/gpu", 2, devices=("0",))],
            "nvidia.com/gpu: time-sliced and unshared devices would share one resource name "
            "(unshared: 1, 2, 3, 4, 5, 6, 7); set rename (or renameByDefault) for "
            "sharing.timeSlicing.resources[0], or select all of its devices",
            id="partial-without-rename",
        ),
        pytest.param(
            [
                SharedResource("nvidia.com/gpu", 2, devices=("0", "1"), rename="nvidia.com/a"),
                SharedResource("nvidia.com/gpu", 2, devices=(uuid(1),), rename="nvidia.com/b"),
            ],
            f"sharing.timeSlicing.resources[1]: device {uuid(1)} (index 1) is already shared by "
            "sharing.timeSlicing.resources[0]",
            id="overlapping-entries",
        ),
    ],
)
def test_sharing_errors(entries: list[SharedResource], message: str) -> None:
    with pytest.raises(DeviceConfigError) as info:
        build(EIGHT, sharing=sharing(*entries))
    assert str(info.value).startswith(message)


# ------------------------------------------------------------------------------- resource patterns


def test_gpu_patterns_name_resources_by_model() -> None:
    gpus = [gpu(0), gpu(1, name="Tesla T4"), gpu(2, name="NVIDIA H100 80GB HBM3")]
    patterns = (ResourcePattern("*a100*", "nvidia.com/a100"), ResourcePattern("*H100*", "nvidia.com/h100"))
    inventory = build(gpus, gpu_resources=patterns)
    assert names(inventory) == {"nvidia.com/a100": 1, "nvidia.com/gpu": 1, "nvidia.com/h100": 1}


def test_mig_patterns_name_resources_by_profile() -> None:
    gpus, layout = mixed_node()
    patterns = (ResourcePattern("1g.*", "nvidia.com/mig-small"),)
    inventory = build(gpus, layout, mig_strategy="mixed", mig_resources=patterns)
    assert names(inventory)["nvidia.com/mig-small"] == 3
    assert "nvidia.com/mig-1g.5gb" not in names(inventory)


# ------------------------------------------------------------------------------------- sockets/size


@pytest.mark.parametrize(
    ("name", "socket"),
    [
        pytest.param("nvidia.com/gpu", "nvidia-gpu.sock", id="gpu"),
        pytest.param("nvidia.com/mig-1g.5gb", "nvidia-mig-1g.5gb.sock", id="mig"),
        pytest.param("nvidia.com/gpu.shared", "nvidia-gpu.shared.sock", id="shared"),
    ],
)
def test_socket_names(name: str, socket: str) -> None:
    resource = Resource(name=name, devices=(), shared=False, replicas=1, fail_requests_greater_than_one=False)
    assert resource.socket_name == socket


def _listandwatch_class() -> Any:
    """The v1beta1 ListAndWatchResponse shape, built here so the estimate is checked against protobuf."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="dp_size_check.proto", package="dpsizecheck", syntax="proto3"
    )
    label_opt = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    label_rep = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    t = descriptor_pb2.FieldDescriptorProto

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            added = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                added.type_name = type_name

    message("NUMANode", ("ID", 1, t.TYPE_INT64, label_opt, ""))
    message("TopologyInfo", ("nodes", 1, t.TYPE_MESSAGE, label_rep, ".dpsizecheck.NUMANode"))
    message(
        "Device",
        ("ID", 1, t.TYPE_STRING, label_opt, ""),
        ("health", 2, t.TYPE_STRING, label_opt, ""),
        ("topology", 3, t.TYPE_MESSAGE, label_opt, ".dpsizecheck.TopologyInfo"),
    )
    message("ListAndWatchResponse", ("devices", 1, t.TYPE_MESSAGE, label_rep, ".dpsizecheck.Device"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("dpsizecheck.ListAndWatchResponse"))


@pytest.mark.parametrize(
    "numa_of",
    [
        pytest.param(lambda g: None, id="no-numa"),
        pytest.param(lambda g: 0, id="numa-0"),
        pytest.param(lambda g: g.index * 100, id="numa-large"),
    ],
)
@pytest.mark.parametrize("replicas", [0, 3, 200])
def test_size_estimate_matches_protobuf_encoding(numa_of: Any, replicas: int) -> None:
    settings = PluginSettings(
        sharing=sharing(SharedResource("nvidia.com/gpu", replicas)) if replicas else None
    )
    resource = build_resources(EIGHT, {}, settings, numa=numa_of, mig_minors=None)[0]
    message = _listandwatch_class()()
    for device in resource.devices:
        entry = message.devices.add(ID=device.id, health="Unhealthy")
        if device.numa_node is not None:
            entry.topology.nodes.add(ID=device.numa_node)
    assert listandwatch_size_bytes(resource) == message.ByteSize()


def test_oversized_resource_is_rejected_with_its_size() -> None:
    with pytest.raises(DeviceConfigError) as info:
        build(EIGHT, sharing=sharing(SharedResource("nvidia.com/gpu", 9000)))
    text = str(info.value)
    assert text.startswith("nvidia.com/gpu: 72000 devices need ")
    assert text.endswith(" MiB per ListAndWatch message, over the kubelet's 4 MiB limit; lower the replicas")
    shown = float(text.split(" need ")[1].split(" MiB")[0])
    assert shown > 4.0


def test_largest_resource_under_the_limit_is_accepted() -> None:
    inventory = build(EIGHT, sharing=sharing(SharedResource("nvidia.com/gpu", 7000)))
    size = listandwatch_size_bytes(inventory.resources[0])
    assert size <= MAX_MESSAGE_BYTES
    assert size / 56000 == pytest.approx(66, abs=2)  # ID 44-46 bytes + "Unhealthy" + NUMA node


def test_build_resources_is_build_inventory_without_warnings() -> None:
    gpus, layout = mixed_node()
    inventory = build(gpus, layout, mig_strategy="mixed")
    assert build_resources(
        gpus, layout, PluginSettings(mig_strategy="mixed"), numa=numa, mig_minors=MINORS
    ) == list(inventory.resources)


@pytest.mark.parametrize("replicas", [2, 9, 10, 11, 99, 100, 101, 1000, 1001])
@pytest.mark.parametrize("numa_node", [None, 0, 1, 300])
def test_size_is_computed_before_replicas_are_built(replicas: int, numa_node: int | None) -> None:
    from gpunode.device_plugin.devices import _planned_size  # the arithmetic behind the early check

    inventory = build_inventory(
        EIGHT[:1],
        {},
        PluginSettings(sharing=sharing(SharedResource("nvidia.com/gpu", replicas))),
        numa=lambda g: numa_node,
        mig_minors=None,
    )
    resource = inventory.resources[0]
    template = replace(resource.devices[0], id=resource.devices[0].device_uuid, replica=None, replicas=1)
    assert _planned_size(template, replicas) == listandwatch_size_bytes(resource)


def test_absurd_replica_counts_fail_without_building_replicas() -> None:
    with pytest.raises(DeviceConfigError, match=r"^nvidia\.com/gpu: 800000000 devices need "):
        build(EIGHT, sharing=sharing(SharedResource("nvidia.com/gpu", 100_000_000)))

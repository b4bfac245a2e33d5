"""gpunode.device_plugin.allocation: Allocate responses per strategy and preferred allocation policies."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpunode.device_plugin.allocation import (
    AllocationError,
    ContainerAllocation,
    DeviceSpec,
    Mount,
    allocate_response,
    cdi_annotation_key,
    pair_score,
    preferred_allocation,
    validate_request,
)
from gpunode.device_plugin.devices import PluginDevice, Resource
from gpunode.device_plugin.settings import PluginSettings
from gpunode.nvml.api import TopoLevel, Topology

# ------------------------------------------------------------------------------------------ fixtures


def whole(i: int, uuid: str | None = None, numa: int | None = 0) -> PluginDevice:
    uuid = uuid or f"GPU-{i}"
    return PluginDevice(
        id=uuid,
        device_uuid=uuid,
        physical_uuid=uuid,
        gpu_index=i,
        index=str(i),
        mig=None,
        numa_node=numa,
        replica=None,
        replicas=1,
        device_nodes=(f"/dev/nvidia{i}",),
        memory_mib=40960,
        profile=None,
    )


def mig_dev(i: int, j: int, caps: tuple[int, int] | None = None) -> PluginDevice:
    uuid = f"MIG-{i}-{j}"
    nodes: tuple[str, ...] = (f"/dev/nvidia{i}",)
    if caps:
        nodes += tuple(f"/dev/nvidia-caps/nvidia-cap{c}" for c in caps)
    return PluginDevice(
        id=uuid,
        device_uuid=uuid,
        physical_uuid=f"GPU-{i}",
        gpu_index=i,
        index=f"{i}:{j}",
        mig=(j + 1, 0),
        numa_node=0,
        replica=None,
        replicas=1,
        device_nodes=nodes,
        memory_mib=4864,
        profile="1g.5gb",
        mig_index=j,
    )


def replicas_of(device: PluginDevice, n: int) -> list[PluginDevice]:
    return [replace(device, id=f"{device.device_uuid}::{k}", replica=k, replicas=n) for k in range(n)]


def resource(devices: Sequence[PluginDevice], name: str = "nvidia.com/gpu", fail: bool = False) -> Resource:
    shared = any(d.replica is not None for d in devices)
    return Resource(
        name=name,
        devices=tuple(devices),
        shared=shared,
        replicas=max((d.replicas for d in devices), default=1),
        fail_requests_greater_than_one=fail,
    )


AAA = whole(0, "GPU-aaa")
BBB = whole(1, "GPU-bbb")
SHARED = resource([*replicas_of(AAA, 4), *replicas_of(BBB, 4)])
SHARED_STRICT = replace(SHARED, fail_requests_greater_than_one=True)
WHOLE8 = resource([whole(i) for i in range(8)])
MIGS = resource([mig_dev(i, j) for i in range(2) for j in range(7)], name="nvidia.com/mig-1g.5gb")
KEY = "cdi.k8s.io/nvidia-device-plugin_1234"


def alloc(
    ids: Sequence[str], res: Resource = SHARED, exists: Sequence[str] = (), **kw: Any
) -> ContainerAllocation:
    devices = validate_request(res, ids)
    present = set(exists)
    return allocate_response(
        devices, PluginSettings(**kw), dev_root_exists=present.__contains__, annotation_key=KEY
    )


# ---------------------------------------------------------------------------------- validate_request


def test_validate_returns_devices_in_request_order() -> None:
    devices = validate_request(SHARED, ["GPU-bbb::1", "GPU-aaa::3", "GPU-bbb::1"])
    assert [d.id for d in devices] == ["GPU-bbb::1", "GPU-aaa::3"]


def test_unknown_ids_are_named_sorted() -> None:
    with pytest.raises(AllocationError) as info:
        validate_request(SHARED, ["GPU-zzz", "GPU-aaa::0", "GPU-aaa::9"])
    assert str(info.value) == (
        "invalid allocation request for nvidia.com/gpu: unknown device IDs GPU-aaa::9, GPU-zzz"
    )


def test_many_unknown_ids_show_ten_and_a_count() -> None:
    ids = [f"GPU-x{k:02d}" for k in range(25)]
    with pytest.raises(AllocationError) as info:
        validate_request(WHOLE8, ids)
    text = str(info.value)
    assert text.endswith(", ".join(ids[:10]) + " and 15 more")
    assert "unknown device IDs" in text


def test_a_huge_unknown_id_is_cut_with_a_count() -> None:
    huge = "GPU-" + "0" * (4 << 20)  # what fits in one 4 MiB gRPC message (sorted first)
    with pytest.raises(AllocationError) as info:
        validate_request(WHOLE8, [huge, *[f"GPU-{k}" + "y" * 1000 for k in range(30)]])
    text = str(info.value)
    assert len(text) < 11 * 300
    assert f"... ({len(huge) - 256} more characters)" in text
    assert text.endswith(" and 21 more")


@pytest.mark.parametrize(
    ("res", "ids", "ok"),
    [
        pytest.param(SHARED_STRICT, ["GPU-aaa::0"], True, id="one-replica-ok"),
        pytest.param(SHARED_STRICT, ["GPU-aaa::0", "GPU-bbb::0"], False, id="two-replicas-fail"),
        pytest.param(SHARED, ["GPU-aaa::0", "GPU-bbb::0"], True, id="flag-off"),
        pytest.param(
            replace(WHOLE8, fail_requests_greater_than_one=True), ["GPU-0", "GPU-1"], True, id="whole"
        ),
    ],
)
def test_fail_requests_greater_than_one(res: Resource, ids: list[str], ok: bool) -> None:
    if ok:
        assert len(validate_request(res, ids)) == len(ids)
        return
    with pytest.raises(AllocationError) as info:
        validate_request(res, ids)
    assert str(info.value) == "invalid request: maximum request size for shared resources is 1; found 2"


# ----------------------------------------------------------------------------------------- Allocate

VM = "/var/run/nvidia-container-devices"


@pytest.mark.parametrize(
    ("ids", "kw", "expected"),
    [
        pytest.param(
            ["GPU-aaa::3", "GPU-bbb::0"],
            {},
            ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}),
            id="envvar-uuid",
        ),
        pytest.param(
            ["GPU-aaa::3", "GPU-aaa::0"],
            {},
            ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-aaa"}),
            id="replicas-deduped",
        ),
        pytest.param(
            ["GPU-bbb::2", "GPU-aaa::1"],
            {"device_id_strategy": "index"},
            ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": "1,0"}),
            id="envvar-index",
        ),
        pytest.param(
            ["GPU-aaa::0", "GPU-bbb::1"],
            {"device_list_strategies": ("volume-mounts",)},
            ContainerAllocation(
                envs={"NVIDIA_VISIBLE_DEVICES": VM},
                mounts=[
                    Mount(f"{VM}/GPU-aaa", "/dev/null", False),
                    Mount(f"{VM}/GPU-bbb", "/dev/null", False),
                ],
            ),
            id="volume-mounts",
        ),
        pytest.param(
            ["GPU-aaa::0", "GPU-aaa::1"],
            {"device_list_strategies": ("envvar", "volume-mounts"), "device_id_strategy": "index"},
            ContainerAllocation(
                envs={"NVIDIA_VISIBLE_DEVICES": VM}, mounts=[Mount(f"{VM}/0", "/dev/null", False)]
            ),
            id="envvar-and-volume-mounts",
        ),
        pytest.param(
            ["GPU-aaa::0", "GPU-bbb::1"],
            {"device_list_strategies": ("cdi-annotations",)},
            ContainerAllocation(
                annotations={
                    KEY: "k8s.device-plugin.nvidia.com/gpu=GPU-aaa,k8s.device-plugin.nvidia.com/gpu=GPU-bbb"
                }
            ),
            id="cdi-annotations",
        ),
        pytest.param(
            ["GPU-aaa::0"],
            {"device_list_strategies": ("cdi-cri",), "pass_device_specs": True, "gds_enabled": True},
            ContainerAllocation(
                cdi_devices=[
                    "k8s.device-plugin.nvidia.com/gpu=GPU-aaa",
                    "k8s.device-plugin.nvidia.com/gds=all",
                ]
            ),
            id="cdi-only-adds-nothing-else",
        ),
        pytest.param(
            ["GPU-bbb::0"],
            {"device_list_strategies": ("cdi-annotations", "cdi-cri"), "device_id_strategy": "index"},
            ContainerAllocation(
                annotations={KEY: "k8s.device-plugin.nvidia.com/gpu=1"},
                cdi_devices=["k8s.device-plugin.nvidia.com/gpu=1"],
            ),
            id="both-cdi-index",
        ),
        pytest.param(
            ["GPU-aaa::0"],
            {"device_list_strategies": ("envvar", "cdi-cri")},
            ContainerAllocation(
                envs={"NVIDIA_VISIBLE_DEVICES": "GPU-aaa"},
                cdi_devices=["k8s.device-plugin.nvidia.com/gpu=GPU-aaa"],
            ),
            id="envvar-and-cdi",
        ),
        pytest.param(
            ["GPU-aaa::0"],
            {"gds_enabled": True, "mofed_enabled": True, "gdrcopy_enabled": True},
            ContainerAllocation(
                envs={
                    "NVIDIA_VISIBLE_DEVICES": "GPU-aaa",
                    "NVIDIA_GDS": "enabled",
                    "NVIDIA_MOFED": "enabled",
                    "NVIDIA_GDRCOPY": "enabled",
                }
            ),
            id="gds-mofed-gdrcopy",
        ),
        pytest.param(
            ["GPU-aaa::0"],
            {"device_list_strategies": ("envvar", "volume-mounts", "cdi-cri"), "imex_channel_ids": (0,)},
            ContainerAllocation(
                envs={"NVIDIA_VISIBLE_DEVICES": VM, "NVIDIA_IMEX_CHANNELS": "0"},
                mounts=[
                    Mount(f"{VM}/GPU-aaa", "/dev/null", False),
                    Mount(f"{VM}/imex/0", "/dev/null", False),
                ],
                cdi_devices=[
                    "k8s.device-plugin.nvidia.com/gpu=GPU-aaa",
                    "k8s.device-plugin.nvidia.com/imex-channel=0",
                ],
            ),
            id="imex-channel",
        ),
    ],
)
def test_allocate_per_strategy(ids: list[str], kw: dict[str, Any], expected: ContainerAllocation) -> None:
    assert alloc(ids, **kw) == expected


@pytest.mark.parametrize(
    ("exists", "dev_root", "expected"),
    [
        pytest.param(
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"],
            "/",
            [
                DeviceSpec("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
                DeviceSpec("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
                DeviceSpec("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm-tools", "rw"),
                DeviceSpec("/dev/nvidia-modeset", "/dev/nvidia-modeset", "rw"),
                DeviceSpec("/dev/nvidia0", "/dev/nvidia0", "rw"),
                DeviceSpec("/dev/nvidia1", "/dev/nvidia1", "rw"),
            ],
            id="all-control-nodes",
        ),
        pytest.param(
            ["/dev/nvidiactl", "/dev/nvidia-uvm"],
            "/run/nvidia/driver",
            [
                DeviceSpec("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
                DeviceSpec("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm", "rw"),
                DeviceSpec("/dev/nvidia0", "/run/nvidia/driver/dev/nvidia0", "rw"),
                DeviceSpec("/dev/nvidia1", "/run/nvidia/driver/dev/nvidia1", "rw"),
            ],
            id="some-absent-dev-root",
        ),
    ],
)
def test_pass_device_specs(exists: list[str], dev_root: str, expected: list[DeviceSpec]) -> None:
    out = alloc(
        ["GPU-aaa::0", "GPU-aaa::1", "GPU-bbb::3"], exists=exists, pass_device_specs=True, dev_root=dev_root
    )
    assert out.devices == expected
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}


def test_mig_device_specs_and_index_ids() -> None:
    res = resource([mig_dev(0, 0, (12, 13)), mig_dev(0, 1, (21, 22))], name="nvidia.com/mig-1g.5gb")
    out = alloc(
        ["MIG-0-1", "MIG-0-0"],
        res,
        exists=["/dev/nvidiactl"],
        pass_device_specs=True,
        device_id_strategy="index",
        imex_channel_ids=(0,),
    )
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "0:1,0:0", "NVIDIA_IMEX_CHANNELS": "0"}
    assert [d.container_path for d in out.devices] == [
        "/dev/nvidiactl",
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
        "/dev/nvidia-caps-imex-channels/channel0",
    ]


def test_custom_cdi_kind_and_annotation_key() -> None:
    devices = validate_request(SHARED, ["GPU-aaa::0"])
    key = cdi_annotation_key("example.io/", "abc")
    out = allocate_response(
        devices,
        PluginSettings(device_list_strategies=("cdi-annotations",), imex_channel_ids=(0,)),
        dev_root_exists=lambda p: True,
        cdi_kind="nvidia.com/gpu",
        annotation_key=key,
    )
    assert out.annotations == {
        "example.io/nvidia-device-plugin_abc": "nvidia.com/gpu=GPU-aaa,nvidia.com/imex-channel=0"
    }


# ---------------------------------------------------------------------------- preferred: topology


def topology(n: int, links: dict[tuple[int, int], int], level: TopoLevel = TopoLevel.SYS) -> Topology:
    nv = [[0] * n for _ in range(n)]
    lv = [[TopoLevel.X if a == b else level for b in range(n)] for a in range(n)]
    for (a, b), count in links.items():
        nv[a][b] = nv[b][a] = count
    return Topology(
        indices=tuple(range(n)),
        levels=tuple(tuple(row) for row in lv),
        nvlinks=tuple(tuple(row) for row in nv),
    )


def islands(n: int, size: int, links: int = 12) -> Topology:
    """GPUs in groups of ``size``, fully NVLinked inside a group and not between groups."""
    pairs = {(a, b): links for a, b in itertools.combinations(range(n), 2) if a // size == b // size}
    return topology(n, pairs)


ALL_NV12 = islands(8, 8)
TWO_ISLANDS = islands(8, 4)


def prefer(
    res: Resource,
    size: int,
    available: Sequence[str] | None = None,
    must: Sequence[str] = (),
    topo: Topology | None = None,
    policy: str = "distributed",
    **kw: Any,
) -> list[str]:
    ids = [d.id for d in res.devices] if available is None else list(available)
    return preferred_allocation(res, ids, must, size, topology=topo, policy=policy, **kw)


def gpus(*indices: int) -> list[str]:
    return [f"GPU-{i}" for i in indices]


@pytest.mark.parametrize(
    ("topo", "available", "must", "size", "expected"),
    [
        pytest.param(ALL_NV12, None, [], 4, gpus(0, 1, 2, 3), id="all-nv12-lowest"),
        pytest.param(ALL_NV12, None, gpus(6), 2, gpus(6, 0), id="all-nv12-must"),
        pytest.param(TWO_ISLANDS, None, [], 4, gpus(0, 1, 2, 3), id="islands-first"),
        pytest.param(TWO_ISLANDS, gpus(0, 1, 4, 5, 6, 7), [], 4, gpus(4, 5, 6, 7), id="islands-second-whole"),
        pytest.param(TWO_ISLANDS, None, gpus(5), 4, gpus(5, 4, 6, 7), id="islands-must-picks-its-island"),
        pytest.param(TWO_ISLANDS, gpus(0, 4, 5), [], 2, gpus(4, 5), id="pair-on-one-island"),
        pytest.param(TWO_ISLANDS, None, [], 1, gpus(0), id="size-one"),
        pytest.param(TWO_ISLANDS, gpus(2, 3, 9), [], 4, gpus(2, 3), id="fewer-than-size"),
        pytest.param(TWO_ISLANDS, None, gpus(1, 5), 2, gpus(1, 5), id="must-fills-request"),
        pytest.param(TWO_ISLANDS, None, gpus(1, 5, 6), 2, gpus(1, 5), id="must-over-size"),
        pytest.param(
            topology(8, {(0, 1): 2, (2, 3): 4, (4, 5): 1}),
            gpus(0, 1, 2, 3, 4, 5),
            [],
            2,
            gpus(2, 3),
            id="most-links",
        ),
    ],
)
def test_topology_aware_choice(
    topo: Topology, available: list[str] | None, must: list[str], size: int, expected: list[str]
) -> None:
    assert prefer(WHOLE8, size, available, must, topo) == expected


def test_pcie_levels_break_nvlink_ties() -> None:
    levels = [[TopoLevel.SYS] * 4 for _ in range(4)]
    levels[2][3] = levels[3][2] = TopoLevel.PIX
    levels[0][1] = levels[1][0] = TopoLevel.NODE
    topo = Topology(
        indices=(0, 1, 2, 3),
        levels=tuple(tuple(row) for row in levels),
        nvlinks=tuple(tuple(0 for _ in range(4)) for _ in range(4)),
    )
    res = resource([whole(i) for i in range(4)])
    assert pair_score(topo, 2, 3) == 50
    assert pair_score(topo, 0, 1) == 20
    assert prefer(res, 2, topo=topo) == gpus(2, 3)


def test_large_node_uses_greedy_and_still_finds_an_island() -> None:
    res = resource([whole(i) for i in range(16)])
    topo = islands(16, 8)
    available = gpus(0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 15, 3)
    assert sorted(prefer(res, 8, available, topo=topo)) == sorted(gpus(8, 9, 10, 11, 12, 13, 14, 15))
    assert prefer(res, 3, gpus(*range(16)), must=gpus(12), topo=topo)[0] == "GPU-12"


def test_topology_missing_a_gpu_scores_zero() -> None:
    topo = islands(4, 2)  # knows GPUs 0-3 only
    res = resource([whole(i) for i in range(6)])
    assert pair_score(topo, 0, 5) == 0
    assert prefer(res, 2, gpus(0, 4, 5, 1), topo=topo) == gpus(0, 1)


def test_without_topology_whole_gpus_go_lowest_first() -> None:
    assert prefer(WHOLE8, 3, gpus(7, 3, 5, 1)) == gpus(1, 3, 5)


# --------------------------------------------------------------------------- preferred: replicas


def ids_on(result: list[str]) -> list[str]:
    return [i.split("::")[0] for i in result]


@pytest.mark.parametrize(
    ("available", "must", "size", "policy", "expected"),
    [
        pytest.param(None, [], 2, "distributed", ["GPU-aaa::0", "GPU-bbb::0"], id="size-2-two-gpus"),
        pytest.param(None, [], 2, "packed", ["GPU-aaa::0", "GPU-bbb::0"], id="packed-equal-load-spreads"),
        pytest.param(
            ["GPU-aaa::2", "GPU-aaa::3", *[f"GPU-bbb::{k}" for k in range(4)]],
            [],
            1,
            "distributed",
            ["GPU-bbb::0"],
            id="distributed-least-used",
        ),
        pytest.param(
            ["GPU-aaa::2", "GPU-aaa::3", *[f"GPU-bbb::{k}" for k in range(4)]],
            [],
            2,
            "packed",
            ["GPU-aaa::2", "GPU-aaa::3"],
            id="packed-most-used",
        ),
        pytest.param(
            ["GPU-aaa::3", *[f"GPU-bbb::{k}" for k in range(4)]],
            [],
            3,
            "packed",
            ["GPU-aaa::3", "GPU-bbb::0", "GPU-bbb::1"],
            id="packed-fills-then-moves",
        ),
        pytest.param(
            ["GPU-aaa::1", "GPU-aaa::2", "GPU-aaa::3", *[f"GPU-bbb::{k}" for k in range(4)]],
            [],
            3,
            "distributed",
            ["GPU-bbb::0", "GPU-aaa::1", "GPU-bbb::1"],
            id="distributed-counts-this-call",
        ),
        pytest.param(None, ["GPU-bbb::2"], 2, "distributed", ["GPU-bbb::2", "GPU-aaa::0"], id="must-first"),
        pytest.param(
            ["GPU-aaa::0", "junk", "GPU-bbb::9", "GPU-bbb::1"],
            ["nope"],
            4,
            "distributed",
            ["GPU-aaa::0", "GPU-bbb::1"],
            id="unknown-ignored-shortfall",
        ),
        pytest.param(None, [], 0, "distributed", [], id="size-zero"),
    ],
)
def test_replica_policies(
    available: list[str] | None, must: list[str], size: int, policy: str, expected: list[str]
) -> None:
    assert prefer(SHARED, size, available, must, topo=ALL_NV12, policy=policy) == expected


def test_allocated_counts_override_the_estimate() -> None:
    counts = {"GPU-aaa": 0, "GPU-bbb": 3}
    assert prefer(SHARED, 1, policy="packed", allocated_counts=counts) == ["GPU-bbb::0"]
    assert prefer(SHARED, 1, policy="distributed", allocated_counts=counts) == ["GPU-aaa::0"]


def test_unhealthy_replicas_missing_from_available_count_as_used() -> None:
    available = [d.id for d in SHARED.devices if d.id != "GPU-aaa::0"]
    assert prefer(SHARED, 1, available) == ["GPU-bbb::0"]


def test_mig_devices_spread_over_physical_gpus() -> None:
    assert prefer(MIGS, 3, topo=ALL_NV12) == ["MIG-0-0", "MIG-1-0", "MIG-0-1"]
    assert prefer(MIGS, 3, policy="packed", available=[d.id for d in MIGS.devices if d.id != "MIG-1-6"]) == [
        "MIG-1-0",
        "MIG-1-1",
        "MIG-1-2",
    ]


def test_eight_by_sixty_four_replicas() -> None:
    res = resource([r for i in range(8) for r in replicas_of(whole(i), 64)])
    chosen = prefer(res, 8)
    assert sorted(ids_on(chosen)) == gpus(*range(8))


# ---------------------------------------------------------------------------------------- property

RESOURCES = {
    "whole": (WHOLE8, TWO_ISLANDS),
    "whole-no-topology": (WHOLE8, None),
    "shared": (SHARED, ALL_NV12),
    "mig": (MIGS, None),
}


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(sorted(RESOURCES)),
    data=st.data(),
    size=st.integers(min_value=-1, max_value=20),
    policy=st.sampled_from(["distributed", "packed", "weird"]),
)
def test_preferred_allocation_properties(kind: str, data: st.DataObject, size: int, policy: str) -> None:
    res, topo = RESOURCES[kind]
    known = [d.id for d in res.devices]
    pool = [*known, "GPU-unknown", "MIG-x", "", "GPU-0::0"]
    available = data.draw(st.lists(st.sampled_from(pool), max_size=24), label="available")
    must = data.draw(st.lists(st.sampled_from(pool), max_size=4), label="must")

    result = preferred_allocation(res, available, must, size, topology=topo, policy=policy)

    valid = {i for i in [*available, *must] if i in res.by_id}
    known_must = list(dict.fromkeys(i for i in must if i in res.by_id))
    assert len(result) == len(set(result))
    assert set(result) <= valid
    assert len(result) == max(0, min(size, len(valid)))
    if size > 0:
        assert result[: min(size, len(known_must))] == known_must[:size]


def test_greedy_honours_must_include_on_a_large_node() -> None:
    res = resource([whole(i) for i in range(32)])
    topo = islands(32, 8)
    result = prefer(res, 8, must=gpus(20), topo=topo)
    assert result[0] == "GPU-20"
    assert sorted(result) == sorted(gpus(*range(16, 24)))

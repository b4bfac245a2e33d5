"""MPS sharing in the device plugin: replicas as time-slicing, NVIDIA's refusals, Allocate's additions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpunode.api.mps import ReadyResource
from gpunode.api.plugin_types import SharedResource, TimeSlicing
from gpunode.common.errors import UsageError
from gpunode.device_plugin.allocation import (
    ContainerAllocation,
    Mount,
    allocate_response,
    mps_allocation,
    validate_request,
)
from gpunode.device_plugin.devices import DeviceConfigError, Inventory, PluginDevice, build_inventory
from gpunode.device_plugin.settings import PluginSettings, settings_from_config
from gpunode.nvml.api import GpuInfo, MigDevice, MigMode, PciInfo

GPU = "nvidia.com/gpu"


def gpu(i: int, *, mig: bool = False) -> GpuInfo:
    return GpuInfo(
        index=i,
        minor=i,
        uuid=f"GPU-{i}",
        name="NVIDIA A100-SXM4-40GB",
        serial=None,
        pci=PciInfo(f"00000000:{i + 7:02X}:00.0", 0, i + 7, 0, 0x20B010DE, 0x134F10DE),
        numa_node=0,
        memory_total_mib=40960,
        compute_capability=(8, 0),
        architecture="ampere",
        brand="nvidia",
        sm_count=108,
        mig=MigMode(current=mig, pending=mig),
    )


def mig3(parent: GpuInfo) -> list[MigDevice]:
    return [
        MigDevice(
            parent_index=parent.index,
            parent_uuid=parent.uuid,
            index=0,
            uuid=f"MIG-{parent.index}-0",
            name="NVIDIA A100-SXM4-40GB MIG 3g.20gb",
            profile="3g.20gb",
            gi_id=1,
            ci_id=0,
            gi_slices=3,
            ci_slices=3,
            memory_mib=19968,
            sm_count=42,
            copy_engines=3,
            decoders=2,
            encoders=0,
            jpeg=0,
            ofa=0,
        )
    ]


EIGHT = [gpu(i) for i in range(8)]


def build(
    gpus: Sequence[GpuInfo], migs: Mapping[int, Sequence[MigDevice]] | None = None, **kw: Any
) -> Inventory:
    return build_inventory(gpus, migs or {}, PluginSettings(**kw), numa=lambda g: 0, mig_minors=None)


def whole(i: int) -> PluginDevice:
    (resource,) = build([gpu(i)]).resources
    return resource.devices[0]


def mps(replicas: int = 4, *, rename_by_default: bool = False) -> TimeSlicing:
    return TimeSlicing(rename_by_default, True, (SharedResource(GPU, replicas),), "mps")


def test_replicas_are_advertised_as_time_slicing_does() -> None:
    inventory = build(EIGHT, sharing=mps(4))
    (resource,) = inventory.resources
    assert resource.name == GPU
    assert len(resource.devices) == 32
    assert resource.shared
    assert resource.fail_requests_greater_than_one
    shared = build(EIGHT, sharing=mps(2, rename_by_default=True)).resources
    assert [r.name for r in shared] == ["nvidia.com/gpu.shared"]


def test_more_than_one_replica_is_refused_as_nvidia_does() -> None:
    (resource,) = build(EIGHT[:2], sharing=mps(2)).resources
    ids = [d.id for d in resource.devices]
    assert len(validate_request(resource, ids[:1])) == 1
    with pytest.raises(Exception, match="maximum request size for shared resources is 1; found 2"):
        validate_request(resource, ids[:2])


@pytest.mark.parametrize("strategy", ["none", "single"])
def test_mig_is_refused(strategy: str) -> None:
    gpus = [gpu(0, mig=True), gpu(1, mig=True)]
    with pytest.raises(
        DeviceConfigError, match=r"^sharing\.mps: MPS sharing is not supported for MIG devices"
    ):
        build(gpus, {g.index: mig3(g) for g in gpus}, sharing=mps(2), mig_strategy=strategy)
    with pytest.raises(DeviceConfigError, match=r"MIG is enabled on GPU 1\)"):
        build([gpu(0), gpu(1, mig=True)], {1: mig3(gpu(1, mig=True))}, sharing=mps(2))


def test_mixed_from_the_command_line_is_refused() -> None:
    with pytest.raises(UsageError, match="not supported with mig-strategy mixed"):
        settings_from_config(None, {"sharing": mps(2), "mig_strategy": "mixed"})
    assert settings_from_config(None, {"sharing": mps(2), "mig_strategy": "single"}).sharing == mps(2)


READY = ReadyResource(25, {"GPU-0": 10240, "GPU-1": 20480})


def test_mps_allocation_is_nvidias_env_and_mounts() -> None:
    got = mps_allocation(GPU, [whole(1), whole(0)], "/run/nvidia/mps", READY)
    assert got == ContainerAllocation(
        envs={
            "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M,1=10240M",
        },
        mounts=[
            Mount("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe", False),
            Mount("/dev/shm", "/run/nvidia/mps/shm", False),
        ],
    )


@pytest.mark.parametrize(
    ("strategies", "visible"),
    [
        (("envvar",), "GPU-0"),
        (("volume-mounts",), "/var/run/nvidia-container-devices"),
        (("cdi-annotations",), None),
        (("cdi-cri",), None),
    ],
)
def test_mps_is_added_with_every_device_list_strategy(
    strategies: tuple[str, ...], visible: str | None
) -> None:
    settings = PluginSettings(device_list_strategies=strategies, sharing=mps(4))
    extra = mps_allocation(GPU, [whole(0)], "/run/nvidia/mps", READY)
    got = allocate_response(
        [whole(0)], settings, dev_root_exists=lambda _: False, annotation_key="k", mps=extra
    )
    assert got.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert got.envs.get("NVIDIA_VISIBLE_DEVICES") == visible
    assert Mount("/dev/shm", "/run/nvidia/mps/shm", False) in got.mounts

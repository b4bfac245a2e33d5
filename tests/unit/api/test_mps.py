"""MPS sharing: the config's rules (NVIDIA's), the per-client limits, the daemon plans, the readiness file."""

from __future__ import annotations

import json

import pytest

from gpunode.api.mps import (
    DaemonPlan,
    MpsConfigError,
    MpsGpu,
    MpsRoot,
    ReadyResource,
    active_thread_percentage,
    client_env,
    max_clients,
    pinned_mem_limit_mib,
    plan_daemons,
    ready_document,
    ready_resources,
    sharing_document,
)
from gpunode.api.plugin_config import PluginConfig
from gpunode.api.plugin_types import SharedResource, TimeSlicing
from gpunode.common.config import parse_config_text
from gpunode.common.errors import ConfigError

GPU = "nvidia.com/gpu"


def cfg(text: str) -> PluginConfig:
    return parse_config_text("version: v1\n" + text, "config.yaml", PluginConfig)


def mps_yaml(entries: str, extra: str = "", flags: str = "") -> str:
    return f"{flags}sharing:\n  mps:\n{extra}    resources:\n{entries}"


def gpu(index: int, memory: int = 40960, cc: tuple[int, int] = (8, 0), mig: bool = False) -> MpsGpu:
    return MpsGpu(index, f"GPU-{index:08d}", memory, cc, mig)


def mps(*resources: SharedResource, rename_by_default: bool = False) -> TimeSlicing:
    return TimeSlicing(rename_by_default, True, resources, "mps")


# --------------------------------------------------------------------------------- the file's rules


def test_mps_is_parsed_and_forces_fail_requests_greater_than_one() -> None:
    for fail in ("", "    failRequestsGreaterThanOne: false\n", "    failRequestsGreaterThanOne: 'true'\n"):
        sharing = cfg(mps_yaml("    - {name: gpu, replicas: 4}\n", extra=fail)).time_slicing()
        assert sharing == TimeSlicing(False, True, (SharedResource(GPU, 4),), "mps")
        assert sharing.mps
        assert sharing.section == "sharing.mps"


def test_rename_by_default_and_nvidias_warnings_for_rename_and_devices() -> None:
    c = cfg(
        mps_yaml(
            "    - {name: gpu, replicas: 3, rename: other, devices: [0]}\n", "    renameByDefault: true\n"
        )
    )
    sharing = c.time_slicing()
    assert sharing is not None
    assert sharing.rename_by_default
    assert sharing.resources == (SharedResource(GPU, 3),)  # rename and devices ignored, as NVIDIA does
    assert c.ignored_fields() == (
        "Setting the 'rename' field in sharing.mps.resources is not yet supported in the config. Ignoring...",
        "Customizing the 'devices' field in sharing.mps.resources is not yet supported in the config. "
        "Ignoring...",
    )


def test_the_extension_honours_rename_under_mps() -> None:
    c = cfg(
        mps_yaml(
            "    - {name: gpu, replicas: 3, rename: gpu-mps}\n",
            flags="flags:\n  gpunode: {timeSlicingExtensions: true}\n",
        )
    )
    sharing = c.time_slicing()
    assert sharing is not None
    assert sharing.resources == (SharedResource(GPU, 3, rename="nvidia.com/gpu-mps"),)
    assert c.ignored_fields() == ()


def test_mps_wins_over_time_slicing_with_a_warning() -> None:
    c = cfg(
        "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 8}]\n"
        "  mps:\n    resources: [{name: gpu, replicas: 2}]\n"
    )
    sharing = c.time_slicing()
    assert sharing is not None
    assert sharing.mps
    assert sharing.resources[0].replicas == 2
    assert c.overridden_fields() == (
        "sharing.timeSlicing is ignored: sharing.mps is set and MPS sharing wins",
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            mps_yaml("    - {name: gpu, replicas: 2}\n", flags="flags: {migStrategy: mixed}\n"),
            "sharing: MPS sharing (sharing.mps) is not supported with mig-strategy mixed",
            id="mixed",
        ),
        pytest.param(
            mps_yaml("    - {name: gpu, replicas: 1}\n"),
            "sharing.mps.resources[0].replicas: must be at least 2",
            id="one",
        ),
        pytest.param(
            mps_yaml("    - {name: gpu}\n"), "sharing.mps.resources[0].replicas: ", id="no-replicas"
        ),
        pytest.param(
            "sharing:\n  mps:\n    resources: []\n",
            "sharing.mps.resources: must list at least one",
            id="empty",
        ),
        pytest.param(
            mps_yaml("    - {name: 'GPU!', replicas: 2}\n"), "sharing.mps.resources[0].name: ", id="bad-name"
        ),
    ],
)
def test_refusals_name_the_path(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg(text)
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_single_and_none_strategies_are_accepted() -> None:
    for strategy in ("none", "single"):
        c = cfg(mps_yaml("    - {name: gpu, replicas: 2}\n", flags=f"flags: {{migStrategy: {strategy}}}\n"))
        assert c.time_slicing() is not None


# ----------------------------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    ("replicas", "percentage"), [(2, 50), (3, 33), (4, 25), (7, 14), (10, 10), (48, 2), (1, 100)]
)
def test_active_thread_percentage(replicas: int, percentage: int) -> None:
    assert active_thread_percentage(replicas) == percentage


@pytest.mark.parametrize(
    ("memory", "replicas", "mib"), [(40960, 4, 10240), (81920, 3, 27306), (15360, 2, 7680), (0, 4, 0)]
)
def test_pinned_memory_limit(memory: int, replicas: int, mib: int) -> None:
    assert pinned_mem_limit_mib(memory, replicas) == mib


@pytest.mark.parametrize(
    ("cc", "clients"), [((7, 0), 16), ((7, 5), 48), ((8, 0), 48), ((6, 1), 16), ((9, 0), 48)]
)
def test_max_clients(cc: tuple[int, int], clients: int) -> None:
    assert max_clients(cc) == clients


def test_paths_follow_nvidias_layout() -> None:
    root = MpsRoot("/run/nvidia/mps")
    assert root.pipe_dir(GPU) == "/run/nvidia/mps/nvidia.com/gpu/pipe"
    assert root.log_dir(GPU) == "/run/nvidia/mps/nvidia.com/gpu/log"
    assert root.started_file(GPU) == "/run/nvidia/mps/nvidia.com/gpu/.started"
    assert root.shm_dir == "/run/nvidia/mps/shm"
    assert root.ready_file == "/run/nvidia/mps/.ready"
    assert root.control_socket(GPU) == "/run/nvidia/mps/nvidia.com/gpu/pipe/control"


# ------------------------------------------------------------------------------------------ plans


def test_one_daemon_per_resource_with_nvidias_commands() -> None:
    plans = plan_daemons(mps(SharedResource(GPU, 4)), [gpu(1, 81920), gpu(0)])
    assert [p.resource for p in plans] == [GPU]
    plan = plans[0]
    assert [g.index for g in plan.gpus] == [0, 1]
    assert plan.thread_percentage == 25
    assert plan.commands() == [
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_device_pinned_mem_limit 1 20480M",
        "set_default_active_thread_percentage 25",
    ]
    assert plan.env(MpsRoot("/r")) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/r/nvidia.com/gpu/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/r/nvidia.com/gpu/log",
        "CUDA_VISIBLE_DEVICES": "GPU-00000000,GPU-00000001",
    }


def test_rename_by_default_names_the_daemon_shared() -> None:
    plans = plan_daemons(mps(SharedResource(GPU, 2), rename_by_default=True), [gpu(0)])
    assert [p.resource for p in plans] == ["nvidia.com/gpu.shared"]


def test_a_gpu_reporting_no_memory_gets_no_memory_limit() -> None:
    (plan,) = plan_daemons(mps(SharedResource(GPU, 2)), [gpu(0, memory=0)])
    assert plan.commands() == ["set_default_active_thread_percentage 50"]


def test_no_plan_without_mps() -> None:
    assert plan_daemons(None, [gpu(0)]) == []
    assert plan_daemons(TimeSlicing(resources=(SharedResource(GPU, 2),)), [gpu(0)]) == []


def test_entries_for_other_resources_are_warned_about() -> None:
    warnings: list[str] = []
    assert plan_daemons(mps(SharedResource("nvidia.com/mig-1g.5gb", 2)), [gpu(0)], warnings=warnings) == []
    assert warnings == [
        "sharing.mps.resources[0]: MPS shares full GPUs (nvidia.com/gpu); "
        "nvidia.com/mig-1g.5gb has no devices here"
    ]


def test_extension_device_selection_and_rename() -> None:
    sharing = mps(
        SharedResource(GPU, 2, devices=("0",), rename="nvidia.com/gpu-a"), SharedResource(GPU, 4, devices=1)
    )
    with pytest.raises(MpsConfigError, match=r"resources\[1\]\.devices: GPU 0 is already shared"):
        plan_daemons(sharing, [gpu(0), gpu(1)])
    sharing = mps(
        SharedResource(GPU, 2, devices=("0",), rename="nvidia.com/gpu-a"),
        SharedResource(GPU, 4, devices=("GPU-00000001",), rename="nvidia.com/gpu-b"),
    )
    plans = plan_daemons(sharing, [gpu(0), gpu(1)])
    assert [(p.resource, p.thread_percentage) for p in plans] == [
        ("nvidia.com/gpu-a", 50),
        ("nvidia.com/gpu-b", 25),
    ]


@pytest.mark.parametrize(
    ("sharing", "gpus", "path", "reason"),
    [
        pytest.param(
            mps(SharedResource(GPU, 2)),
            [gpu(0), gpu(1, mig=True), gpu(3, mig=True)],
            "sharing.mps",
            "MPS sharing is not supported for MIG devices (MIG is enabled on GPU 1, 3)",
            id="mig",
        ),
        pytest.param(
            mps(SharedResource(GPU, 49)),
            [gpu(0)],
            "sharing.mps.resources[0].replicas",
            "49 replicas exceed the 48 clients an MPS server takes on GPU 0 (compute capability 8.0)",
            id="replicas-volta-and-later",
        ),
        pytest.param(
            mps(SharedResource(GPU, 17)),
            [gpu(0, cc=(7, 0))],
            "sharing.mps.resources[0].replicas",
            "17 replicas exceed the 16 clients",
            id="replicas-older",
        ),
    ],
)
def test_refusals(sharing: TimeSlicing, gpus: list[MpsGpu], path: str, reason: str) -> None:
    with pytest.raises(MpsConfigError) as info:
        plan_daemons(sharing, gpus)
    assert info.value.path == path
    assert info.value.reason.startswith(reason)


# -------------------------------------------------------------------------------------- readiness


def test_ready_document_round_trip_and_mismatch() -> None:
    sharing = mps(SharedResource(GPU, 4))
    plans = plan_daemons(sharing, [gpu(0), gpu(1, 81920)])
    doc = ready_document(sharing_document(sharing), plans)
    ready = ready_resources(doc, sharing)
    assert ready == {GPU: ReadyResource(25, {"GPU-00000000": 10240, "GPU-00000001": 20480})}
    assert ready_resources(doc, mps(SharedResource(GPU, 2))) is None  # written for other settings
    assert ready_resources(doc, mps(SharedResource(GPU, 4), rename_by_default=True)) is None
    for bad in (None, [], {"sharing": doc["sharing"], "resources": []}, {"sharing": doc["sharing"]}):
        assert ready_resources(bad, sharing) is None


def test_client_env_counts_the_containers_devices_from_zero() -> None:
    ready = ReadyResource(25, {"GPU-a": 10240, "GPU-b": 20480})
    assert client_env(GPU, ready, ["GPU-b", "GPU-a"]) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M,1=10240M",
    }
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in client_env(GPU, ReadyResource(50, {}), ["GPU-a"])


def test_plans_travel_as_json() -> None:
    plans = plan_daemons(mps(SharedResource(GPU, 4)), [gpu(0), gpu(1, 81920, (7, 0))])
    assert [DaemonPlan.from_json(json.loads(json.dumps(p.to_json()))) for p in plans] == plans


def test_daemon_plan_most_replicas_decides_threads() -> None:
    plan = DaemonPlan(GPU, (gpu(0), gpu(1)), {0: 2, 1: 4})
    assert plan.thread_percentage == 25

"""gpunode.api.readiness: the text of the readiness files the driver loader and the validator write."""

from __future__ import annotations

import pytest

from gpunode.api.readiness import ctr_ready_text, driver_ready_text


def test_ctr_ready_is_the_startup_probes_three_lines() -> None:
    assert (
        ctr_ready_text(True) == "GDRCOPY_ENABLED: false\nGDS_ENABLED: false\nGPU_DIRECT_RDMA_ENABLED: true\n"
    )
    assert ctr_ready_text(False).endswith("GPU_DIRECT_RDMA_ENABLED: false\n")


@pytest.mark.parametrize(
    ("host_driver", "root", "expected"),
    [
        pytest.param(True, "/whatever", ("true", "/", "/host"), id="host-driver"),
        pytest.param(False, "/", ("false", "/", "/host"), id="ours-in-host-root"),
        pytest.param(
            False,
            "/run/nvidia/driver",
            ("false", "/run/nvidia/driver", "/run/nvidia/driver"),
            id="driver-root",
        ),
    ],
)
def test_driver_ready_env_file(host_driver: bool, root: str, expected: tuple[str, str, str]) -> None:
    lines = driver_ready_text(host_driver=host_driver, driver_root=root).splitlines()
    assert lines == [
        f"IS_HOST_DRIVER={expected[0]}",
        f"NVIDIA_DRIVER_ROOT={expected[1]}",
        f"DRIVER_ROOT_CTR_PATH={expected[2]}",
        "NVIDIA_DEV_ROOT=/",
        "DEV_ROOT_CTR_PATH=/host",
    ]

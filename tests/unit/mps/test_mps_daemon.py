"""gpunode.mps.daemon's pure parts: where the control binary is found, the environment it runs with."""

from __future__ import annotations

from pathlib import Path

from gpunode.api.mps import DaemonPlan, MpsGpu, MpsRoot
from gpunode.mps.agent import Plan
from gpunode.mps.daemon import ControlDaemon, driver_env, find_control_binary


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_binary_is_looked_up_under_the_driver_root_in_order(tmp_path: Path) -> None:
    found, looked = find_control_binary(str(tmp_path))
    assert found is None
    assert looked[0] == str(tmp_path / "usr/bin/nvidia-cuda-mps-control")
    later = executable(tmp_path / "usr/local/nvidia/bin/nvidia-cuda-mps-control")
    assert find_control_binary(str(tmp_path))[0] == later
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/nvidia-cuda-mps-control").write_text("not executable")
    assert find_control_binary(str(tmp_path))[0] == later  # a file that cannot run does not count
    first = executable(tmp_path / "usr/bin/nvidia-cuda-mps-control")
    assert find_control_binary(str(tmp_path))[0] == first


def test_env_puts_the_binary_dir_first_and_the_driver_libraries(tmp_path: Path) -> None:
    binary = executable(tmp_path / "usr/bin/nvidia-cuda-mps-control")
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    env = driver_env(str(tmp_path), binary, {"PATH": "/bin", "LD_LIBRARY_PATH": "/opt/lib"})
    assert env["PATH"] == f"{tmp_path}/usr/bin:/bin"
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path}/usr/lib/x86_64-linux-gnu:{tmp_path}/usr/lib:/opt/lib"
    assert "LD_LIBRARY_PATH" not in driver_env("/", Path("/usr/bin/nvidia-cuda-mps-control"), {})


def test_daemon_env_is_nvidias(tmp_path: Path) -> None:
    plan = DaemonPlan("nvidia.com/gpu", (MpsGpu(0, "GPU-a", 40960, (8, 0)),), {0: 4})
    daemon = ControlDaemon(plan, MpsRoot("/run/nvidia/mps"), Path("/usr/bin/nvidia-cuda-mps-control"), {})
    assert daemon.env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps/nvidia.com/gpu/pipe"
    assert daemon.env["CUDA_MPS_LOG_DIRECTORY"] == "/run/nvidia/mps/nvidia.com/gpu/log"
    assert daemon.env["CUDA_VISIBLE_DEVICES"] == "GPU-a"
    assert not daemon.alive()  # no pid file, no socket


def test_plan_document_from_the_planning_child() -> None:
    plan = DaemonPlan("nvidia.com/gpu", (MpsGpu(0, "GPU-a", 40960, (8, 0)),), {0: 4})
    doc = {
        "sharing": {"renameByDefault": False},
        "plans": [plan.to_json()],
        "warnings": ["w"],
        "ignored": ["i"],
        "file": {"mpsRoot": "/x", "migStrategy": None},
    }
    got = Plan.from_json(doc)
    assert got == Plan({"renameByDefault": False}, (plan,), ("w",), ("i",), "/x")
    assert Plan.from_json({"sharing": None}) == Plan(None)

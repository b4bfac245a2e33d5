"""One simulated node shared by real processes through a state file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pynvml
import pytest

from gpunode.sim import nvml as sim


def _py(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def _xid_waiter(state: Path, preset: str, gpu: int) -> object:
    """Join a fresh shared node and return an event set waiting for XIDs on one GPU."""
    sim.init_state_file(state, preset)
    sim.install(state=state)
    pynvml.nvmlInit()
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(
        pynvml.nvmlDeviceGetHandleByIndex(gpu), pynvml.nvmlEventTypeXidCriticalError, es
    )
    return es


def test_a_mig_layout_made_in_one_process_is_seen_by_another(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-h100")
    lib = sim.install(state=state)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetMigMode(h) == [0, 0]
    _py(
        """
        import sys, pynvml
        from gpunode.sim import nvml as sim
        sim.install(state=sys.argv[1])
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(3)
        pynvml.nvmlDeviceSetMigMode(h, 1)
        gi = pynvml.nvmlDeviceCreateGpuInstance(h, 9)
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 2)
        """,
        str(state),
    )
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]  # visible on the very next call
    m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert pynvml.nvmlDeviceGetName(m) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert lib.node.state.generation >= 3


def test_concurrent_writers_never_corrupt_the_file(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "a30x4")
    writer = """
        import sys
        from gpunode.sim.nvml import SimNode
        from pathlib import Path
        node = SimNode.open(Path(sys.argv[1]))
        for n in range(25):
            with node.mutate() as st:
                st.inject_xid(int(sys.argv[2]), 100 + n)
        """
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(writer), str(state), str(g)])
        for g in range(4)
    ]
    for p in procs:
        assert p.wait(60) == 0
    data = json.loads(state.read_text())
    assert len(data["events"]) == 100
    assert sorted(e["seq"] for e in data["events"]) == list(range(1, 101))
    for g in range(4):
        assert [e["data"] for e in data["events"] if e["gpu"] == g] == list(range(100, 125))
    assert not list(tmp_path.glob(".node.json.*"))  # no temp files left behind


def test_xid_from_another_process_wakes_a_blocked_wait(tmp_path: Path, gpunode_cmd: list[str]) -> None:
    state = tmp_path / "node.json"
    es = _xid_waiter(state, "dgx-a100", 6)
    got: list[tuple[int, float]] = []

    def waiter() -> None:
        data = pynvml.nvmlEventSetWait_v2(es, 10_000)
        got.append((int(data.eventData), time.monotonic()))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    cpu_before = time.process_time()
    subprocess.run(
        [*gpunode_cmd, "sim", "xid", "--state", str(state), "--gpu", "6", "--xid", "79"], check=True
    )
    returned = time.monotonic()
    t.join(5)
    assert got
    assert got[0][0] == 79
    assert got[0][1] - returned < 0.25
    assert time.process_time() - cpu_before < 0.5


def test_idle_wait_on_a_shared_node_does_not_spin(tmp_path: Path) -> None:
    es = _xid_waiter(tmp_path / "node.json", "t4x4", 0)
    cpu0, wall0 = time.thread_time(), time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 600)
    assert time.monotonic() - wall0 >= 0.59
    assert time.thread_time() - cpu0 < 0.05


def test_a_corrupt_state_file_is_an_error_not_a_reset(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    state.write_text("{not json")
    with pytest.raises(sim.StateError, match=str(state)):
        sim.install("dgx-a100", state=state)
    assert state.read_text() == "{not json"


def test_a_state_file_of_another_preset_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "t4x4")
    with pytest.raises(sim.StateError, match="t4x4"):
        sim.install("dgx-a100", state=state)

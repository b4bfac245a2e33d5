"""`gpunode-exporter` scraped over real HTTP, on a shared simulated node, with a fake kubelet PodResources."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpunode.nvml import mig
from gpunode.sim import nvml as sim

EXPORTER = str(Path(sys.executable).parent / "gpunode-exporter")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int, accept: str | None = None) -> tuple[str, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode(), resp.headers["Content-Type"]


def samples(text: str, name: str) -> list[dict[str, str]]:
    out = []
    for fam in text_string_to_metric_families(text):
        # prometheus_client's parser names a counter's samples <name>_total; the exposition has <name>
        exposed = name + "_total" if fam.type == "counter" and fam.name == name else name
        for s in fam.samples:
            if s.name == exposed:
                out.append({**s.labels, "__value__": str(s.value)})
    return out


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


@pytest.fixture
def exporter(node: Path) -> Iterator[Callable[..., int]]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> int:
        port = free_port()
        p = subprocess.Popen(
            [EXPORTER, "--sim-state", str(node), "-a", f"127.0.0.1:{port}", "--node-name", "node-a", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        procs.append(p)
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)  # sampled once
                return port
            except OSError:
                assert p.poll() is None, p.stdout.read() if p.stdout else ""
                assert time.monotonic() < deadline, "exporter did not start"
                time.sleep(0.1)

    yield start
    for p in procs:
        p.terminate()
        out, _ = p.communicate(timeout=10)
        if os.environ.get("GPUNODE_TEST_DEBUG"):
            print(out)


def test_scrape_has_dcgm_names_labels_and_values(exporter: Callable[..., int]) -> None:
    port = exporter()
    text, ctype = scrape(port)
    assert ctype.startswith("text/plain")
    util = samples(text, "DCGM_FI_DEV_GPU_UTIL")
    assert sorted(int(s["gpu"]) for s in util) == list(range(8))
    first = next(s for s in util if s["gpu"] == "0")
    assert first["UUID"].startswith("GPU-")
    assert first["modelName"] == "NVIDIA A100-SXM4-40GB"
    assert first["device"] == "nvidia0"
    assert first["pci_bus_id"] == "00000000:07:00.0"
    assert first["Hostname"] == "node-a"
    assert first["DCGM_FI_DRIVER_VERSION"] == "550.54.15"
    for name in (
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_XID_ERRORS",
    ):
        assert len(samples(text, name)) == 8, name
    power = float(samples(text, "DCGM_FI_DEV_POWER_USAGE")[0]["__value__"])
    assert 40 <= power <= 400  # watts, not milliwatts
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
    assert "approximat" in text.split("# HELP DCGM_FI_PROF_PCIE_TX_BYTES", 1)[1].splitlines()[0].lower()
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in text  # needs DCGM profiling: never faked
    om, om_type = scrape(port, "application/openmetrics-text; version=1.0.0")
    assert om_type.startswith("application/openmetrics-text")
    assert om.rstrip().endswith("# EOF")


def test_xid_shows_code_and_message(exporter: Callable[..., int], node: Path) -> None:
    port = exporter("-c", "200")
    with sim.SimNode.open(node).mutate() as st:
        st.inject_xid(3, 48)
    deadline = time.monotonic() + 5
    while True:
        xid = [s for s in samples(scrape(port)[0], "DCGM_FI_DEV_XID_ERRORS") if s["gpu"] == "3"]
        if xid and xid[0]["__value__"] == "48.0":
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert xid[0]["err_code"] == "48"
    assert xid[0]["err_msg"] == "Double Bit ECC Error"


def test_lost_gpu_keeps_its_identity_with_health_zero(exporter: Callable[..., int], node: Path) -> None:
    port = exporter("-c", "200")
    with sim.SimNode.open(node).mutate() as st:
        st.lose(2)
    deadline = time.monotonic() + 5
    while True:
        text = scrape(port)[0]
        health = {s["gpu"]: s["__value__"] for s in samples(text, "gpunode_gpu_health")}
        if health.get("2") == "0.0":
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert sum(v == "1.0" for v in health.values()) == 7
    assert "2" not in {s["gpu"] for s in samples(text, "DCGM_FI_DEV_GPU_UTIL")}


def test_mig_devices_have_their_own_memory_series(exporter: Callable[..., int], node: Path) -> None:
    with sim.SimNode.open(node).mutate() as st:
        st.set_mig_mode(0, 1)
        st.reset_gpu(0)
        for enum in (mig.GI_3_SLICE, mig.GI_1_SLICE):
            _, gi = st.create_gi(0, enum, None)
            ci = mig.CI_3_SLICE if enum == mig.GI_3_SLICE else mig.CI_1_SLICE
            st.create_ci(0, gi, ci, None)
    port = exporter()
    text = scrape(port)[0]
    used = [s for s in samples(text, "DCGM_FI_DEV_FB_USED") if s["gpu"] == "0"]
    assert sorted(s["GPU_I_PROFILE"] for s in used) == ["1g.5gb", "3g.20gb"]
    assert {s["GPU_I_ID"] for s in used} == {"2", "10"}
    assert "0" not in {
        s["gpu"] for s in samples(text, "DCGM_FI_DEV_GPU_UTIL")
    }  # no whole-GPU util in MIG mode


def test_malformed_counters_file_exits_2_with_the_line(node: Path, tmp_path: Path) -> None:
    csv = tmp_path / "counters.csv"
    csv.write_text(
        "# comment\nDCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\nDCGM_FI_DEV_NOPE, gauge, x\n"
    )
    r = subprocess.run(
        [EXPORTER, "--sim-state", str(node), "-f", str(csv)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2
    assert f"{csv}:3" in r.stderr
    assert "DCGM_FI_DEV_NOPE" in r.stderr


def test_port_in_use_exits_1(node: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            [EXPORTER, "--sim-state", str(node), "-a", f"127.0.0.1:{port}", "--log-format", "json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert r.returncode == 1
    events = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    assert any(e["event"] == "listen_failed" for e in events)


@pytest.fixture
async def pods(tmp_path: Path) -> object:
    from gpunode.sim.podresources import FakePodResources

    fake = FakePodResources(tmp_path / "pod-resources.sock")
    await fake.start()
    yield fake
    await fake.stop()


async def _scrape_async(port: int) -> str:
    import asyncio

    return await asyncio.to_thread(lambda: scrape(port)[0])


async def test_pod_attribution_full_gpus_mig_and_replicas(
    exporter: Callable[..., int], node: Path, pods: object, tmp_path: Path
) -> None:
    import asyncio

    with sim.SimNode.open(node).mutate() as st:
        st.set_mig_mode(7, 1)
        st.reset_gpu(7)
        _, gi = st.create_gi(7, mig.GI_3_SLICE, None)
        st.create_ci(7, gi, mig.CI_3_SLICE, None)
        uuids = [st.gpu_uuid(i) for i in range(8)]
        mig_uuid = st.mig_uuid(7, gi, 0)
    pods.set_pods(
        [  # type: ignore[attr-defined]
            {
                "name": "train",
                "namespace": "ml",
                "containers": [
                    {
                        "name": "worker",
                        "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [uuids[0]]}],
                    }
                ],
            },
            {
                "name": "infer",
                "namespace": "web",
                "containers": [
                    {
                        "name": "srv",
                        "devices": [{"resource_name": "nvidia.com/mig-3g.20gb", "device_ids": [mig_uuid]}],
                    }
                ],
            },
            {
                "name": "a",
                "namespace": "ts",
                "containers": [
                    {
                        "name": "c",
                        "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [f"{uuids[1]}::0"]}],
                    }
                ],
            },
            {
                "name": "b",
                "namespace": "ts",
                "containers": [
                    {
                        "name": "c",
                        "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [f"{uuids[1]}::1"]}],
                    }
                ],
            },
        ]
    )
    sock = str(tmp_path / "pod-resources.sock")
    port = await asyncio.to_thread(
        exporter, "-k", "--pod-resources-socket", sock, "--kubernetes-virtual-gpus"
    )
    text = await _scrape_async(port)
    util = {(s["gpu"], s.get("pod"), s.get("vgpu")): s for s in samples(text, "DCGM_FI_DEV_GPU_UTIL")}
    assert util[("0", "train", None)]["namespace"] == "ml"
    assert util[("0", "train", None)]["container"] == "worker"
    assert ("1", "a", "0") in util
    assert ("1", "b", "1") in util
    used = [s for s in samples(text, "DCGM_FI_DEV_FB_USED") if s["gpu"] == "7"]
    assert [(s["GPU_I_PROFILE"], s["pod"], s["namespace"]) for s in used] == [("3g.20gb", "infer", "web")]
    assert ("2", None, None) in util  # an idle GPU keeps its series, without pod labels


def test_absent_pod_resources_socket_still_serves_and_counts(
    exporter: Callable[..., int], tmp_path: Path
) -> None:
    port = exporter("-k", "--pod-resources-socket", str(tmp_path / "missing.sock"), "-c", "300")
    text = scrape(port)[0]
    assert len(samples(text, "DCGM_FI_DEV_GPU_UTIL")) == 8
    assert all("pod" not in s for s in samples(text, "DCGM_FI_DEV_GPU_UTIL"))
    failures = samples(text, "gpunode_exporter_podresources_failures_total")
    assert failures
    assert float(failures[0]["__value__"]) >= 1


def test_a_mig_layout_made_at_runtime_is_picked_up(exporter: Callable[..., int], node: Path) -> None:
    port = exporter("-c", "200")
    with sim.SimNode.open(node).mutate() as st:
        st.set_mig_mode(4, 1)
        st.reset_gpu(4)
        _, gi = st.create_gi(4, mig.GI_2_SLICE, None)
        st.create_ci(4, gi, mig.CI_2_SLICE, None)
    deadline = time.monotonic() + 5
    while True:
        used = [s for s in samples(scrape(port)[0], "DCGM_FI_DEV_FB_USED") if s["gpu"] == "4"]
        if [s.get("GPU_I_PROFILE") for s in used] == ["2g.10gb"]:
            break
        assert time.monotonic() < deadline, used
        time.sleep(0.1)


def test_profiling_ratios_come_from_gpm_on_hopper(tmp_path: Path) -> None:
    state = tmp_path / "h100.json"
    sim.init_state_file(state, "dgx-h100")
    port = free_port()
    p = subprocess.Popen(
        [EXPORTER, "--sim-state", str(state), "-a", f"127.0.0.1:{port}", "-c", "200"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                active = samples(scrape(port)[0], "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
            except OSError:
                active = []
            if len(active) == 8:
                break
            assert time.monotonic() < deadline, "no GPM-based series"
            time.sleep(0.1)
        text = scrape(port)[0]
        for name in (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
        ):
            values = [float(s["__value__"]) for s in samples(text, name)]
            assert len(values) == 8
            assert all(0.0 <= v <= 1.0 for v in values)  # ratios, as dcgm-exporter's
    finally:
        p.terminate()
        p.wait(10)

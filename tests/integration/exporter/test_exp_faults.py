"""The exporter after faults (issue 14, item 9): a MIG layout applied beside a lost GPU shows in the next
scrapes, the lost GPU keeps its identity with health 0, and nothing crashes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpunode.sim import nvml as sim
from helpers.faults import all_balanced, apply_layout

EXPORTER = str(Path(sys.executable).parent / "gpunode-exporter")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def samples(text: str, name: str) -> list[dict[str, str]]:
    return [
        {**s.labels, "__value__": str(s.value)}
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def mig_layout(text: str) -> dict[str, set[tuple[str, str]]]:
    """(GPU instance id, profile) of each MIG device's memory series, per GPU index."""
    out: dict[str, set[tuple[str, str]]] = {}
    for s in samples(text, "DCGM_FI_DEV_FB_USED"):
        if "GPU_I_ID" in s:
            out.setdefault(s["gpu"], set()).add((s["GPU_I_ID"], s["GPU_I_PROFILE"]))
    return out


def node_layout(state: Path) -> dict[str, set[tuple[str, str]]]:
    """The same from the node itself, for the GPUs that answer."""
    st = sim.SimNode.open(state).state
    names = {1: "1g.5gb", 2: "2g.10gb", 3: "3g.20gb"}  # A100-40GB, by compute slices
    return {
        str(gpu): {(str(gi.id), names[ci.size]) for gi, ci in st.mig_devices(gpu)}
        for gpu, g in enumerate(st.gpus)
        if not g.lost and st.mig_devices(gpu)
    }


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    with sim.SimNode.open(state).mutate() as st:
        all_balanced(st)
    return state


@pytest.fixture
def exporter(node: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    p = subprocess.Popen(
        [EXPORTER, "--sim-state", str(node), "-a", f"127.0.0.1:{port}", "--node-name", "node-a", "-c", "200"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
                break
            except OSError:
                assert p.poll() is None, p.stdout.read() if p.stdout else ""
                assert time.monotonic() < deadline, "exporter did not start"
                time.sleep(0.1)
        yield p, port
    finally:
        p.terminate()
        p.wait(10)


def until_scrape(port: int, ok: object, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(port)
        if ok(text):  # type: ignore[operator]
            return text
        assert time.monotonic() < deadline, mig_layout(text)
        time.sleep(0.1)


def test_a_layout_applied_beside_a_lost_gpu_shows_in_the_scrape(
    exporter: tuple[subprocess.Popen[str], int], node: Path, tmp_path: Path
) -> None:
    proc, port = exporter
    until_scrape(port, lambda t: mig_layout(t) == node_layout(node))
    with sim.SimNode.open(node).mutate() as st:
        st.lose(7)
    until_scrape(
        port, lambda t: {s["gpu"]: s["__value__"] for s in samples(t, "gpunode_gpu_health")}["7"] == "0.0"
    )

    apply_layout(node, tmp_path, "seven-1g-on-0-6")
    text = until_scrape(port, lambda t: mig_layout(t) == node_layout(node))
    assert all(len(devices) == 7 for devices in mig_layout(text).values())
    health = {s["gpu"]: s["__value__"] for s in samples(text, "gpunode_gpu_health")}
    assert health == {**{str(i): "1.0" for i in range(7)}, "7": "0.0"}  # GPU 7 keeps its identity
    assert proc.poll() is None

    with sim.SimNode.open(node).mutate() as st:
        st.restore(7)
    text = until_scrape(port, lambda t: "7" in mig_layout(t))
    assert mig_layout(text) == node_layout(node)  # GPU 7's own layout, as it was


async def test_a_failed_mig_read_is_read_again_at_the_next_sample(node: Path) -> None:
    from gpunode.exporter.sampler import Sampler
    from gpunode.nvml import errors
    from gpunode.nvml.real import RealNvml

    sim.install(state=node)
    nvml = await RealNvml.open()
    try:
        sampler = Sampler(nvml, interval=60)
        await sampler.sample()
        with sim.SimNode.open(node).mutate() as st:  # GPU 0 loses its 3g instance
            gi = next(g for g in st.gpus[0].gis if g.size == 4)
            assert st.destroy_ci(0, gi.id, gi.cis[0].id) == 0
            assert st.destroy_gi(0, gi.id) == 0
        sampler.layout_changed.add(0)  # what the MIG event does
        real = nvml.mig_devices

        async def failing(index: int) -> object:
            raise errors.NvmlError("Unknown Error", 999)

        nvml.mig_devices = failing  # type: ignore[method-assign,assignment]
        with pytest.raises(errors.NvmlError):
            await sampler.sample()
        nvml.mig_devices = real  # type: ignore[method-assign]
        snap = await sampler.sample()  # not an inventory pass: only the change asks for a new read
        gpu0 = next(s for s in snap.gpus if s.info.index == 0)
        assert sorted(m.device.profile for m in gpu0.migs) == ["1g.5gb", "1g.5gb", "2g.10gb"]
    finally:
        await nvml.close()
        sim.uninstall()

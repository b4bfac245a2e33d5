"""MPS sharing end to end: the MPS control daemon agent (a process, with the fake control binary), the
device plugin and the kubelet emulator. The plugin advertises the replicas only while the daemon is ready,
and Allocate answers as NVIDIA's plugin does for MPS."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpunode.common.hostpaths import HostPaths
from gpunode.sim import mps_control
from gpunode.sim.kubelet import FakeKubelet
from helpers.mounts import unmount_under
from helpers.waiting import until

Starter = Any  # the start_plugin fixture (see conftest.py)
GPU = "nvidia.com/gpu"
AGENT = str(Path(sys.executable).parent / "gpunode-mps-control-daemon")
CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"


@pytest.fixture
def short() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # control socket paths stay under 107 bytes
    yield base
    unmount_under(base)  # the agent's <root>/shm tmpfs (mounted when the tests run as root)
    shutil.rmtree(base, ignore_errors=True)


StartAgent = Callable[..., Coroutine[Any, Any, asyncio.subprocess.Process]]


@pytest.fixture
async def mps_agent(tmp_path: Path, short: Path) -> AsyncIterator[StartAgent]:
    procs: list[asyncio.subprocess.Process] = []

    async def start(*, follow: bool = False) -> asyncio.subprocess.Process:
        """``follow``: --follow-device-plugin (the config the plugin publishes), else a config file."""
        mps_control.install(short / "drv")
        (tmp_path / "mps.yaml").write_text(CONFIG)
        config = ["--follow-device-plugin"] if follow else ["--config-file", str(tmp_path / "mps.yaml")]
        p = await asyncio.create_subprocess_exec(
            AGENT,
            "--sim-state",
            str(tmp_path / "node.json"),  # the plugin's simulated node
            "--driver-root",
            str(short / "drv"),
            "--mps-root",
            str(short / "host/run/nvidia/mps"),  # the host's /run/nvidia/mps as the plugin sees it
            *config,
            "--watch-interval",
            "0.1",
            "--http-port",
            "-1",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.returncode is None:
            p.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(p.wait(), 15)
            except TimeoutError:
                p.kill()
                await p.wait()
    pid = short / "host/run/nvidia/mps" / GPU / "pipe/nvidia-cuda-mps-control.pid"
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pid.read_text()), signal.SIGKILL)


async def test_mps_replicas_wait_for_the_daemon_and_allocate_as_nvidia(
    start_plugin: Starter, kubelet: FakeKubelet, mps_agent: StartAgent, short: Path
) -> None:
    running = await start_plugin("dgx-a100", config=CONFIG, wait=None, host=HostPaths(root=short / "host"))
    await until(lambda: running.plugin.ready.is_set(), timeout=10)
    assert GPU not in kubelet.plugins  # no MPS daemon yet: no MPS resource advertised

    agent = await mps_agent()
    await kubelet.wait_registered(GPU, timeout=30)
    await kubelet.wait_for(lambda: len(kubelet.healthy(GPU)) == 32, timeout=10)  # 8 GPUs x 4 replicas
    replica = sorted(kubelet.healthy(GPU))[0]
    uuid = replica.split("::")[0]

    resp = (await kubelet.allocate(GPU, [replica])).container_responses[0]
    assert dict(resp.envs) == {
        "NVIDIA_VISIBLE_DEVICES": uuid,
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
    }
    mounts = {(m.container_path, m.host_path) for m in resp.mounts}
    assert mounts == {
        ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
        ("/dev/shm", "/run/nvidia/mps/shm"),
    }

    # failRequestsGreaterThanOne is forced under MPS, as NVIDIA's plugin does
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await kubelet.allocate(GPU, sorted(kubelet.healthy(GPU))[:2])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "maximum request size for shared resources is 1; found 2" in (info.value.details() or "")

    # the daemon goes away: the plugin stops advertising MPS replicas
    agent.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(agent.wait(), 20) == 0
    await kubelet.wait_for(lambda: not kubelet.healthy(GPU), timeout=10)


async def test_the_daemon_follows_the_config_the_plugin_serves(
    start_plugin: Starter, kubelet: FakeKubelet, mps_agent: StartAgent, short: Path, tmp_path: Path
) -> None:
    """--follow-device-plugin: the agent waits for the plugin's published config, and a new config the
    plugin takes (its file edited) restarts the daemons with the new limits: the replicas follow."""
    root = short / "host/run/nvidia/mps"
    agent = await mps_agent(follow=True)  # first: it waits, not ready, nothing published yet
    await until(lambda: root.is_dir(), timeout=20)
    await asyncio.sleep(0.5)
    assert not (root / ".ready").exists()
    assert agent.returncode is None

    running = await start_plugin("dgx-a100", config=CONFIG, wait=None, host=HostPaths(root=short / "host"))
    published = root / ".device-plugin-config.yaml"
    await until(published.exists, timeout=20)  # once its config is in force
    assert published.read_text() == CONFIG
    assert oct(published.stat().st_mode & 0o777) == "0o644"
    await kubelet.wait_registered(GPU, timeout=30)
    await kubelet.wait_for(lambda: len(kubelet.healthy(GPU)) == 32, timeout=20)  # 8 GPUs x 4 replicas

    # the plugin's file changes: it reloads and publishes; the daemons restart with 2 replicas' limits
    two = CONFIG.replace("replicas: 4", "replicas: 2")
    (tmp_path / "config" / "config.yaml").write_text(two)
    await until(lambda: published.exists() and published.read_text() == two, timeout=20)
    await kubelet.wait_for(lambda: len(kubelet.healthy(GPU)) == 16, timeout=30)
    resp = (await kubelet.allocate(GPU, [sorted(kubelet.healthy(GPU))[0]])).container_responses[0]
    assert dict(resp.envs)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"

    # a restarted plugin with the same config rewrites nothing (the daemons are left alone)
    before = published.stat().st_mtime_ns
    assert running.plugin.mps_watch.publish_config(two.encode()) is False
    assert published.stat().st_mtime_ns == before
    assert agent.returncode is None

"""A fake kubelet on a temp directory and the device plugin running on a shared simulated node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpunode.api.plugin_config import PluginConfig
from gpunode.common.config import load_config
from gpunode.common.hostpaths import HostPaths
from gpunode.device_plugin.health import XidPolicy
from gpunode.device_plugin.plugin import AgentOptions, DevicePlugin
from gpunode.device_plugin.settings import settings_from_config
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim
from gpunode.sim.kubelet import FakeKubelet


@dataclass
class Running:
    plugin: DevicePlugin
    task: asyncio.Task[None]
    kubelet: FakeKubelet
    state: Path
    node: sim.SimNode = field(init=False)

    def __post_init__(self) -> None:
        self.node = sim.SimNode.open(self.state)

    def mutate(self) -> Any:
        """Change the simulated node the way another process would: through the shared state file."""
        return self.node.mutate()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # a failed run was asserted on already
            await self.task


PLUGIN_TASKS = {
    "device-plugin",
    "http",
    "watchdog",
    "registrar",
    "kubelet-watch",
    "self-check",
    "nvml-events",
    "health-probe",
    "rebuild",
    "config-watch",
    "sighup",
}

Starter = Callable[..., Coroutine[Any, Any, Running]]


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(tmp_path / "device-plugins")
    await k.start()
    yield k
    await k.stop()


@pytest.fixture
async def start_plugin(tmp_path: Path, kubelet: FakeKubelet) -> AsyncIterator[Starter]:
    running: list[Running] = []

    async def start(
        preset: str = "dgx-a100",
        *,
        config: str | None = None,
        overrides: dict[str, Any] | None = None,
        recovery_period: float = 300.0,
        probe_interval: float = 0.1,
        policy: XidPolicy | None = None,
        register: bool = True,
        wait: str | None = "nvidia.com/gpu",
        prepare: Callable[[sim.NodeState], None] | None = None,
        host: HostPaths | None = None,
        nvml_retry_interval: float = 30.0,
    ) -> Running:
        state = tmp_path / "node.json"
        if not state.exists():
            sim.init_state_file(state, preset)
        if prepare is not None:
            with sim.SimNode.open(state).mutate() as st:
                prepare(st)
        sim.install(state=state)
        config_path = None
        cfg = None
        if config is not None:
            config_path = tmp_path / "config" / "config.yaml"
            config_path.parent.mkdir(exist_ok=True)
            config_path.write_text(config)
            cfg = load_config(config_path, PluginConfig)
        extra = dict(overrides or {})

        def load(c: PluginConfig | None) -> Any:
            return settings_from_config(c, extra)

        opts = AgentOptions(
            kubelet_socket=kubelet.socket if register else None,
            config_file=config_path,
            load_settings=load,
            host=host or HostPaths(root=tmp_path / "host"),
            recovery_period=recovery_period,
            policy=policy or XidPolicy(),
            http_port=0,
            self_check_interval=0.2,
            probe_interval=probe_interval,
            nvml_retry_interval=nvml_retry_interval,
        )
        plugin = DevicePlugin(opts, RealNvml.open, load(cfg), cfg)
        task = asyncio.create_task(plugin.run(), name="device-plugin")
        r = Running(plugin, task, kubelet, state)
        running.append(r)
        if wait is not None:
            await kubelet.wait_registered(wait, timeout=10)
        return r

    yield start
    for r in running:
        await r.stop()
    # nothing of the plugin may be left running (the fake kubelet's own tasks end with it)
    left = [t.get_name() for t in asyncio.all_tasks() if t.get_name() in PLUGIN_TASKS and not t.done()]
    assert left == []

"""A fake kubelet on a temp directory and the device plugin running on a shared simulated node."""

from __future__ import annotations

import asyncio
import contextlib
import time
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
from gpunode.nvml.api import HealthEvent
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim
from gpunode.sim.kubelet import FakeKubelet
from helpers.waiting import until


@dataclass
class Calls:
    """What the plugin asked of NVML, counted, so a test waits for it instead of sleeping a while."""

    opens: int = 0  # NVML open attempts finished (failed ones too)
    probes: int = 0  # health-probe passes begun (each asks for the lost GPUs once)
    events: int = 0  # NVML events the plugin has finished handling


class CountingNvml(RealNvml):
    """The real library on the simulator, counting the calls in :class:`Calls`."""

    calls: Calls

    async def lost_gpus(self) -> list[int]:
        self.calls.probes += 1
        return await super().lost_gpus()

    def events(self, *args: Any, **kwargs: Any) -> AsyncIterator[HealthEvent]:
        return self._counted(super().events(*args, **kwargs))

    async def _counted(self, events: AsyncIterator[HealthEvent]) -> AsyncIterator[HealthEvent]:
        try:
            async for event in events:
                yield event
                self.calls.events += 1  # the plugin asks for the next one: this one is handled
        finally:
            await events.aclose()  # type: ignore[attr-defined]


@dataclass
class Running:
    plugin: DevicePlugin
    task: asyncio.Task[None]
    kubelet: FakeKubelet
    state: Path
    calls: Calls = field(default_factory=Calls)
    node: sim.SimNode = field(init=False)

    def __post_init__(self) -> None:
        self.node = sim.SimNode.open(self.state)

    def mutate(self) -> Any:
        """Change the simulated node the way another process would: through the shared state file."""
        return self.node.mutate()

    async def probe_passes(self, n: int, timeout: float = 5.0) -> None:
        """Wait until ``n`` health-probe passes that began after this call have run to their end."""
        target = self.calls.probes + n + 1  # pass k has ended once pass k + 1 has begun
        await until(lambda: self.calls.probes >= target, timeout)

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
    "mps-watch",
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
        prepare: Callable[[sim.SimNodeState], None] | None = None,
        host: HostPaths | None = None,
        nvml_retry_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
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
            mps_poll_interval=0.05,
        )
        calls = Calls()

        async def open_nvml() -> RealNvml:
            try:
                nvml = await CountingNvml.open()
            finally:
                calls.opens += 1
            nvml.calls = calls
            return nvml

        plugin = DevicePlugin(opts, open_nvml, load(cfg), cfg, clock=clock)
        task = asyncio.create_task(plugin.run(), name="device-plugin")
        r = Running(plugin, task, kubelet, state, calls)
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

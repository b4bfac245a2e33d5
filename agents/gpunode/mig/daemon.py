"""The MIG manager's wiring: the layouts it converges to (the config file, layouts generated for the GPUs
present, or the defaults) and :func:`serve`, which puts the node, the state machine, the name source
(Kubernetes label or bare-metal file), the HTTP endpoint and the signal handling together.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.api.mig_config import MigSpec, load_spec
from gpunode.common import sdnotify
from gpunode.common.logging import Logger, get_logger
from gpunode.common.metrics import create_metrics
from gpunode.common.runtime import on_sighup, supervise
from gpunode.common.settings import CommonSettings
from gpunode.mig.apply import Applier
from gpunode.mig.bare_metal import FileSource, NoOperands, StateFile
from gpunode.mig.clients import HostClients
from gpunode.mig.kube_mode import KubeSource, MigNodeState, PausedOperands
from gpunode.mig.manager import AGENT, MigManager, OperandGate, StateSink
from gpunode.mig.node import hook_runner, open_node
from gpunode.mig.notify import notify_agents
from gpunode.mig.options import ManagerOptions

if TYPE_CHECKING:
    from gpunode.kube.client import Kube
    from gpunode.kube.operands import OperandPauser
    from gpunode.nvml.api import Nvml

__all__ = ["load_layouts", "serve"]


async def load_layouts(opts: ManagerOptions, nvml: Nvml, log: Logger) -> MigSpec:
    """The named layouts: ``CONFIG_FILE`` as is; otherwise generated for the GPUs present; when none of
    them can be generated for (no MIG-capable GPU, no profiles), ``DEFAULT_CONFIG_FILE`` or the shipped
    default. A bad file is a ConfigError."""
    if opts.config_file:
        return await asyncio.to_thread(load_spec, opts.config_file)
    from gpunode.mig.layouts import NoProfilesDiscovered, default_spec, generate
    from gpunode.mig.state import identity

    gpus = await nvml.gpus()
    why = "no MIG-capable GPU on this node"
    if any(g.mig_capable for g in gpus):
        rows = [(identity(g), await nvml.gi_profiles(g.index) if g.mig_capable else []) for g in gpus]
        try:
            spec = generate(rows)
            log.info("mig_layouts_generated", configs=list(spec.configs))
            return spec
        except NoProfilesDiscovered as exc:
            why = str(exc)
    if opts.default_config_file:
        log.info("mig_layouts_default", file=opts.default_config_file, why=why)
        return await asyncio.to_thread(load_spec, opts.default_config_file)
    log.info("mig_layouts_default", file="<shipped default>", why=why)
    return default_spec()


async def serve(
    opts: ManagerOptions, common: CommonSettings, kube: tuple[Kube, OperandPauser] | None = None
) -> int:
    """Run the manager (Kubernetes mode with ``kube``, bare metal with ``opts.selected_config_file``) on
    the node ``common`` opens (the simulated one under --simulate / --sim-state)."""
    from gpunode.common.http import HealthServer
    from gpunode.mig.clients import SystemctlCommand, systemctl_prefix

    log = get_logger("gpunode.mig.manager")
    metrics = create_metrics(AGENT)
    nvml, resetter = await open_node(common, opts.host_root)
    try:
        spec = await load_layouts(opts, nvml, log)
        log.info("mig_layouts", source=spec.source, configs=list(spec.configs))
        journal = Path(opts.journal_file) if opts.journal_file else None

        def make_applier(name: str) -> Applier:
            hooks = hook_runner(opts.hooks_file, config_file=manager.spec.source, selected_config=name)
            return Applier(nvml, resetter, journal=journal, hooks=hooks)

        sink: StateSink
        gate: OperandGate
        source: KubeSource | FileSource
        if kube is not None:
            sink, gate, source = (
                MigNodeState(kube[0]),
                PausedOperands(kube[1]),
                KubeSource(kube[0], kube[1], log),
            )
        else:
            assert opts.selected_config_file is not None
            sink, gate = StateFile(opts.state_file, opts.reboot_marker), NoOperands()
            source = FileSource(opts.selected_config_file, log)
        clients = None
        if opts.with_shutdown_host_gpu_clients:
            prefix = systemctl_prefix(opts.host_root_mount)
            clients = HostClients(SystemctlCommand(prefix), opts.services, log=log)

        def notify() -> None:
            if opts.notify_agents:
                notify_agents(opts.notify_processes, log)

        async def reload_spec() -> MigSpec:
            return await load_layouts(opts, nvml, log)

        manager = MigManager(
            opts,
            spec=spec,
            make_applier=make_applier,
            sink=sink,
            gate=gate,
            clients=clients,
            load_spec=reload_spec,
            notify=notify,
            metrics=metrics,
            log=log,
        )

        if opts.oneshot:
            await source.start(manager)
            outcome = await manager.handle(manager.selected, "start")
            return 1 if outcome in ("failed", "deferred") else 0
        async with asyncio.TaskGroup() as tg:
            if opts.http_port is not None:
                http = HealthServer(metrics.registry, host=opts.http_host, port=opts.http_port)
                http.add_check("nvml", lambda: (manager.nvml_ok, "ok" if manager.nvml_ok else "NVML failing"))
                if kube is not None:
                    k = kube[0]
                    http.add_check("kube", lambda: (k.available is not False, k.last_error or "reachable"))
                tg.create_task(http.serve(), name="http")
            tg.create_task(sdnotify.watchdog_task(), name="watchdog")
            await source.start(manager)
            manager.trigger("start")
            tg.create_task(
                supervise("reconfigure", manager.worker, metrics=metrics, log=log), name="reconfigure"
            )
            tg.create_task(
                supervise(
                    "follow", lambda: source.follow(manager), metrics=metrics, log=log, restart_on_return=True
                ),
                name="node-watch" if kube is not None else "file-watch",
            )
            tg.create_task(manager.reassert(), name="reassert")
            tg.create_task(on_sighup(manager.reload, metrics=metrics, log=log), name="sighup")
        return 0
    finally:
        with contextlib.suppress(Exception):
            await nvml.close()
        if kube is not None:
            with contextlib.suppress(Exception):
                await kube[0].aclose()

"""gpunode-mps-control-daemon: NVIDIA's MPS control daemon for ``sharing.mps`` (one per shared resource)."""

from __future__ import annotations

import asyncio
import json
import sys

from gpunode.agent.main import AgentContext, AgentSpec, Started
from gpunode.api.mps import DEFAULT_ROOT
from gpunode.common.errors import UsageError
from gpunode.mps.agent import MpsAgent, MpsOptions, Plan, PlanFailed
from gpunode.mps.settings import MpsSettings

__all__ = ["SPEC", "main", "planner_command"]

PLAN_TIMEOUT = 120.0


def planner_command(s: MpsSettings, *, mig_strategy_given: bool) -> list[str]:
    """The planning child's command line (:mod:`gpunode.mps.plan`)."""
    common = s.common
    cmd = [sys.executable, "-m", "gpunode.mps.plan", "--driver-root", common.driver_root]
    if common.config_file:
        cmd += ["--config-file", common.config_file]
    if mig_strategy_given:
        cmd += ["--mig-strategy", s.mig_strategy]
    if common.simulate is not None:
        cmd += ["--simulate", common.simulate]
    if common.sim_state is not None:
        cmd += ["--sim-state", common.sim_state]
    return cmd


def start(ctx: AgentContext[MpsSettings]) -> Started:
    s = ctx.settings
    sources = ctx.parsed.sources
    # flag > env > the file's flags.* > default: the file is read by the planning child
    cmd = planner_command(s, mig_strategy_given=sources.get("mig_strategy", "default") != "default")
    root_given = sources.get("mps_root", "default") != "default"

    async def planner() -> Plan:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(ctx.environ)
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), PLAN_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise PlanFailed(f"planning took more than {PLAN_TIMEOUT:.0f} s") from None
        text = err.decode("utf-8", "replace").strip()
        if proc.returncode == 2:
            raise UsageError(text)
        if proc.returncode != 0:
            raise PlanFailed(text or f"exit {proc.returncode}")
        try:
            return Plan.from_json(json.loads(out))
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanFailed(f"unreadable plan: {exc}") from None

    opts = MpsOptions(
        mps_root=s.mps_root if root_given else None,
        default_root=DEFAULT_ROOT,
        driver_root=s.common.driver_root,
        watch_interval=s.watch_interval,
        retry_interval=s.retry_interval,
        http_host=s.http.listen_host(ctx.environ),
        http_port=None if s.http.http_port < 0 else s.http.http_port,
        environ=dict(ctx.environ),
    )
    return Started(MpsAgent(opts, planner).run())


SPEC = AgentSpec(
    name="mps-control-daemon",
    console_script="gpunode-mps-control-daemon",
    settings_type=MpsSettings,
    start=start,
    description=__doc__,
    uses_nvml=False,  # the planning child opens NVML; the resident agent never loads it
)
main = SPEC.main

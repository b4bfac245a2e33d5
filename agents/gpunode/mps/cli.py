"""gpunode-mps-control-daemon: NVIDIA's MPS control daemon for ``sharing.mps`` (one per shared resource)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from gpunode.agent.main import AgentContext, AgentSpec, Started
from gpunode.api.mps import DEFAULT_ROOT
from gpunode.common.errors import UsageError
from gpunode.mps.agent import ComputeModeFailed, MpsAgent, MpsOptions, Plan, PlanFailed
from gpunode.mps.computemode import EXIT_NO_PERMISSION
from gpunode.mps.follow import FollowedConfig
from gpunode.mps.labelled import LabelledConfig
from gpunode.mps.settings import MpsSettings

__all__ = ["SPEC", "compute_mode_command", "main", "planner_command"]

PLAN_TIMEOUT = 120.0
FIELD_MANAGER = "gpunode-mps-control-daemon"


def _sim_args(s: MpsSettings) -> list[str]:
    common = s.common
    out = []
    if common.simulate is not None:
        out += ["--simulate", common.simulate]
    if common.sim_state is not None:
        out += ["--sim-state", common.sim_state]
    return out


def compute_mode_command(s: MpsSettings, mode: str, uuids: Sequence[str]) -> list[str]:
    """The compute-mode child's command line (:mod:`gpunode.mps.computemode`)."""
    cmd = [sys.executable, "-m", "gpunode.mps.computemode", "--mode", mode]
    cmd += ["--driver-root", s.common.driver_root, *_sim_args(s)]
    for uuid in uuids:
        cmd += ["--gpu", uuid]
    return cmd


def planner_command(s: MpsSettings, *, mig_strategy_given: bool, config_file: str | None = None) -> list[str]:
    """The planning child's command line (:mod:`gpunode.mps.plan`); ``config_file`` overrides the
    settings' (the file a node label chose in a config directory)."""
    common = s.common
    cmd = [sys.executable, "-m", "gpunode.mps.plan", "--driver-root", common.driver_root]
    path = config_file if config_file is not None else common.config_file
    if path:
        cmd += ["--config-file", path]
    if mig_strategy_given:
        cmd += ["--mig-strategy", s.mig_strategy]
    return cmd + _sim_args(s)


async def _child(cmd: Sequence[str], environ: dict[str, str], what: str) -> tuple[int, bytes, str]:
    """Run a short-lived child: (exit status, stdout, stderr as text); PlanFailed on a timeout."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=environ
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), PLAN_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise PlanFailed(f"{what} took more than {PLAN_TIMEOUT:.0f} s") from None
    return proc.returncode or 0, out, err.decode("utf-8", "replace").strip()


def mount_shm_and_exit(s: MpsSettings) -> int:
    """``--mount-shm``: NVIDIA's ``mount-shm`` step alone (the init container): 0 mounted or present."""
    from gpunode.api.mps import MpsRoot
    from gpunode.common.logging import get_logger
    from gpunode.mps.shm import DEFAULT_SIZE, mount_shm

    log = get_logger("gpunode.mps")
    result = mount_shm(MpsRoot(s.mps_root).shm_dir, s.shm_size or DEFAULT_SIZE)
    if result.outcome == "skipped":
        log.error("mps_shm_not_mounted", path=result.path, reason=result.detail)
        return 1
    event = "mps_shm_mounted" if result.outcome == "mounted" else "mps_shm_present"
    log.info(event, path=result.path, detail=result.detail)
    return 0


def start(ctx: AgentContext[MpsSettings]) -> Started | int:
    s = ctx.settings
    if s.mount_shm:
        return mount_shm_and_exit(s)
    sources = ctx.parsed.sources
    # flag > env > the file's flags.* > default: the file is read by the planning child
    mig_given = sources.get("mig_strategy", "default") != "default"
    root_given = sources.get("mps_root", "default") != "default"
    environ = dict(ctx.environ)
    labelled = _labelled(s)

    async def planner() -> Plan:
        chosen = labelled.path or "" if labelled is not None else None
        cmd = planner_command(s, mig_strategy_given=mig_given, config_file=chosen)
        code, out, text = await _child(cmd, environ, "planning")
        if code == 2:
            raise UsageError(text)
        if code != 0:
            raise PlanFailed(text or f"exit {code}")
        try:
            return Plan.from_json(json.loads(out))
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanFailed(f"unreadable plan: {exc}") from None

    async def compute_mode(mode: str, uuids: Sequence[str]) -> None:
        try:
            cmd = compute_mode_command(s, mode, uuids)
            code, _, text = await _child(cmd, environ, "setting the compute mode")
        except PlanFailed as exc:
            raise ComputeModeFailed(str(exc)) from None
        if code != 0:
            raise ComputeModeFailed(text or f"exit {code}", permission=code == EXIT_NO_PERMISSION)

    opts = MpsOptions(
        mps_root=s.mps_root if root_given else None,
        default_root=DEFAULT_ROOT,
        driver_root=s.common.driver_root,
        watch_interval=s.watch_interval,
        retry_interval=s.retry_interval,
        http_host=s.http.listen_host(ctx.environ),
        http_port=None if s.http.http_port < 0 else s.http.http_port,
        environ=environ,
        shm_size=s.shm_size or None,
        log_interval=s.log_interval,
    )
    return Started(MpsAgent(opts, planner, compute_mode, labelled).run())


def _labelled(s: MpsSettings) -> LabelledConfig | FollowedConfig | None:
    """With ``--follow-device-plugin``: the config the device plugin publishes. With ``--config-file``
    naming a directory: the node label chooses the file (the device plugin's way; it needs the
    Kubernetes API, whose client is imported only then)."""
    path = s.common.config_file
    if s.follow_device_plugin:
        if path:
            raise UsageError(
                f"--follow-device-plugin takes the device plugin's config, and --config-file {path} names "
                "another: give one of them (CONFIG_FILE / FOLLOW_DEVICE_PLUGIN)"
            )
        from gpunode.api.mps import MpsRoot
        from gpunode.common.logging import get_logger

        return FollowedConfig(Path(MpsRoot(s.mps_root).plugin_config_file), log=get_logger("gpunode.mps"))
    if not path or not Path(path).is_dir():
        return None
    from gpunode.common.logging import get_logger
    from gpunode.kube.client import Kube

    options = s.label_config.options(Path(path), first_label_wait=s.kube.kube_api_timeout)
    try:
        kube = Kube.connect(
            s.common.node_name,
            s.kube.kubeconfig,
            namespace=s.kube.namespace,
            timeout=s.kube.kube_api_timeout,
            field_manager=FIELD_MANAGER,
        )
    except UsageError as exc:
        raise UsageError(
            f"--config-file {path} is a directory: the node label {options.node_label} chooses the "
            f"config in it, which needs the Kubernetes API: {exc}"
        ) from None
    return LabelledConfig(options, kube, log=get_logger("gpunode.mps"))  # errors: the agent's counter


SPEC = AgentSpec(
    name="mps-control-daemon",
    console_script="gpunode-mps-control-daemon",
    settings_type=MpsSettings,
    start=start,
    description=__doc__,
    uses_nvml=False,  # the planning child opens NVML; the resident agent never loads it
)
main = SPEC.main

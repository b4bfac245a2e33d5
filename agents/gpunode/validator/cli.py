"""gpunode-validator: NVIDIA's operator validator components and status files.

    gpunode-validator --component driver|toolkit|plugin|cuda   check; write <component>-ready on success
    gpunode-validator --wait-for driver [--wait-for toolkit]    wait for the status files (init containers)

Status files go to --validations-dir (default /run/nvidia/validations, under --host-root). Exit 0 when
the check passed or was skipped (the file is then not written), 1 when it failed or a wait timed out,
2 on bad usage.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpunode.agent.main import AgentContext, AgentSpec, Started
from gpunode.common.errors import UsageError
from gpunode.common.hostpaths import HostPaths
from gpunode.validator import checks
from gpunode.validator.settings import ValidatorSettings

__all__ = ["SPEC", "main", "options", "wait_names"]


def wait_names(given: Sequence[str]) -> list[str]:
    """``driver`` -> ``driver-ready``; a name with a dash or dot (``.driver-ctr-ready``) is a file name."""
    names = []
    for item in (p.strip() for p in given):
        if not item or "/" in item or item in (".", ".."):
            raise UsageError(f"--wait-for {item!r}: a component or a file name in the validations dir")
        names.append(item if "-" in item or "." in item else checks.status_file(item))
    return names


def options(s: ValidatorSettings) -> checks.ValidatorOptions:
    """What the components check, from the settings."""
    common = s.common
    paths = HostPaths(s.host_root, common.driver_root, s.kubelet_dir)
    return checks.ValidatorOptions(
        paths=paths,
        validations_dir=paths.host(s.validations_dir),
        driver_root=common.driver_root,
        simulated=common.simulate is not None or common.sim_state is not None,
        toolkit_checks=tuple(s.toolkit_checks.split(",")),
        runtime_name=s.nvidia_runtime_name,
        cdi_kind=s.cdi_kind,
        plugin_http_port=None if s.plugin_http_port < 0 else s.plugin_http_port,
        with_workload=s.with_workload,
    )


def start(ctx: AgentContext[ValidatorSettings]) -> Started:
    s = ctx.settings
    waits = wait_names(s.wait_for)
    if not s.component and not waits:
        raise UsageError("give --component (COMPONENT) or --wait-for")
    opts = options(s)
    return Started(_run(ctx, opts, waits))


async def _run(
    ctx: AgentContext[ValidatorSettings], opts: checks.ValidatorOptions, waits: Sequence[str]
) -> int:
    s = ctx.settings
    if waits:
        missing = await checks.wait_for(waits, opts.validations_dir, timeout=s.timeout, out=_say)
        if missing:
            where = ", ".join(str(opts.validations_dir / n) for n in missing)
            print(f"timed out after {s.timeout:g} s waiting for {where}", file=sys.stderr)
            return 1
        _say(f"found {', '.join(waits)}")
    if not s.component:
        return 0
    outcome = await checks.run_component(s.component, opts, lambda: ctx.open_nvml(str(opts.paths.driver_dir)))
    line = f"{s.component}: {outcome.status}: {outcome.detail}"
    if outcome.status == "passed":
        line += f" (wrote {opts.validations_dir / checks.status_file(s.component)})"
    print(line, file=sys.stderr if outcome.status == "failed" else sys.stdout, flush=True)
    return 1 if outcome.status == "failed" else 0


def _say(text: str) -> None:
    print(text, flush=True)


SPEC = AgentSpec(
    name="gpunode-validator",  # the log field it has always had
    console_script="gpunode-validator",
    settings_type=ValidatorSettings,
    start=start,
    description=__doc__,
    # The simulator flags are checked when a component opens NVML (a bad preset fails that component,
    # exit 1), as they always were, not up front.
    uses_nvml=False,
)
main = SPEC.main

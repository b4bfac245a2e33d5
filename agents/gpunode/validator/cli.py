"""gpunode-validator: NVIDIA's operator validator components and status files.

    gpunode-validator --component driver|toolkit|plugin|cuda   check; write <component>-ready on success
    gpunode-validator --wait-for driver [--wait-for toolkit]    wait for the status files (init containers)

Status files go to --validations-dir (default /run/nvidia/validations, under --host-root). Exit 0 when
the check passed or was skipped (the file is then not written), 1 when it failed or a wait timed out,
2 on bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpunode.common.cli import FlagSet, add_common_flags, log_effective_config
from gpunode.common.errors import UsageError
from gpunode.common.hostpaths import HostPaths
from gpunode.common.logging import configure_logging
from gpunode.common.runtime import run
from gpunode.validator import checks

if TYPE_CHECKING:
    from gpunode.nvml.api import Nvml


def flag_set() -> FlagSet:
    f = FlagSet(prog="gpunode-validator", description=__doc__)
    add_common_flags(f, config_file=False)
    f.add("--component", short="-c", env="COMPONENT", choices=checks.COMPONENTS, help="the check to run")
    f.parser.add_argument(
        "--wait-for",
        action="append",
        default=argparse.SUPPRESS,
        metavar="COMPONENT",
        help="wait until COMPONENT-ready (or this file) exists; repeatable [env $WAIT_FOR, comma list]",
    )
    f.add("--timeout", env="WAIT_TIMEOUT", type=float, default=300.0, help="--wait-for limit in s (0: none)")
    f.add("--validations-dir", env="OUTPUT_DIR", default="/run/nvidia/validations", help="status files")
    f.add("--host-root", env=("HOST_ROOT", "GPUNODE_HOST_ROOT"), default="/", help="where the host's / is")
    f.add("--kubelet-dir", env="KUBELET_DIR", default="/var/lib/kubelet", help="the kubelet's directory")
    f.add("--toolkit-checks", env="TOOLKIT_CHECKS", type=_toolkit_checks, default="cdi,runtime")
    f.add("--nvidia-runtime-name", env="NVIDIA_RUNTIME_NAME", default=checks.DEFAULT_RUNTIME_NAME)
    f.add("--cdi-kind", env="GPUNODE_CDI_KIND", default=checks.DEFAULT_CDI_KIND, help="kind of the CDI spec")
    f.add("--plugin-http-port", env="GPUNODE_HTTP_PORT", type=int, default=9451, help="-1: skip /readyz")
    f.add("--with-workload", env="WITH_WORKLOAD", type=bool, default=True, help="cuda: run the CUDA check")
    return f


def _toolkit_checks(text: str) -> str:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or any(p not in checks.TOOLKIT_CHECKS for p in parts):
        raise ValueError("a comma list of cdi, runtime")
    return ",".join(parts)


def wait_names(args: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``driver`` -> ``driver-ready``; a name with a dash or dot (``.driver-ctr-ready``) is a file name."""
    raw = list(args) or [p for p in environ.get("WAIT_FOR", "").split(",") if p.strip()]
    names = []
    for item in (p.strip() for p in raw):
        if not item or "/" in item or item in (".", ".."):
            raise UsageError(f"--wait-for {item!r}: a component or a file name in the validations dir")
        names.append(item if "-" in item or "." in item else checks.status_file(item))
    return names


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    settings = flag_set().parse(argv, env)
    v = settings.values
    try:
        waits = wait_names(settings.args.get("wait_for", []), env)
    except UsageError as exc:
        print(f"gpunode-validator: error: {exc}", file=sys.stderr)
        return 2
    if not v["component"] and not waits:
        print("gpunode-validator: error: give --component (COMPONENT) or --wait-for", file=sys.stderr)
        return 2
    configure_logging(v["log_format"], v["log_level"], agent="gpunode-validator", node=v["node_name"])
    log_effective_config(v, settings.sources)
    paths = HostPaths(v["host_root"], v["driver_root"], v["kubelet_dir"])
    simulated = v["simulate"] is not None or v["sim_state"] is not None
    opts = checks.ValidatorOptions(
        paths=paths,
        validations_dir=paths.host(v["validations_dir"]),
        driver_root=v["driver_root"],
        simulated=simulated,
        toolkit_checks=tuple(v["toolkit_checks"].split(",")),
        runtime_name=v["nvidia_runtime_name"],
        cdi_kind=v["cdi_kind"],
        plugin_http_port=None if v["plugin_http_port"] < 0 else v["plugin_http_port"],
        with_workload=v["with_workload"],
    )
    return run(_run(opts, v, waits))


async def _run(opts: checks.ValidatorOptions, v: Mapping[str, Any], waits: Sequence[str]) -> int:
    if waits:
        missing = await checks.wait_for(waits, opts.validations_dir, timeout=v["timeout"], out=_say)
        if missing:
            where = ", ".join(str(opts.validations_dir / n) for n in missing)
            print(f"timed out after {v['timeout']:g} s waiting for {where}", file=sys.stderr)
            return 1
        _say(f"found {', '.join(waits)}")
    if not v["component"]:
        return 0

    async def open_nvml() -> Nvml:
        from gpunode.agent.nvml import open_nvml as opener

        return await opener(opts.paths.driver_dir, v["simulate"], v["sim_state"])

    outcome = await checks.run_component(v["component"], opts, open_nvml)
    line = f"{v['component']}: {outcome.status}: {outcome.detail}"
    if outcome.status == "passed":
        line += f" (wrote {opts.validations_dir / checks.status_file(v['component'])})"
    print(line, file=sys.stderr if outcome.status == "failed" else sys.stdout, flush=True)
    return 1 if outcome.status == "failed" else 0


def _say(text: str) -> None:
    print(text, flush=True)


__all__ = ["flag_set", "main", "wait_names"]

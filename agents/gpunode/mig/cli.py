"""gpunode-mig: apply, assert and export MIG layouts in mig-parted's `version: v1` format.

    gpunode-mig apply  -f config.yaml -c all-balanced [--mode-only] [--skip-reset] [-k hooks.yaml] [--dry-run]
    gpunode-mig assert -f config.yaml -c all-balanced [--mode-only] [--valid-config]
    gpunode-mig export [-o yaml|json] [-l current]
    gpunode-mig generate-config [-f out.yaml] [-o yaml|json]
    gpunode-mig checkpoint -f state.json  |  gpunode-mig restore -f state.json

Exit 0 on success, 1 on failure (nothing changed when a layout is infeasible), 2 on bad usage or config.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpunode.common.cli import FlagSet, add_common_flags, log_effective_config, split_verb
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.hostpaths import HostPaths
from gpunode.common.logging import configure_logging
from gpunode.common.runtime import run
from gpunode.mig import DEFAULT_JOURNAL

if TYPE_CHECKING:
    from gpunode.nvml.api import Nvml

VERBS = ("apply", "assert", "export", "generate-config", "checkpoint", "restore")


def flag_set(verb: str) -> FlagSet:
    f = FlagSet(prog=f"gpunode-mig {verb}", description=__doc__)
    add_common_flags(f, config_file=False)
    f.add("--debug", env="MIG_PARTED_DEBUG", type=bool, default=False, short="-d", help="log every step")
    f.add(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's /sys is mounted (GPU resets)",
    )
    if verb in ("apply", "assert"):
        f.add(
            "--config-file",
            env="MIG_PARTED_CONFIG_FILE",
            short="-f",
            metavar="FILE",
            help="mig-parted v1 config ('-': stdin; default: the shipped default layouts)",
        )
        f.add(
            "--selected-config",
            env="MIG_PARTED_SELECTED_CONFIG",
            short="-c",
            metavar="NAME",
            help="the named layout",
        )
        f.add(
            "--mode-only",
            env="MIG_PARTED_MODE_CHANGE_ONLY",
            type=bool,
            default=False,
            short="-m",
            help="MIG mode only",
        )
    if verb == "apply":
        f.add(
            "--hooks-file",
            env="MIG_PARTED_HOOKS_FILE",
            short="-k",
            metavar="FILE",
            help="mig-parted v1 hooks file",
        )
        f.add(
            "--skip-reset",
            env="MIG_PARTED_SKIP_RESET",
            type=bool,
            default=False,
            short="-s",
            help="never reset GPUs",
        )
        f.add(
            "--dry-run",
            env="MIG_PARTED_DRY_RUN",
            type=bool,
            default=False,
            help="print the plan, change nothing",
        )
        f.add(
            "--force",
            env="MIG_PARTED_FORCE",
            type=bool,
            default=False,
            help="go ahead although processes are using GPUs the change touches",
        )
        f.add(
            "--journal-file",
            env="MIG_PARTED_JOURNAL_FILE",
            default=DEFAULT_JOURNAL,
            metavar="FILE",
            help="where an apply records its progress ('' : none)",
        )
    if verb == "assert":
        f.add(
            "--valid-config",
            env="MIG_PARTED_VALID_CONFIG",
            type=bool,
            default=False,
            short="-a",
            help="only check the file and the name",
        )
    if verb in ("export", "generate-config"):
        f.add(
            "--output-format",
            env="MIG_PARTED_OUTPUT_FORMAT",
            default="yaml",
            choices=("yaml", "json"),
            short="-o",
            help="yaml or json",
        )
    if verb == "export":
        f.add(
            "--config-label",
            env="MIG_PARTED_CONFIG_LABEL",
            default="current",
            short="-l",
            help="name of the exported config",
        )
    if verb == "generate-config":
        f.add(
            "--output-file", env="MIG_PARTED_OUTPUT_FILE", short="-f", metavar="FILE", help="default: stdout"
        )
    if verb in ("checkpoint", "restore"):
        f.add(
            "--checkpoint-file",
            env="MIG_PARTED_CHECKPOINT_FILE",
            short="-f",
            metavar="FILE",
            help="checkpoint JSON",
        )
    return f


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    split = split_verb("gpunode-mig", argv, VERBS, __doc__)
    if isinstance(split, int):
        return split
    verb, rest = split
    flags = flag_set(verb)
    values = flags.parse(rest, env).values
    configure_logging(
        values["log_format"],
        "debug" if values["debug"] else values["log_level"],
        agent="mig",
        node=values["node_name"],
    )
    try:
        from gpunode.agent.nvml import check_simulation

        check_simulation(values.get("simulate"), values.get("sim_state"))
        if verb in ("checkpoint", "restore") and not values.get("checkpoint_file"):
            raise UsageError("--checkpoint-file (-f) is required")  # before NVML is opened
        spec = load_selected(verb, values)
    except (ConfigError, UsageError, ValueError, LookupError) as exc:
        print(f"gpunode-mig: error: {exc}", file=sys.stderr)
        return 2
    if verb == "assert" and values["valid_config"]:
        print("Selected MIG configuration is valid")
        return 0
    log_effective_config(values, flags.parse(rest, env).sources, flags=flags.flags.values())
    return run(command(verb, values, env, spec))


def load_selected(verb: str, values: Mapping[str, Any]) -> Any:
    """For apply / assert: (spec, name, entries); exit 2 for a bad file or an unknown name."""
    if verb not in ("apply", "assert"):
        return None
    from gpunode.api.mig_config import UnknownConfig, load_spec, parse_spec

    path = values.get("config_file")
    if not path:  # mig-parted insists on a file; we fall back to the shipped default layouts
        from gpunode.mig.layouts import default_spec

        spec = default_spec()
    else:
        spec = parse_spec(sys.stdin.read(), "<stdin>") if path == "-" else load_spec(path)
    try:
        entries = spec.select(values.get("selected_config"))
    except UnknownConfig as exc:
        raise UsageError(str(exc)) from None
    name = values.get("selected_config") or next(iter(spec.configs))
    return spec, name, entries


async def open_node(values: Mapping[str, Any]) -> tuple[Any, Any]:
    """NVML (the simulator under --simulate / --sim-state) and the matching GPU resetter."""
    from gpunode.mig.state import SysfsResetter
    from gpunode.nvml.real import RealNvml

    resetter: Any
    if values.get("simulate") or values.get("sim_state"):
        from gpunode.sim import nvml as sim
        from gpunode.sim.mig_reset import SimResetter

        lib = sim.install(values.get("simulate"), values.get("sim_state"))
        resetter = SimResetter(lib.node)
    else:
        resetter = SysfsResetter(HostPaths(root=values["host_root"]))
    nvml = await RealNvml.open(values["driver_root"])
    return nvml, resetter


def hook_runner(values: Mapping[str, Any]) -> Any:
    path = values.get("hooks_file")
    if not path:
        return None
    from gpunode.api.mig_hooks import load_hooks
    from gpunode.common.logging import get_logger
    from gpunode.mig.hooks import run_hooks

    hooks = load_hooks(path)
    base = {
        "MIG_PARTED_CONFIG_FILE": str(values.get("config_file") or ""),
        "MIG_PARTED_SELECTED_CONFIG": str(values.get("selected_config") or ""),
        "MIG_PARTED_HOOKS_FILE": str(path),
        "MIG_PARTED_SKIP_RESET": str(bool(values.get("skip_reset"))).lower(),
        "MIG_PARTED_MODE_CHANGE_ONLY": str(bool(values.get("mode_only"))).lower(),
    }
    log = get_logger("gpunode.mig")

    async def runner(name: str) -> None:
        await run_hooks(hooks, name, base, log=log)

    return runner


async def command(verb: str, values: Mapping[str, Any], env: Mapping[str, str], selected: Any) -> int:
    from gpunode.mig.apply import Applier, MigError
    from gpunode.mig.hooks import HookFailed
    from gpunode.mig.plan import Infeasible
    from gpunode.mig.selection import SelectionError
    from gpunode.nvml import errors
    from gpunode.nvml.errors import ResetFailed

    try:
        hooks = hook_runner(values) if verb == "apply" else None
    except ConfigError as exc:
        print(f"gpunode-mig: error: {exc}", file=sys.stderr)
        return 2
    nvml, resetter = await open_node(values)
    debug = bool(values["debug"])
    try:
        journal = values.get("journal_file") or None
        applier = Applier(
            nvml,
            resetter,
            journal=Path(journal) if journal else None,
            hooks=hooks,
            progress=(lambda line: print(line, file=sys.stderr)) if debug else None,
        )
        if verb == "apply":
            _, name, entries = selected
            report = await applier.apply(
                name,
                entries,
                mode_only=values["mode_only"],
                skip_reset=values["skip_reset"],
                dry_run=values["dry_run"],
                force=values["force"],
                source=str(values["config_file"]),
            )
            if values["dry_run"]:
                assert report.plan is not None
                print("\n".join(report.plan.describe()) if not report.plan.empty else "nothing to change")
                return 0
            if report.pending:
                print(f"MIG mode set, pending a reset of GPU {', '.join(map(str, report.pending))}")
                return 0
            print("MIG configuration applied successfully")
            return 0
        if verb == "assert":
            _, name, entries = selected
            plan = await applier.check(name, entries, mode_only=values["mode_only"])
            if plan.empty:
                print(
                    "Selected MIG configuration mode settings currently applied"
                    if values["mode_only"]
                    else "Selected MIG configuration currently applied"
                )
                return 0
            print("Assertion failure: selected configuration not currently applied")
            for line in plan.describe():
                print(f"  {line}")
            return 1
        if verb == "export":
            return await export(nvml, values)
        if verb == "generate-config":
            return await generate(nvml, values)
        if verb == "checkpoint":
            return await checkpoint(nvml, values)
        return await restore(applier, values)
    except (Infeasible, SelectionError, MigError, HookFailed, ResetFailed, errors.NvmlError) as exc:
        print(f"gpunode-mig: {verb} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        await nvml.close()


async def export(nvml: Nvml, values: Mapping[str, Any]) -> int:
    from gpunode.mig.layouts import export as export_spec
    from gpunode.mig.layouts import render
    from gpunode.mig.plan import current_devices
    from gpunode.mig.state import identity, read_states

    gpus = await nvml.gpus()
    states = await read_states(nvml, gpus)
    rows = [(identity(g), s.mode_current, current_devices(s)) for g, s in zip(gpus, states, strict=True)]
    print(render(export_spec(rows, label=values["config_label"]), values["output_format"]), end="")
    return 0


async def generate(nvml: Nvml, values: Mapping[str, Any]) -> int:
    from gpunode.common.atomic import atomic_write
    from gpunode.mig.layouts import generate as generate_spec
    from gpunode.mig.layouts import render
    from gpunode.mig.state import identity

    gpus = await nvml.gpus()
    rows = [(identity(g), await nvml.gi_profiles(g.index) if g.mig_capable else []) for g in gpus]
    text = render(generate_spec(rows), values["output_format"])
    out = values.get("output_file")
    if out:
        atomic_write(Path(out), text, mode=0o644)
    else:
        print(text, end="")
    return 0


async def checkpoint(nvml: Nvml, values: Mapping[str, Any]) -> int:
    from gpunode.common.atomic import atomic_write
    from gpunode.mig.state import read_states

    path = values["checkpoint_file"]
    gpus = [g for g in await nvml.gpus() if g.mig_capable]
    devices = []
    for gpu, state in zip(gpus, await read_states(nvml, gpus), strict=True):
        devices.append(
            {
                "UUID": gpu.uuid,
                "MigMode": 1 if state.mode_current else 0,
                "GpuInstances": [
                    {
                        "ProfileID": gi.profile.enum,
                        "Placement": {"Start": gi.start, "Size": gi.size},
                        "ComputeInstances": [
                            {
                                "ProfileID": ci.profile_enum,
                                "EngProfileID": 0,
                                "Placement": {"Start": ci.start, "Size": ci.slices},
                            }
                            for ci in gi.cis
                        ],
                    }
                    for gi in state.instances
                ],
            }
        )
    doc = {"Version": "v1", "MigState": {"Devices": devices}}
    atomic_write(Path(path), json.dumps(doc, indent=2) + "\n", mode=0o644)
    print("MIG configuration checkpointed successfully")
    return 0


async def restore(applier: Any, values: Mapping[str, Any]) -> int:
    path = values["checkpoint_file"]
    try:
        doc = json.loads(await asyncio.to_thread(Path(path).read_text))
        devices = doc["MigState"]["Devices"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"gpunode-mig: error: {path}: not a checkpoint: {exc}", file=sys.stderr)
        return 2
    await applier.restore(devices)
    print("MIG configuration restored successfully")
    return 0

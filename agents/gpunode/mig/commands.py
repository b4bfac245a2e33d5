"""What each ``gpunode-mig`` verb does once its settings are resolved: the messages mig-parted prints
and its exit codes (0 done, 1 failed with nothing changed when a layout is infeasible, 2 bad usage).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gpunode.api.mig_config import MigEntry
from gpunode.common.errors import ConfigError, UsageError
from gpunode.mig.apply import Applier, HookRunner, MigError
from gpunode.mig.hooks import HookFailed
from gpunode.mig.node import hook_runner, open_node
from gpunode.mig.plan import Infeasible
from gpunode.mig.selection import SelectionError
from gpunode.mig.settings import (
    ApplySettings,
    AssertSettings,
    CheckpointSettings,
    ExportSettings,
    GenerateConfigSettings,
    RestoreSettings,
    SelectedConfigSettings,
    VerbSettings,
)
from gpunode.nvml import errors
from gpunode.nvml.errors import ResetFailed

__all__ = [
    "Selected",
    "apply",
    "assert_applied",
    "checkpoint",
    "export",
    "generate_config",
    "load_selected",
    "restore",
]

FAILURES = (Infeasible, SelectionError, MigError, HookFailed, ResetFailed, errors.NvmlError)


@dataclass(frozen=True)
class Selected:
    """The layout apply / assert work on: its name and its entries."""

    name: str
    entries: tuple[MigEntry, ...]


def load_selected(s: SelectedConfigSettings) -> Selected:
    """The named layout of ``--config-file`` (the shipped defaults without one); a bad file is a
    ConfigError, an unknown name a UsageError (both exit 2)."""
    from gpunode.api.mig_config import UnknownConfig, load_spec, parse_spec

    path = s.config_file
    if not path:  # mig-parted insists on a file; we fall back to the shipped default layouts
        from gpunode.mig.layouts import default_spec

        spec = default_spec()
    else:
        spec = parse_spec(sys.stdin.read(), "<stdin>") if path == "-" else load_spec(path)
    try:
        entries = spec.select(s.selected_config)
    except UnknownConfig as exc:
        raise UsageError(str(exc)) from None
    name = s.selected_config or next(iter(spec.configs))
    return Selected(name, tuple(entries))


async def _on_node(
    verb: str,
    s: VerbSettings,
    act: Callable[[Applier], Awaitable[int]],
    *,
    journal: str | None = None,
    hooks: HookRunner | None = None,
) -> int:
    """Open the node, run ``act`` with an applier on it, and turn a failure into exit 1."""
    nvml, resetter = await open_node(s.common, s.host_root)
    try:
        applier = Applier(
            nvml,
            resetter,
            journal=Path(journal) if journal else None,
            hooks=hooks,
            progress=(lambda line: print(line, file=sys.stderr)) if s.debug else None,
        )
        return await act(applier)
    except FAILURES as exc:
        print(f"gpunode-mig: {verb} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        await nvml.close()


async def apply(s: ApplySettings, selected: Selected) -> int:
    try:
        hooks = hook_runner(
            s.hooks_file,
            config_file=s.config_file,
            selected_config=s.selected_config,
            skip_reset=s.skip_reset,
            mode_only=s.mode_only,
        )
    except ConfigError as exc:
        print(f"gpunode-mig: error: {exc}", file=sys.stderr)
        return 2

    async def act(applier: Applier) -> int:
        report = await applier.apply(
            selected.name,
            selected.entries,
            mode_only=s.mode_only,
            skip_reset=s.skip_reset,
            dry_run=s.dry_run,
            force=s.force,
            source=str(s.config_file),
        )
        if report.plan is not None and report.plan.no_gpu_matched:
            print(f"gpunode-mig: warning: {report.plan.no_gpu_matched}", file=sys.stderr)
        if s.dry_run:
            assert report.plan is not None
            print("\n".join(report.plan.describe()) if not report.plan.empty else "nothing to change")
            return 0
        if report.pending:
            print(f"MIG mode set, pending a reset of GPU {', '.join(map(str, report.pending))}")
            return 0
        print("MIG configuration applied successfully")
        return 0

    return await _on_node("apply", s, act, journal=s.journal_file or None, hooks=hooks)


async def assert_applied(s: AssertSettings, selected: Selected) -> int:
    async def act(applier: Applier) -> int:
        plan = await applier.check(selected.name, selected.entries, mode_only=s.mode_only)
        if plan.no_gpu_matched:
            print(f"gpunode-mig: warning: {plan.no_gpu_matched}", file=sys.stderr)
        if plan.empty:
            print(
                "Selected MIG configuration mode settings currently applied"
                if s.mode_only
                else "Selected MIG configuration currently applied"
            )
            return 0
        print("Assertion failure: selected configuration not currently applied")
        for line in plan.describe():
            print(f"  {line}")
        return 1

    return await _on_node("assert", s, act)


async def export(s: ExportSettings) -> int:
    from gpunode.mig.layouts import export as export_spec
    from gpunode.mig.layouts import render
    from gpunode.mig.plan import current_devices
    from gpunode.mig.state import identity, read_states

    async def act(applier: Applier) -> int:
        nvml = applier.nvml
        gpus = await nvml.gpus()
        states = await read_states(nvml, gpus)
        rows = [
            (identity(g), st.mode_current, current_devices(st)) for g, st in zip(gpus, states, strict=True)
        ]
        print(render(export_spec(rows, label=s.config_label), s.output_format), end="")
        return 0

    return await _on_node("export", s, act)


async def generate_config(s: GenerateConfigSettings) -> int:
    from gpunode.common.atomic import atomic_write
    from gpunode.mig.layouts import generate, render
    from gpunode.mig.state import identity

    async def act(applier: Applier) -> int:
        nvml = applier.nvml
        gpus = await nvml.gpus()
        rows = [(identity(g), await nvml.gi_profiles(g.index) if g.mig_capable else []) for g in gpus]
        text = render(generate(rows), s.output_format)
        if s.output_file:
            atomic_write(Path(s.output_file), text, mode=0o644)
        else:
            print(text, end="")
        return 0

    return await _on_node("generate-config", s, act)


async def checkpoint(s: CheckpointSettings) -> int:
    from gpunode.common.atomic import atomic_write
    from gpunode.mig.state import read_states

    path = s.checkpoint_file
    assert path  # checked before NVML was opened

    async def act(applier: Applier) -> int:
        nvml = applier.nvml
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

    return await _on_node("checkpoint", s, act)


async def restore(s: RestoreSettings) -> int:
    path = s.checkpoint_file
    assert path  # checked before NVML was opened

    async def act(applier: Applier) -> int:
        try:
            doc = json.loads(await asyncio.to_thread(Path(path).read_text))
            devices = doc["MigState"]["Devices"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"gpunode-mig: error: {path}: not a checkpoint: {exc}", file=sys.stderr)
            return 2
        await applier.restore(devices)
        print("MIG configuration restored successfully")
        return 0

    return await _on_node("restore", s, act)

"""Carry out a MIG plan: mode changes, resets of exactly the GPUs that need one, then instances at
explicit placements; crash-safe through a journal, hooks around it, verified at the end.

The order, for one ``apply``:

1. read the node and plan (:func:`gpunode.mig.plan.plan_node`): an infeasible layout fails here, before
   anything changes; an empty plan means converged (assert = "the plan is empty");
2. ``apply-start`` hook; refuse when the plan would disrupt GPU processes (unless forced);
3. the journal records the config, the desired layout and each step as it completes;
4. mode step (``pre-apply-mode`` hook first): instances on that GPU destroyed, mode set, and the GPU
   reset only if its product needs it and only that GPU;
5. device step (``pre-apply-config`` hook first): plan again from the live state, destroy what goes,
   create the rest at the planned placements;
6. verify (plan again: it must be empty), clear the journal; ``apply-exit`` hook always.

A process killed anywhere leaves the journal and a partial layout; the next ``apply`` (or the MIG
manager's next start) plans from the live state, which destroys or completes whatever is half-made
(a GPU instance without its compute instances, say), so it converges with no orphans.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpunode.api.mig_config import MigEntry
from gpunode.common.atomic import atomic_write
from gpunode.common.logging import get_logger
from gpunode.mig.plan import DesiredGpu, GpuPlan, NodePlan, plan_node
from gpunode.mig.selection import desired_per_gpu, no_gpu_matched
from gpunode.mig.state import Resetter, identity, read_states, select_gpus
from gpunode.nvml import errors
from gpunode.nvml.api import GpuInfo, Nvml, Placement
from gpunode.nvml.errors import ResetFailed

HookRunner = Callable[[str], Awaitable[None]]
StepHook = Callable[[int], None]

_step_hook: StepHook | None = None


def install_step_hook(hook: StepHook | None) -> None:
    """Testing seam: call ``hook(n)`` right after the n-th journalled step of every :class:`Applier`
    created afterwards in this process (None removes it). The crash tests install one that SIGKILLs the
    process (``tests/helpers/mig_crash.py``, which then runs the command's ``main``). Only code running
    in the process can install it: nothing reads it from the environment, a flag or a file."""
    global _step_hook
    _step_hook = hook


class MigError(Exception):
    """An apply that failed; the message says where and why."""


class ProcessesInTheWay(MigError):
    def __init__(self, pids: Mapping[int, Sequence[int]]) -> None:
        self.pids = dict(pids)
        listed = "; ".join(
            f"GPU {gpu}: pids {', '.join(map(str, p))}" for gpu, p in sorted(self.pids.items())
        )
        super().__init__(
            f"the change would disrupt running GPU processes ({listed}); stop them or pass --force"
        )


class RebootRequired(MigError):
    """A MIG mode change is pending and the GPU could not be reset."""


@dataclass
class ApplyReport:
    changed: bool = False
    plan: NodePlan | None = None
    steps: int = 0
    calls: dict[int, int] = field(default_factory=dict)  # NVML create/destroy/mode calls per GPU
    resets: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # mode changes waiting for a reset (--skip-reset)
    resumed: dict[str, Any] | None = None  # the journal of an interrupted apply, when one was found


class Journal:
    """What an apply is doing, on disk, atomically: config, desired layout, steps done."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, Any] = {}

    def read(self) -> dict[str, Any] | None:
        if self.path is None:
            return None
        try:
            loaded = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"unreadable": str(self.path)}
        return loaded if isinstance(loaded, dict) else {"unreadable": str(self.path)}

    def begin(self, **fields: Any) -> None:
        self.data = {"version": 1, "pid": os.getpid(), "started": time.time(), "steps": [], **fields}
        self._write()

    def step(self, text: str) -> None:
        self.data.setdefault("steps", []).append(text)
        self._write()

    def finish(self) -> None:
        if self.path is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def _write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(self.data, indent=1, sort_keys=True) + "\n", mode=0o600)


class Applier:
    """Applies and asserts MIG layouts on one node."""

    def __init__(
        self,
        nvml: Nvml,
        resetter: Resetter,
        *,
        journal: Path | None = None,
        hooks: HookRunner | None = None,
        progress: Callable[[str], None] | None = None,
        after_step: StepHook | None = None,
    ) -> None:
        self.nvml = nvml
        self.resetter = resetter
        self.journal = Journal(journal)
        self.hooks = hooks
        self.progress = progress or (lambda _line: None)
        self.log = get_logger("gpunode.mig")
        self._steps = 0
        self._no_match: str | None = None  # set by desired(): the config matches no GPU here
        self._after_step = after_step if after_step is not None else _step_hook  # tests only

    # -- planning --------------------------------------------------------------------------------------
    async def desired(
        self, name: str, entries: Sequence[MigEntry]
    ) -> tuple[list[GpuInfo], dict[int, DesiredGpu]]:
        gpus = await self.nvml.gpus()
        ids = [identity(g) for g in gpus]
        chosen = desired_per_gpu(name, entries, ids)
        desired = {i: DesiredGpu(d.mig_enabled, dict(d.devices)) for i, d in chosen.items()}
        self._no_match = no_gpu_matched(name, entries, ids)
        if self._no_match is not None:
            self.log.warning("mig_config_matches_no_gpu", config=name, detail=self._no_match)
        return gpus, desired

    async def plan(
        self, gpus: Sequence[GpuInfo], desired: Mapping[int, DesiredGpu], *, mode_only: bool = False
    ) -> NodePlan:
        states = await read_states(self.nvml, select_gpus(gpus, desired))
        plan = plan_node(states, desired, mode_only=mode_only)
        return replace(plan, no_gpu_matched=self._no_match) if self._no_match is not None else plan

    async def check(self, name: str, entries: Sequence[MigEntry], *, mode_only: bool = False) -> NodePlan:
        """``assert``: the plan that would run (empty: the layout is in place)."""
        gpus, desired = await self.desired(name, entries)
        return await self.plan(gpus, desired, mode_only=mode_only)

    # -- applying --------------------------------------------------------------------------------------
    async def apply(
        self,
        name: str,
        entries: Sequence[MigEntry],
        *,
        mode_only: bool = False,
        skip_reset: bool = False,
        dry_run: bool = False,
        force: bool = False,
        source: str = "",
    ) -> ApplyReport:
        report = ApplyReport(resumed=self.journal.read())
        if report.resumed:
            self.log.warning("mig_apply_resuming", interrupted=report.resumed)
        gpus, desired = await self.desired(name, entries)
        plan = await self.plan(gpus, desired, mode_only=mode_only)  # Infeasible: nothing touched
        report.plan = plan
        if dry_run:
            return report
        await self._hook("apply-start")
        failed = False
        try:
            if plan.empty:
                self.journal.finish()  # an interrupted apply that happened to finish: nothing left
                return report
            pids = {p.index: p.disrupted_processes for p in plan.gpus if p.disrupted_processes}
            if pids and not force:
                raise ProcessesInTheWay(pids)
            self.journal.begin(
                config=name,
                source=source,
                desired={
                    str(i): {"mig-enabled": d.mig_enabled, "mig-devices": dict(d.devices)}
                    for i, d in desired.items()
                },
            )
            by_index = {g.index: g for g in gpus}
            mode_plans = [p for p in plan.gpus if p.set_mode is not None or p.reset]
            if mode_plans:
                await self._hook("pre-apply-mode")
                for gp in mode_plans:
                    await self._mode_step(by_index[gp.index], gp, skip_reset, report)
            if report.pending:
                # The mode is set but waits for a reset: that is all --skip-reset can do.
                if not mode_only:
                    raise RebootRequired(
                        "MIG mode change pending on GPU "
                        + ", ".join(map(str, report.pending))
                        + " (--skip-reset): reset those GPUs or reboot, then apply again"
                    )
                self.journal.finish()
                report.changed = True
                return report
            if not mode_only:
                plan = await self.plan(gpus, desired)  # fresh state after the mode step
                if not plan.empty:
                    await self._hook("pre-apply-config")
                    for gp in plan.gpus:
                        await self._device_step(gp, report)
            after = await self.plan(gpus, desired, mode_only=mode_only)
            if not after.empty:
                raise MigError("after applying, the layout still differs: " + "; ".join(after.describe()))
            report.changed = True
            self.journal.finish()
            self.log.info(
                "mig_applied", config=name, steps=report.steps, resets=report.resets, calls=report.calls
            )
            return report
        except BaseException:
            failed = True
            raise
        finally:
            try:
                await self._hook("apply-exit")
            except Exception as exc:
                if not failed:
                    raise
                # mig-parted's rule: the apply's own error is what the caller hears; this one is logged.
                self.log.error("mig_hook_failed_after_error", hook="apply-exit", error=str(exc))

    async def restore(self, devices: Sequence[Mapping[str, Any]], *, skip_reset: bool = False) -> ApplyReport:
        """Put back a checkpoint exactly: MIG modes, and every instance at its recorded placement."""
        report = ApplyReport()
        gpus = {g.uuid: g for g in await self.nvml.gpus()}
        for dev in devices:
            gpu = gpus.get(str(dev.get("UUID")))
            if gpu is None:
                raise MigError(f"checkpoint names GPU {dev.get('UUID')}, which this node does not have")
            state = (await read_states(self.nvml, [gpu]))[0]
            want_mode = bool(dev.get("MigMode"))
            destroy = tuple(
                [(gi.id, ci.id) for gi in state.instances for ci in gi.cis]
                + [(gi.id, None) for gi in state.instances]
            )
            plan = GpuPlan(
                index=gpu.index,
                set_mode=want_mode if want_mode != state.mode_current else None,
                reset=state.reset_for_mode,
                destroy=destroy,
                create_cis=(),
                create=(),
                keep=(),
                disrupted_processes=state.processes,
            )
            if plan.set_mode is not None:
                await self._mode_step(gpu, plan, skip_reset, report)
            else:
                await self._destroy(plan, report)
            for gi in dev.get("GpuInstances") or []:
                where = gi["Placement"]
                created = await self.nvml.create_gpu_instance(
                    gpu.index, int(gi["ProfileID"]), Placement(int(where["Start"]), int(where["Size"]))
                )
                self._did(
                    gpu.index, f"GPU {gpu.index}: GI profile {gi['ProfileID']} @{where['Start']}", report
                )
                for ci in gi.get("ComputeInstances") or []:
                    cw = ci.get("Placement")
                    placement = Placement(int(cw["Start"]), int(cw["Size"])) if cw else None
                    await self.nvml.create_compute_instance(
                        gpu.index, created.id, int(ci["ProfileID"]), placement
                    )
                    self._did(
                        gpu.index, f"GPU {gpu.index}: CI profile {ci['ProfileID']} in GI {created.id}", report
                    )
        report.changed = report.steps > 0
        return report

    async def _mode_step(self, gpu: GpuInfo, gp: GpuPlan, skip_reset: bool, report: ApplyReport) -> None:
        """Set the MIG mode (instances on this GPU destroyed first) and reset this GPU when the product
        needs it, or only reset it when the right mode is already pending."""
        await self._destroy(gp, report)
        if gp.set_mode is not None:
            result = await self.nvml.set_mig_mode(gp.index, gp.set_mode)
            self._did(
                gp.index, f"GPU {gp.index}: MIG mode -> {'enabled' if gp.set_mode else 'disabled'}", report
            )
            if not result.needs_reset:
                return
            want = gp.set_mode
        else:
            mode = await self.nvml.mig_mode(gp.index)
            if mode is None or mode.current == mode.pending:
                return
            want = mode.pending
        if skip_reset:
            self.log.warning(
                "mig_mode_pending", gpu=gp.index, hint="reset the GPU or reboot (--skip-reset given)"
            )
            report.pending.append(gp.index)
            return
        self.progress(f"GPU {gp.index}: resetting (the MIG mode change needs it on this GPU)")
        try:
            await self.resetter.reset(gpu)
        except ResetFailed as exc:
            raise RebootRequired(f"MIG mode change pending on GPU {gp.index}: {exc}") from None
        report.resets.append(gp.index)
        self._did(gp.index, f"GPU {gp.index}: reset", report)
        after = await self.nvml.mig_mode(gp.index)
        if after is None or after.current != want:
            raise RebootRequired(f"GPU {gp.index}: MIG mode still pending after reset; reboot the node")

    async def _device_step(self, gp: GpuPlan, report: ApplyReport) -> None:
        await self._destroy(gp, report)
        for gi_id, ci in gp.create_cis:
            await self.nvml.create_compute_instance(
                gp.index, gi_id, ci.profile_enum, Placement(ci.start, ci.slices)
            )
            self._did(gp.index, f"GPU {gp.index}: CI {ci.name} in GI {gi_id} @{ci.start}", report)
        for gi in gp.create:
            created = await self.nvml.create_gpu_instance(
                gp.index, gi.profile_enum, Placement(gi.start, gi.size)
            )
            self._did(
                gp.index, f"GPU {gp.index}: GI {gi.name} @{gi.start}:{gi.size} (id {created.id})", report
            )
            for ci in gi.cis:
                await self.nvml.create_compute_instance(
                    gp.index, created.id, ci.profile_enum, Placement(ci.start, ci.slices)
                )
                self._did(gp.index, f"GPU {gp.index}: CI {ci.name} in GI {created.id} @{ci.start}", report)

    async def _destroy(self, gp: GpuPlan, report: ApplyReport) -> None:
        for gi_id, ci_id in gp.destroy:
            try:
                if ci_id is None:
                    await self.nvml.destroy_gpu_instance(gp.index, gi_id)
                else:
                    await self.nvml.destroy_compute_instance(gp.index, gi_id, ci_id)
            except errors.NotFound:
                continue  # already gone (an earlier, interrupted run got this far)
            what = f"GI {gi_id}" if ci_id is None else f"CI {ci_id} of GI {gi_id}"
            self._did(gp.index, f"GPU {gp.index}: destroyed {what}", report)

    def _did(self, gpu: int, text: str, report: ApplyReport) -> None:
        report.steps += 1
        report.calls[gpu] = report.calls.get(gpu, 0) + 1
        self.journal.step(text)
        self.progress(text)
        self.log.info("mig_step", gpu=gpu, step=report.steps, detail=text)
        self._steps += 1
        if self._after_step is not None:
            self._after_step(self._steps)  # the crash tests' seam (install_step_hook)

    async def _hook(self, name: str) -> None:
        if self.hooks is not None:
            await self.hooks(name)

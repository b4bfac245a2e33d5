"""The MIG manager: keep this node's MIG layout at the one its ``nvidia.com/mig.config`` label names.

What NVIDIA's k8s-mig-manager does (shared/reference/mig.md §3), with its traps closed (§6):

* **Kubernetes mode.** At start the manager finishes an operand pause an earlier run left behind
  (:meth:`~gpunode.kube.operands.OperandPauser.recover`), then handles the node's current label
  (always: Hopper forgets its MIG mode at reboot), every change of it, every ``--reassert-interval``
  (a failed config is retried and a lost layout put back without anyone flipping the label) and every
  SIGHUP (which also re-reads the config file).
* **Bare-metal mode** (``--selected-config-file``): the name comes from a file (a bare name, or the
  ``MIG_PARTED_SELECTED_CONFIG=name`` line NVIDIA's systemd override holds), watched with inotify; the
  outcome goes to a JSON state file. No Kubernetes, no operands.

This module is the state machine that converges to a name; where the name comes from and where the
state goes are :mod:`gpunode.mig.kube_mode` and :mod:`gpunode.mig.bare_metal`, the wiring
:mod:`gpunode.mig.daemon`. Handling a name (:meth:`MigManager.reconfigure`), the decision being the
pure :func:`gpunode.mig.decisions.decide`:

1. no name: nothing (``mig_config_unset``);
2. a name the config does not have: ``failed``, the reason listing the names it has;
3. the layout already in place: ``success``; nothing paused. A config none of whose entries matches a
   GPU of this node changes nothing and is a ``success`` too (mig-parted's rule), with the reason
   annotation saying that no GPU matched;
4. a layout that cannot exist here (infeasible, a selection error): ``failed`` before anything changes;
5. a mode change still needed although the state says ``rebooting``: ``failed`` (no reboot loop);
6. otherwise ``pending``; operands paused (their labels come back whatever happens); host GPU clients
   stopped when asked (started again whatever happens); the layout applied and verified; on a mode
   change that needs a reboot, with ``WITH_REBOOT``, state ``rebooting`` and the reboot command;
7. ``success``, or ``failed`` on any error, with the reason in the node annotation
   ``nvidia.com/mig.config.state-reason`` (one line, removed on success unless no GPU matched) or
   the state file.

After a change the device plugin and feature discovery on this node get a SIGHUP
(:mod:`gpunode.mig.notify`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Literal, Protocol

from gpunode.api.mig_config import MigEntry, MigSpec
from gpunode.common import sdnotify
from gpunode.common.bounds import clip, communicate
from gpunode.common.errors import ConfigError
from gpunode.common.logging import Logger, get_logger
from gpunode.common.metrics import AgentMetrics, create_metrics
from gpunode.mig.apply import ApplyReport, RebootRequired
from gpunode.mig.clients import HostClients
from gpunode.mig.decisions import CONFIG_LABEL, STATES, State, decide, describe_error, one_line
from gpunode.mig.options import ManagerOptions
from gpunode.mig.plan import Infeasible, NodePlan
from gpunode.mig.selection import SelectionError
from gpunode.nvml import errors as nvml_errors

__all__ = [
    "AGENT",
    "ApplierLike",
    "MigManager",
    "OperandGate",
    "ReconfigureOutcome",
    "StateSink",
]

AGENT = "mig-manager"
DEFERRED_RETRY_S = 5.0


class StateSink(Protocol):
    """Where the state goes: the node's label and annotation, or the bare-metal state file."""

    async def previous(self) -> str | None: ...

    async def set(self, state: State, reason: str, config: str) -> None: ...


class OperandGate(Protocol):
    """What is paused around a change: the operand DaemonSets, or nothing on bare metal."""

    def paused(self, timeout: float) -> contextlib.AbstractAsyncContextManager[object]: ...


class ApplierLike(Protocol):
    async def check(self, name: str, entries: Sequence[MigEntry], *, mode_only: bool = False) -> NodePlan: ...

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
    ) -> ApplyReport: ...


ReconfigureOutcome = Literal["unset", "unchanged", "deferred", "pending", "rebooting", "success", "failed"]


class MigManager:
    """Handles config names one at a time; see the module docstring."""

    def __init__(
        self,
        opts: ManagerOptions,
        *,
        spec: MigSpec,
        make_applier: Callable[[str], ApplierLike],
        sink: StateSink,
        gate: OperandGate,
        clients: HostClients | None = None,
        load_spec: Callable[[], Awaitable[MigSpec]] | None = None,
        reboot: Callable[[], Awaitable[None]] | None = None,
        notify: Callable[[], object] | None = None,
        metrics: AgentMetrics | None = None,
        log: Logger | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.opts = opts
        self.spec = spec
        self.make_applier = make_applier
        self.sink = sink
        self.gate = gate
        self.clients = clients
        self.load_spec = load_spec
        self.reboot = reboot if reboot is not None else self._run_reboot_command
        self.notify = notify
        self.log = log if log is not None else get_logger("gpunode.mig.manager")
        self.sleep = sleep
        self.metrics = metrics if metrics is not None else create_metrics(AGENT, process_metrics=False)
        from prometheus_client import Counter, Gauge

        self.reconfigures = Counter(
            "gpunode_mig_reconfigure",
            "MIG reconfigurations by result (success, failed, rebooting).",
            labelnames=("result",),
            registry=self.metrics.registry,
        )
        self.state_gauge = Gauge(
            "gpunode_mig_config_state",
            "1 for the MIG config state this manager last wrote (pending, rebooting, success, failed).",
            labelnames=("state",),
            registry=self.metrics.registry,
        )
        for state in STATES:
            self.state_gauge.labels(state=state).set(0)
        self.selected: str | None = None  # the name to converge to (label or file)
        self.state: str | None = None  # the last state written
        self.nvml_ok = True
        self.handled = asyncio.Event()  # set once the first name has been handled
        self._wake = asyncio.Event()
        self._forced: str | None = None
        self._last: str | None = None

    # -- triggers ----------------------------------------------------------------------------------
    def trigger(self, why: str) -> None:
        """Wake the worker: ``label`` acts only on a new name; anything else re-handles the current one."""
        if why != "label":
            self._forced = why
        self._wake.set()

    async def worker(self) -> None:
        """Handle the selected name whenever it changes or a re-handle is asked for, one at a time."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            forced, self._forced = self._forced, None
            name = self.selected or ""
            if name == self._last and forced is None:
                continue
            why = forced if forced is not None else "label"
            self._last = name
            if await self.handle(name, why) == "deferred":  # the API server away: again shortly
                await self.sleep(DEFERRED_RETRY_S)
                self.trigger("retry")
            if not self.handled.is_set():
                self.handled.set()
                sdnotify.notify(ready=True, status=f"MIG config {name or '<unset>'}: {self.state or 'none'}")

    async def reassert(self) -> None:
        """Re-handle the current name every interval: retries a failure, restores a lost layout."""
        if self.opts.reassert_interval <= 0:
            return
        while True:
            await self.sleep(self.opts.reassert_interval)
            self.trigger("reassert")

    async def reload(self) -> None:
        """SIGHUP: re-read the config (a bad one keeps the last good), then re-handle the name."""
        if self.load_spec is not None:
            try:
                self.spec = await self.load_spec()
                self.log.info("mig_config_reloaded", source=self.spec.source, configs=len(self.spec.configs))
            except Exception as exc:
                self.log.error("config_rejected", error=str(exc), keeping=self.spec.source)
                self.metrics.count_error("config")
        self.trigger("sighup")

    # -- handling one name -------------------------------------------------------------------------
    async def handle(self, name: str | None, why: str = "label") -> ReconfigureOutcome:
        """:meth:`reconfigure`, never raising (except cancellation)."""
        try:
            return await self.reconfigure(name, why)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.error("mig_reconfigure_crashed", config=name, error=str(exc), exc_info=True)
            self.metrics.count_error("reconfigure")
            return "failed"

    async def reconfigure(self, name: str | None, why: str = "label") -> ReconfigureOutcome:
        if not name:
            if why != "reassert":
                self.log.info("mig_config_unset", label=CONFIG_LABEL, trigger=why)
            return "unset"
        try:
            previous = await self.sink.previous()
        except Exception as exc:  # the API server away: the reassert (or the next change) tries again
            self.log.warning("mig_reconfigure_deferred", config=name, error=str(exc), trigger=why)
            self.metrics.count_error("state")
            return "deferred"
        spec = self.spec
        applier: ApplierLike | None = None
        applied: bool | None = None
        mode_change = False
        plan_error: str | None = None
        note = ""  # the reason shown with success: the config matches no GPU here
        entries = spec.configs.get(name, ())
        if name in spec.configs:
            try:
                applier = self.make_applier(name)
                checked = await applier.check(name, entries)
                applied, note = checked.empty, checked.no_gpu_matched or ""
                if not applied:
                    mode_change = not (await applier.check(name, entries, mode_only=True)).empty
                self.nvml_ok = True
            except (Infeasible, SelectionError, ConfigError) as exc:
                plan_error = describe_error(exc)
            except Exception as exc:
                self.nvml_ok = not isinstance(exc, nvml_errors.NvmlError)
                self.log.error("mig_check_failed", config=name, error=str(exc), exc_info=True)
                plan_error = "cannot read the MIG state: " + describe_error(exc)
        decision = decide(
            name,
            tuple(spec.configs),
            applied=applied,
            plan_error=plan_error,
            mode_change=mode_change,
            previous_state=previous,
        )
        if why == "reassert" and decision.action == "success" and previous == "success":
            self.log.debug("mig_config_in_place", config=name)
            self._gauge("success")
            return "unchanged"
        started = time.monotonic()
        self.log.info(
            "mig_reconfigure_started",
            config=name,
            trigger=why,
            previous_state=previous,
            action=decision.action,
            mode_change=decision.mode_change,
        )
        if decision.action in ("success", "failed"):
            state: State = "success" if decision.action == "success" else "failed"
            reason = decision.reason if state == "failed" else note
            return await self._finish(name, state, reason, started)
        assert applier is not None
        return await self._change(name, applier, entries, decision.mode_change, spec.source, started)

    async def _change(
        self,
        name: str,
        applier: ApplierLike,
        entries: Sequence[MigEntry],
        mode_change: bool,
        source: str,
        started: float,
    ) -> ReconfigureOutcome:
        try:
            await self._set(name, "pending", "")
        except Exception as exc:
            return await self._finish(name, "failed", f"could not record state pending: {exc}", started)
        report: ApplyReport | None = None
        try:
            async with (
                self.gate.paused(self.opts.operand_timeout),
                self._host_clients(mode_change) as stopped,
            ):
                if stopped and mode_change and self.opts.host_clients_settle > 0:
                    self.log.info("mig_host_clients_settling", seconds=self.opts.host_clients_settle)
                    await self.sleep(self.opts.host_clients_settle)
                report = await applier.apply(name, entries, source=source)
        except RebootRequired as exc:
            if self.opts.with_reboot:
                return await self._reboot(name, str(exc), started)
            reason = f"{exc} (set WITH_REBOOT=true to let the manager reboot the node)"
            return await self._finish(name, "failed", reason, started)
        except Exception as exc:
            self.log.error("mig_apply_failed", config=name, error=str(exc), error_type=type(exc).__name__)
            return await self._finish(name, "failed", describe_error(exc), started)
        outcome = await self._finish(name, "success", "", started)
        if report is not None and report.changed and self.notify is not None:
            try:
                self.notify()
            except Exception as exc:
                self.log.warning("mig_notify_failed", error=str(exc))
        return outcome

    def _host_clients(self, mode_change: bool) -> contextlib.AbstractAsyncContextManager[Sequence[str]]:
        if self.clients is None or not self.opts.with_shutdown_host_gpu_clients:
            return _nothing_stopped()
        extra = (self.opts.host_kubelet_service,) if mode_change and self.opts.host_kubelet_service else ()
        return _stopped(self.clients, extra)

    async def _reboot(self, name: str, why: str, started: float) -> ReconfigureOutcome:
        try:
            await self._set(name, "rebooting", one_line(why))
        except Exception as exc:
            reason = f"{why}; not rebooting: could not record state rebooting: {exc}"
            return await self._finish(name, "failed", reason, started)
        self.log.warning("mig_rebooting", config=name, reason=why, command=list(self.opts.reboot_command))
        try:
            await self.reboot()
        except Exception as exc:
            return await self._finish(name, "failed", f"{why}; the reboot failed: {exc}", started)
        self.reconfigures.labels(result="rebooting").inc()
        self.log.info(
            "mig_reconfigure_finished",
            config=name,
            state="rebooting",
            duration_s=round(time.monotonic() - started, 3),
        )
        return "rebooting"

    async def _run_reboot_command(self) -> None:
        argv = self.opts.reboot_command
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await communicate(proc)  # only the tail is kept: a chatty command costs 64 KiB
        if proc.returncode != 0:
            tail = out.data.decode(errors="replace").strip().splitlines()
            raise RuntimeError(
                f"{shlex.join(argv)} exited with {proc.returncode}"
                + (f": {clip(tail[-1], 500)}" if tail else "")
            )

    async def _set(self, name: str, state: State, reason: str) -> None:
        await self.sink.set(state, reason, name)
        self.state = state
        self._gauge(state)
        emit = self.log.error if state == "failed" else self.log.info
        emit("mig_config_state", config=name, state=state, reason=reason or None)

    def _gauge(self, state: str) -> None:
        for s in STATES:
            self.state_gauge.labels(state=s).set(1 if s == state else 0)

    async def _finish(self, name: str, state: State, reason: str, started: float) -> ReconfigureOutcome:
        """Record the outcome. A success carries a reason only when it is a note worth seeing (the config
        matches no GPU here, so nothing changed: mig-parted's success, made visible)."""
        reason = one_line(reason) if state in ("failed", "success") else ""
        try:
            await self._set(name, state, reason)
        except Exception as exc:
            self.log.error("mig_state_write_failed", config=name, state=state, reason=reason, error=str(exc))
            self.metrics.count_error("state")
        self.reconfigures.labels(result=state).inc()
        self.log.info(
            "mig_reconfigure_finished",
            config=name,
            state=state,
            duration_s=round(time.monotonic() - started, 3),
        )
        return state


@contextlib.asynccontextmanager
async def _nothing_stopped() -> AsyncIterator[Sequence[str]]:
    yield ()


@contextlib.asynccontextmanager
async def _stopped(clients: HostClients, extra: Sequence[str]) -> AsyncIterator[Sequence[str]]:
    async with clients.stopped(extra) as ctx:
        yield tuple(ctx.stopped)

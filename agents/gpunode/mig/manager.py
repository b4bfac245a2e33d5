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

Handling a name (:meth:`MigManager.reconfigure`), the decision being the pure :func:`decide`:

1. no name: nothing (``mig_config_unset``);
2. a name the config does not have: ``failed``, the reason listing the names it has;
3. the layout already in place: ``success``; nothing paused;
4. a layout that cannot exist here (infeasible, a selection error): ``failed`` before anything changes;
5. a mode change still needed although the state says ``rebooting``: ``failed`` (no reboot loop);
6. otherwise ``pending``; operands paused (their labels come back whatever happens); host GPU clients
   stopped when asked (started again whatever happens); the layout applied and verified; on a mode
   change that needs a reboot, with ``WITH_REBOOT``, state ``rebooting`` and the reboot command;
7. ``success``, or ``failed`` on any error, with the reason in the node annotation
   ``nvidia.com/mig.config.state-reason`` (one line, removed on success) or the state file.

After a change the device plugin and feature discovery on this node get a SIGHUP.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gpunode.api.mig_config import MigEntry, MigSpec, load_spec
from gpunode.common import errors as common_errors
from gpunode.common import sdnotify
from gpunode.common.atomic import atomic_write_json
from gpunode.common.errors import ConfigError
from gpunode.common.logging import Logger, get_logger
from gpunode.common.metrics import AgentMetrics, create_metrics
from gpunode.common.runtime import Backoff, on_sighup, supervise
from gpunode.mig import DEFAULT_JOURNAL
from gpunode.mig.apply import Applier, ApplyReport, RebootRequired
from gpunode.mig.clients import HostClients
from gpunode.mig.plan import Infeasible, NodePlan
from gpunode.mig.selection import SelectionError
from gpunode.nvml import errors as nvml_errors

if TYPE_CHECKING:
    from gpunode.kube.api import NodeInfo
    from gpunode.kube.client import Kube
    from gpunode.kube.operands import OperandPauser
    from gpunode.nvml.api import Nvml

__all__ = [
    "AGENT",
    "CONFIG_LABEL",
    "REASON_ANNOTATION",
    "STATES",
    "STATE_LABEL",
    "Decision",
    "ManagerOptions",
    "MigManager",
    "StateFile",
    "build_options",
    "decide",
    "find_agents",
    "load_layouts",
    "one_line",
    "parse_selected_config",
    "serve",
    "unknown_config_reason",
]

AGENT = "mig-manager"
OWNER = "gpunode-mig-manager"
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
REASON_ANNOTATION = "nvidia.com/mig.config.state-reason"
STATES = ("pending", "rebooting", "success", "failed")
PAUSE_REASON = "mig-change"  # labels read paused-for-mig-change, as NVIDIA's
MAX_REASON = 1000
SELECTED_VAR = "MIG_PARTED_SELECTED_CONFIG"
DEFAULT_STATE_FILE = "/run/gpunode/mig-manager/state.json"
DEFAULT_NOTIFY = ("gpunode-device-plugin", "gpunode-feature-discovery")
REBOOT_MARKER = "reboot-pending.json"
AFTER_REBOOT = "MIG mode change did not take effect after rebooting"
DEFERRED_RETRY_S = 5.0

State = Literal["pending", "rebooting", "success", "failed"]


# ============================================================================================ pure parts
def one_line(text: str, limit: int = MAX_REASON) -> str:
    """``text`` as one line of at most ``limit`` characters (a reason for an annotation or a file)."""
    return common_errors.one_line(text, limit)


def unknown_config_reason(name: str, available: Sequence[str]) -> str:
    return f'unknown MIG config "{name}"; the configs are: {", ".join(available)}'


_SELECTED_RE = re.compile(rf"{SELECTED_VAR}=[\"']?([^\"'\s]*)")


def parse_selected_config(text: str) -> str | None:
    """The config name a selected-config file holds: the value of the last
    ``MIG_PARTED_SELECTED_CONFIG=name`` (as NVIDIA's systemd override writes it,
    ``Environment="MIG_PARTED_SELECTED_CONFIG=name"``), or else the first line that is a bare name.
    Blank lines, ``#`` / ``;`` comments and ``[Section]`` headers are ignored; None when empty."""
    assigned: str | None = None
    bare: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or (line.startswith("[") and line.endswith("]")):
            continue
        found = _SELECTED_RE.findall(line)
        if found:
            assigned = found[-1]
            continue
        if "=" not in line and bare is None:
            bare = line.strip("\"'").strip()
    value = assigned if assigned is not None else bare
    return value or None


@dataclass(frozen=True)
class Decision:
    """What handling a config name comes to before anything changes."""

    action: Literal["nothing", "success", "failed", "apply"]
    reason: str = ""
    mode_change: bool = False


def decide(
    name: str | None,
    configs: Sequence[str],
    *,
    applied: bool | None = None,
    plan_error: str | None = None,
    mode_change: bool = False,
    previous_state: str | None = None,
) -> Decision:
    """The decision for config ``name`` given what was found out about it: ``applied`` (the layout is
    in place; None: not checked), ``plan_error`` (why it cannot be planned), ``mode_change`` (a MIG
    mode change is still needed) and the state written before (``rebooting`` guards the reboot loop)."""
    if not name:
        return Decision("nothing")
    if name not in configs:
        return Decision("failed", unknown_config_reason(name, configs))
    if plan_error:
        return Decision("failed", plan_error)
    if applied:
        return Decision("success")
    if mode_change and previous_state == "rebooting":
        return Decision("failed", AFTER_REBOOT, mode_change=True)
    return Decision("apply", mode_change=mode_change)


def describe_error(exc: BaseException) -> str:
    """A failure as the one-line reason users read on the node."""
    if isinstance(exc, Infeasible | SelectionError | RebootRequired | ConfigError):
        return str(exc)
    if isinstance(exc, nvml_errors.NvmlError):
        return f"NVML: {exc}"
    text = str(exc)
    return text if text and type(exc).__module__.startswith("gpunode") else f"{type(exc).__name__}: {text}"


# ============================================================================================== options
@dataclass(frozen=True)
class ManagerOptions:
    config_file: str | None = None
    default_config_file: str | None = None
    services: tuple[str, ...] = ()  # from GPU_CLIENTS_FILE
    with_reboot: bool = False
    with_shutdown_host_gpu_clients: bool = False
    host_kubelet_service: str = "kubelet.service"
    operand_timeout: float = 300.0
    reassert_interval: float = 300.0  # <= 0: off
    journal_file: str | None = None
    reboot_command: tuple[str, ...] = ("reboot",)
    reboot_marker: Path | None = None  # bare metal: survives the reboot (the state file does not)
    notify_agents: bool = True
    notify_processes: tuple[str, ...] = DEFAULT_NOTIFY
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    oneshot: bool = False
    selected_config_file: Path | None = None  # bare-metal mode when set
    state_file: Path = Path(DEFAULT_STATE_FILE)
    host_clients_settle: float = 30.0  # after stopping host clients for a mode change (fabric manager)
    values: Mapping[str, Any] = field(default_factory=dict)  # flags, for open_node / hook_runner


def build_options(
    values: Mapping[str, Any], sources: Mapping[str, str], environ: Mapping[str, str]
) -> ManagerOptions:
    """The options from the resolved flags (``sources``: where each came from); ConfigError for a bad
    config, clients or hooks file, UsageError for a selected-config file in a directory that does not
    exist."""
    from gpunode.api.gpu_clients import load_gpu_clients
    from gpunode.api.mig_hooks import load_hooks
    from gpunode.common.errors import UsageError
    from gpunode.common.httpcore import default_listen_host

    bare = bool(values["selected_config_file"])
    if bare and not Path(values["selected_config_file"]).parent.is_dir():
        where = Path(values["selected_config_file"]).parent
        raise UsageError(f"--selected-config-file: directory {where} does not exist")
    root = "/" if bare and sources["host_root_mount"] == "default" else values["host_root_mount"]
    reboot = values["reboot_command"] or ("reboot" if root == "/" else f"chroot {shlex.quote(root)} reboot")
    for path in (values["config_file"], values["default_config_file"]):
        if path:
            load_spec(path)  # a missing or bad file: exit 2 at start, naming the file and the problem
    if values["hooks_file"]:
        load_hooks(values["hooks_file"])  # likewise, rather than a failure at each change
    journal = values["journal_file"] or None
    marker = Path(journal or DEFAULT_JOURNAL).parent / REBOOT_MARKER
    return ManagerOptions(
        config_file=values["config_file"],
        default_config_file=values["default_config_file"],
        services=load_gpu_clients(values["gpu_clients_file"]) if values["gpu_clients_file"] else (),
        with_reboot=values["with_reboot"],
        with_shutdown_host_gpu_clients=values["with_shutdown_host_gpu_clients"],
        host_kubelet_service=values["host_kubelet_systemd_service"],
        operand_timeout=values["operand_timeout"],
        reassert_interval=values["reassert_interval"],
        journal_file=journal,
        reboot_command=tuple(shlex.split(reboot)),
        reboot_marker=marker if bare else None,
        notify_agents=values["notify_agents"],
        notify_processes=tuple(p.strip() for p in values["notify_processes"].split(",") if p.strip()),
        http_host=default_listen_host(environ),
        http_port=None if values["http_port"] < 0 or values["oneshot"] else values["http_port"],
        oneshot=values["oneshot"],
        selected_config_file=Path(values["selected_config_file"]) if bare else None,
        state_file=Path(values["state_file"]),
        host_clients_settle=values["host_clients_settle"],
        values={**values, "host_root_mount": root},
    )


# ========================================================================================= config source
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


# ============================================================================= where the state is written
class StateSink(Protocol):
    async def previous(self) -> str | None: ...

    async def set(self, state: State, reason: str, config: str) -> None: ...


class NodeState:
    """State label and reason annotation on the node, one merge patch each time, only when different."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._known: tuple[str | None, str | None] | None = None

    async def previous(self) -> str | None:
        node = await self.kube.get_node()
        self._remember(node)
        return node.labels.get(STATE_LABEL)

    async def set(self, state: State, reason: str, config: str) -> None:
        want = (state, reason or None)
        if self._known == want:
            return
        node = await self.kube.patch_node(
            labels={STATE_LABEL: state}, annotations={REASON_ANNOTATION: reason or None}
        )
        self._remember(node)

    def _remember(self, node: NodeInfo) -> None:
        self._known = (node.labels.get(STATE_LABEL), node.annotations.get(REASON_ANNOTATION))


class StateFile:
    """Bare metal: ``{state, reason, config, time}`` written atomically as JSON. The file usually lives
    in /run, which a reboot empties, so ``rebooting`` is also recorded in ``marker`` (persistent) to
    stop a reboot loop."""

    def __init__(self, path: Path, marker: Path | None = None) -> None:
        self.path = path
        self.marker = marker

    def read(self) -> dict[str, Any]:
        import json

        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    async def previous(self) -> str | None:
        if self.marker is not None and self.marker.exists():
            return "rebooting"
        state = self.read().get("state")
        return state if isinstance(state, str) else None

    async def set(self, state: State, reason: str, config: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc = {"state": state, "reason": reason, "config": config, "time": now}
        await asyncio.to_thread(self._write, doc)

    def _write(self, doc: dict[str, Any]) -> None:
        if self.marker is not None:
            if doc["state"] == "rebooting":
                self.marker.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(self.marker, doc, 0o600)
            elif doc["state"] != "pending":
                with contextlib.suppress(FileNotFoundError):
                    self.marker.unlink()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, doc)


# ============================================================================================ operands
class OperandGate(Protocol):
    def paused(self, timeout: float) -> contextlib.AbstractAsyncContextManager[Any]: ...


class NoOperands:
    """Bare metal: nothing to pause."""

    @contextlib.asynccontextmanager
    async def paused(self, timeout: float) -> AsyncIterator[None]:
        yield None


class PausedOperands:
    def __init__(self, pauser: OperandPauser) -> None:
        self.pauser = pauser

    def paused(self, timeout: float) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.pauser.paused(PAUSE_REASON, timeout=timeout)


# ========================================================================================== the agents
def find_agents(names: Sequence[str], *, own_pid: int | None = None) -> list[int]:
    """Pids of processes whose program is one of ``names``: argv[0]'s basename, or argv[1]'s when
    argv[0] is a Python interpreter (a console script started through its ``#!`` line)."""
    import psutil

    wanted = set(names)
    me = os.getpid() if own_pid is None else own_pid
    found: list[int] = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            argv = proc.info.get("cmdline") or []
        except (psutil.Error, AttributeError):
            continue
        if not argv or proc.pid == me:
            continue
        prog = os.path.basename(argv[0])
        if prog not in wanted and prog.startswith("python") and len(argv) > 1:
            prog = os.path.basename(argv[1])
        if prog in wanted:
            found.append(proc.pid)
    return sorted(found)


def notify_agents(names: Sequence[str], log: Logger) -> list[int]:
    """SIGHUP the device plugin and feature discovery on this node, so they re-read the MIG layout."""
    told: list[int] = []
    for pid in find_agents(names):
        try:
            os.kill(pid, signal.SIGHUP)
            told.append(pid)
        except OSError as exc:
            log.warning("mig_notify_failed", pid=pid, error=str(exc))
    log.info("mig_agents_notified", pids=told, programs=list(names))
    return told


# ========================================================================================= the manager
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


Outcome = Literal["unset", "unchanged", "deferred", "pending", "rebooting", "success", "failed"]


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
    async def handle(self, name: str | None, why: str = "label") -> Outcome:
        """:meth:`reconfigure`, never raising (except cancellation)."""
        try:
            return await self.reconfigure(name, why)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.error("mig_reconfigure_crashed", config=name, error=str(exc), exc_info=True)
            self.metrics.count_error("reconfigure")
            return "failed"

    async def reconfigure(self, name: str | None, why: str = "label") -> Outcome:
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
        entries = spec.configs.get(name, ())
        if name in spec.configs:
            try:
                applier = self.make_applier(name)
                applied = (await applier.check(name, entries)).empty
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
            return await self._finish(name, state, decision.reason, started)
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
    ) -> Outcome:
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

    async def _reboot(self, name: str, why: str, started: float) -> Outcome:
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
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            tail = out.decode(errors="replace").strip().splitlines()
            raise RuntimeError(
                f"{shlex.join(argv)} exited with {proc.returncode}" + (f": {tail[-1]}" if tail else "")
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

    async def _finish(self, name: str, state: State, reason: str, started: float) -> Outcome:
        reason = one_line(reason) if state == "failed" else ""
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


# =========================================================================================== the sources
class KubeSource:
    """The ``nvidia.com/mig.config`` label of this node."""

    def __init__(self, kube: Kube, pauser: OperandPauser, log: Logger) -> None:
        self.kube = kube
        self.pauser = pauser
        self.log = log

    async def start(self, manager: MigManager) -> None:
        """Finish a pause an earlier run left, then read the label; the API server is waited for."""
        from gpunode.kube.api import KubeUnavailable

        backoff = Backoff(1.0, 30.0)
        while True:
            try:
                restored = await self.pauser.recover()
                node = await self.kube.get_node()
                break
            except KubeUnavailable as exc:
                delay = backoff.next()
                self.log.warning("kube_unavailable", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
        if restored:
            self.log.warning("mig_operands_restored_after_crash", labels=restored)
        manager.selected = node.labels.get(CONFIG_LABEL, "")

    async def follow(self, manager: MigManager) -> None:
        async for node in self.kube.watch_node():
            label = node.labels.get(CONFIG_LABEL, "")
            if label != manager.selected:
                self.log.info(
                    "mig_config_label_changed", config=label or None, before=manager.selected or None
                )
                manager.selected = label
                manager.trigger("label")


class FileSource:
    """The name in ``--selected-config-file``, followed through its directory with inotify."""

    def __init__(self, path: Path, log: Logger) -> None:
        self.path = path
        self.log = log

    def read(self) -> str:
        try:
            return parse_selected_config(self.path.read_text()) or ""
        except FileNotFoundError:
            return ""
        except (OSError, UnicodeDecodeError) as exc:
            self.log.error("mig_selected_config_unreadable", file=str(self.path), error=str(exc))
            return ""

    async def start(self, manager: MigManager) -> None:
        manager.selected = self.read()

    async def follow(self, manager: MigManager) -> None:
        from gpunode.common.fswatch import watch_directory

        async for event in watch_directory(self.path.parent, writes=True):
            name = self.read()
            if event.name == self.path.name or name != manager.selected:
                if name != manager.selected:
                    self.log.info("mig_selected_config_changed", config=name or None, file=str(self.path))
                manager.selected = name
                manager.trigger("file")


# ============================================================================================== serving
def connect_kube(values: Mapping[str, Any]) -> tuple[Kube, OperandPauser]:
    """The API client and the operand pauser (UsageError, exit 2, without a node name or credentials).
    The Kubernetes client is imported only here: bare-metal mode never loads it."""
    from gpunode.kube.client import Kube
    from gpunode.kube.operands import DEFAULT_OPERANDS, Operand, OperandPauser

    kube = Kube.connect(
        values.get("node_name"),
        values.get("kubeconfig"),
        namespace=values.get("namespace") or "default",
        timeout=float(values.get("kube_api_timeout") or 10.0),
        field_manager=OWNER,
    )
    operands = (*DEFAULT_OPERANDS, Operand("client"))
    return kube, OperandPauser(kube, OWNER, operands=operands)


async def serve(opts: ManagerOptions, kube: tuple[Kube, OperandPauser] | None = None) -> int:
    """Run the manager (Kubernetes mode with ``kube``, bare metal with ``opts.selected_config_file``)."""
    from gpunode.common.http import HealthServer
    from gpunode.mig.cli import hook_runner, open_node
    from gpunode.mig.clients import SystemctlCommand, systemctl_prefix

    log = get_logger("gpunode.mig.manager")
    metrics = create_metrics(AGENT)
    values = dict(opts.values)
    nvml, resetter = await open_node(values)
    try:
        spec = await load_layouts(opts, nvml, log)
        log.info("mig_layouts", source=spec.source, configs=list(spec.configs))
        journal = Path(opts.journal_file) if opts.journal_file else None

        def make_applier(name: str) -> Applier:
            hooks = hook_runner({**values, "selected_config": name, "config_file": manager.spec.source})
            return Applier(nvml, resetter, journal=journal, hooks=hooks)

        sink: StateSink
        gate: OperandGate
        source: KubeSource | FileSource
        if kube is not None:
            sink, gate, source = (
                NodeState(kube[0]),
                PausedOperands(kube[1]),
                KubeSource(kube[0], kube[1], log),
            )
        else:
            assert opts.selected_config_file is not None
            sink, gate = StateFile(opts.state_file, opts.reboot_marker), NoOperands()
            source = FileSource(opts.selected_config_file, log)
        clients = None
        if opts.with_shutdown_host_gpu_clients:
            prefix = systemctl_prefix(str(values.get("host_root_mount") or "/"))
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

"""A config file chosen out of a directory by a node label and kept current (config-manager, in process).

A ConfigMap mounted as a directory holds several named configs (``default``, ``sliced``, ...); the node
label ``nvidia.com/device-plugin.config`` names the one a node should use. The device plugin and feature
discovery both honour it, through the one :class:`LabelConfig` here, so the sharing labels always
describe what the plugin advertises.

The pure part: :func:`select_config` makes the choice as a function of the names present, the label
value, the default config and the fallback strategies; :func:`list_configs` lists a directory the way the
choice needs it, leaving out the ConfigMap's own bookkeeping (``..data``, ``..2026_01_01_...``) and
subdirectories. The order, as in NVIDIA's config-manager:

1. the label value, which must name a file present;
2. else ``--default-config``;
3. else the fallback strategies in order: ``named`` (a file called ``default``), ``single`` (the only
   file there is), ``empty`` (no file at all: built-in defaults).

Unlike config-manager, a label (or default config) naming a file that is not there is not the end: the
result carries the problem in ``error`` *and* whatever the rest of the chain picks, so the caller can
report the problem and still serve (or keep what it already serves).

The live part: :class:`LabelConfig`, generic over what a file loads into (the agent's loader turns a
path, or None for no file, into its config type). At start it waits a little for the node's label
(:meth:`~LabelConfig.wait_for_label`: not longer than about a second when the API server is known to be
away), then loads the label's file, else the default chain's (:meth:`~LabelConfig.first`). Afterwards
it follows the node (:meth:`~LabelConfig.watch_node`) and the directory
(:meth:`~LabelConfig.watch_directory`), and on each change, once things are quiet, chooses again and
hands a changed config to the agent's ``apply`` callback (:meth:`~LabelConfig.follow_changes`).
Keep-last-good throughout: a label naming a missing file, a directory that cannot be read, a file that
does not load, or a config the agent refuses leave the config in force as it is; the content of the
config in force is still followed. With ``report`` (the device plugin) the outcome is written to the
node as ``nvidia.com/device-plugin.config.state`` (``applied`` or ``failed: <reason>``) and
``nvidia.com/device-plugin.config.applied`` (the file in force, ``""`` for built-in defaults).

Nothing here imports the Kubernetes client: the node comes through the small :class:`NodeApi` protocol
that :class:`gpunode.kube.client.Kube` satisfies. Time (the first-label wait, retry backoff, the quiet
period) goes through an injectable clock and sleep, so tests run on fake time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal, Protocol, TypeVar

from gpunode.common import errors, fswatch
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.runtime import Backoff
from gpunode.common.settings import setting
from gpunode.kube.api import KubeError, NodeInfo

if TYPE_CHECKING:
    from gpunode.common.logging import Logger

__all__ = [
    "APPLIED_ANNOTATION",
    "DEFAULT_FALLBACKS",
    "DEFAULT_NAME",
    "DEVICE_PLUGIN_CONFIG_LABEL",
    "FALLBACK_STRATEGIES",
    "LOAD_ERRORS",
    "STATE_ANNOTATION",
    "InForce",
    "LabelConfig",
    "LabelConfigOptions",
    "LabelConfigSettings",
    "Loaded",
    "NoUsableConfig",
    "NodeApi",
    "Selection",
    "SelectionSource",
    "is_config_name",
    "list_configs",
    "one_line",
    "parse_fallback_strategies",
    "select_config",
]

DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
DEFAULT_NAME = "default"  # what the ``named`` fallback looks for
FALLBACK_STRATEGIES = ("named", "single", "empty")
DEFAULT_FALLBACKS = ("named", "single")  # the GPU Operator's and the helm chart's choice

SelectionSource = Literal["label", "default-config", "named", "single", "empty"]


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select_config`.

    ``source`` says how ``name`` was chosen; ``name`` is None for the ``empty`` fallback (no file:
    built-in defaults) and when nothing could be chosen (``source`` None too). ``error`` is a one-line
    problem to report (a label or default config naming a missing file, or no choice at all); it may
    come together with a choice made further down the chain. ``why`` is a short human explanation.
    """

    name: str | None
    source: SelectionSource | None
    why: str
    error: str | None = None

    @property
    def chosen(self) -> bool:
        """Whether anything was chosen (a file, or ``empty``)."""
        return self.source is not None


def parse_fallback_strategies(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"named,single"`` (flag / env form) or a list -> ``("named", "single")``, in order, deduplicated.

    An empty text means no fallbacks; ``ValueError`` names an unknown strategy and lists the known ones.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in items:
        item = raw.strip().lower()
        if not item:
            continue
        if item not in FALLBACK_STRATEGIES:
            raise ValueError(
                f"unknown fallback strategy {raw.strip()!r}: must be one of {', '.join(FALLBACK_STRATEGIES)}"
            )
        if item not in out:
            out.append(item)
    return tuple(out)


def is_config_name(name: str) -> bool:
    """Whether a directory entry's name can be a config: not empty, no ``/``, not hidden.

    Hidden names cover a ConfigMap volume's internals: ``..data`` (the symlink kubelet swaps atomically),
    ``..data_tmp`` and the timestamped ``..2026_01_01_00_00_00.123`` directories, and other dotfiles.
    """
    return bool(name) and not name.startswith(".") and "/" not in name and "\0" not in name


def list_configs(directory: str | os.PathLike[str]) -> tuple[str, ...]:
    """The config names in ``directory``, sorted: regular files (symlinks followed, as a ConfigMap's
    ``name -> ..data/name`` entries are), no subdirectories, no dangling links, no ConfigMap internals.

    Raises ``OSError`` when the directory cannot be listed.
    """
    names: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not is_config_name(entry.name):
                continue
            try:
                if entry.is_file(follow_symlinks=True):
                    names.append(entry.name)
            except OSError:  # vanished meanwhile, or unreadable: not a config we can use
                continue
    return tuple(sorted(names))


def _have(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "no config files"


def select_config(
    available: Collection[str],
    label: str | None,
    *,
    default_config: str | None = None,
    fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
    where: str | os.PathLike[str] = "the config directory",
) -> Selection:
    """Choose the config for a node: the label's value, else ``default_config``, else ``fallbacks``.

    ``available`` holds the names present (entries that :func:`is_config_name` rejects are ignored);
    ``label`` is the node label's value (None or ``""``: unset); ``where`` names the directory in
    messages. Pure: no file system access.
    """
    names = sorted({n for n in available if is_config_name(n)})
    place = os.fspath(where)
    problems: list[str] = []
    if label:
        if label in names:
            return Selection(label, "label", f'the node label names "{label}"')
        problems.append(f'config "{label}" not found in {place} (have: {_have(names)})')
        lead = f'the node label names "{label}", which is missing; '
    else:
        lead = "no node label; "
    if default_config:
        if default_config in names:
            return Selection(
                default_config,
                "default-config",
                lead + f'the default config "{default_config}"',
                _join(problems),
            )
        problems.append(f'default config "{default_config}" not found in {place} (have: {_have(names)})')
        lead += f'default config "{default_config}" missing; '
    for strategy in fallbacks:
        if strategy == "named" and DEFAULT_NAME in names:
            return Selection(
                DEFAULT_NAME, "named", lead + f'the file named "{DEFAULT_NAME}"', _join(problems)
            )
        if strategy == "single" and len(names) == 1:
            return Selection(names[0], "single", lead + "the only file", _join(problems))
        if strategy == "empty":
            return Selection(None, "empty", lead + "no file (built-in defaults)", _join(problems))
    tried = f"fallbacks {', '.join(fallbacks)} matched nothing" if fallbacks else "no fallbacks"
    if problems:
        problems.append(tried)
    else:
        problems.append(f"no config selected in {place}: no node label, {tried} (have: {_have(names)})")
    return Selection(None, None, lead + "nothing matched", _join(problems))


def _join(problems: Sequence[str]) -> str | None:
    return "; ".join(problems) if problems else None


def _fallback_list(text: str) -> str:
    """``"named, single"`` -> ``"named,single"``; ``ValueError`` names an unknown strategy."""
    return ",".join(parse_fallback_strategies(text))


# ========================================================================================= the controller
STATE_ANNOTATION = "nvidia.com/device-plugin.config.state"  # "applied" or "failed: <reason>"
APPLIED_ANNOTATION = "nvidia.com/device-plugin.config.applied"  # the config in force ("" = built-in)
MAX_REASON = 300  # characters of a failure reason in the annotation
LABEL_POLL = 0.05  # the first-label wait looks at the clock this often
AWAY_GRACE = 1.0  # with the API server known to be away, the first-label wait gives up after this
REPORT_FINAL_TIMEOUT = 3.0  # before exiting for want of a config: how long saying so may take
# What a loader raises for a config it cannot use; anything else is a bug and is not swallowed.
LOAD_ERRORS: tuple[type[Exception], ...] = (ConfigError, UsageError, ValueError, LookupError, OSError)

C = TypeVar("C")
Apply = Callable[[C, "InForce"], Awaitable[str | None]]


def one_line(error: BaseException | str, limit: int = MAX_REASON) -> str:
    """A failure as one short line for a node annotation (every problem of a ConfigError, joined)."""
    return errors.one_line(error, limit)


@dataclass(frozen=True)
class LabelConfigOptions:
    """``--config-file`` naming a directory of named configs, one of them chosen by a node label."""

    directory: Path
    node_label: str = DEVICE_PLUGIN_CONFIG_LABEL
    default_config: str | None = None
    fallbacks: tuple[str, ...] = DEFAULT_FALLBACKS
    first_label_wait: float | None = None  # at start, how long to wait for the label (None: 2 x API timeout)
    settle: float = 0.1  # a ConfigMap update is several renames in a row: wait for quiet


@dataclass(frozen=True)
class InForce:
    """The named config an agent serves with; ``name`` None: no file (built-in defaults)."""

    name: str | None
    source: SelectionSource
    digest: str | None  # sha256 of the file's content (None: no file)


@dataclass(frozen=True)
class Loaded(Generic[C]):
    """The config chosen at start, loaded: apply ``config``, then :meth:`LabelConfig.took` it."""

    config: C
    chosen: InForce
    failure: str | None  # problems met on the way (a missing label's file, a refused one), to report


class NoUsableConfig(Exception):
    """At start, no file of the directory (nor the ``empty`` fallback) gave a config."""

    def __init__(self, directory: str, reason: str) -> None:
        super().__init__(directory, reason)
        self.directory = directory
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class NodeApi(Protocol):
    """What the controller needs of the API client (:class:`gpunode.kube.client.Kube` has it)."""

    node_name: str
    timeout: float
    available: bool | None  # None until the first call, then whether the last one got through
    last_error: str

    def watch_node(self) -> AsyncIterator[NodeInfo]: ...

    async def patch_node(self, *, annotations: Mapping[str, str | None] | None = None) -> NodeInfo: ...


class LabelConfig(Generic[C]):
    """The config chosen by the node label, loaded with ``load`` and kept current.

    ``load(path)`` turns a file (None: no file, the ``empty`` fallback) into the agent's config, raising
    one of :data:`LOAD_ERRORS` when it cannot be used. ``count_error(reason)`` counts failures
    (``config``, ``config-selection``, ``kube``). ``report``: write the outcome to the node's
    annotations (one agent per node should). ``clock`` and ``sleep`` drive every wait.
    """

    def __init__(
        self,
        options: LabelConfigOptions,
        load: Callable[[Path | None], C],
        *,
        log: Logger,
        count_error: Callable[[str], object],
        kube: NodeApi | None = None,
        report: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.options = options
        self.kube = kube
        self.report = report
        self.log = log
        self._load = load
        self._count_error = count_error
        self._clock = clock
        self._sleep = sleep
        self.label: str | None = None  # None: not known yet (API server not reached)
        self.in_force: InForce | None = None
        self.state = ""  # "applied" or "failed: <reason>" once a config was taken
        self._label_known = asyncio.Event()
        self._reselect = asyncio.Event()
        self._started = asyncio.Event()  # the first config was taken, or found missing
        self._rejected: tuple[str | None, str | None, str] | None = None  # (name, digest, reason)
        self._selection_error: str | None = None
        self._want: dict[str, str] = {}  # the annotations the node should carry
        self._reported: dict[str, str] | None = None  # what it carries (None: not read yet)
        self._report_kick = asyncio.Event()
        self._kube_error = ""
        self._lock = asyncio.Lock()

    # -- choosing and reading -------------------------------------------------------------------------
    def choose(self, label: str | None) -> tuple[Selection, tuple[str, ...]]:
        """The choice for ``label`` among the files there now, and those files."""
        d = self.options
        try:
            names = list_configs(d.directory)
        except OSError as exc:
            reason = f"cannot list {d.directory}: {exc.strerror or exc}"
            return Selection(None, None, "the directory cannot be listed", reason), ()
        chosen = select_config(
            names, label, default_config=d.default_config, fallbacks=d.fallbacks, where=d.directory
        )
        return chosen, names

    def path(self, name: str | None) -> Path | None:
        return self.options.directory / name if name is not None else None

    def _digest(self, name: str | None) -> str | None:
        """The named file's digest (None for no file); :class:`ConfigError` when it cannot be read."""
        path = self.path(name)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
        return hashlib.sha256(data).hexdigest()

    # -- start ------------------------------------------------------------------------------------------
    async def wait_for_label(self, *, run_watch: bool = False) -> None:
        """At start: the node's label, unless the API server is away (then the default chain serves).

        The label comes from :meth:`watch_node`, which the caller runs already, or (``run_watch``, for a
        caller that starts its watch later or never) which runs here for the wait only.
        """
        if self.kube is None:
            return
        if not run_watch:
            await self._await_label(self.kube)
            return
        async with asyncio.TaskGroup() as tg:
            watch = tg.create_task(self.watch_node(), name="node-watch")
            try:
                await self._await_label(self.kube)
            finally:
                watch.cancel()

    async def _await_label(self, kube: NodeApi) -> None:
        wait = self.options.first_label_wait
        limit = wait if wait is not None else 2 * kube.timeout
        started = self._clock()
        while not self._label_known.is_set():
            waited = self._clock() - started
            away = kube.available is False or bool(self._kube_error)
            if waited >= limit or (away and waited >= AWAY_GRACE):
                self.log.warning(
                    "node_label_unknown",
                    error=self._kube_error or kube.last_error or f"no answer within {limit:g}s",
                    action="serving with the default config chain; the label applies once the API answers",
                )
                return
            await self._sleep_or(self._label_known, LABEL_POLL)

    async def first(self) -> Loaded[C]:
        """The first config: the label's, else the default chain's (nothing is in force to keep yet).

        Raises :class:`NoUsableConfig` (after saying so on the node, with ``report``) when no choice
        loads at all.
        """
        selection, names = self.choose(self.label)
        self._selection_error = selection.error
        failures: list[str] = []
        candidates = [selection]
        if selection.source == "label":  # should its content be refused, the default chain is next
            candidates.append(self.choose(None)[0])
        tried: set[str | None] = set()
        for candidate in candidates:
            if candidate.error and candidate.error not in failures:
                failures.append(candidate.error)
            if not candidate.chosen or candidate.name in tried:
                continue
            tried.add(candidate.name)
            digest = None
            try:
                digest = self._digest(candidate.name)
                config = self._load(self.path(candidate.name))
            except LOAD_ERRORS as exc:
                self.log.error("config_rejected", error=str(exc), config=candidate.name)
                self._count_error("config")
                failures.append(one_line(exc))
                self._rejected = (candidate.name, digest, one_line(exc))  # not again for the same content
                continue
            assert candidate.source is not None
            if selection.error:
                self.log.error("config_selection_failed", reason=selection.error, label=self.label)
                self._count_error("config-selection")
            chosen = InForce(candidate.name, candidate.source, digest)
            return Loaded(config, chosen, "; ".join(failures) or None)
        d = self.options.directory
        reason = "; ".join(failures) or f"no usable config in {d} (have: {', '.join(names)})"
        self.log.error("config_selection_failed", reason=reason, label=self.label)
        self._count_error("config-selection")
        self._started.set()  # an agent that carries on without one takes the first usable config later
        await self.report_final(reason)
        raise NoUsableConfig(str(d), reason)

    def took(self, chosen: InForce, failure: str | None = None) -> None:
        """``chosen`` is in force now: log it and (with ``report``) say so on the node."""
        kept = self.in_force is not None and self.in_force.name == chosen.name and failure is not None
        self.in_force = chosen
        self._started.set()
        self.log.info(
            "config_selected",
            name=chosen.name,
            source=chosen.source,
            label=self.label,
            **({"kept": "the selection failed; the config in force follows its file"} if kept else {}),
        )
        self._set_state(failure)

    def _set_state(self, *reasons: str | None) -> None:
        problems = [r for r in reasons if r]
        self.state = "failed: " + one_line("; ".join(problems)) if problems else "applied"
        if not self.report:
            return
        applied = self.in_force.name if self.in_force is not None and self.in_force.name else ""
        want = {STATE_ANNOTATION: self.state, APPLIED_ANNOTATION: applied}
        if want != self._want:
            self._want = want
            self.log.info("config_state", state=self.state, applied=applied)
            self._report_kick.set()

    # -- live -------------------------------------------------------------------------------------------
    def changed(self) -> None:
        """Choose again soon (the directory or the label changed)."""
        self._reselect.set()

    async def reload(self, apply: Apply[C]) -> None:
        """Read the chosen file again and apply it even when unchanged (SIGHUP)."""
        await self._apply(apply, force=True)

    async def follow_changes(self, apply: Apply[C]) -> None:
        """Forever: after each change, once quiet, choose again and ``apply`` what changed.

        ``apply(config, chosen)`` returns None when the agent now serves ``config``, else why it
        refused it (the config in force stays). Begins once the first config was taken (:meth:`took`)
        or :meth:`first` found none.
        """
        await self._started.wait()
        self._reselect.set()  # one pass at once: a change between the first choice and now counts
        while True:
            await self._reselect.wait()
            while True:  # wait for a quiet moment: one ConfigMap update is several renames
                self._reselect.clear()
                if not await self._sleep_or(self._reselect, self.options.settle):
                    break
            await self._apply(apply)

    async def _apply(self, apply: Apply[C], *, force: bool = False) -> None:
        """Choose again and apply what changed; keep-last-good (see the module's description)."""
        async with self._lock:
            await self._apply_locked(apply, force)

    async def _apply_locked(self, apply: Apply[C], force: bool) -> None:
        current = self.in_force
        selection, _ = self.choose(self.label)
        if selection.error != self._selection_error:
            self._selection_error = selection.error
            if selection.error:
                self.log.error("config_selection_failed", reason=selection.error, label=self.label)
                self._count_error("config-selection")
        name: str | None
        if selection.source is not None and (selection.error is None or current is None):
            name, source = selection.name, selection.source
        elif current is not None:
            name, source = current.name, current.source  # keep the config in force
        else:  # nothing in force (no config loaded at start) and nothing to take
            self._set_state(selection.error)
            return
        keeping = (
            f"the config in force ({current.name or 'built-in defaults'})"
            if current
            else "the settings in force"
        )
        problem: str | None = None
        try:
            digest = self._digest(name)
        except ConfigError as exc:
            self.log.error("config_rejected", error=str(exc), config=name, keeping=keeping)
            self._count_error("config")
            if current is not None and name == current.name:  # gone: keep serving what was read
                self._set_state(selection.error, one_line(exc))
                return
            digest, problem = None, one_line(exc)
        if (
            problem is None
            and not force
            and current is not None
            and (name, digest) == (current.name, current.digest)
        ):
            if source != current.source:
                self.in_force = InForce(name, source, digest)
            self._rejected = None
            self._set_state(selection.error)
            return
        rejected = self._rejected
        if problem is None and not force and rejected is not None and rejected[:2] == (name, digest):
            self._set_state(selection.error, rejected[2])  # still the content refused before
            return
        if problem is None:
            try:
                config = self._load(self.path(name))
            except LOAD_ERRORS as exc:
                self.log.error("config_rejected", error=str(exc), config=name, keeping=keeping)
                self._count_error("config")
                problem = one_line(exc)
            else:
                chosen = InForce(name, source, digest)
                refused = await apply(config, chosen)
                if refused is None:
                    self._rejected = None
                    self.took(chosen, selection.error)
                    return
                problem = one_line(f"{self.path(name) or self.options.directory}: {refused}")
        self._rejected = (name, digest, problem)
        self._set_state(selection.error, problem)

    async def watch_directory(self) -> None:
        """Any change in the directory (a ConfigMap update swaps ``..data``) makes the choice again."""
        async for _ in fswatch.watch_directory(self.options.directory, writes=True):
            self._reselect.set()

    async def watch_node(self) -> None:
        """The node's label (and our annotations on it), from one watch that survives API outages."""
        assert self.kube is not None
        backoff = Backoff(first=0.5, cap=30.0)
        while True:
            try:
                async for node in self.kube.watch_node():
                    backoff.reset()
                    self._kube_error = ""
                    self._saw(node)
            except KubeError as exc:  # 403 / 404: the watch itself retries outages
                self._kube_error = str(exc)
                delay = backoff.next()
                self.log.error("node_watch_failed", error=str(exc), retry_in_s=delay)
                self._count_error("kube")
                await self._sleep(delay)

    def _saw(self, node: NodeInfo) -> None:
        if self.report and self._reported is None:
            keys = (STATE_ANNOTATION, APPLIED_ANNOTATION)
            self._reported = {k: node.annotations[k] for k in keys if k in node.annotations}
            self._report_kick.set()
        key = self.options.node_label
        label = node.labels.get(key, "")
        if not self._label_known.is_set() or label != self.label:
            if self._label_known.is_set():
                self.log.info("node_label_changed", label=key, value=label, previous=self.label)
            self.label = label
            self._label_known.set()
            self._reselect.set()

    async def report_state(self) -> None:
        """Write the wanted annotations when they differ from what the node carries; retry failures."""
        assert self.kube is not None
        backoff = Backoff(first=0.5, cap=30.0)
        while True:
            await self._report_kick.wait()
            self._report_kick.clear()
            if self._reported is None:
                continue  # the node has not been read yet; the watch kicks when it is
            patch = {k: v for k, v in self._want.items() if self._reported.get(k) != v}
            if not patch:
                continue
            try:
                await self.kube.patch_node(annotations=patch)
            except KubeError as exc:
                delay = backoff.next()
                self.log.warning("config_state_not_reported", error=str(exc), retry_in_s=delay)
                self._count_error("kube")
                await self._sleep_or(self._report_kick, delay)
                self._report_kick.set()
                continue
            backoff.reset()
            self._reported.update(patch)
            self.log.info("config_state_reported", annotations=patch)

    async def report_final(self, reason: str) -> None:
        """Before exiting for want of any usable config: say why on the node, if the API answers soon."""
        if self.kube is None or not self.report:
            return
        annotations = {STATE_ANNOTATION: f"failed: {one_line(reason)}", APPLIED_ANNOTATION: ""}
        with contextlib.suppress(Exception):  # best effort: the exit status (2) must not change
            async with asyncio.timeout(REPORT_FINAL_TIMEOUT):
                await self.kube.patch_node(annotations=annotations)

    def kube_check(self) -> tuple[bool, str]:
        """Readiness: whether the API server answers for the node."""
        kube = self.kube
        assert kube is not None
        if self._kube_error:
            return (False, self._kube_error)
        if kube.available is None:
            return (False, "API server not reached yet")
        if not kube.available:
            return (False, kube.last_error or "API server unreachable")
        return (True, f"node {kube.node_name}")

    async def _sleep_or(self, event: asyncio.Event, seconds: float) -> bool:
        """Sleep (the injected sleep), waking early when ``event`` is set; whether it was set."""
        if event.is_set():
            return True
        waiter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
        return event.is_set()


# ================================================================================================ flags
@dataclass(frozen=True)
class LabelConfigSettings:
    """config-manager's flags, a settings group (``group(LabelConfigSettings)``) for agents whose
    ``--config-file`` may name a directory of configs."""

    node_label: str = setting(
        "--node-label",
        env="NODE_LABEL",
        default=DEVICE_PLUGIN_CONFIG_LABEL,
        metavar="KEY",
        help="with --config-file naming a directory: the node label whose value names the config to use",
    )
    default_config: str | None = setting(
        "--default-config",
        env="DEFAULT_CONFIG",
        metavar="NAME",
        help="with a config directory: the config used when the node label is unset",
    )
    fallback_strategies: str = setting(
        "--fallback-strategies",
        env="FALLBACK_STRATEGIES",
        type=_fallback_list,
        default="named,single",
        metavar="LIST",
        help="with a config directory and no label or default config: named (the file 'default'), "
        "single (the only file), empty (no file), tried in order",
    )

    def options(self, directory: Path, *, first_label_wait: float | None = None) -> LabelConfigOptions:
        """The controller's options for ``directory`` (what ``--config-file`` names)."""
        return LabelConfigOptions(
            directory=directory,
            node_label=self.node_label,
            default_config=self.default_config or None,
            fallbacks=parse_fallback_strategies(self.fallback_strategies),
            first_label_wait=first_label_wait,
        )

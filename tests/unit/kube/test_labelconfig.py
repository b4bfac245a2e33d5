"""gpunode.kube.labelconfig: which named config a node label selects, listing a ConfigMap mount, and the
controller that keeps the chosen config current (on fake time)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpunode.common.errors import ConfigError
from gpunode.kube.api import KubeForbidden, KubeUnavailable, NodeInfo
from gpunode.kube.labelconfig import (
    DEFAULT_FALLBACKS,
    InForce,
    LabelConfig,
    LabelConfigOptions,
    NoUsableConfig,
    Selection,
    is_config_name,
    list_configs,
    parse_fallback_strategies,
    select_config,
)

WHERE = "/available-configs"
NAMED_SINGLE = ("named", "single")

# (files present, label value, default config, fallbacks) -> (chosen name, source, error or None)
CASES = [
    # the label wins when it names a file
    pytest.param(
        ("default", "big"), "big", None, NAMED_SINGLE, "big", "label", None, id="label-names-a-file"
    ),
    pytest.param(
        ("default", "big"), "big", "default", NAMED_SINGLE, "big", "label", None, id="label-beats-default"
    ),
    pytest.param(("only",), "only", None, (), "only", "label", None, id="label-needs-no-fallbacks"),
    # no label: default config, then the fallbacks in order
    pytest.param(("default", "big"), None, None, NAMED_SINGLE, "default", "named", None, id="no-label-named"),
    pytest.param(("default", "big"), "", None, NAMED_SINGLE, "default", "named", None, id="empty-label"),
    pytest.param(
        ("a", "big"), None, "big", NAMED_SINGLE, "big", "default-config", None, id="no-label-default-config"
    ),
    pytest.param(("solo",), None, None, NAMED_SINGLE, "solo", "single", None, id="single-file"),
    pytest.param(
        ("default", "solo"), None, None, ("single", "named"), "default", "named", None, id="order-matters"
    ),
    pytest.param(("solo",), None, None, ("named",), None, None, "no node label", id="named-only-no-default"),
    pytest.param(("a", "b"), None, None, ("single", "empty"), None, "empty", None, id="empty-fallback"),
    pytest.param(("a", "b"), None, None, ("empty", "named"), None, "empty", None, id="empty-first"),
    pytest.param(
        ("a", "b"),
        None,
        None,
        NAMED_SINGLE,
        None,
        None,
        "no config selected in /available-configs: no node label, fallbacks named, single matched "
        "nothing (have: a, b)",
        id="nothing-matches",
    ),
    pytest.param((), None, None, NAMED_SINGLE, None, None, "have: no config files", id="empty-directory"),
    pytest.param((), None, None, (), None, None, "no fallbacks", id="no-fallbacks-at-all"),
    # a label naming a missing file: reported, and the rest of the chain still chooses
    pytest.param(
        ("default", "small"),
        "big",
        None,
        NAMED_SINGLE,
        "default",
        "named",
        'config "big" not found in /available-configs (have: default, small)',
        id="missing-label-falls-back-named",
    ),
    pytest.param(
        ("small",),
        "big",
        None,
        NAMED_SINGLE,
        "small",
        "single",
        'config "big" not found in /available-configs (have: small)',
        id="missing-label-falls-back-single",
    ),
    pytest.param(
        ("a", "b"),
        "big",
        None,
        NAMED_SINGLE,
        None,
        None,
        'config "big" not found in /available-configs (have: a, b); fallbacks named, single matched nothing',
        id="missing-label-nothing-else",
    ),
    pytest.param(
        ("a", "b"),
        "big",
        None,
        ("empty",),
        None,
        "empty",
        'config "big" not found in /available-configs (have: a, b)',
        id="missing-label-empty",
    ),
    # a default config naming a missing file: reported, fallbacks still apply
    pytest.param(
        ("default", "a"),
        None,
        "gone",
        NAMED_SINGLE,
        "default",
        "named",
        'default config "gone" not found in /available-configs (have: a, default)',
        id="missing-default-config",
    ),
    pytest.param(
        ("default",),
        "nope",
        "gone",
        NAMED_SINGLE,
        "default",
        "named",
        'config "nope" not found in /available-configs (have: default); '
        'default config "gone" not found in /available-configs (have: default)',
        id="missing-label-and-default-config",
    ),
    # ConfigMap internals and hidden files are never configs, not even when a label names them
    pytest.param(
        ("..data", "..2026_01_01_00_00_00.000000001", ".hidden", "solo"),
        None,
        None,
        NAMED_SINGLE,
        "solo",
        "single",
        None,
        id="internals-ignored-for-single",
    ),
    pytest.param(
        ("..data", "default"),
        "..data",
        None,
        NAMED_SINGLE,
        "default",
        "named",
        'config "..data" not found in /available-configs (have: default)',
        id="label-naming-internals",
    ),
    pytest.param(
        ("Default",), None, None, ("named",), None, None, "matched nothing", id="named-is-case-sensitive"
    ),
]


@pytest.mark.parametrize(
    ("files", "label", "default", "fallbacks", "name", "source", "error"),
    CASES,
)
def test_select_config(
    files: tuple[str, ...],
    label: str | None,
    default: str | None,
    fallbacks: tuple[str, ...],
    name: str | None,
    source: str | None,
    error: str | None,
) -> None:
    got = select_config(files, label, default_config=default, fallbacks=fallbacks, where=WHERE)
    assert (got.name, got.source) == (name, source), got.why
    assert got.chosen is (source is not None)
    if error is None:
        assert got.error is None
    else:
        assert got.error is not None
        assert error in got.error
        assert "\n" not in got.error  # reported in a node annotation: one line
    assert got.why


def test_select_config_is_pure_and_deterministic() -> None:
    files = ["b", "default", "a"]
    first = select_config(files, "x", where=WHERE)
    assert files == ["b", "default", "a"]  # input untouched
    assert select_config(reversed(files), "x", where=WHERE) == first  # type: ignore[arg-type]
    assert first == Selection(first.name, first.source, first.why, first.error)


def test_default_fallbacks_are_named_then_single() -> None:
    assert DEFAULT_FALLBACKS == ("named", "single")
    assert select_config(["solo"], None).source == "single"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("named,single", ("named", "single")),
        (" named , single ,", ("named", "single")),
        ("EMPTY", ("empty",)),
        ("single,named,single", ("single", "named")),
        ("", ()),
        (["named", "empty"], ("named", "empty")),
    ],
)
def test_parse_fallback_strategies(text: str | list[str], expected: tuple[str, ...]) -> None:
    assert parse_fallback_strategies(text) == expected


def test_parse_fallback_strategies_names_the_bad_one() -> None:
    with pytest.raises(ValueError, match=r"'newest'.*named, single, empty"):
        parse_fallback_strategies("named,newest")


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("default", True),
        ("time-sliced.yaml", True),
        ("a", True),
        ("..data", False),
        ("..data_tmp", False),
        ("..2026_05_01_12_00_00.123456789", False),
        (".hidden", False),
        ("", False),
        ("a/b", False),
    ],
)
def test_is_config_name(name: str, ok: bool) -> None:
    assert is_config_name(name) is ok


def configmap_mount(root: Path, files: dict[str, str], stamp: str = "..2026_01_01_00_00_00.1") -> Path:
    """A directory laid out as the kubelet lays out a ConfigMap volume."""
    root.mkdir(exist_ok=True)
    (root / stamp).mkdir()
    for name, text in files.items():
        (root / stamp / name).write_text(text)
    os.symlink(stamp, root / "..data")
    for name in files:
        os.symlink(f"..data/{name}", root / name)
    return root


def test_list_configs_in_a_configmap_mount(tmp_path: Path) -> None:
    mount = configmap_mount(tmp_path / "cm", {"default": "version: v1\n", "sliced": "version: v1\n"})
    (mount / ".dotfile").write_text("x")
    (mount / "subdir").mkdir()
    (mount / "subdir" / "inner").write_text("x")
    os.symlink("..data/gone", mount / "dangling")
    assert list_configs(mount) == ("default", "sliced")


def test_list_configs_in_a_plain_directory(tmp_path: Path) -> None:
    for name in ("zeta", "alpha", "mid"):
        (tmp_path / name).write_text("version: v1\n")
    os.symlink(tmp_path / "alpha", tmp_path / "link-to-alpha")
    assert list_configs(tmp_path) == ("alpha", "link-to-alpha", "mid", "zeta")


def test_list_configs_of_a_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No such file"):
        list_configs(tmp_path / "absent")


def test_listing_feeds_selection(tmp_path: Path) -> None:
    mount = configmap_mount(tmp_path / "cm", {"small": "version: v1\n"})
    got = select_config(list_configs(mount), "big", where=mount)
    assert (got.name, got.source) == ("small", "single")
    assert got.error == f'config "big" not found in {mount} (have: small)'


# ================================================================== the controller, on fake time
KEY = "nvidia.com/device-plugin.config"
STATE = "nvidia.com/device-plugin.config.state"
APPLIED = "nvidia.com/device-plugin.config.applied"


class FakeTime:
    """A clock and a sleep that only move when the test says so (:meth:`advance`)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), self._seq, fut))
        await fut

    @staticmethod
    async def settle() -> None:
        """Let every task run until it waits on something (a timer, a queue, an event)."""
        for _ in range(60):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move the clock forward, waking each sleeper at its own time, in order."""
        target = self.now + seconds
        await self.settle()
        while self._timers and self._timers[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._timers)
            if fut.done():  # a sleep that was cancelled (woken early by an event)
                continue
            self.now = deadline
            fut.set_result(None)
            await self.settle()
        self.now = target


class Log:
    """Records events as a structlog logger would emit them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.events.append(("info", event, kw))

    def warning(self, event: str, **kw: Any) -> None:
        self.events.append(("warning", event, kw))

    def error(self, event: str, **kw: Any) -> None:
        self.events.append(("error", event, kw))

    def of(self, name: str) -> list[dict[str, Any]]:
        return [kw for _, event, kw in self.events if event == name]


class FakeKube:
    """The node as :class:`gpunode.kube.client.Kube` shows it: a watch that starts with the node as it is
    (once the API answers) and yields it after every change; ``watch_errors`` are raised by the next
    watches (403 / 404), ``patch_errors`` by the next patches."""

    node_name = "node-1"
    timeout = 5.0

    def __init__(self, label: str | None = None, *, answers: bool = True) -> None:
        self.available: bool | None = None
        self.last_error = ""
        self.labels: dict[str, str] = {KEY: label} if label is not None else {}
        self.annotations: dict[str, str] = {}
        self.patches: list[dict[str, str | None]] = []
        self.watch_errors: list[Exception] = []
        self.patch_errors: list[Exception] = []
        self.watches = 0
        self._answers = asyncio.Event()
        if answers:
            self._answers.set()
        self._changes: asyncio.Queue[None] = asyncio.Queue()

    def node(self) -> NodeInfo:
        return NodeInfo(self.node_name, dict(self.labels), dict(self.annotations), False, "1")

    def away(self, error: str = "get nodes: no answer: ConnectError: connection refused") -> None:
        self._answers.clear()
        self.available, self.last_error = False, error

    def back(self) -> None:
        self._answers.set()

    def set_label(self, value: str | None) -> None:
        if value is None:
            self.labels.pop(KEY, None)
        else:
            self.labels[KEY] = value
        self._changes.put_nowait(None)

    async def watch_node(self) -> AsyncIterator[NodeInfo]:
        self.watches += 1
        if self.watch_errors:
            raise self.watch_errors.pop(0)
        await self._answers.wait()  # an outage is retried inside the client, never raised
        self.available, self.last_error = True, ""
        yield self.node()
        while True:
            await self._changes.get()
            yield self.node()

    async def patch_node(self, *, annotations: Mapping[str, str | None] | None = None) -> NodeInfo:
        if self.patch_errors:
            raise self.patch_errors.pop(0)
        patch = dict(annotations or {})
        self.patches.append(patch)
        for k, v in patch.items():
            if v is None:
                self.annotations.pop(k, None)
            else:
                self.annotations[k] = v
        return self.node()


def in_force(ctl: LabelConfig[str]) -> str | None:
    assert ctl.in_force is not None
    return ctl.in_force.name


def load_text(path: Path | None) -> str:
    """The loader of these tests: a file's text (no file: "built-in"); text starting "bad" is refused."""
    if path is None:
        return "built-in"
    text = path.read_text()
    if text.startswith("bad"):
        raise ConfigError(str(path), [f"sharing.timeSlicing: {text.strip()}"])
    return text


class World:
    """A config directory, the fake node, fake time, and an agent that records what it applies."""

    def __init__(self, root: Path, files: Mapping[str, str], label: str | None = None) -> None:
        self.dir = root / "configs"
        self.dir.mkdir()
        self.write(files)
        self.kube = FakeKube(label)
        self.time = FakeTime()
        self.log = Log()
        self.errors: list[str] = []
        self.applied: list[tuple[str, str | None]] = []  # (config, name)
        self.refuse: dict[str, str] = {}  # config text -> why the agent refuses it

    def write(self, files: Mapping[str, str]) -> None:
        for entry in self.dir.iterdir():
            if entry.name not in files:
                entry.unlink()
        for name, text in files.items():
            (self.dir / name).write_text(text)

    def controller(self, *, report: bool = True, **options: Any) -> LabelConfig[str]:
        return LabelConfig(
            LabelConfigOptions(self.dir, **options),
            load_text,
            kube=self.kube,  # type: ignore[arg-type]
            report=report,
            log=self.log,  # type: ignore[arg-type]
            count_error=self.errors.append,
            clock=self.time.clock,
            sleep=self.time.sleep,
        )

    async def apply(self, config: str, chosen: InForce) -> str | None:
        if config in self.refuse:
            return self.refuse[config]
        self.applied.append((config, chosen.name))
        return None

    async def start(self, ctl: LabelConfig[str]) -> str:
        """What an agent does at start: the label (the watch runs), the first config, taken."""
        await self.time.settle()
        waiting = asyncio.create_task(ctl.wait_for_label())
        while not waiting.done():
            await self.time.advance(0.05)
        loaded = await ctl.first()
        ctl.took(loaded.chosen, loaded.failure)
        return loaded.config

    @contextlib.asynccontextmanager
    async def live(self, ctl: LabelConfig[str]) -> AsyncIterator[None]:
        """The controller's tasks, as an agent runs them; each must still be running at the end."""
        tasks = [
            asyncio.create_task(ctl.watch_node()),
            asyncio.create_task(ctl.report_state()),
            asyncio.create_task(ctl.follow_changes(self.apply)),
        ]
        try:
            yield
            await self.time.advance(1.0)
            for task in tasks:
                assert not task.done(), task  # no crash, whatever happened
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


TWO = {"default": "plain", "sliced": "replicas: 4"}

# files, label, default config, fallbacks -> the config served, its name, its source, the state
START_CASES = [
    pytest.param(TWO, "sliced", None, NAMED_SINGLE, "replicas: 4", "sliced", "label", "applied", id="label"),
    pytest.param(
        {**TWO, "big": "replicas: 8"}, None, "big", NAMED_SINGLE, "replicas: 8", "big", "default-config",
        "applied", id="default-config",
    ),
    pytest.param(TWO, None, None, NAMED_SINGLE, "plain", "default", "named", "applied", id="named"),
    pytest.param({"solo": "s"}, None, None, NAMED_SINGLE, "s", "solo", "single", "applied", id="single"),
    pytest.param(TWO, None, None, ("empty",), "built-in", None, "empty", "applied", id="empty"),
    pytest.param(
        TWO, "nope", None, NAMED_SINGLE, "plain", "default", "named",
        'failed: config "nope" not found in {dir} (have: default, sliced)', id="missing-label-file",
    ),
    pytest.param(
        {"default": "plain", "sliced": "bad: replicas 1"}, "sliced", None, NAMED_SINGLE, "plain", "default",
        "named", "failed: {dir}/sliced: sharing.timeSlicing: bad: replicas 1", id="bad-label-file",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("files", "label", "default", "fallbacks", "served", "name", "source", "state"), START_CASES
)
async def test_the_first_config_follows_the_selection_chain(
    tmp_path: Path,
    files: dict[str, str],
    label: str | None,
    default: str | None,
    fallbacks: tuple[str, ...],
    served: str,
    name: str | None,
    source: str,
    state: str,
) -> None:
    w = World(tmp_path, files, label)
    ctl = w.controller(default_config=default, fallbacks=fallbacks)
    async with w.live(ctl):
        assert await w.start(ctl) == served
        await w.time.advance(1.0)
    assert ctl.in_force is not None
    assert (ctl.in_force.name, ctl.in_force.source) == (name, source)
    assert ctl.state == state.format(dir=w.dir)
    assert w.kube.annotations == {STATE: state.format(dir=w.dir), APPLIED: name or ""}
    assert w.applied == []  # the initial pass found nothing new to apply
    selected = w.log.of("config_selected")
    assert [(e["name"], e["source"], e["label"]) for e in selected] == [(name, source, label or "")]
    if "bad" in state:
        assert len(w.log.of("config_rejected")) == 1  # refused once, not again for the same content


async def test_nothing_usable_at_start_says_so_on_the_node_and_raises(tmp_path: Path) -> None:
    w = World(tmp_path, {"a": "x", "b": "bad"}, "b")
    ctl = w.controller()
    async with w.live(ctl):
        await w.time.settle()
        with pytest.raises(NoUsableConfig) as err:
            await ctl.first()
    assert "fallbacks named, single matched nothing" in err.value.reason
    assert err.value.reason.startswith(f"{w.dir}/b: sharing.timeSlicing: bad")
    assert w.kube.annotations[STATE].startswith(f"failed: {w.dir}/b: ")
    assert w.kube.annotations[APPLIED] == ""
    assert ctl.in_force is None
    assert "config-selection" in w.errors


async def test_label_change_applies_live_and_a_missing_file_keeps_the_config_in_force(
    tmp_path: Path,
) -> None:
    w = World(tmp_path, TWO)
    ctl = w.controller()
    async with w.live(ctl):
        await w.start(ctl)
        assert in_force(ctl) == "default"

        w.kube.set_label("sliced")
        await w.time.advance(0.05)
        assert w.applied == []  # still inside the quiet period
        await w.time.advance(0.1)
        assert w.applied == [("replicas: 4", "sliced")]
        assert w.log.of("node_label_changed")[-1] == {"label": KEY, "value": "sliced", "previous": ""}
        assert w.log.of("config_selected")[-1]["source"] == "label"
        await w.time.advance(0.5)
        assert w.kube.annotations == {STATE: "applied", APPLIED: "sliced"}

        w.kube.set_label("nope")  # names no file: keep what is in force, say why
        await w.time.advance(0.5)
        assert w.applied == [("replicas: 4", "sliced")]
        assert in_force(ctl) == "sliced"
        missing = f'config "nope" not found in {w.dir} (have: default, sliced)'
        assert w.kube.annotations == {STATE: f"failed: {missing}", APPLIED: "sliced"}
        assert [e["reason"] for e in w.log.of("config_selection_failed")] == [missing]

        w.write({"default": "plain", "sliced": "replicas: 2"})  # the config in force still follows its file
        ctl.changed()
        await w.time.advance(0.5)
        assert w.applied[-1] == ("replicas: 2", "sliced")
        assert w.log.of("config_selected")[-1]["kept"]
        assert w.kube.annotations[STATE] == f"failed: {missing}"

        w.write({"default": "plain", "sliced": "replicas: 2", "nope": "replicas: 9"})  # the file appears
        ctl.changed()
        await w.time.advance(0.5)
        assert w.applied[-1] == ("replicas: 9", "nope")
        assert w.kube.annotations == {STATE: "applied", APPLIED: "nope"}

        w.write({"default": "plain"})  # the file in force is deleted: nothing else to take, keep it
        ctl.changed()
        await w.time.advance(0.5)
        assert in_force(ctl) == "nope"
        assert w.kube.annotations[STATE] == (
            f'failed: config "nope" not found in {w.dir} (have: default); '
            f"{w.dir}/nope: cannot read: No such file or directory"
        )
        assert w.kube.annotations[APPLIED] == "nope"

        w.kube.set_label(None)  # label removed: back to the default chain
        await w.time.advance(0.5)
        assert w.applied[-1] == ("plain", "default")
        assert w.kube.annotations == {STATE: "applied", APPLIED: "default"}
    # every change written once, nothing written twice
    states = [p.get(STATE) for p in w.kube.patches]
    assert all(a != b for a, b in itertools.pairwise(states))


async def test_a_bad_file_keeps_the_last_good_config_and_says_why(tmp_path: Path) -> None:
    w = World(tmp_path, TWO, "sliced")
    ctl = w.controller()
    async with w.live(ctl):
        await w.start(ctl)
        w.write({"default": "plain", "sliced": "bad: replicas 0"})
        ctl.changed()
        await w.time.advance(0.5)
        assert w.applied == []  # last good stays
        assert in_force(ctl) == "sliced"
        reason = f"{w.dir}/sliced: sharing.timeSlicing: bad: replicas 0"
        assert w.kube.annotations == {STATE: f"failed: {reason}", APPLIED: "sliced"}
        assert len(w.log.of("config_rejected")) == 1
        assert w.log.of("config_rejected")[0]["keeping"] == "the config in force (sliced)"
        assert w.errors.count("config") == 1

        ctl.changed()  # another event, same content: not refused again
        await w.time.advance(0.5)
        assert len(w.log.of("config_rejected")) == 1

        w.refuse["replicas: 3"] = "resources: nvidia.com/gpu: no device matched"  # the agent says no
        w.write({"default": "plain", "sliced": "replicas: 3"})
        ctl.changed()
        await w.time.advance(0.5)
        assert w.applied == []
        assert w.kube.annotations[STATE] == (
            f"failed: {w.dir}/sliced: resources: nvidia.com/gpu: no device matched"
        )

        w.write({"default": "plain", "sliced": "replicas: 5"})  # fixed
        ctl.changed()
        await w.time.advance(0.5)
        assert w.applied == [("replicas: 5", "sliced")]
        assert w.kube.annotations == {STATE: "applied", APPLIED: "sliced"}

        await ctl.reload(w.apply)  # SIGHUP: read again and apply, though nothing changed
        assert w.applied == [("replicas: 5", "sliced")] * 2


async def test_an_unlistable_directory_keeps_the_config_in_force(tmp_path: Path) -> None:
    w = World(tmp_path, TWO)
    ctl = w.controller()
    async with w.live(ctl):
        await w.start(ctl)
        w.dir.rename(tmp_path / "gone")
        ctl.changed()
        await w.time.advance(0.5)
        assert in_force(ctl) == "default"
        assert w.kube.annotations[STATE].startswith(f"failed: cannot list {w.dir}: ")
        assert w.kube.annotations[APPLIED] == "default"
        (tmp_path / "gone").rename(w.dir)
        ctl.changed()
        await w.time.advance(0.5)
        assert w.kube.annotations[STATE] == "applied"
        assert w.applied == []  # same file, same content: nothing to apply


async def test_an_api_outage_is_retried_with_backoff_without_a_crash(tmp_path: Path) -> None:
    w = World(tmp_path, TWO, "sliced")
    forbidden = KubeForbidden("watch", "nodes", "no")
    w.kube.watch_errors = [forbidden, forbidden, forbidden]
    w.kube.patch_errors = [KubeUnavailable("patch", "nodes", "timed out")] * 2
    ctl = w.controller(first_label_wait=10.0)
    async with w.live(ctl):
        await w.time.settle()
        assert ctl.kube_check() == (False, str(forbidden))
        waiting = asyncio.create_task(ctl.wait_for_label())
        await w.time.advance(1.2)  # the watch fails: the wait gives up after a second
        assert waiting.done()
        assert w.log.of("node_label_unknown")[0]["error"] == str(forbidden)
        loaded = await ctl.first()  # the default chain meanwhile
        ctl.took(loaded.chosen, loaded.failure)
        assert loaded.chosen.name == "default"

        await w.time.advance(5.0)  # retried at 0.5, 1, 2 s: then the label applies
        assert [e["retry_in_s"] for e in w.log.of("node_watch_failed")] == [0.5, 1.0, 2.0]
        assert w.kube.watches == 4
        assert w.errors.count("kube") >= 3
        assert w.applied == [("replicas: 4", "sliced")]
        assert ctl.kube_check() == (True, "node node-1")
        # the node's annotations: two failed patches, retried with backoff, then written once
        assert [e["retry_in_s"] for e in w.log.of("config_state_not_reported")] == [0.5, 1.0]
        assert w.kube.annotations == {STATE: "applied", APPLIED: "sliced"}


FIRST_LABEL_CASES = [
    # how the API server behaves, the wait configured -> when the wait ends, the config served
    pytest.param("answers", None, 0.0, "sliced", id="label-at-once"),
    pytest.param("late", None, 2.0, "sliced", id="label-after-2s"),
    pytest.param("away", None, 1.0, "default", id="api-away-gives-up-after-1s"),
    pytest.param("silent", 4.0, 4.0, "default", id="no-answer-times-out"),
    pytest.param("silent", None, 10.0, "default", id="default-wait-twice-the-api-timeout"),
]


@pytest.mark.parametrize(("api", "wait", "ends", "served"), FIRST_LABEL_CASES)
async def test_first_label_wait(
    tmp_path: Path, api: str, wait: float | None, ends: float, served: str
) -> None:
    w = World(tmp_path, TWO, "sliced")
    if api == "away":
        w.kube.away()
    elif api in ("late", "silent"):
        w.kube._answers.clear()  # not answered yet, no error known either
    ctl = w.controller(first_label_wait=wait)
    async with w.live(ctl):
        waiting = asyncio.create_task(ctl.wait_for_label())
        if api == "late":
            await w.time.advance(2.0)
            assert not waiting.done()
            w.kube.back()
        if ends - w.time.now > 0.1:
            await w.time.advance(ends - w.time.now - 0.1)
            assert not waiting.done()
        await w.time.advance(0.15)
        assert waiting.done()
        loaded = await ctl.first()
        ctl.took(loaded.chosen, loaded.failure)
        assert loaded.chosen.name == served
        unknown = w.log.of("node_label_unknown")
        assert bool(unknown) is (served == "default")
        if api == "away":
            assert unknown[0]["error"] == w.kube.last_error
        elif api == "silent":
            assert unknown[0]["error"] == f"no answer within {ends:g}s"
        if api != "answers" and served == "default":  # the label applies once the API answers
            w.kube.back()
            await w.time.advance(0.5)
            assert w.applied == [("replicas: 4", "sliced")]
            assert not w.log.of("node_label_changed")  # the first label known is no change


async def test_first_label_wait_can_run_its_own_watch(tmp_path: Path) -> None:
    """A caller that starts its node watch later (feature discovery) or never (one-shot)."""
    w = World(tmp_path, TWO, "sliced")
    ctl = w.controller(report=False)
    waiting = asyncio.create_task(ctl.wait_for_label(run_watch=True))
    await w.time.advance(0.1)
    assert waiting.done()
    assert ctl.label == "sliced"
    loaded = await ctl.first()
    ctl.took(loaded.chosen, loaded.failure)
    assert loaded.config == "replicas: 4"
    assert ctl.state == "applied"
    assert w.kube.patches == []  # not reporting: the node is never written
    assert not w.log.of("config_state")


def test_a_controller_needs_no_kubernetes_client() -> None:
    code = (
        "import sys, gpunode.kube.labelconfig\n"
        "heavy = ('lightkube', 'httpx2', 'pydantic', 'yaml')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout

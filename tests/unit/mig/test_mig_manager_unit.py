"""The MIG manager's decisions, parsing and host-client rules, and its reconfigure sequence with fakes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpunode.api.mig_config import MigEntry, MigSpec
from gpunode.mig.apply import ApplyReport, MigError, RebootRequired
from gpunode.mig.bare_metal import StateFile, parse_selected_config
from gpunode.mig.clients import (
    ClientsError,
    HostClients,
    SystemctlCommand,
    UnitStatus,
    client_action,
    parse_show,
    systemctl_prefix,
)
from gpunode.mig.decisions import AFTER_REBOOT, Decision, decide, one_line, unknown_config_reason
from gpunode.mig.manager import MigManager
from gpunode.mig.notify import find_agents
from gpunode.mig.options import ManagerOptions, build_options
from gpunode.mig.plan import GpuPlan, Infeasible, NodePlan
from helpers.waiting import until

CONFIGS = ("all-disabled", "all-balanced", "impossible")


# -- decide --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "facts", "expected"),
    [
        pytest.param(None, {}, Decision("nothing"), id="label-absent"),
        pytest.param("", {}, Decision("nothing"), id="label-empty"),
        pytest.param(
            "nope",
            {},
            Decision(
                "failed", 'unknown MIG config "nope"; the configs are: all-disabled, all-balanced, impossible'
            ),
            id="unknown-name",
        ),
        pytest.param(
            "impossible",
            {"plan_error": "GPU 2 (A100): no room"},
            Decision("failed", "GPU 2 (A100): no room"),
            id="infeasible",
        ),
        pytest.param("all-balanced", {"applied": True}, Decision("success"), id="already-applied"),
        pytest.param(
            "all-balanced",
            {"applied": True, "previous_state": "rebooting"},
            Decision("success"),
            id="applied-after-reboot",
        ),
        pytest.param("all-balanced", {"applied": False}, Decision("apply"), id="devices-only"),
        pytest.param(
            "all-balanced",
            {"applied": False, "mode_change": True},
            Decision("apply", mode_change=True),
            id="mode-change",
        ),
        pytest.param(
            "all-balanced",
            {"applied": False, "mode_change": True, "previous_state": "rebooting"},
            Decision("failed", AFTER_REBOOT, mode_change=True),
            id="mode-still-pending-after-reboot",
        ),
        pytest.param(
            "all-balanced",
            {"applied": False, "mode_change": False, "previous_state": "rebooting"},
            Decision("apply"),
            id="rebooted-mode-done-devices-left",
        ),
        pytest.param(
            "all-balanced",
            {"applied": False, "previous_state": "failed"},
            Decision("apply"),
            id="retry-after-failure",
        ),
    ],
)
def test_decide(name: str | None, facts: dict[str, Any], expected: Decision) -> None:
    assert decide(name, CONFIGS, **facts) == expected


def test_one_line_reason_is_one_line_and_bounded() -> None:
    assert one_line("a\n  b\tc ") == "a b c"
    long = one_line("x" * 5000)
    assert len(long) == 1000
    assert long.endswith("...")
    assert unknown_config_reason("x", ["a", "b"]) == 'unknown MIG config "x"; the configs are: a, b'


# -- the selected-config file ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("all-balanced\n", "all-balanced", id="bare-name"),
        pytest.param("  all-1g.5gb  ", "all-1g.5gb", id="spaces"),
        pytest.param('"all-1g.5gb"\n', "all-1g.5gb", id="quoted"),
        pytest.param("", None, id="empty"),
        pytest.param("\n# a comment\n\n", None, id="only-comments"),
        pytest.param("MIG_PARTED_SELECTED_CONFIG=all-2g.10gb\n", "all-2g.10gb", id="assignment"),
        pytest.param(
            '[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=all-3g.20gb"\n',
            "all-3g.20gb",
            id="nvidia-override",
        ),
        pytest.param(
            "[Service]\nEnvironment=MIG_PARTED_SELECTED_CONFIG=a\nEnvironment=MIG_PARTED_SELECTED_CONFIG=b\n",
            "b",
            id="last-assignment-wins",
        ),
        pytest.param("export MIG_PARTED_SELECTED_CONFIG='all-disabled'\n", "all-disabled", id="shell-export"),
        pytest.param("OTHER=1\nall-balanced\n", "all-balanced", id="other-vars-ignored"),
        pytest.param("# all-disabled\nall-balanced\n", "all-balanced", id="commented-name"),
        pytest.param("MIG_PARTED_SELECTED_CONFIG=\n", None, id="assigned-empty"),
    ],
)
def test_parse_selected_config(text: str, expected: str | None) -> None:
    assert parse_selected_config(text) == expected


# -- host GPU clients: the rules -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "action"),
    [
        pytest.param(UnitStatus("a", active_state="active"), "stop", id="active"),
        pytest.param(UnitStatus("a", active_state="activating"), "stop", id="activating"),
        pytest.param(
            UnitStatus("a", load_state="not-found", active_state="inactive"), "skip", id="not-found"
        ),
        pytest.param(UnitStatus("a", active_state="failed"), "restart", id="failed"),
        pytest.param(
            UnitStatus("a", active_state="failed", unit_file_state="disabled"),
            "restart",
            id="failed-disabled",
        ),
        pytest.param(UnitStatus("a", unit_file_state="disabled"), "skip", id="disabled"),
        pytest.param(UnitStatus("a", unit_file_state="masked"), "skip", id="masked"),
        pytest.param(UnitStatus("a", type="oneshot"), "skip", id="inactive-oneshot"),
        pytest.param(UnitStatus("a", type="oneshot", active_state="active"), "stop", id="active-oneshot"),
        pytest.param(UnitStatus("a"), "restart", id="inactive"),
        pytest.param(UnitStatus("a", unit_file_state="static"), "restart", id="inactive-static"),
    ],
)
def test_client_action(status: UnitStatus, action: str) -> None:
    assert client_action(status)[0] == action


def test_parse_show() -> None:
    text = "Type=oneshot\nLoadState=loaded\nActiveState=inactive\nUnitFileState=enabled\n"
    assert parse_show("x.service", text) == UnitStatus(
        "x.service", "loaded", "inactive", "enabled", "oneshot"
    )
    assert parse_show("gone.service", "LoadState=not-found\n").load_state == "not-found"


def test_systemctl_prefix() -> None:
    assert systemctl_prefix("/") == ("systemctl",)
    assert systemctl_prefix("/host") == ("chroot", "/host", "systemctl")


class FakeSystemctl:
    def __init__(self, units: dict[str, UnitStatus], *, fail: Sequence[str] = ()) -> None:
        self.units = units
        self.fail = set(fail)  # "stop x" / "start x"
        self.calls: list[str] = []

    async def status(self, unit: str) -> UnitStatus:
        self.calls.append(f"show {unit}")
        return self.units.get(unit, UnitStatus(unit, load_state="not-found"))

    async def stop(self, unit: str, timeout: float) -> None:
        self.calls.append(f"stop {unit}")
        if f"stop {unit}" in self.fail:
            raise ClientsError(f"systemctl stop {unit}: exit 1: boom")

    async def start(self, unit: str, timeout: float) -> None:
        self.calls.append(f"start {unit}")
        if f"start {unit}" in self.fail:
            raise ClientsError(f"systemctl start {unit}: exit 1: boom")


UNITS = {
    "persistenced": UnitStatus("persistenced", active_state="active"),
    "dcgm": UnitStatus("dcgm", active_state="failed"),
    "gone": UnitStatus("gone", load_state="not-found"),
    "off": UnitStatus("off", unit_file_state="disabled"),
    "setup": UnitStatus("setup", type="oneshot"),
    "idle": UnitStatus("idle"),
    "fm": UnitStatus("fm", active_state="active"),
    "kubelet": UnitStatus("kubelet", active_state="active"),
    "kubelet.service": UnitStatus("kubelet.service", active_state="active"),
}


async def test_clients_stopped_then_restarted_in_reverse_order() -> None:
    fake = FakeSystemctl(UNITS)
    clients = HostClients(fake, ["persistenced", "dcgm", "gone", "off", "setup", "idle", "fm"])
    async with clients.stopped(["kubelet"]) as ctx:
        assert ctx.stopped == ["persistenced", "fm", "kubelet"]
        assert [c for c in fake.calls if not c.startswith("show")] == [
            "stop persistenced",
            "stop fm",
            "stop kubelet",
        ]
        fake.calls.clear()
    assert fake.calls == ["start kubelet", "start fm", "start idle", "start dcgm", "start persistenced"]


async def test_clients_restarted_when_the_change_fails() -> None:
    fake = FakeSystemctl(UNITS)
    with pytest.raises(MigError):
        async with HostClients(fake, ["persistenced", "fm"]).stopped():
            raise MigError("apply failed")
    assert fake.calls[-2:] == ["start fm", "start persistenced"]


async def test_a_failing_stop_restarts_what_was_stopped_and_raises() -> None:
    fake = FakeSystemctl(UNITS, fail=["stop fm"])
    with pytest.raises(ClientsError, match="stop fm"):
        async with HostClients(fake, ["persistenced", "fm", "idle"]).stopped():
            pytest.fail("the body must not run")
    assert "show idle" not in fake.calls
    assert fake.calls[-2:] == ["start fm", "start persistenced"]


async def test_a_failing_restart_is_an_error_after_trying_every_service() -> None:
    fake = FakeSystemctl(UNITS, fail=["start fm"])
    with pytest.raises(ClientsError, match="not started again: systemctl start fm"):
        async with HostClients(fake, ["persistenced", "fm"]).stopped():
            pass
    assert fake.calls[-2:] == ["start fm", "start persistenced"]


async def test_clients_restarted_when_cancelled() -> None:
    fake = FakeSystemctl(UNITS)
    entered = asyncio.Event()

    async def change() -> None:
        async with HostClients(fake, ["persistenced"]).stopped():
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(change())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.calls[-1] == "start persistenced"


async def test_systemctl_command_against_a_fake_systemctl(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    script = tmp_path / "systemctl"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            echo "$@" >> {log}
            for unit; do :; done
            case "$1 $unit" in
              "show dcgm.service") printf 'LoadState=loaded\\nActiveState=active\\nType=simple\\n';;
              "show gone.service") printf 'LoadState=not-found\\nActiveState=inactive\\n';;
              "stop dcgm.service") exit 0;;
              "start dcgm.service") echo "Job for dcgm.service failed" >&2; exit 1;;
              *) exit 4;;
            esac
            """
        )
    )
    script.chmod(0o755)
    ctl = SystemctlCommand([str(script)])
    assert (await ctl.status("dcgm.service")).active_state == "active"
    assert (await ctl.status("gone.service")).load_state == "not-found"
    await ctl.stop("dcgm.service", 5)
    with pytest.raises(ClientsError, match=r"Job for dcgm\.service failed"):
        await ctl.start("dcgm.service", 5)
    assert log.read_text().splitlines()[2:] == ["stop -- dcgm.service", "start -- dcgm.service"]
    assert (
        log.read_text().splitlines()[0]
        == "show --property=LoadState,ActiveState,UnitFileState,Type -- dcgm.service"
    )


@pytest.mark.parametrize("unit", ["--host=evil", "-M=x", "a b.service", "x=y"])
async def test_systemctl_command_refuses_an_option_for_a_unit(tmp_path: Path, unit: str) -> None:
    log = tmp_path / "calls"
    script = tmp_path / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    script.chmod(0o755)
    ctl = SystemctlCommand([str(script)])
    for call in (ctl.status(unit), ctl.stop(unit, 5), ctl.start(unit, 5)):
        with pytest.raises(ClientsError, match="refusing to run systemctl"):
            await call
    assert not log.exists()  # refused before any systemctl ran


# -- the reconfigure sequence, with fakes -----------------------------------------------------------------
def spec_of(*names: str) -> MigSpec:
    entry = MigEntry("mig-configs.x[0]", "all", (), True, {"1g.5gb": 7})
    return MigSpec("test.yaml", {n: (entry,) for n in names})


MODE_PLAN = NodePlan((GpuPlan(0, set_mode=True),))
DEVICE_PLAN = NodePlan((GpuPlan(0, destroy=((1, None),)),))


class FakeApplier:
    def __init__(
        self,
        *,
        events: list[str],
        applied: bool = False,
        mode: bool = False,
        check_error: Exception | None = None,
        apply_error: Exception | None = None,
    ) -> None:
        self.applied, self.mode, self.check_error, self.apply_error = applied, mode, check_error, apply_error
        self.events = events

    async def check(self, name: str, entries: Sequence[MigEntry], *, mode_only: bool = False) -> NodePlan:
        if self.check_error is not None:
            raise self.check_error
        if self.applied:
            return NodePlan()
        if mode_only:
            return MODE_PLAN if self.mode else NodePlan()
        return MODE_PLAN if self.mode else DEVICE_PLAN

    async def apply(self, name: str, entries: Sequence[MigEntry], **kw: Any) -> ApplyReport:
        self.events.append(f"apply {name}")
        if self.apply_error is not None:
            raise self.apply_error
        return ApplyReport(changed=True)


class FakeSink:
    def __init__(self, events: list[str], previous: str | None = None, fail_on: str | None = None) -> None:
        self.events, self.prev, self.fail_on = events, previous, fail_on

    async def previous(self) -> str | None:
        return self.prev

    async def set(self, state: str, reason: str, config: str) -> None:
        if state == self.fail_on:
            raise ConnectionError("API server away")
        self.events.append(f"state {state}" + (f": {reason}" if reason else ""))
        self.prev = state


class FakeGate:
    def __init__(self, events: list[str], error: Exception | None = None) -> None:
        self.events, self.error = events, error

    @contextlib.asynccontextmanager
    async def paused(self, timeout: float) -> AsyncIterator[None]:
        self.events.append("pause")
        try:
            if self.error is not None:
                raise self.error
            yield None
        finally:
            self.events.append("restore")


def manager(
    events: list[str],
    applier: FakeApplier,
    *,
    previous: str | None = None,
    sink_fails_on: str | None = None,
    gate_error: Exception | None = None,
    with_reboot: bool = False,
    clients: bool = False,
) -> MigManager:
    opts = ManagerOptions(
        with_reboot=with_reboot, with_shutdown_host_gpu_clients=clients, host_clients_settle=0.0
    )
    host = HostClients(FakeSystemctl(UNITS), ["persistenced"]) if clients else None

    async def reboot() -> None:
        events.append("reboot")

    def notify() -> None:
        events.append("notify")

    return MigManager(
        opts,
        spec=spec_of(*CONFIGS),
        make_applier=lambda name: applier,
        sink=FakeSink(events, previous, sink_fails_on),
        gate=FakeGate(events, gate_error),
        clients=host,
        reboot=reboot,
        notify=notify,
    )


CASES: list[Any] = [
    pytest.param("", {}, {}, "unset", [], id="unset"),
    pytest.param(
        "nope",
        {},
        {},
        "failed",
        ['state failed: unknown MIG config "nope"; the configs are: all-disabled, all-balanced, impossible'],
        id="unknown",
    ),
    pytest.param("all-balanced", {"applied": True}, {}, "success", ["state success"], id="in-place"),
    pytest.param(
        "impossible",
        {"check_error": Infeasible(2, "A100", "3g.20gb x3 does not fit")},
        {},
        "failed",
        ["state failed: GPU 2 (A100): 3g.20gb x3 does not fit"],
        id="infeasible-nothing-paused",
    ),
    pytest.param(
        "all-balanced",
        {},
        {},
        "success",
        ["state pending", "pause", "apply all-balanced", "restore", "state success", "notify"],
        id="applied",
    ),
    pytest.param(
        "all-balanced",
        {"apply_error": MigError("GPU 3: create failed")},
        {},
        "failed",
        ["state pending", "pause", "apply all-balanced", "restore", "state failed: GPU 3: create failed"],
        id="apply-fails",
    ),
    pytest.param(
        "all-balanced",
        {},
        {"gate_error": RuntimeError("1 operand pod(s) still running after 3 s: ns/p")},
        "failed",
        [
            "state pending",
            "pause",
            "restore",
            "state failed: RuntimeError: 1 operand pod(s) still running after 3 s: ns/p",
        ],
        id="operands-stay",
    ),
    pytest.param(
        "all-balanced",
        {"mode": True, "apply_error": RebootRequired("GPU 0: reset refused")},
        {},
        "failed",
        [
            "state pending",
            "pause",
            "apply all-balanced",
            "restore",
            "state failed: GPU 0: reset refused (set WITH_REBOOT=true to let the manager reboot the node)",
        ],
        id="reboot-needed-not-allowed",
    ),
    pytest.param(
        "all-balanced",
        {"mode": True, "apply_error": RebootRequired("GPU 0: reset refused")},
        {"with_reboot": True},
        "rebooting",
        [
            "state pending",
            "pause",
            "apply all-balanced",
            "restore",
            "state rebooting: GPU 0: reset refused",
            "reboot",
        ],
        id="reboot",
    ),
    pytest.param(
        "all-balanced",
        {"mode": True, "apply_error": RebootRequired("GPU 0: reset refused")},
        {"with_reboot": True, "sink_fails_on": "rebooting"},
        "failed",
        [
            "state pending",
            "pause",
            "apply all-balanced",
            "restore",
            "state failed: GPU 0: reset refused; not rebooting: could not record state rebooting: "
            "API server away",
        ],
        id="reboot-state-not-written-no-reboot",
    ),
    pytest.param(
        "all-balanced",
        {"mode": True},
        {"previous": "rebooting", "with_reboot": True},
        "failed",
        [f"state failed: {AFTER_REBOOT}"],
        id="no-reboot-loop",
    ),
    pytest.param(
        "all-balanced",
        {},
        {"sink_fails_on": "pending"},
        "failed",
        ["state failed: could not record state pending: API server away"],
        id="pending-not-written-nothing-touched",
    ),
]


@pytest.mark.parametrize(("name", "applier_kw", "manager_kw", "outcome", "expected"), CASES)
async def test_reconfigure_sequence(
    name: str, applier_kw: dict[str, Any], manager_kw: dict[str, Any], outcome: str, expected: list[str]
) -> None:
    events: list[str] = []
    m = manager(events, FakeApplier(events=events, **applier_kw), **manager_kw)
    assert await m.reconfigure(name, "label") == outcome
    assert events == expected


async def test_mode_change_stops_the_kubelet_too_and_restarts_everything_before_restoring() -> None:
    events: list[str] = []
    m = manager(events, FakeApplier(events=events, mode=True), clients=True)
    assert m.clients is not None
    fake = m.clients.systemctl
    assert isinstance(fake, FakeSystemctl)
    assert await m.reconfigure("all-balanced") == "success"
    assert [c for c in fake.calls if not c.startswith("show")] == [
        "stop persistenced",
        "stop kubelet.service",
        "start kubelet.service",
        "start persistenced",
    ]


async def test_devices_only_change_leaves_the_kubelet_alone() -> None:
    events: list[str] = []
    m = manager(events, FakeApplier(events=events), clients=True)
    assert await m.reconfigure("all-balanced") == "success"
    assert m.clients is not None
    assert isinstance(m.clients.systemctl, FakeSystemctl)
    assert "show kubelet.service" not in m.clients.systemctl.calls


async def test_reassert_is_quiet_when_in_place_and_retries_a_failure() -> None:
    events: list[str] = []
    applier = FakeApplier(events=events, applied=True)
    m = manager(events, applier, previous="success")
    assert await m.reconfigure("all-balanced", "reassert") == "unchanged"
    assert events == []
    m.sink = FakeSink(events, "failed")
    assert await m.reconfigure("all-balanced", "reassert") == "success"
    assert events == ["state success"]


async def test_worker_handles_new_names_and_forced_rehandles_only() -> None:
    handled: list[tuple[str | None, str]] = []
    events: list[str] = []
    m = manager(events, FakeApplier(events=events, applied=True))

    async def fake_handle(name: str | None, why: str = "label") -> Any:
        handled.append((name, why))
        return "success"

    async def taken() -> None:
        """Until the worker has taken the trigger: it clears its wake-up, then decides without waiting."""
        await until(lambda: not m._wake.is_set())

    m.handle = fake_handle  # type: ignore[method-assign]
    worker = asyncio.create_task(m.worker())
    try:
        m.selected = "a"
        m.trigger("start")
        await asyncio.wait_for(m.handled.wait(), 2)
        m.trigger("label")  # same name: nothing
        await taken()
        m.selected = "b"
        m.trigger("label")
        await taken()
        m.trigger("reassert")
        await taken()
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    assert handled == [("a", "start"), ("b", "label"), ("b", "reassert")]


async def test_state_file_and_the_reboot_marker(tmp_path: Path) -> None:
    sink = StateFile(tmp_path / "run" / "state.json", tmp_path / "lib" / "reboot-pending.json")
    assert await sink.previous() is None
    await sink.set("rebooting", "GPU 0: reset refused", "all-balanced")
    (tmp_path / "run" / "state.json").unlink()  # a reboot empties /run
    assert await sink.previous() == "rebooting"
    await sink.set("pending", "", "all-balanced")
    assert await sink.previous() == "rebooting"  # still in the same attempt
    await sink.set("failed", AFTER_REBOOT, "all-balanced")
    assert await sink.previous() == "failed"
    doc = sink.read()
    assert doc["state"] == "failed"
    assert doc["reason"] == AFTER_REBOOT
    assert doc["config"] == "all-balanced"
    assert doc["time"].endswith("Z")


# -- options and agents -----------------------------------------------------------------------------------
def test_build_options_bare_metal_defaults_to_the_root_filesystem(tmp_path: Path) -> None:
    from gpunode.mig.manager_cli import SPEC

    flags = SPEC.parser()
    s = flags.parse(["--selected-config-file", str(tmp_path / "sel")], {})
    opts = build_options(s.settings, s.sources, {})
    assert opts.reboot_command == ("reboot",)
    assert opts.host_root_mount == "/"
    assert opts.reboot_marker == Path("/var/lib/gpunode/mig/reboot-pending.json")
    s = flags.parse(["--node-name", "n"], {"HOST_ROOT_MOUNT": "/host"})
    opts = build_options(s.settings, s.sources, {})
    assert opts.reboot_command == ("chroot", "/host", "reboot")
    assert opts.selected_config_file is None
    assert opts.operand_timeout == 300.0
    assert opts.reassert_interval == 300.0
    assert opts.http_port == 9453


def test_find_agents_sees_console_scripts_started_through_their_interpreter(tmp_path: Path) -> None:
    name = f"fake-agent-{os.getpid()}"
    script = tmp_path / name
    script.write_text("import time\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        assert proc.pid in find_agents([name])
        assert proc.pid not in find_agents(["gpunode-something-else"])
    finally:
        proc.kill()
        proc.wait()


async def test_worker_retries_when_the_state_could_not_be_read() -> None:
    outcomes = ["deferred", "success"]
    handled: list[str] = []
    events: list[str] = []
    m = manager(events, FakeApplier(events=events))

    async def fake_handle(name: str | None, why: str = "label") -> Any:
        handled.append(why)
        return outcomes.pop(0)

    async def no_sleep(seconds: float) -> None:
        await asyncio.sleep(0)

    m.handle = fake_handle  # type: ignore[method-assign]
    m.sleep = no_sleep
    worker = asyncio.create_task(m.worker())
    try:
        m.selected = "a"
        m.trigger("start")
        for _ in range(100):
            if len(handled) == 2:
                break
            await asyncio.sleep(0.01)
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    assert handled == ["start", "retry"]

"""Soak: the device plugin under load and faults for minutes; leaks, drift and every mismatch with the node.

    .venv/bin/python benchmarks/soak.py                 # 10 minutes
    .venv/bin/python benchmarks/soak.py --minutes 3     # shorter
    .venv/bin/python benchmarks/soak.py --quick         # 2 minutes (a smoke run)
    .venv/bin/python benchmarks/soak.py --json          # machine-readable output on stdout

The plugin runs as a real, separate process (`gpunode-device-plugin --sim-state ... --mig-strategy mixed
--health-recovery-period 5s`) on the simulated `dgx-a100` preset: GPUs 0-5 in MIG mode (all-balanced at
start: two 1g.5gb, one 2g.10gb, one 3g.20gb each), GPUs 6-7 whole (`nvidia.com/gpu`). The fake kubelet (the
real Registration service, dialing back and keeping a ListAndWatch stream per resource) and the load live
in this process. What runs at once, from start to end (issue 14, item 9):

* load: Allocate (one Healthy ID) and GetPreferredAllocation (every Healthy ID, size 2) at 50/s each,
  round-robin over the resources the kubelet holds, each call timed;
* a fault every 3 s, GPU by GPU (0, 1, ... 7, 0, ...), alternating a recoverable fatal XID (32, 61, 62,
  69, 8) with a lost GPU (`lose`, the GPU restored 3 s later, one GPU lost at a time): every GPU rests
  24 s between its faults;
* a kubelet restart every 15 s (`FakeKubelet.restart()`: sockets wiped, kubelet.sock created anew);
* a MIG layout change every 60 s (the first after 30 s) on GPUs 0-5 by a bare `gpunode-mig apply` (no
  MIG manager pausing the agents), cycling through four layouts, each made while GPU 6 or 7 is lost
  (the issue's case; the change waits up to 48 s for the fault schedule to lose one, and that GPU stays
  lost until the kubelet holds the new layout);
* every 5 s: the plugin's RSS, open fds and threads.

Checks, each a mismatch when it fails (0 is the target):

* after a fault: every device of that GPU Unhealthy in the kubelet within 5 s;
* before a GPU's next fault: every device of it Healthy again once the hold-down (5 s) and four probe
  intervals are over since its XID or its restore (recovery happened);
* after each fault and each kubelet restart has settled (no layout change under way): the kubelet holds
  exactly the node's devices per resource, the devices of lost GPUs Unhealthy (converging within 5 s);
* a kubelet restart: every resource registered again and listed within 10 s;
* a layout change: the kubelet holds the node's devices within 15 s of `gpunode-mig apply` ending, and
  no resource ever lists a device set that is neither the old nor the new one (a half-applied layout).

Figures: RSS slope (least squares over the samples after the first minute, MB per minute), fds and
threads first/last/max, latency drift (p99 of the first and of the last minute), fault-to-Unhealthy and
recovery times, re-registration times, layout convergence. A report, not a test: it exits 0 unless
something crashes; the verdict line says whether every check held.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from benchlib import load_average, machine_base, percentile
from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb

if TYPE_CHECKING:
    from gpunode.sim.kubelet import FakeKubelet

PRESET = "dgx-a100"
MIG_GPUS = (0, 1, 2, 3, 4, 5)
WHOLE_GPUS = (6, 7)
GPUS = 8
GPU = "nvidia.com/gpu"
RECOVERY_S = 5.0  # --health-recovery-period
PROBE_S = 1.0  # the plugin probes every RECOVERY_S / 5
RECOVERABLE_XIDS = (32, 61, 62, 69, 8)  # fatal under the default policy, no reset needed
RATE = 50.0  # calls per second, per method
FAULT_EVERY = 3.0
RESTART_EVERY = 15.0
MIG_EVERY = 60.0
MIG_FIRST = 30.0
SAMPLE_EVERY = 5.0
UNHEALTHY_WITHIN = 5.0
SETTLE_WITHIN = 5.0
REGISTER_WITHIN = 10.0
MIG_WITHIN = 15.0

LAYOUTS = {
    "balanced": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
    "all-1g": {"1g.5gb": 7},
    "all-3g": {"3g.20gb": 2},
    "all-2g": {"2g.10gb": 3},
}
CYCLE = ("all-1g", "all-3g", "all-2g", "balanced")  # the node starts balanced
GI_ENUM_OF = {"1g.5gb": 0, "2g.10gb": 1, "3g.20gb": 2}  # NVML's GPU-instance profile enums (gpunode.nvml.mig)

REPO = Path(__file__).resolve().parent.parent


def layouts_yaml() -> str:
    gpus = ", ".join(map(str, MIG_GPUS))
    lines = ["version: v1", "mig-configs:"]
    for name, devices in LAYOUTS.items():
        spec = ", ".join(f'"{p}": {n}' for p, n in devices.items())
        lines += [
            f"  {name}:",
            f"    - devices: [{gpus}]",
            "      mig-enabled: true",
            f"      mig-devices: {{{spec}}}",
        ]
    return "\n".join(lines) + "\n"


def executable(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    return str(beside if beside.exists() else REPO / ".venv/bin" / name)


# -- the node's own view ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeView:
    resources: dict[str, frozenset[str]]  # what the plugin should advertise (mixed strategy)
    per_gpu: dict[int, frozenset[str]]  # the advertised IDs on each GPU
    lost: frozenset[int]


def prepare_node(state: Path) -> None:
    """dgx-a100 with GPUs 0-5 in MIG mode, all-balanced; GPUs 6-7 whole."""
    from gpunode.nvml import mig
    from gpunode.sim import nvml as sim

    sim.init_state_file(state, PRESET, force=True)
    with sim.SimNode.open(state).mutate() as st:
        for gpu in MIG_GPUS:
            assert st.set_mig_mode(gpu, 1)[0] == 0
            st.reset_gpu(gpu)
            for profile in ("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"):  # largest first, as the driver places
                enum = GI_ENUM_OF[profile]
                ret, gi = st.create_gi(gpu, enum, None)
                assert ret == 0, (gpu, profile, ret)
                slices = mig.GI_ENUMS[enum][0]
                ci = next(e for e, c in mig.CI_ENUMS.items() if c == slices)
                assert st.create_ci(gpu, gi, ci, None)[0] == 0


def read_node(state: Path) -> NodeView:
    from gpunode.nvml import mig
    from gpunode.sim import nvml as sim

    st = sim.SimNode.open(state).state
    resources: dict[str, set[str]] = defaultdict(set)
    per_gpu: dict[int, set[str]] = defaultdict(set)
    for gpu, g in enumerate(st.gpus):
        if g.mig_current != 1:
            resources[GPU].add(st.gpu_uuid(gpu))
            per_gpu[gpu].add(st.gpu_uuid(gpu))
            continue
        product = st.product(gpu)
        for gi, ci in st.mig_devices(gpu):
            spec = product.gi_profile(gi.profile)
            assert spec is not None
            gi_name = mig.gi_profile_name(gi.profile, product.memory_mib << 20, spec.memory_mib)
            name = "nvidia.com/mig-" + mig.ci_profile_name(gi_name, ci.size).replace("+", ".")
            uuid = st.mig_uuid(gpu, gi.id, ci.id)
            resources[name].add(uuid)
            per_gpu[gpu].add(uuid)
    return NodeView(
        {k: frozenset(v) for k, v in resources.items()},
        {k: frozenset(v) for k, v in per_gpu.items()},
        frozenset(i for i, g in enumerate(st.gpus) if g.lost),
    )


def mutate(state: Path, op: str, gpu: int | None = None, xid: int = 0) -> None:
    """``lose``, ``restore`` (one GPU, or every fault with None) or ``xid`` on the shared node."""
    from gpunode.sim import nvml as sim

    with sim.SimNode.open(state).mutate() as st:
        if op == "xid" and gpu is not None:
            st.inject_xid(gpu, xid)
        elif op == "lose" and gpu is not None:
            st.lose(gpu)
        elif op == "restore":
            st.restore(gpu)


# -- the kubelet's view ----------------------------------------------------------------------------------
def held(kubelet: FakeKubelet) -> dict[str, frozenset[str]]:
    """The device IDs per resource the kubelet holds (a resource whose stream ended holds none)."""
    return {n: frozenset(p.devices) for n, p in kubelet.plugins.items() if not p.ended and p.devices}


def health_of(kubelet: FakeKubelet) -> dict[str, str]:
    return {i: h for p in kubelet.plugins.values() if not p.ended for i, h in p.devices.items()}


def counts(view: dict[str, frozenset[str]]) -> str:
    return ", ".join(f"{n.removeprefix('nvidia.com/')}={len(ids)}" for n, ids in sorted(view.items()))


def differences(kubelet: FakeKubelet, node: NodeView) -> str:
    """Why the kubelet does not hold what the node has, or ""."""
    got = held(kubelet)
    if got != node.resources:
        extra = sum(len(got.get(n, frozenset()) - ids) for n, ids in node.resources.items())
        extra += sum(len(ids) for n, ids in got.items() if n not in node.resources)
        missing = sum(len(ids - got.get(n, frozenset())) for n, ids in node.resources.items())
        return f"kubelet {counts(got)} / node {counts(node.resources)} ({extra} stale, {missing} missing)"
    health = health_of(kubelet)
    bad = [g for g in sorted(node.lost) if any(health.get(i) == "Healthy" for i in node.per_gpu.get(g, ()))]
    if bad:
        return f"lost GPU(s) {bad} advertised Healthy"
    return ""


# -- the run ---------------------------------------------------------------------------------------------
@dataclass
class Call:
    at: float
    method: str
    ns: int
    outcome: str  # ok | INVALID_ARGUMENT | UNAVAILABLE | ... | gone (resource withdrawn meanwhile)


@dataclass
class Soak:
    state: Path
    tmp: Path
    kubelet: FakeKubelet
    proc: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)
    calls: list[Call] = field(default_factory=list)
    mismatches: list[tuple[float, str, str]] = field(default_factory=list)
    to_unhealthy: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    slow: list[tuple[float, str, float, bool]] = field(default_factory=list)  # at, what, s, layout changing
    recovery: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    reregister: list[float] = field(default_factory=list)
    settle: list[float] = field(default_factory=list)
    mig_apply: list[float] = field(default_factory=list)
    mig_converge: list[float] = field(default_factory=list)
    mig_failed: list[str] = field(default_factory=list)
    apply_pauses: list[float] = field(default_factory=list)  # the longest gap between two steps of each apply
    mig_windows: list[tuple[float, float]] = field(default_factory=list)  # apply start, kubelet converged
    half_applied: int = 0
    samples: list[tuple[float, float, int, int]] = field(default_factory=list)  # t, RSS MB, fds, threads
    n_faults: int = 0
    n_restarts: int = 0
    ready_since: dict[int, float] = field(default_factory=dict)  # GPU -> its last XID, or its restore
    lost: int | None = None  # the GPU lost now (one at a time)
    with_lost_gpu: int = 0  # layout changes made while a GPU outside the layout was lost
    mig_busy: bool = False
    gpu_events: list[tuple[float, int]] = field(default_factory=list)  # (when, GPU) lost or restored
    restarting: bool = False

    background: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def now(self) -> float:
        return time.monotonic() - self.started

    def mismatch(self, check: str, why: str) -> None:
        self.mismatches.append((self.now(), check, why))
        print(f"  [{self.now():7.1f} s] MISMATCH {check}: {why}", file=sys.stderr, flush=True)

    async def node(self) -> NodeView:
        return await asyncio.to_thread(read_node, self.state)

    async def converged(self, timeout: float) -> str:
        """ "" once the kubelet holds what the node has (polling), or why not after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            why = differences(self.kubelet, await self.node())
            if not why or time.monotonic() > deadline:
                return why
            await asyncio.sleep(0.05)

    async def check_settled(self, after: str) -> None:
        if self.mig_busy or self.restarting:
            return  # the layout change and the restart check themselves
        t0 = time.monotonic()
        why = await self.converged(SETTLE_WITHIN)
        if why and not self.mig_busy and not self.restarting:
            self.mismatch(f"after {after}", why)
        elif not why:
            self.settle.append(time.monotonic() - t0)

    # -- load --------------------------------------------------------------------------------------------
    async def load(self, rate: float) -> None:
        turn = itertools.count()
        period = 1.0 / rate
        next_at = time.monotonic()
        while True:
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = time.monotonic()  # behind: no burst to catch up
            live = sorted(n for n, p in self.kubelet.plugins.items() if not p.ended and p.devices)
            if not live:
                continue
            name = live[next(turn) % len(live)]
            plugin = self.kubelet.plugins.get(name)
            if plugin is None:
                continue
            healthy = sorted(i for i, h in plugin.devices.items() if h == "Healthy")
            if not healthy:
                continue
            alloc = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=healthy[:1])]
            )
            pref = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=healthy, allocation_size=min(2, len(healthy))
                    )
                ]
            )
            for method, request in (("Allocate", alloc), ("GetPreferredAllocation", pref)):
                t0 = time.perf_counter_ns()
                try:
                    # the grpc deadline, and ours: a call on a channel the kubelet closes meanwhile can
                    # wait for ever on the client side
                    async with asyncio.timeout(6):
                        await getattr(plugin.stub, method)(request, timeout=5)
                    outcome = "ok"
                except grpc.aio.AioRpcError as exc:
                    outcome = exc.code().name
                    now = self.kubelet.plugins.get(name)
                    if outcome == "INVALID_ARGUMENT" and (
                        now is not plugin or not set(healthy) <= set(now.devices)
                    ):
                        outcome = "gone"  # withdrawn meanwhile (a layout change): the kubelet moves on too
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # the soak is over
                    outcome = "channel-closed"  # grpc.aio cancels the calls of a channel the kubelet closes
                except TimeoutError:
                    outcome = "client-hang"  # no answer, not even the deadline's
                except Exception as exc:  # the channel closed by a kubelet restart meanwhile
                    outcome = type(exc).__name__
                self.calls.append(Call(self.now(), method, time.perf_counter_ns() - t0, outcome))

    # -- faults ------------------------------------------------------------------------------------------
    async def gpu_devices(self, gpu: int) -> frozenset[str]:
        return (await self.node()).per_gpu.get(gpu, frozenset())

    async def wait_health(self, gpu: int, want: str, timeout: float) -> float | None:
        """Seconds until every device of ``gpu`` the kubelet holds reads ``want``; None: not in time.

        Woken by every change the kubelet sees; the GPU's devices are read from the node again every
        half second (a layout change may replace them meanwhile)."""
        t0 = time.monotonic()
        while True:
            ids = await self.gpu_devices(gpu)

            def done(ids: frozenset[str] = ids) -> bool:
                health = health_of(self.kubelet)
                return bool(ids) and all(health.get(i) == want for i in ids)

            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await self.kubelet.wait_for(done, timeout=min(0.5, left))
                return time.monotonic() - t0

    async def faults(self) -> None:
        for k in itertools.count():
            await asyncio.sleep(max(0.0, (k + 1) * FAULT_EVERY - self.now()))
            if self.lost is not None and not self.mig_busy:  # back 3 s later, or once a layout change is over
                gpu, self.lost = self.lost, None
                self.gpu_events.append((self.now(), gpu))
                await asyncio.to_thread(mutate, self.state, "restore", gpu)
                self.ready_since[gpu] = self.now()
                self.spawn(self.time_recovery(gpu, "lost GPU restored"))
            gpu = k % GPUS
            if gpu == self.lost:
                continue  # still lost (a layout change is under way)
            since = self.ready_since.get(gpu)
            if since is not None and self.now() - since > RECOVERY_S + 4 * PROBE_S + 1:
                health = health_of(self.kubelet)  # the hold-down is long over: Healthy again by now
                ids = await self.gpu_devices(gpu)
                if not self.restarting and any(health.get(i, "Healthy") != "Healthy" for i in ids):
                    self.mismatch(
                        "recovery",
                        f"GPU {gpu} still Unhealthy {self.now() - since:.0f} s after its fault ended",
                    )
            kind = "lose" if (k + k // GPUS) % 2 and self.lost is None else "xid"
            if kind == "xid":
                xid = RECOVERABLE_XIDS[k % len(RECOVERABLE_XIDS)]
                await asyncio.to_thread(mutate, self.state, "xid", gpu, xid)
                self.ready_since[gpu] = self.now()
            else:
                self.gpu_events.append((self.now(), gpu))
                await asyncio.to_thread(mutate, self.state, "lose", gpu)
                self.lost = gpu
                self.ready_since.pop(gpu, None)
            self.n_faults += 1
            took = await self.wait_health(gpu, "Unhealthy", UNHEALTHY_WITHIN)
            if took is None:
                if not self.restarting and not self.mig_busy:
                    self.mismatch(
                        f"{kind} -> Unhealthy", f"GPU {gpu} not Unhealthy within {UNHEALTHY_WITHIN:.0f} s"
                    )
            else:
                self.to_unhealthy[kind].append(took)
                if took > 0.5:
                    self.slow.append((self.now(), f"{kind} on GPU {gpu} -> Unhealthy", took, self.mig_busy))
                if kind == "xid":
                    self.spawn(self.time_recovery(gpu, "XID"))
            await self.check_settled(f"{kind} on GPU {gpu}")

    async def time_recovery(self, gpu: int, what: str) -> None:
        took = await self.wait_health(gpu, "Healthy", 3 * FAULT_EVERY * GPUS)
        if took is not None:
            self.recovery[what].append(took)

    # -- kubelet restarts ----------------------------------------------------------------------------------
    async def restarts(self) -> None:
        for k in itertools.count(1):
            await asyncio.sleep(max(0.0, k * RESTART_EVERY - self.now()))
            expected = set(held(self.kubelet)) or set((await self.node()).resources)
            self.restarting = True
            try:
                before = time.monotonic()
                restart = asyncio.ensure_future(self.kubelet.restart())
                try:
                    await asyncio.shield(restart)
                except asyncio.CancelledError:  # the soak is over: a grpc server cancelled while it
                    await restart  # stops never finishes stopping; let the restart end first
                    raise
                back = time.monotonic()
                deadline = back + REGISTER_WITHIN
                while True:
                    registered = {
                        n
                        for n, p in self.kubelet.plugins.items()
                        if p.registered_at > before and p.updates > 0
                    }
                    if expected <= registered or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.01)
                self.n_restarts += 1
                if expected <= registered:
                    self.reregister.append(time.monotonic() - back)
                    if self.reregister[-1] > 0.5:
                        self.slow.append(
                            (self.now(), "restart -> listed", self.reregister[-1], self.mig_busy)
                        )
                elif not self.mig_busy:  # a layout change may withdraw a resource meanwhile
                    self.mismatch("kubelet restart", f"not registered again: {sorted(expected - registered)}")
            finally:
                self.restarting = False
            await self.check_settled("kubelet restart")

    # -- MIG layout changes --------------------------------------------------------------------------------
    async def mig_changes(self, config: Path) -> None:
        for k in itertools.count():
            await asyncio.sleep(max(0.0, MIG_FIRST + k * MIG_EVERY - self.now()))
            # the case: a GPU outside the layout is lost meanwhile (the fault schedule loses
            # GPU 6 or 7 every 24 s; it stays lost until the change is over)
            waited = time.monotonic()
            while self.lost not in WHOLE_GPUS and time.monotonic() - waited < 2 * FAULT_EVERY * GPUS:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            name = CYCLE[k % len(CYCLE)]
            self.mig_busy = True
            if self.lost in WHOLE_GPUS:
                self.with_lost_gpu += 1
            seen: dict[str, set[frozenset[str]]] = defaultdict(set)
            events_before = len(self.gpu_events)
            node_before = await self.node()

            def record(seen: dict[str, set[frozenset[str]]] = seen) -> bool:  # every change the kubelet sees
                for n, ids in held(self.kubelet).items():
                    seen[n].add(ids)
                return False

            watcher = asyncio.create_task(self.kubelet.wait_for(record, timeout=3600))
            try:
                t0 = time.monotonic()
                proc = await asyncio.create_subprocess_exec(
                    executable("gpunode-mig"),
                    "apply",
                    "-f",
                    str(config),
                    "-c",
                    name,
                    "--sim-state",
                    str(self.state),
                    "--journal-file",
                    str(self.tmp / "mig-journal.json"),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
                out, _ = await proc.communicate()
                self.mig_apply.append(time.monotonic() - t0)
                failed = proc.returncode != 0
                if failed:
                    self.mig_failed.append(f"{name}: exit {proc.returncode}: {apply_error(out)}")
                t1 = time.monotonic()
                why = await self.converged(MIG_WITHIN)
                if why:
                    self.mismatch(f"layout {name}", why)
                else:
                    self.mig_converge.append(time.monotonic() - t1)
                self.mig_windows.append((t0 - self.started, self.now()))
                # a GPU lost or back meanwhile passes through a state of its own: its devices as last read
                touched = {g for _, g in self.gpu_events[events_before:]}
                node_after = await self.node()
                excused = frozenset().union(
                    *(
                        node_before.per_gpu.get(g, frozenset()) | node_after.per_gpu.get(g, frozenset())
                        for g in touched
                    )
                )

                gap = longest_pause(out)
                self.apply_pauses.append(gap)
                for n, views in seen.items():
                    # the old and the new list: the node's, before and after (the kubelet held the old one
                    # unless a restart had just emptied it; it holds the new one once converged)
                    old, new = (
                        node_before.resources.get(n, frozenset()),
                        node_after.resources.get(n, frozenset()),
                    )
                    odd = half_applied(views, old, new, excused)
                    if odd:
                        self.half_applied += len(odd)
                        self.mismatch(
                            f"layout {name}",
                            f"{n} listed {len(odd)} half-applied device set(s); the apply paused up to "
                            f"{gap:.2f} s between two of its steps",
                        )
            finally:
                watcher.cancel()
                self.mig_busy = False

    # -- the process -----------------------------------------------------------------------------------------
    async def sampler(self) -> None:
        while True:
            sample = await asyncio.to_thread(process_sample, self.proc.pid)
            if sample is None:
                return
            self.samples.append((self.now(), *sample))
            await asyncio.sleep(SAMPLE_EVERY)

    async def progress(self) -> None:
        while True:
            await asyncio.sleep(60)
            rss = f", RSS {self.samples[-1][1]:.1f} MB" if self.samples else ""
            print(
                f"  [{self.now():7.1f} s] {len(self.calls)} calls, {self.n_faults} faults, "
                f"{self.n_restarts} restarts, {len(self.mig_apply)} layout changes, "
                f"{len(self.mismatches)} mismatches{rss}",
                file=sys.stderr,
                flush=True,
            )

    async def watch_process(self) -> None:
        while self.proc.poll() is None:  # noqa: ASYNC110 (a child process: no event to wait on)
            await asyncio.sleep(0.5)
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"the plugin exited ({self.proc.returncode}):\n{tail}")


def half_applied(
    views: set[frozenset[str]], before: frozenset[str], after: frozenset[str], excused: frozenset[str]
) -> set[frozenset[str]]:
    """The device lists that are neither the old nor the new one, but for the ``excused`` devices (those of
    GPUs lost or back during the change, which pass through a state of their own)."""
    return {v for v in views if (v ^ before) - excused and (v ^ after) - excused}


def longest_pause(out: bytes) -> float:
    """The longest time between two consecutive steps of a ``gpunode-mig apply`` (from its JSON log)."""
    from datetime import datetime

    stamps = []
    for line in out.decode(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "mig_step" and "ts" in event:
            stamps.append(datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp())
    return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)


def apply_error(out: bytes) -> str:
    """What a failed ``gpunode-mig apply`` said: its last plain line (the error for a person), else its
    last error log event, else its last line."""
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    events = []
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            return line[:300]
        if isinstance(event, dict) and event.get("level") in ("error", "warning"):
            events.append(str(event.get("error") or event.get("event")))
    return (events[0] if events else lines[-1] if lines else "")[:300]


def process_sample(pid: int) -> tuple[float, int, int] | None:
    """(RSS in MB, open fds, threads) of a process; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return (
            int(fields["VmRSS"].split()[0]) / 1e3,
            len(os.listdir(f"/proc/{pid}/fd")),
            int(fields["Threads"]),
        )
    except (OSError, KeyError, ValueError):
        return None


def spawn_plugin(state: Path, kubelet_socket: Path, log: Path) -> subprocess.Popen[bytes]:
    """The plugin as its own process, in this environment less anything that would change its settings."""
    from gpunode.common.settings import flags_of
    from gpunode.device_plugin.flags import DevicePluginFlags

    drop = {e for f in flags_of(DevicePluginFlags) for e in f.envs}
    drop |= {
        "DP_DISABLE_HEALTHCHECKS",
        "DP_ENABLE_HEALTHCHECKS",
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "GPUNODE_SIM_STATE",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop}
    argv = [
        executable("gpunode-device-plugin"),
        "--sim-state",
        str(state),
        "--kubelet-socket",
        str(kubelet_socket),
        "--http-port",
        "0",
        "--log-format",
        "json",
        "--mig-strategy",
        "mixed",
        "--health-recovery-period",
        f"{RECOVERY_S:g}s",
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=REPO)


async def start_plugin(tmp: Path, state: Path, kubelet: FakeKubelet) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / "plugin.log"
    proc = await asyncio.to_thread(spawn_plugin, state, kubelet.socket, log)
    t0 = time.monotonic()
    while True:
        try:
            await kubelet.wait_registered(GPU, after=0, timeout=0.25)
            break
        except TimeoutError:
            if proc.poll() is not None or time.monotonic() - t0 > 60:
                proc.kill()
                raise RuntimeError("the plugin did not register:\n" + log.read_text()[-3000:]) from None
    return proc, log


async def run(minutes: float, tmp: Path, rate: float) -> tuple[Soak, int, float]:
    from gpunode.sim.kubelet import FakeKubelet

    state = tmp / "node.json"
    await asyncio.to_thread(prepare_node, state)
    config = tmp / "layouts.yaml"
    config.write_text(layouts_yaml())
    kubelet = FakeKubelet(tmp / "device-plugins")
    await kubelet.start()
    proc, log = await start_plugin(tmp, state, kubelet)
    soak = Soak(state, tmp, kubelet, proc, log)
    try:
        why = await soak.converged(15)
        if why:
            raise RuntimeError(f"the plugin does not advertise the node at start: {why}")
        soak.started = time.monotonic()
        tasks = [
            soak.load(rate),
            soak.faults(),
            soak.restarts(),
            soak.mig_changes(config),
            soak.sampler(),
            soak.progress(),
            soak.watch_process(),
        ]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(minutes * 60):
                async with asyncio.TaskGroup() as tg:
                    for coro in tasks:
                        tg.create_task(coro)
        for task in list(soak.background):
            task.cancel()
        # the end: whatever is lost comes back, then the node and the kubelet must agree once more
        await asyncio.to_thread(mutate, state, "restore")
        why = await soak.converged(SETTLE_WITHIN + MIG_WITHIN)
        if why:
            soak.mismatch("at the end", why)
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 15)
        return soak, rc, time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await kubelet.stop()


# -- report ------------------------------------------------------------------------------------------------
def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y)."""
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def ms(values: Sequence[float]) -> str:
    if not values:
        return "-"
    s = sorted(values)
    p50, p99 = 1e3 * statistics.median(s), 1e3 * percentile(s, 99)
    return f"n {len(s)}, p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {1e3 * s[-1]:.0f} ms"


def report(soak: Soak, rc: int, stop_s: float, minutes: float, rate: float) -> dict[str, Any]:
    calls_by: dict[str, list[Call]] = defaultdict(list)
    for c in soak.calls:
        calls_by[c.method].append(c)
    end = max((c.at for c in soak.calls), default=0.0)
    latency = {}
    for method, calls in sorted(calls_by.items()):
        first = sorted(c.ns for c in calls if c.at < 60 and c.outcome == "ok")
        last = sorted(c.ns for c in calls if c.at >= end - 60 and c.outcome == "ok")
        outcomes: dict[str, int] = defaultdict(int)
        for c in calls:
            outcomes[c.outcome] += 1
        p99_first = percentile(first, 99) / 1e6 if first else 0.0
        p99_last = percentile(last, 99) / 1e6 if last else 0.0
        latency[method] = {
            "calls": len(calls),
            "per_s": round(len(calls) / max(end, 1e-9), 1),
            "outcomes": dict(sorted(outcomes.items())),
            "p50_ms": round(statistics.median(c.ns for c in calls) / 1e6, 3) if calls else None,
            "p99_first_minute_ms": round(p99_first, 3),
            "p99_last_minute_ms": round(p99_last, 3),
            "drift": round(p99_last / p99_first, 2) if p99_first else None,
        }
    after_warmup = [s for s in soak.samples if s[0] >= 60] or soak.samples
    rss = [s[1] for s in soak.samples]
    fds = [s[2] for s in soak.samples]
    threads = [s[3] for s in soak.samples]
    return {
        "minutes": minutes,
        "rate_per_method": rate,
        "plugin_exit_code": rc,
        "plugin_stop_s": round(stop_s, 2),
        "latency": latency,
        "rss_mb": {
            "first": rss[0] if rss else None,
            "after_first_minute": after_warmup[0][1] if after_warmup else None,
            "last": rss[-1] if rss else None,
            "max": max(rss, default=None),
            "slope_mb_per_min": round(60 * slope([(s[0], s[1]) for s in after_warmup]), 3),
        },
        "fds": {
            "first": fds[0] if fds else None,
            "last": fds[-1] if fds else None,
            "max": max(fds, default=None),
        },
        "threads": {
            "first": threads[0] if threads else None,
            "last": threads[-1] if threads else None,
            "max": max(threads, default=None),
        },
        "faults": soak.n_faults,
        "to_unhealthy": {k: ms(v) for k, v in soak.to_unhealthy.items()},
        "recovery": {k: ms(v) for k, v in soak.recovery.items()},
        "kubelet_restarts": soak.n_restarts,
        "reregister": ms(soak.reregister),
        "settle_checks": ms(soak.settle),
        "mig_changes": len(soak.mig_apply),
        "mig_changes_with_a_lost_gpu": soak.with_lost_gpu,
        "mig_apply": ms(soak.mig_apply),
        "mig_apply_longest_pause": ms(soak.apply_pauses),
        "mig_converge": ms(soak.mig_converge),
        "mig_apply_failures": soak.mig_failed,
        "half_applied_views": soak.half_applied,
        "mig_windows_s": [(round(a, 1), round(b, 1)) for a, b in soak.mig_windows],
        "slow_over_500ms": [
            {"at_s": round(t, 1), "what": w, "s": round(d, 3), "layout_changing": busy}
            for t, w, d, busy in soak.slow
        ],
        "mismatches": [{"at_s": round(t, 1), "check": c, "why": w} for t, c, w in soak.mismatches],
    }


def print_table(doc: dict[str, Any], host: dict[str, Any]) -> None:
    rows: list[tuple[str, str]] = []
    for method, lat in doc["latency"].items():
        outcomes = ", ".join(f"{k} {v}" for k, v in lat["outcomes"].items())
        rows.append((f"{method}: calls", f"{lat['calls']} ({lat['per_s']}/s); {outcomes}"))
        rows.append(
            (
                f"{method}: p99 first / last minute",
                f"{lat['p99_first_minute_ms']} / {lat['p99_last_minute_ms']} ms (x{lat['drift']}); "
                f"p50 {lat['p50_ms']} ms",
            )
        )
    r, f, t = doc["rss_mb"], doc["fds"], doc["threads"]
    rows.append(
        (
            "RSS",
            f"{r['first']} MB at start, {r['after_first_minute']} after 1 min, {r['last']} at end, "
            f"max {r['max']}",
        )
    )
    rows.append(("RSS slope (after the first minute)", f"{r['slope_mb_per_min']:+.3f} MB/min"))
    rows.append(("open fds", f"{f['first']} -> {f['last']} (max {f['max']})"))
    rows.append(("threads", f"{t['first']} -> {t['last']} (max {t['max']})"))
    rows.append(("faults (XID / lost GPU, alternating)", str(doc["faults"])))
    for kind, text in doc["to_unhealthy"].items():
        rows.append((f"{kind} -> Unhealthy in the kubelet", text))
    for kind, text in doc["recovery"].items():
        rows.append((f"Healthy again after {kind}", text))
    rows.append(("kubelet restarts", str(doc["kubelet_restarts"])))
    rows.append(("  restart -> every resource listed again", doc["reregister"]))
    rows.append(("settled checks (node == kubelet)", doc["settle_checks"]))
    rows.append(
        (
            "MIG layout changes (bare gpunode-mig apply)",
            f"{doc['mig_changes']} ({doc['mig_changes_with_a_lost_gpu']} with GPU 6 or 7 lost meanwhile)",
        )
    )
    rows.append(("  apply took", doc["mig_apply"]))
    rows.append(("  longest pause between two apply steps", doc["mig_apply_longest_pause"]))
    rows.append(("  apply end -> kubelet holds the new layout", doc["mig_converge"]))
    rows.append(("  apply failures (not the plugin's)", str(len(doc["mig_apply_failures"]))))
    rows.append(("  half-applied device sets listed", str(doc["half_applied_views"])))
    rows.append(("plugin exit code on SIGTERM", f"{doc['plugin_exit_code']} after {doc['plugin_stop_s']} s"))
    rows.append(("MISMATCHES node vs kubelet", str(len(doc["mismatches"]))))
    width = max(len(k) for k, _ in rows)
    print(f"Device plugin soak: {doc['minutes']:g} min on {PRESET} (GPUs 0-5 MIG, 6-7 whole), mixed strategy")
    print(f"machine: {host['platform']}; {host['cpu']}; {host['python']}; {host['cpu_count']} CPUs")
    print(f"         load average {host['load_average_start']} at start, {host['load_average_end']} at end")
    print(
        f"load: Allocate + GetPreferredAllocation at {doc['rate_per_method']:g}/s each; a fault every "
        f"{FAULT_EVERY:g} s, a kubelet restart every {RESTART_EVERY:g} s, "
        f"a layout change every {MIG_EVERY:g} s"
    )
    print()
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    for m in doc["mismatches"]:
        print(f"  at {m['at_s']} s, {m['check']}: {m['why']}")
    for failure in doc["mig_apply_failures"]:
        print(f"  apply failed: {failure}")
    windows = ", ".join(f"{a:g}-{b:g} s" for a, b in doc["mig_windows_s"])
    for slow in doc["slow_over_500ms"]:
        during = " (a layout change under way)" if slow["layout_changing"] else ""
        print(f"  slow: at {slow['at_s']} s, {slow['what']} took {slow['s']} s{during}")
    if windows:
        print(f"  layout changes (apply start - kubelet converged): {windows}")
    print()
    print(
        "0 mismatches: every check held."
        if not doc["mismatches"]
        else f"{len(doc['mismatches'])} MISMATCHES."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--quick", action="store_true", help="2 minutes")
    parser.add_argument(
        "--rate", type=float, default=RATE, help=f"calls per second per method (default {RATE:g})"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    minutes = 2.0 if args.quick else args.minutes
    host = machine_base(load_average_start=load_average())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        soak, rc, stop_s = asyncio.run(run(minutes, Path(tmp), args.rate))
        doc = report(soak, rc, stop_s, minutes, args.rate)
    host["load_average_end"] = load_average()
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        json.dump({"machine": host, **doc}, sys.stdout, indent=2)
        print()
    else:
        print_table(doc, host)
        print(f"\nelapsed {doc['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast the device plugin answers the kubelet, reacts to faults and restarts, and what it costs idle.

    .venv/bin/python benchmarks/device_plugin.py            # the full run (about 2-3 minutes on two cores)
    .venv/bin/python benchmarks/device_plugin.py --quick    # fewer samples, 15 s idle window
    .venv/bin/python benchmarks/device_plugin.py --json     # machine-readable output on stdout
    .venv/bin/python benchmarks/device_plugin.py --profile  # cProfile the plugin's RPC paths even on target

The plugin runs as a real, separate process (`gpunode-device-plugin --sim-state ... --kubelet-socket ...`)
on the simulated `dgx-a100` preset (8x A100-SXM4-40GB, NVLink); the fake kubelet (the real Registration
service, with the dial-back and the ListAndWatch stream a kubelet keeps) and the measuring client live in
this process. A second plugin process serves the same node time-sliced, 64 replicas per GPU (512 devices).

1. Floor: a trivial DevicePlugin servicer of the same proto (empty AllocateResponse and
   PreferredAllocationResponse), served by grpc.aio in another process on a Unix socket, timed with the
   same client code and the same requests as the plugin: what any Python gRPC plugin costs.
2. Allocate with 1 and 2 GPU IDs: p50 <= 1.2 x floor p50 and p99 <= 1.5 x floor p99.
3. GetPreferredAllocation, 8 GPUs available, size 2 and 4 (topology-aware search): p99 <= floor p99 + 1 ms.
4. GetPreferredAllocation, 8 GPUs x 64 replicas, all 512 IDs available, size 1 and 4: p99 <= floor p99 + 3 ms.
5. XID injected by another process (a long-lived helper that mutates the shared simulator state file and
   reports CLOCK_MONOTONIC right after the change is written) until the fake kubelet's ListAndWatch stream
   shows that GPU Unhealthy: p99 <= 100 ms. A GPU stays Unhealthy after a fatal XID (recovery needs the
   hold-down *and* the health probe, which runs every 10 s), so every plugin lifetime takes one XID per GPU
   and the plugin is restarted between batches of 8.
6. Kubelet restart (`FakeKubelet.restart()`: sockets wiped, kubelet.sock created anew) until the plugin's
   Register call has arrived and its ListAndWatch stream has delivered the devices: p99 <= 500 ms, timed
   from the moment kubelet.sock exists again.
7. Plugin RSS after all of the above: <= 50 MB (10^6 bytes); plugin CPU over an idle window (60 s, 15 s with
   --quick) with the kubelet's stream open and nothing happening: <= 0.5 % of one core.

Latency figures are gathered call by call in rotation: each plugin case and the floor case it is judged
against take turns (floor, plugin, floor, plugin, ... with the order rotated every turn so that neither
always follows the other), in rounds that visit every group again and again. On a small, shared machine
the tail is mostly the machine's own noise; taking turns spreads that noise evenly over the floor and the
plugin instead of billing a noisy second to whichever series was running. Each call is timed on its own with
time.perf_counter_ns, the garbage collector on; percentiles are nearest-rank. A report, not a test: it exits
0 unless something crashes. When a latency target is missed, the plugin is started again under cProfile
(same flags, a separate process) and the missed path is called again, and the plugin's handler for it is
timed alone in this process (no gRPC, no profiler); both follow the table. A missed RSS target adds what
each of the plugin's imports costs; a missed idle-CPU target adds the plugin's CPU time per thread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from benchlib import load_average, machine_base, percentile
from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpunode._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from gpunode.sim.kubelet import FakeKubelet

# Only grpc and the stubs at module level: the floor server and the XID helper run this same file, and the
# floor's RSS is reported as what a bare grpc.aio servicer process costs. The rest is imported where used.

PRESET = "dgx-a100"
GPUS = 8
REPLICAS = 64
RESOURCE = "nvidia.com/gpu"
# Fatal under the default policy (none is an application XID); one per GPU within a plugin lifetime.
FATAL_XIDS = (79, 48, 94, 95, 63, 64, 74, 92)

ALLOCATE_P50_FACTOR = 1.2
ALLOCATE_P99_FACTOR = 1.5
PREFERRED_8_EXTRA_US = 1_000.0
PREFERRED_512_EXTRA_US = 3_000.0
XID_TARGET_MS = 100.0
REREGISTER_TARGET_MS = 500.0
RSS_TARGET_MB = 50.0
IDLE_CPU_TARGET_PCT = 0.5

TIME_SLICING_CONFIG = f"""\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: {RESOURCE}
        replicas: {REPLICAS}
"""

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent


# -- configuration -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Iterations:
    rounds: int  # rounds over the latency groups (a floor case and its plugin cases)
    calls: int  # timed calls per latency case, all rounds together
    calls_512: int  # the same for the 512-device cases (slower per call)
    warmup: int  # untimed calls per case before the first round
    xid_batches: int  # plugin lifetimes of one XID per GPU each
    restarts: int  # kubelet restarts
    idle_s: float  # idle CPU window
    profile_calls: int  # calls to a profiled plugin per missed path


FULL = Iterations(
    rounds=10,
    calls=3_000,
    calls_512=2_000,
    warmup=200,
    xid_batches=3,
    restarts=25,
    idle_s=60.0,
    profile_calls=2_000,
)
QUICK = Iterations(
    rounds=4, calls=600, calls_512=400, warmup=50, xid_batches=1, restarts=8, idle_s=15.0, profile_calls=500
)


# -- figures -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    section: str
    figure: str
    unit: str
    n: int
    median: float
    p99: float
    target: str = "-"
    ok: bool | None = None

    @property
    def verdict(self) -> str:
        return "-" if self.ok is None else "PASS" if self.ok else "FAIL"


@dataclass(frozen=True)
class Stats:
    n: int
    median: float
    p99: float


def stats(samples_ns: Sequence[int], unit: str) -> Stats:
    scale = {"us": 1e3, "ms": 1e6}[unit]
    ordered = sorted(samples_ns)
    return Stats(len(ordered), statistics.median(ordered) / scale, percentile(ordered, 99) / scale)


def fmt(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


# -- child processes -----------------------------------------------------------------------------------------
_CHILDREN: list[subprocess.Popen[Any]] = []


def spawn(argv: Sequence[str], log: Path, *, env: dict[str, str] | None = None, pipes: bool = False) -> Any:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipes else out,
            stderr=out,
            env=env,
            text=pipes,
            bufsize=1 if pipes else -1,
            cwd=REPO,
        )
    _CHILDREN.append(proc)
    return proc


async def stop_child(proc: subprocess.Popen[Any], grace: float = 10.0) -> int:
    """SIGTERM, wait (without blocking the loop: the fake kubelet lives on it), then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    rc = proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)
    return rc


def kill_children() -> None:
    """Last resort, outside the event loop: every child still alive gets SIGTERM, then SIGKILL."""
    for proc in list(_CHILDREN):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + 5.0
    for proc in list(_CHILDREN):
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        _CHILDREN.remove(proc)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def plugin_executable() -> str:
    beside = Path(sys.executable).with_name("gpunode-device-plugin")
    return str(beside if beside.exists() else REPO / ".venv/bin/gpunode-device-plugin")


def plugin_env() -> dict[str, str]:
    """This environment without anything that would change the plugin's settings or health policy."""
    from gpunode.common.settings import flags_of
    from gpunode.device_plugin.flags import DevicePluginFlags

    drop = {e for f in flags_of(DevicePluginFlags) for e in f.envs}
    drop |= {"DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS", "NOTIFY_SOCKET", "WATCHDOG_USEC"}
    drop |= {"WATCHDOG_PID", "GPUNODE_SIM_STATE"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@dataclass
class Plugin:
    name: str
    proc: subprocess.Popen[Any]
    kubelet: FakeKubelet
    log: Path
    startup_ns: int  # spawn until registered with its devices listed

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stub(self) -> pb_grpc.DevicePluginStub:
        return self.kubelet.plugins[RESOURCE].stub


async def start_plugin(
    tmp: Path,
    name: str,
    kubelet: FakeKubelet,
    state: Path,
    devices: int,
    *,
    config: Path | None = None,
    profile_out: Path | None = None,
) -> Plugin:
    args = ["--sim-state", str(state), "--kubelet-socket", str(kubelet.socket), "--http-port", "0"]
    args += ["--log-format", "json"]
    if config is not None:
        args += ["--config-file", str(config)]
    if profile_out is None:
        argv = [plugin_executable(), *args]
    else:
        argv = [sys.executable, str(SCRIPT), "--profiled-plugin", str(profile_out), *args]
    log = tmp / f"{name}.log"
    t0 = time.monotonic()
    proc = spawn(argv, log, env=plugin_env())
    deadline = t0 + 60.0
    while True:
        try:
            await kubelet.wait_registered(RESOURCE, after=t0, timeout=0.25)
            break
        except TimeoutError:
            if proc.poll() is not None:
                raise RuntimeError(f"plugin {name} exited ({proc.returncode}):\n{log_tail(log)}") from None
            if time.monotonic() > deadline:
                await stop_child(proc)
                raise RuntimeError(f"plugin {name} did not register within 60 s:\n{log_tail(log)}") from None
    ready = time.monotonic()
    healthy = kubelet.healthy(RESOURCE)
    if len(healthy) != devices or kubelet.unhealthy(RESOURCE):
        await stop_child(proc)
        raise RuntimeError(f"plugin {name}: expected {devices} Healthy devices, kubelet sees {len(healthy)}")
    return Plugin(name, proc, kubelet, log, int((ready - t0) * 1e9))


# -- 1. the floor: a trivial servicer in another process -----------------------------------------------------
class FloorServicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        return pb.AllocateResponse()

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse()


async def serve_floor(socket_path: str) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # as the plugin's servers
    pb_grpc.add_DevicePluginServicer_to_server(FloorServicer(), server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0)


async def open_floor(tmp: Path) -> tuple[subprocess.Popen[Any], grpc.aio.Channel, pb_grpc.DevicePluginStub]:
    sock = tmp / "floor.sock"
    proc = spawn([sys.executable, str(SCRIPT), "--serve-floor", str(sock)], tmp / "floor.log")
    channel = grpc.aio.insecure_channel(f"unix://{sock}")  # the options FakeKubelet uses: none
    stub = pb_grpc.DevicePluginStub(channel)
    deadline = time.monotonic() + 30
    while True:
        try:
            await stub.GetDevicePluginOptions(pb.Empty(), timeout=1, wait_for_ready=True)
            return proc, channel, stub
        except grpc.aio.AioRpcError:
            if proc.poll() is not None or time.monotonic() > deadline:
                await channel.close()
                await stop_child(proc)
                raise RuntimeError(f"floor server did not start:\n{log_tail(tmp / 'floor.log')}") from None


# -- 2.-4. latency -----------------------------------------------------------------------------------------
def allocate_request(ids: Sequence[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])


def preferred_request(available: Sequence[str], size: int) -> pb.PreferredAllocationRequest:
    return pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=list(available), allocation_size=size)
        ]
    )


@dataclass(frozen=True)
class Case:
    key: str
    section: str
    label: str
    method: str  # "Allocate" or "GetPreferredAllocation"
    request: Any
    stub: Callable[[], pb_grpc.DevicePluginStub]
    calls: int
    floor: str | None = None  # key of the floor case it is judged against
    kind: str = "floor"  # floor | allocate | preferred-8 | preferred-512
    plugin: str = ""  # "plain" or "shared": which plugin serves it

    def call(self) -> Any:
        return getattr(self.stub(), self.method)


async def time_calls(call: Any, request: Any, n: int) -> list[int]:
    """n sequential unary calls of one case, each timed on its own (warm-ups and profiled runs)."""
    clock = time.perf_counter_ns
    out = [0] * n
    for i in range(n):
        t0 = clock()
        await call(request, timeout=10)
        out[i] = clock() - t0
    return out


def latency_cases(
    it: Iterations,
    uuids: list[str],
    floor: pb_grpc.DevicePluginStub,
    plain: Plugin,
    shared: Plugin,
) -> list[Case]:
    replica_ids = [f"{u}::{r}" for u in uuids for r in range(REPLICAS)]
    a1, a2 = allocate_request(uuids[:1]), allocate_request(uuids[2:4])
    p8 = {size: preferred_request(uuids, size) for size in (2, 4)}
    p512 = {size: preferred_request(replica_ids, size) for size in (1, 4)}
    fsec = "floor: trivial servicer, other process"
    asec, psec = "plugin: Allocate", "plugin: GetPreferredAllocation"
    alloc, pref = "Allocate", "GetPreferredAllocation"
    cases = [
        Case("f-a1", fsec, "Allocate, 1 ID", alloc, a1, lambda: floor, it.calls),
        Case("a1", asec, "Allocate, 1 GPU ID", alloc, a1, plain.stub, it.calls, "f-a1", "allocate", "plain"),
        Case("f-a2", fsec, "Allocate, 2 IDs", alloc, a2, lambda: floor, it.calls),
        Case("a2", asec, "Allocate, 2 GPU IDs", alloc, a2, plain.stub, it.calls, "f-a2", "allocate", "plain"),
        Case("f-p8", fsec, "GetPreferredAllocation, 8 IDs", pref, p8[2], lambda: floor, it.calls),
    ]
    for s in (2, 4):
        label = f"8 GPUs available, size {s}"
        cases.append(
            Case(f"p8-{s}", psec, label, pref, p8[s], plain.stub, it.calls, "f-p8", "preferred-8", "plain")
        )
    cases.append(
        Case("f-p512", fsec, "GetPreferredAllocation, 512 IDs", pref, p512[1], lambda: floor, it.calls_512)
    )
    for s in (1, 4):
        label = f"8 GPUs x {REPLICAS} replicas (512 IDs), size {s}"
        cases.append(
            Case(
                f"p512-{s}",
                psec,
                label,
                pref,
                p512[s],
                shared.stub,
                it.calls_512,
                "f-p512",
                "preferred-512",
                "shared",
            )
        )
    return cases


async def check_answers(cases: list[Case]) -> None:
    """The plugin answers what it should before anything is timed (the floor answers nothing)."""
    for case in cases:
        if case.kind == "floor":
            continue
        resp = await case.call()(case.request, timeout=10)
        if case.kind == "allocate":
            ids = list(case.request.container_requests[0].devices_ids)
            got = resp.container_responses[0].envs.get("NVIDIA_VISIBLE_DEVICES")
            if got != ",".join(ids):
                raise RuntimeError(f"{case.label}: NVIDIA_VISIBLE_DEVICES={got!r}, expected {ids}")
        else:
            size = case.request.container_requests[0].allocation_size
            chosen = list(resp.container_responses[0].deviceIDs)
            if len(set(chosen)) != size:
                raise RuntimeError(f"{case.label}: preferred {chosen}, expected {size} distinct IDs")


async def time_in_turn(cases: Sequence[Case], n: int) -> dict[str, list[int]]:
    """The measuring client for floor and plugin alike: n calls of every case, taking turns call by call
    (the order rotated every turn), each timed on its own."""
    clock = time.perf_counter_ns
    calls = [(c.key, c.call(), c.request) for c in cases]
    out: dict[str, list[int]] = {c.key: [0] * n for c in cases}
    for i in range(n):
        shift = i % len(calls)
        for key, call, request in calls[shift:] + calls[:shift]:
            t0 = clock()
            await call(request, timeout=10)
            out[key][i] = clock() - t0
    return out


def groups(cases: list[Case]) -> list[list[Case]]:
    """Each floor case with the plugin cases judged against it."""
    by_floor: dict[str, list[Case]] = {}
    for c in cases:
        by_floor.setdefault(c.key if c.floor is None else c.floor, []).append(c)
    return list(by_floor.values())


async def measure_latency(cases: list[Case], it: Iterations) -> dict[str, list[int]]:
    for case in cases:
        await time_calls(case.call(), case.request, it.warmup)
    samples: dict[str, list[int]] = defaultdict(list)
    for r in range(it.rounds):
        for group in groups(cases):
            calls = group[0].calls
            per_round = calls // it.rounds + (1 if r < calls % it.rounds else 0)
            gc.collect()  # so one group's garbage is not billed to the next
            for key, values in (await time_in_turn(group, per_round)).items():
                samples[key] += values
    return samples


def latency_figures(cases: list[Case], samples: dict[str, list[int]]) -> list[Figure]:
    summary = {c.key: stats(samples[c.key], "us") for c in cases}
    figures = []
    for c in cases:
        s = summary[c.key]
        target, ok = "-", None
        if c.floor is not None:
            f = summary[c.floor]
            if c.kind == "allocate":
                p50_max, p99_max = ALLOCATE_P50_FACTOR * f.median, ALLOCATE_P99_FACTOR * f.p99
                target = f"p50 <= {fmt(p50_max)} us, p99 <= {fmt(p99_max)} us"
                ok = s.median <= p50_max and s.p99 <= p99_max
            else:
                extra = PREFERRED_8_EXTRA_US if c.kind == "preferred-8" else PREFERRED_512_EXTRA_US
                p99_max = f.p99 + extra
                target = f"p99 <= {fmt(p99_max)} us"
                ok = s.p99 <= p99_max
        figures.append(Figure(c.section, c.label, "us", s.n, s.median, s.p99, target, ok))
    return figures


# -- 5. XID to Unhealthy -------------------------------------------------------------------------------------
def xid_helper(state: Path) -> int:
    """Runs in its own process: one injection per stdin line, CLOCK_MONOTONIC (ns) once it is written."""
    from gpunode.sim.nvml import SimNode
    from gpunode.sim.nvml.state import ALL

    node = SimNode.open(state)
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        with node.mutate() as st:
            if words[0] == "xid":
                st.inject_xid(int(words[1]), int(words[2]), ALL, ALL, time.time())
            elif words[0] == "restore":
                st.restore()
        done = time.monotonic_ns()
        print(f"done {done}", flush=True)
    return 0


class Injector:
    def __init__(self, tmp: Path, state: Path) -> None:
        self.proc = spawn(
            [sys.executable, str(SCRIPT), "--xid-helper", str(state)], tmp / "helper.log", pipes=True
        )

    async def _reply(self, expect: str) -> str:
        line: str = await asyncio.to_thread(self.proc.stdout.readline)
        if not line.startswith(expect):
            raise RuntimeError(f"XID helper answered {line!r}, expected {expect!r}")
        return line

    async def ready(self) -> None:
        await self._reply("ready")

    async def command(self, text: str) -> int:
        """Send a command; returns the helper's CLOCK_MONOTONIC (ns) right after the state file is written."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return int((await self._reply("done")).split()[1])

    async def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        await stop_child(self.proc, grace=2.0)


async def xid_batch(kubelet: FakeKubelet, injector: Injector, uuids: list[str], batch: int) -> list[int]:
    """One fatal XID per GPU (each GPU once: it stays Unhealthy), injection-written to stream-shows-it."""
    samples = []
    order = list(range(GPUS))
    order = order[batch % GPUS :] + order[: batch % GPUS]  # vary which GPU goes first
    for gpu in order:
        uuid = uuids[gpu]
        if uuid not in kubelet.healthy(RESOURCE):
            raise RuntimeError(f"GPU {gpu} is not Healthy before its XID")

        async def seen(uuid: str = uuid) -> int:
            await kubelet.wait_for(lambda: uuid in kubelet.unhealthy(RESOURCE), timeout=10)
            return time.monotonic_ns()

        watcher = asyncio.create_task(seen())
        await asyncio.sleep(0)  # the watcher is waiting before the XID exists
        injected = await injector.command(f"xid {gpu} {FATAL_XIDS[gpu]}")
        shown = await watcher
        samples.append(shown - injected)
        if len(kubelet.unhealthy(RESOURCE)) != len(samples):
            raise RuntimeError(
                f"after XID on GPU {gpu}: unexpected Unhealthy set {kubelet.unhealthy(RESOURCE)}"
            )
        await asyncio.sleep(0.05)
    return samples


# -- 6. kubelet restart -------------------------------------------------------------------------------------
async def kubelet_restarts(kubelet: FakeKubelet, n: int) -> tuple[list[int], list[int]]:
    """(kubelet back -> Register accepted, kubelet back -> devices listed on the new stream), ns."""
    to_register, to_listed = [], []
    for _ in range(n):
        before = time.monotonic()
        await kubelet.restart()
        back = time.monotonic()  # kubelet.sock exists again
        endpoint = await kubelet.wait_registered(RESOURCE, after=before, timeout=10)
        listed = time.monotonic()
        to_register.append(max(0, int((endpoint.registered_at - back) * 1e9)))
        to_listed.append(int((listed - back) * 1e9))
        if len(kubelet.healthy(RESOURCE)) != GPUS:
            raise RuntimeError("after the kubelet restart the plugin lists the wrong devices")
        await asyncio.sleep(0.2)
    return to_register, to_listed


# -- 7. resources --------------------------------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 1e6


def rss_split(pid: int) -> str:
    """RssAnon / RssFile / RssShmem from /proc (file-backed pages are mostly shared libraries)."""
    parts = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("RssAnon", "RssFile", "RssShmem")):
                key, value = line.split(":", 1)
                parts[key] = int(value.split()[0]) / 1e3
    except OSError:
        return ""
    return ", ".join(f"{k} {v:.1f} MB" for k, v in parts.items())


def thread_names(pid: int) -> dict[int, str]:
    import psutil

    names = {}
    for t in psutil.Process(pid).threads():
        try:
            names[t.id] = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            names[t.id] = "?"
    return names


async def idle_cpu(pid: int, seconds: float) -> tuple[float, str]:
    """Percent of one core over `seconds` of idleness, and the CPU time per thread."""
    import psutil

    proc = psutil.Process(pid)
    names = thread_names(pid)
    threads0 = {t.id: t.user_time + t.system_time for t in proc.threads()}
    t0 = proc.cpu_times()
    wall0 = time.monotonic()
    await asyncio.sleep(seconds)
    t1 = proc.cpu_times()
    wall = time.monotonic() - wall0
    threads1 = {t.id: t.user_time + t.system_time for t in proc.threads()}
    busy = (t1.user - t0.user) + (t1.system - t0.system)
    lines = [f"{len(threads1)} threads; CPU seconds over {wall:.1f} s (user+system, clock ticks of 10 ms):"]
    for tid, total in sorted(threads1.items(), key=lambda kv: -(kv[1] - threads0.get(kv[0], 0.0))):
        name = "main (asyncio loop)" if tid == pid else names.get(tid, "?")
        lines.append(f"  {name:<20} tid {tid:<8} {total - threads0.get(tid, 0.0):.3f} s")
    return 100.0 * busy / wall, "\n".join(lines)


IMPORT_STEPS = (
    "asyncio",
    "grpc",
    "gpunode._proto.deviceplugin.v1beta1.api_pb2_grpc",
    "structlog",
    "gpunode.common.logging",
    "prometheus_client",
    "gpunode.common.metrics",
    "gpunode.common.http",
    "yaml",
    "pydantic",
    "gpunode.common.config",
    "gpunode.common.cli",
    "gpunode.api.plugin_config",
    "gpunode.device_plugin.devices",
    "gpunode.device_plugin.allocation",
    "gpunode.device_plugin.server",
    "asyncinotify",
    "gpunode.device_plugin.plugin",
    "gpunode.device_plugin.cli",
    "pynvml",
    "gpunode.nvml.real",
    "gpunode.sim.nvml",
)

_IMPORT_PROBE = """
import importlib, sys
blocked = set(sys.argv[1].split(",")) - {""}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(name + " blocked")
sys.meta_path.insert(0, Block())
def rss():
    d = {}
    for line in open("/proc/self/status"):
        if line.startswith(("RssAnon", "RssFile")):
            d[line.split(":")[0]] = int(line.split()[1]) / 1e3
    return d["RssAnon"], d["RssFile"]
print("(interpreter)", len(sys.modules), *rss())
for name in sys.argv[2:]:
    importlib.import_module(name)
    print(name, len(sys.modules), *rss())
"""


def _probe_imports(blocked: str) -> list[tuple[str, int, float, float]]:
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, blocked, *IMPORT_STEPS],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip()[-500:])
    rows = []
    for line in out.stdout.splitlines():
        name, modules, anon, file = line.rsplit(" ", 3)
        rows.append((name, int(modules), float(anon), float(file)))
    return rows


def import_breakdown() -> str:
    """Memory of a fresh interpreter after each import the plugin makes, in order (where RSS goes)."""
    try:
        rows = _probe_imports("")
        lean = _probe_imports("rich,pygments")
    except (RuntimeError, subprocess.SubprocessError) as exc:
        return f"import breakdown failed: {exc}"
    lines = [
        "a fresh interpreter after each import the plugin makes, cumulative (+increment), MB:",
        f"  {'module':<50} {'modules':>7} {'RssAnon':>14} {'RssFile':>14} {'RSS':>6}",
    ]
    pa = pf = 0.0
    for name, modules, anon, file in rows:
        lines.append(
            f"  {name:<50} {modules:>7} {anon:6.1f} (+{anon - pa:4.1f}) {file:6.1f} (+{file - pf:4.1f})"
            f" {anon + file:6.1f}"
        )
        pa, pf = anon, file
    _, _, anon, file = lean[-1]
    lines.append(
        f"  the same with rich and pygments unimportable (structlog imports them when installed; here they "
        f"come with the test extras): RSS {anon + file:.1f} MB"
    )
    return "\n".join(lines)


# -- profiles ------------------------------------------------------------------------------------------------
def profiled_plugin(out: str, args: list[str]) -> int:
    """Runs in its own process: the plugin's main() under cProfile, stats written on a clean stop."""
    from gpunode.device_plugin.cli import main as plugin_main

    prof = cProfile.Profile()
    prof.enable()
    try:
        return plugin_main(args)
    finally:
        prof.disable()
        prof.dump_stats(out)


PROFILE_KEYS = (
    "Allocate",
    "GetPreferredAllocation",
    "validate_request",
    "allocate_response",
    "to_proto",
    "uuid4",
    "preferred_allocation",
    "_unknown",
    "_topology_pick",
    "_greedy_pick",
    "inc",
)


def format_profile(path: Path, calls: int) -> str:
    st = pstats.Stats(str(path))
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = st.stats  # type: ignore[attr-defined]
    idle = sum(tt for (file, _, fn), (_, _, tt, _, _) in raw.items() if "poll" in fn or "select" in fn)
    busy = sum(tt for (_, _, _), (_, _, tt, _, _) in raw.items()) - idle
    grpc_c = sum(tt for (_, _, fn), (_, _, tt, _, _) in raw.items() if "_contextvars.Context" in fn)
    lines = [
        f"main thread busy (all but the epoll wait), whole run incl. start-up: {busy * 1e3:.0f} ms, "
        f"{busy / calls * 1e6:.0f} us per call; of which own time of Context.run (grpc's Cython callbacks, "
        f"invisible to cProfile): {grpc_c / calls * 1e6:.0f} us per call",
        "per-call cumulative time of the handler and its helpers (profiler overhead included):",
    ]
    for (file, line, fn), (_cc, nc, _tt, ct, _) in sorted(raw.items(), key=lambda kv: -kv[1][3]):
        if fn in PROFILE_KEYS and ("gpunode" in file or fn == "uuid4" or fn == "inc") and nc >= calls // 2:
            lines.append(f"  {fn:<24} {nc:>7} calls  {ct / nc * 1e6:8.1f} us/call  {Path(file).name}:{line}")
    text = io.StringIO()
    pstats.Stats(str(path), stream=text).strip_dirs().sort_stats("tottime").print_stats(25)
    body = text.getvalue()
    start = body.find("   ncalls")
    lines.append("top 25 by own time:")
    lines.append(body[start:].rstrip() if start >= 0 else body.rstrip())
    return "\n".join(lines)


async def profile_case(
    tmp: Path, kubelet: FakeKubelet, state: Path, case: Case, config: Path | None, calls: int
) -> str:
    out = tmp / f"profile-{case.key}.prof"
    devices = GPUS * REPLICAS if config is not None else GPUS
    plugin = await start_plugin(
        tmp, f"profiled-{case.key}", kubelet, state, devices, config=config, profile_out=out
    )
    try:
        call = getattr(plugin.stub(), case.method)
        await time_calls(call, case.request, min(200, calls))
        samples = await time_calls(call, case.request, calls)
    finally:
        rc = await stop_child(plugin.proc, grace=20.0)
    if not out.exists():
        return f"(no profile written; plugin exit code {rc})\n{log_tail(plugin.log)}"
    s = stats(samples, "us")
    head = f"under the profiler: p50 {fmt(s.median)} us, p99 {fmt(s.p99)} us over {s.n} calls\n"
    return head + format_profile(out, calls + min(200, calls))


async def handler_cost(tmp: Path, state: Path, case: Case, config: Path | None, calls: int) -> str:
    """The plugin's own handler, in this process, without gRPC or a profiler: its share of the RPC."""
    from gpunode.agent.nvml import open_nvml
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.common.logging import configure_logging
    from gpunode.device_plugin.cli import SPEC
    from gpunode.device_plugin.plugin import AgentOptions, DevicePlugin
    from gpunode.device_plugin.server import _Servicer
    from gpunode.device_plugin.settings import PluginSettings, plugin_settings

    plugin_dir = tmp / f"in-process-{case.key}"
    plugin_dir.mkdir()
    argv = [
        "--sim-state",
        str(state),
        "--kubelet-socket",
        str(plugin_dir / "kubelet.sock"),
        "--http-port",
        "-1",
    ]
    argv += ["--config-file", str(config)] if config is not None else []
    env = plugin_env()
    parser = SPEC.parser()
    parsed = parser.parse(argv, env, PluginConfig)
    # the plugin's log lines (errors only) go nowhere: stdout carries the report
    configure_logging("json", "error", agent="device-plugin", stream=io.StringIO())

    def load(cfg: PluginConfig | None) -> PluginSettings:
        return plugin_settings(parser.resolve(parsed.args, env, cfg)[0], cfg)

    settings = load(parsed.config)
    opts = AgentOptions(
        kubelet_socket=plugin_dir / "kubelet.sock", config_file=None, load_settings=load, http_port=None
    )

    async def open_() -> Any:
        return await open_nvml(settings.driver_root, None, state)

    plugin = DevicePlugin(opts, open_, settings, parsed.config)
    plugin.nvml = await open_()
    try:
        await plugin.reconcile(initial=True)
        handler = getattr(_Servicer(plugin.servers[RESOURCE]), case.method)
        for _ in range(200):
            response = await handler(case.request, None)
        clock = time.perf_counter_ns
        samples = [0] * calls
        for i in range(calls):
            t0 = clock()
            await handler(case.request, None)
            samples[i] = clock() - t0
    finally:
        await plugin._stop_all()
        await plugin.nvml.close()
    s = stats(samples, "us")
    return (
        f"handler alone (in-process, no gRPC, no profiler): p50 {fmt(s.median)} us, p99 {fmt(s.p99)} us "
        f"over {s.n} calls; response {response.ByteSize()} bytes serialized "
        f"(the floor's: 0), request {case.request.ByteSize()} bytes"
    )


# -- the run -------------------------------------------------------------------------------------------------
@dataclass
class Result:
    figures: list[Figure] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    profiles: dict[str, str] = field(default_factory=dict)


async def run(it: Iterations, tmp: Path, every_profile: bool) -> Result:
    import psutil

    from gpunode.sim.kubelet import FakeKubelet
    from gpunode.sim.nvml import init_state_file, read_state_file

    result = Result()
    sim_dir, config_dir = tmp / "sim", tmp / "config"
    sim_dir.mkdir()
    config_dir.mkdir()
    state = sim_dir / "state.json"
    init_state_file(state, PRESET)
    node = read_state_file(state)
    uuids = [node.gpu_uuid(i) for i in range(GPUS)]
    config = config_dir / "time-slicing.yaml"
    config.write_text(TIME_SLICING_CONFIG)

    kubelet = FakeKubelet(tmp / "kubelet")
    kubelet_shared = FakeKubelet(tmp / "kubelet-shared")
    await kubelet.start()
    await kubelet_shared.start()
    floor_proc: subprocess.Popen[Any] | None = None
    floor_channel: grpc.aio.Channel | None = None
    injector: Injector | None = None
    running: list[Plugin] = []
    startups: list[int] = []
    try:
        # 5. XID -> Unhealthy, one batch of 8 per plugin lifetime
        injector = Injector(tmp, state)
        await injector.ready()
        xid_samples: list[int] = []
        for batch in range(it.xid_batches):
            plugin = await start_plugin(tmp, f"plugin-xid-{batch}", kubelet, state, GPUS)
            running.append(plugin)
            startups.append(plugin.startup_ns)
            xid_samples += await xid_batch(kubelet, injector, uuids, batch)
            await stop_child(plugin.proc)
            running.remove(plugin)
            await injector.command("restore")

        # the plugin measured from here on, and the time-sliced one
        plugin = await start_plugin(tmp, "plugin", kubelet, state, GPUS)
        running.append(plugin)
        startups.append(plugin.startup_ns)
        rss_started = rss_mb(plugin.pid)
        shared = await start_plugin(
            tmp, "plugin-shared", kubelet_shared, state, GPUS * REPLICAS, config=config
        )
        running.append(shared)
        floor_proc, floor_channel, floor = await open_floor(tmp)

        # 1.-4. latency, floor and plugin taking turns
        cases = latency_cases(it, uuids, floor, plugin, shared)
        await check_answers(cases)
        samples = await measure_latency(cases, it)
        result.figures += latency_figures(cases, samples)
        rss_shared = rss_mb(shared.pid)
        rss_floor = rss_mb(floor_proc.pid)
        await stop_child(shared.proc)
        running.remove(shared)

        x = stats(xid_samples, "ms")
        sec = "health: XID (other process) -> Unhealthy on ListAndWatch"
        result.figures.append(
            Figure(
                sec,
                f"fatal XID, {len(xid_samples) // GPUS} batches x {GPUS} GPUs",
                "ms",
                x.n,
                x.median,
                x.p99,
                f"p99 <= {fmt(XID_TARGET_MS)} ms",
                x.p99 <= XID_TARGET_MS,
            )
        )

        # 6. kubelet restarts
        to_register, to_listed = await kubelet_restarts(kubelet, it.restarts)
        sec = "kubelet restart (sockets wiped, kubelet.sock anew)"
        r, lst = stats(to_register, "ms"), stats(to_listed, "ms")
        result.figures.append(Figure(sec, "kubelet back -> Register accepted", "ms", r.n, r.median, r.p99))
        result.figures.append(
            Figure(
                sec,
                "kubelet back -> registered, devices listed",
                "ms",
                lst.n,
                lst.median,
                lst.p99,
                f"p99 <= {fmt(REREGISTER_TARGET_MS)} ms",
                lst.p99 <= REREGISTER_TARGET_MS,
            )
        )
        s = stats(startups, "ms")
        result.figures.append(
            Figure(sec, "(plugin start -> registered, devices listed)", "ms", s.n, s.median, s.p99)
        )

        # 7. memory and idle CPU
        await asyncio.sleep(1.0)  # let the last restart settle
        sec = "resources (plugin process)"
        rss = rss_mb(plugin.pid)
        full = psutil.Process(plugin.pid).memory_full_info()
        result.figures.append(
            Figure(
                sec,
                "RSS after all runs",
                "MB",
                1,
                rss,
                rss,
                f"<= {fmt(RSS_TARGET_MB)} MB",
                rss <= RSS_TARGET_MB,
            )
        )
        result.figures.append(Figure(sec, "(RSS right after start-up)", "MB", 1, rss_started, rss_started))
        result.figures.append(
            Figure(
                sec, f"(RSS, time-sliced plugin, {GPUS * REPLICAS} devices)", "MB", 1, rss_shared, rss_shared
            )
        )
        result.figures.append(
            Figure(sec, "(RSS, floor process: bare grpc.aio servicer)", "MB", 1, rss_floor, rss_floor)
        )
        result.notes["memory"] = (
            f"plugin after all runs: RSS {full.rss / 1e6:.1f} MB, USS {full.uss / 1e6:.1f} MB, "
            f"PSS {full.pss / 1e6:.1f} MB ({rss_split(plugin.pid)}); "
            f"{psutil.Process(plugin.pid).num_threads()} threads"
        )
        await floor_channel.close()
        floor_channel = None
        await stop_child(floor_proc)
        cpu, per_thread = await idle_cpu(plugin.pid, it.idle_s)
        result.figures.append(
            Figure(
                sec,
                f"idle CPU over {it.idle_s:.0f} s, % of one core",
                "%",
                1,
                cpu,
                cpu,
                f"<= {IDLE_CPU_TARGET_PCT} %",
                cpu <= IDLE_CPU_TARGET_PCT,
            )
        )
        if plugin.proc.poll() is not None:
            raise RuntimeError(f"the plugin exited during the run:\n{log_tail(plugin.log)}")
        await stop_child(plugin.proc)
        running.remove(plugin)

        # what a miss costs: profiles and breakdowns
        if cpu > IDLE_CPU_TARGET_PCT or every_profile:
            result.notes["idle CPU per thread"] = per_thread
        if rss > RSS_TARGET_MB or every_profile:
            result.notes["import cost"] = import_breakdown()
        by_label = {f.figure: f for f in result.figures}
        for case in cases:
            if case.kind == "floor" or not (by_label[case.label].ok is False or every_profile):
                continue
            shared_case = case.plugin == "shared"
            key = f"{case.label}: plugin under cProfile (main thread), {it.profile_calls} calls"
            cfg = config if shared_case else None
            profile = await profile_case(
                tmp, kubelet_shared if shared_case else kubelet, state, case, cfg, it.profile_calls
            )
            own = await handler_cost(tmp, state, case, cfg, it.profile_calls)
            result.profiles[key] = own + "\n" + profile
    finally:
        for p in running:
            await stop_child(p.proc)
        if floor_channel is not None:
            await floor_channel.close()
        if floor_proc is not None:
            await stop_child(floor_proc)
        if injector is not None:
            await injector.close()
        await kubelet.stop()
        await kubelet_shared.stop()
    return result


# -- report --------------------------------------------------------------------------------------------------
def cpu_ticks() -> list[int]:
    """The aggregate `cpu` line of /proc/stat (user nice system idle iowait irq softirq steal ...)."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return []


def steal_percent(before: list[int], after: list[int]) -> str:
    """CPU time the hypervisor took away (steal) and the machine's busy share, over the run."""
    if len(before) < 8 or len(after) < 8:
        return "unknown"
    delta = [a - b for a, b in zip(after, before, strict=False)]
    total = sum(delta[:8]) or 1
    busy = total - delta[3] - delta[4]
    return f"steal {100 * delta[7] / total:.1f} %, all CPUs busy {100 * busy / total:.0f} % of the time"


def machine() -> dict[str, Any]:
    import psutil

    return machine_base(
        memory_gb=round(psutil.virtual_memory().total / 1e9, 1),
        grpcio=metadata.version("grpcio"),
        protobuf=metadata.version("protobuf"),
        load_average_start=load_average(),
    )


def cell(value: float, unit: str) -> str:
    return f"{fmt(value)} {unit}"


def table(figures: list[Figure]) -> str:
    head = ("figure", "n", "median", "p99", "target", "verdict")
    rows = [
        (
            f.figure,
            str(f.n),
            cell(f.median, f.unit),
            "-" if f.n == 1 else cell(f.p99, f.unit),
            f.target,
            f.verdict,
        )
        for f in figures
    ]
    widths = [max(len(r[c]) for r in (head, *rows)) for c in range(len(head))]
    right = {1, 2, 3}

    def line(r: tuple[str, ...]) -> str:
        cells = (r[c].rjust(widths[c]) if c in right else r[c].ljust(widths[c]) for c in range(len(r)))
        return "  ".join(cells).rstrip()

    out = [line(head), "  ".join("-" * w for w in widths)]
    section = None
    for f, r in zip(figures, rows, strict=True):
        if f.section != section:
            if section is not None:
                out.append("")
            out.append(f"[{f.section}]")
            section = f.section
        out.append(line(r))
    return "\n".join(out)


def order(figures: list[Figure]) -> list[Figure]:
    """Sections in first-seen order, figures within a section in their own order."""
    sections: dict[str, list[Figure]] = {}
    for f in figures:
        sections.setdefault(f.section, []).append(f)
    return [f for group in sections.values() for f in group]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="fewer samples, a 15 s idle window (a smoke run)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile every plugin RPC path, on target or not"
    )
    parser.add_argument("--serve-floor", metavar="SOCKET", help=argparse.SUPPRESS)
    parser.add_argument("--xid-helper", metavar="STATE", help=argparse.SUPPRESS)
    parser.add_argument("--profiled-plugin", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_floor:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_floor(args.serve_floor))
        return 0
    if args.xid_helper:
        return xid_helper(Path(args.xid_helper))
    if args.profiled_plugin:
        return profiled_plugin(args.profiled_plugin[0], args.profiled_plugin[1:])

    it = QUICK if args.quick else FULL
    started = time.perf_counter()
    ticks = cpu_ticks()
    host = machine()
    try:
        with tempfile.TemporaryDirectory(prefix="dp-bench-") as tmp:
            result = asyncio.run(run(it, Path(tmp), args.profile))
    finally:
        kill_children()
    host["load_average_end"] = load_average()
    host["cpu_during_run"] = steal_percent(ticks, cpu_ticks())
    elapsed = time.perf_counter() - started
    figures = order(result.figures)
    missed = [f for f in figures if f.ok is False]

    if args.json:
        doc = {
            "preset": PRESET,
            "machine": host,
            "iterations": asdict(it),
            "quick": args.quick,
            "elapsed_s": round(elapsed, 2),
            "figures": [{**asdict(f), "verdict": f.verdict} for f in figures],
            "missed": [f.figure for f in missed],
            "notes": result.notes,
            "profiles": result.profiles,
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0

    print(f"Device plugin benchmark: preset {PRESET} ({GPUS} GPUs), {'quick' if args.quick else 'full'} run")
    print(f"machine: {host['platform']}; {host['cpu']}; {host['memory_gb']} GB")
    print(
        f"         {host['python']}; {host['cpu_count']} CPUs ({host['cpus_usable']} usable); "
        f"grpcio {host['grpcio']}, protobuf {host['protobuf']}"
    )
    print(
        f"         load average {host['load_average_start']} at start, {host['load_average_end']} at end; "
        f"during the run: {host['cpu_during_run']}"
    )
    print(
        f"samples: {it.calls} calls per latency case ({it.calls_512} for 512 IDs) after {it.warmup} warm-up "
        f"calls, in {it.rounds} rounds, each plugin case taking turns with its floor case call by call; "
        f"{it.xid_batches} x {GPUS} XIDs; {it.restarts} kubelet restarts; "
        f"idle window {it.idle_s:.0f} s" + (" (--quick: 15 s instead of 60 s)" if args.quick else "")
    )
    print(
        "plugin: its own process (gpunode-device-plugin --sim-state); client and fake kubelet: this process"
    )
    print()
    print(table(figures))
    print()
    if missed:
        print("MISSED TARGET: " + "; ".join(f"{f.figure} [{f.section}]" for f in missed))
    else:
        print("All targets met.")
    for key, text in result.notes.items():
        print(f"\n== {key}\n{text.rstrip()}")
    for key, text in result.profiles.items():
        print(f"\n== cProfile: {key}\n{text.rstrip()}")
    print(f"\nelapsed {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

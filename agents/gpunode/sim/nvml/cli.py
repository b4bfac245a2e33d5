"""`gpunode sim ...`: create, inspect and break a shared simulated node from outside."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from gpunode.nvml import mig
from gpunode.sim import hosttree
from gpunode.sim.nvml import codes
from gpunode.sim.nvml.node import SimNode, init_state_file
from gpunode.sim.nvml.presets import PRESETS, UnknownPreset, get_preset, preset_names
from gpunode.sim.nvml.state import ALL, FABRIC_FAULTS, INIT_FAULTS, SimNodeState, StateError

MIB = 1 << 20


class UsageError(Exception):
    """Bad arguments: exit 2, state untouched."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sub-commands of `gpunode sim`."""
    s = p.add_subparsers(dest="sim_command", required=True, metavar="COMMAND")
    state_env = os.environ.get("GPUNODE_SIM_STATE")

    def with_state(q: argparse.ArgumentParser) -> argparse.ArgumentParser:
        q.add_argument(
            "--state",
            type=Path,
            default=Path(state_env) if state_env else None,
            required=state_env is None,
            help="shared state file (env GPUNODE_SIM_STATE)",
        )
        return q

    def with_gpu(q: argparse.ArgumentParser, required: bool = True) -> argparse.ArgumentParser:
        q.add_argument("--gpu", type=int, required=required, metavar="INDEX", help="GPU index")
        return q

    s.add_parser("presets", help="list the simulated node presets")
    q = with_state(s.add_parser("init", help="create a state file for a fresh simulated node"))
    q.add_argument("preset", help="one of: " + ", ".join(preset_names()))
    q.add_argument("--seed", type=int, default=0, help="telemetry seed (default 0)")
    q.add_argument("--force", action="store_true", help="replace an existing state file")
    q.add_argument(
        "--host-root",
        type=Path,
        metavar="DIR",
        help="also lay down the node's /sys, /proc and /dev under DIR (kept in step with MIG changes)",
    )
    q.add_argument(
        "--imex-channel",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="with --host-root: also the IMEX channel node /dev/nvidia-caps-imex-channels/channelN",
    )
    q = with_state(s.add_parser("show", help="inventory, MIG layout, faults and recent events"))
    q.add_argument("--json", action="store_true", help="print the state as JSON")
    q = with_gpu(with_state(s.add_parser("xid", help="inject an XID event")))
    q.add_argument("--xid", type=int, required=True, help="XID code, e.g. 79 (fell off the bus), 48 (DBE)")
    q.add_argument("--gi", type=int, default=None, help="GPU instance the XID belongs to (MIG)")
    q.add_argument("--ci", type=int, default=None, help="compute instance the XID belongs to (MIG)")
    with_gpu(with_state(s.add_parser("lose", help="the GPU falls off the bus (GPU_IS_LOST from now on)")))
    with_gpu(
        with_state(s.add_parser("restore", help="clear faults (one GPU, or every fault)")), required=False
    )
    q = with_gpu(with_state(s.add_parser("ecc", help="inject ECC errors")))
    q.add_argument("--type", choices=("sbe", "dbe"), required=True, help="single- or double-bit")
    q.add_argument("--count", type=int, default=1)
    with_gpu(with_state(s.add_parser("reset", help="reset a GPU (applies a pending MIG mode)")))
    q = with_gpu(with_state(s.add_parser("fabric", help="NVLink fabric state of a GPU (GB200 presets)")))
    q.add_argument("fault", choices=("ok", *FABRIC_FAULTS), help="ok, or the fault to report from now on")
    q = with_state(s.add_parser("fail-init", help="make NVML init fail from now on"))
    q.add_argument("reason", choices=sorted(INIT_FAULTS))
    q = with_gpu(with_state(s.add_parser("proc", help="start or stop a simulated GPU process")))
    q.add_argument("--pid", type=int, required=True)
    q.add_argument("--mem", type=int, default=1024, metavar="MIB", help="memory it uses (default 1024)")
    q.add_argument("--gi", type=int, default=None)
    q.add_argument("--ci", type=int, default=None)
    q.add_argument("--stop", action="store_true", help="stop the process instead")


def _check_gpu(state: SimNodeState, gpu: int) -> None:
    if not 0 <= gpu < len(state.gpus):
        raise UsageError(f"no GPU with index {gpu}: preset {state.preset} has GPUs 0-{len(state.gpus) - 1}")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (UsageError, StateError, UnknownPreset) as exc:
        print(f"gpunode sim: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    cmd = args.sim_command
    if cmd == "presets":
        for name in preset_names():
            print(f"{name:<15} {PRESETS[name].description}")
        return 0
    path: Path = args.state
    if cmd == "init":
        get_preset(args.preset)
        root: Path | None = args.host_root
        if root is None and args.imex_channel:
            raise UsageError("--imex-channel needs --host-root (the channel nodes live in the host tree)")
        if root is not None and root.exists() and not root.is_dir():
            raise UsageError(f"--host-root {root} is not a directory")
        if any(not 0 <= c < 2048 for c in args.imex_channel):
            raise UsageError("--imex-channel: IMEX channels are 0-2047")
        state = init_state_file(path, args.preset, seed=args.seed, force=args.force)
        print(f"created {path}: {state.preset}, {len(state.gpus)} GPUs")
        if root is not None:
            hosttree.build(root, state, imex_channels=args.imex_channel)
            hosttree.link(path, root)
            print(f"host tree at {root}: /sys, /proc/driver/nvidia, /proc/devices and /dev of the node")
        return 0
    node = SimNode.open(path)
    if cmd == "show":
        if args.json:
            print(json.dumps(node.state.to_json(), indent=2))
        else:
            print(render(node.state))
        return 0
    target: int | None = getattr(args, "gpu", None)
    if target is not None:
        _check_gpu(node.state, target)
    gpu = -1 if target is None else target
    now = time.time()
    with node.mutate() as st:
        if cmd == "xid":
            st.inject_xid(
                gpu, args.xid, ALL if args.gi is None else args.gi, ALL if args.ci is None else args.ci, now
            )
            msg = f"XID {args.xid} on GPU {gpu}"
        elif cmd == "lose":
            st.lose(gpu, now)
            msg = f"GPU {gpu} fell off the bus"
        elif cmd == "restore":
            st.restore(target)
            msg = "faults cleared" + ("" if target is None else f" on GPU {target}")
        elif cmd == "ecc":
            if args.count < 1:
                raise UsageError("--count must be at least 1")
            st.inject_ecc(gpu, args.type, args.count, now)
            msg = f"{args.count} {args.type.upper()} error(s) on GPU {gpu}"
        elif cmd == "reset":
            ret = st.reset_gpu(gpu)
            if ret != codes.SUCCESS:
                raise UsageError(f"GPU {gpu} reset failed: {codes.STRINGS.get(ret, ret)}")
            msg = f"GPU {gpu} reset; MIG mode now {'enabled' if st.gpus[gpu].mig_current else 'disabled'}"
        elif cmd == "fabric":
            if st.spec.fabric is None:
                raise UsageError(f"preset {st.preset} has no NVLink fabric (try gb200-nvl4)")
            st.set_fabric_fault(gpu, None if args.fault == "ok" else args.fault)
            msg = f"GPU {gpu} fabric: {args.fault}"
        elif cmd == "fail-init":
            st.init_fault = args.reason
            msg = f"NVML init will fail: {args.reason}"
        elif cmd == "proc":
            msg = _proc(st, gpu, args)
        else:  # pragma: no cover - argparse limits the choices
            raise UsageError(f"unknown command {cmd}")
    print(msg)
    return 0


def _proc(st: SimNodeState, gpu: int, args: argparse.Namespace) -> str:
    from gpunode.sim.nvml.state import ProcessState

    procs = st.gpus[gpu].processes
    if args.stop:
        before = len(procs)
        procs[:] = [p for p in procs if p.pid != args.pid]
        if len(procs) == before:
            raise UsageError(f"no process {args.pid} on GPU {gpu}")
        return f"process {args.pid} stopped on GPU {gpu}"
    gi = ALL if args.gi is None else args.gi
    ci = ALL if args.ci is None else args.ci
    if gi != ALL and st.find_gi(gpu, gi) is None:
        raise UsageError(f"GPU {gpu} has no GPU instance {gi}")
    procs.append(ProcessState(args.pid, args.mem, gi, ci))
    return f"process {args.pid} started on GPU {gpu}"


def gi_name(state: SimNodeState, gpu: int, enum: int) -> str:
    product = state.product(gpu)
    spec = product.gi_profile(enum)
    assert spec is not None
    return mig.gi_profile_name(enum, product.memory_mib * MIB, spec.memory_mib)


def render(state: SimNodeState) -> str:
    preset = state.spec
    lines = [f"simulated node: {preset.name} ({preset.description}); driver {preset.driver_version}"]
    if state.init_fault:
        lines.append(f"FAULT: NVML init fails ({state.init_fault})")
    lines.append(f"{'GPU':<4}{'name':<26}{'uuid':<42}{'bus':<18}{'memory':>10}  MIG        health")
    for i, g in enumerate(state.gpus):
        product = state.product(i)
        if not product.mig_capable:
            mode = "n/a"
        else:
            mode = ("on" if g.mig_current else "off") + (
                f"->{'on' if g.mig_pending else 'off'}" if g.mig_pending != g.mig_current else ""
            )
        health = "LOST" if g.lost else "ok"
        if g.fabric_fault:
            health += f" fabric {g.fabric_fault}"
        if g.dbe_volatile or g.sbe_volatile:
            health += f" ecc sbe={g.sbe_volatile} dbe={g.dbe_volatile}"
        lines.append(
            f"{i:<4}{product.name:<26}{state.gpu_uuid(i):<42}{preset.gpus[i].bus_id:<18}"
            f"{product.memory_mib:>7} MiB  {mode:<10} {health}"
        )
    for i, g in enumerate(state.gpus):
        for gi in g.gis:
            cis = ", ".join(
                f"CI {ci.id} {mig.ci_profile_name(gi_name(state, i, gi.profile), ci.size)}@{ci.start}"
                for ci in gi.cis
            )
            lines.append(
                f"  GPU {i} GI {gi.id:<2} {gi_name(state, i, gi.profile):<12} "
                f"placement {gi.start}:{gi.size}  "
                f"[{cis or 'no compute instances'}]"
            )
        for p in g.processes:
            where = "" if p.gi == ALL else f" (GI {p.gi} CI {p.ci})"
            lines.append(f"  GPU {i} process {p.pid} using {p.used_mib} MiB{where}")
    recent = state.events[-5:]
    if recent:
        lines.append("recent events:")
        names = {0x1: "SBE", 0x2: "DBE", 0x8: "XID", 0x100: "MIG config"}
        for ev in recent:
            lines.append(
                f"  #{ev.seq} GPU {ev.gpu} {names.get(ev.type, hex(ev.type))} "
                f"{ev.data if ev.type == 0x8 else ''}".rstrip()
            )
    return "\n".join(lines)

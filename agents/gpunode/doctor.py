"""gpunode doctor: check this GPU node end to end and say what to do about each problem.

    gpunode doctor [--json] [--host-root DIR] [--sim-state FILE] [--mig-config NAME] [...]

Checks, in order: nvml, nouveau, modules, device-nodes, persistence, mig, fabric, device-plugin, cdi,
runtime, labels, exporter, xid. Each one ends ok, warn, fail or skip (a check that does not apply here,
such as the kubelet's on a machine that is not a Kubernetes node); every warn and fail carries a fix.
Exit 0 when nothing failed, 1 otherwise, 2 on bad usage. On a simulated node (--simulate / --sim-state)
the kernel checks (modules, device nodes, nouveau, persistence) look at --host-root only when one is
given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gpunode.common.cli import parse_interval as _interval
from gpunode.common.errors import ConfigError
from gpunode.common.hostpaths import HostPaths
from gpunode.common.settings import CommonSettings, SettingsParser, group, setting
from gpunode.validator import checks

if TYPE_CHECKING:
    from gpunode.nvml.api import GpuInfo, Nvml

__all__ = [
    "Check",
    "DoctorOptions",
    "DoctorSettings",
    "diagnose",
    "main",
    "options",
    "render_json",
    "render_table",
]

Status = Literal["ok", "warn", "fail", "skip"]
CHECK_NAMES = (
    "nvml",
    "nouveau",
    "modules",
    "device-nodes",
    "persistence",
    "mig",
    "fabric",
    "device-plugin",
    "cdi",
    "runtime",
    "labels",
    "exporter",
    "xid",
)
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
GFD_OUTPUT = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
PERSISTENCED_PIDS = (
    "/var/run/nvidia-persistenced/nvidia-persistenced.pid",
    "/run/nvidia-persistenced/nvidia-persistenced.pid",
)
REGENERATE_CDI = (
    "regenerate the spec: gpunode-toolkit cdi generate --output /var/run/cdi/nvidia.yaml "
    "(or nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml); specs go stale after driver "
    "upgrades and MIG changes"
)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


NodeLabels = Callable[[], Awaitable[Mapping[str, str]]]


@dataclass(frozen=True)
class DoctorOptions:
    paths: HostPaths
    simulated: bool = False
    host_given: bool = False  # --host-root named a tree (a simulated node then checks it too)
    mig_config: str | None = None
    mig_config_file: str | None = None
    exporter_port: int | None = 9400  # None: not checked
    gfd_output_file: str = GFD_OUTPUT  # a host path
    gfd_sleep_interval: float | None = 60.0  # None: "infinite" (freshness not checked)
    xid_window: float = 2.0
    runtime_name: str = checks.DEFAULT_RUNTIME_NAME
    cdi_kind: str = checks.DEFAULT_CDI_KIND
    http_timeout: float = 2.0
    marker_nodes: bool = False  # accept the fake host's marker files as device nodes (tests)
    clock: Callable[[], float] = field(default=time.time, compare=False)


@dataclass
class _Facts:
    """What several checks share: NVML's answers, the exporter's page, whether this is a kube node."""

    nvml: Nvml | None = None
    nvml_error: str = ""
    driver_version: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)
    devices: list[checks.DeviceRef] = field(default_factory=list)
    kube_node: bool = False
    exporter_status: int = 0
    exporter_body: str = ""


def _skip_kernel(opts: DoctorOptions) -> str:
    if opts.simulated and not opts.host_given:
        return "simulated node: no kernel driver to look at (give --host-root to check a host tree)"
    return ""


# ---------------------------------------------------------------------------------------------- checks


async def _nvml_check(facts: _Facts, open_nvml: checks.NvmlOpener) -> Check:
    from gpunode.nvml import errors

    fix = (
        "load the driver (gpunode-driver-loader init, or the host's driver packages), then check "
        "`nvidia-smi` and `dmesg | grep -i nvrm`; in a container, --driver-root must point at the driver"
    )
    try:
        facts.nvml = await open_nvml()
        system = await facts.nvml.system()
        facts.gpus = await facts.nvml.gpus()
        facts.devices = await checks.nvml_devices(facts.nvml)
        lost = await facts.nvml.lost_gpus()
    except (errors.NvmlError, OSError) as exc:
        facts.nvml_error = f"NVML: {exc}"
        if facts.nvml is not None:  # loaded but not answering: the checks that need it skip
            with contextlib.suppress(errors.NvmlError, OSError):
                await facts.nvml.close()
            facts.nvml, facts.gpus, facts.devices = None, [], []
        return Check("nvml", "fail", facts.nvml_error, fix)
    facts.driver_version = system.driver_version
    major, minor = system.cuda_version
    detail = f"driver {system.driver_version}, CUDA {major}.{minor}, {len(facts.gpus)} GPUs"
    if not facts.gpus:
        return Check("nvml", "fail", detail, "no GPU visible: check `lspci -d 10de:` and `dmesg`")
    if lost:
        return Check(
            "nvml",
            "fail",
            f"{detail}; GPU {', '.join(map(str, lost))} lost (fell off the bus)",
            "drain the node and reset the GPU (nvidia-smi -r) or reboot; check power and PCIe seating",
        )
    return Check("nvml", "ok", detail)


def _loaded(paths: HostPaths, module: str) -> bool:
    if (paths.sys_module(module) / "refcnt").exists():
        return True
    with contextlib.suppress(OSError):
        for line in paths.proc_modules.read_text().splitlines():
            if line.split(" ", 1)[0] == module:
                return True
    return False


def _nouveau_check(opts: DoctorOptions) -> Check:
    if why := _skip_kernel(opts):
        return Check("nouveau", "skip", why)
    paths = opts.paths
    blacklist = (
        "blacklist nouveau: write 'blacklist nouveau' and 'options nouveau modeset=0' to "
        "/etc/modprobe.d/blacklist-nouveau.conf, rebuild the initramfs and reboot "
        "(gpunode-driver-loader init unloads it when nothing uses it)"
    )
    if _loaded(paths, "nouveau"):
        return Check("nouveau", "fail", "the nouveau module is loaded and holds the GPUs", blacklist)
    if paths.sys_module("nouveau").is_dir():
        return Check(
            "nouveau",
            "warn",
            "nouveau is built into the kernel",
            "add 'modprobe.blacklist=nouveau nouveau.modeset=0' to the kernel command line and reboot",
        )
    return Check("nouveau", "ok", "not loaded")


def _modules_check(opts: DoctorOptions) -> Check:
    if why := _skip_kernel(opts):
        return Check("modules", "skip", why)
    loaded = {m: _loaded(opts.paths, m) for m in ("nvidia", "nvidia_uvm", "nvidia_modeset")}
    missing = [m for m, ok in loaded.items() if not ok]
    fix = "gpunode-driver-loader init (or: modprobe -a nvidia nvidia-uvm nvidia-modeset)"
    if "nvidia" in missing:
        return Check("modules", "fail", "the nvidia module is not loaded", fix)
    if "nvidia_uvm" in missing:
        return Check("modules", "fail", "nvidia_uvm is not loaded: CUDA cannot run", "modprobe nvidia-uvm")
    if missing:
        return Check("modules", "warn", "nvidia_modeset is not loaded", "modprobe nvidia-modeset")
    return Check("modules", "ok", "nvidia, nvidia_uvm, nvidia_modeset loaded")


def _majors(paths: HostPaths) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        chars = paths.proc_devices.read_text().split("Block devices:")[0]
        for line in chars.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                out[parts[1]] = int(parts[0])
    return out


def _node_major(path: Path) -> int | None:
    try:
        st = path.stat()
        if stat.S_ISCHR(st.st_mode):
            return os.major(st.st_rdev)
        match = re.match(r"c (\d+):\d+", path.read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _proc_minors(paths: HostPaths) -> list[int]:
    minors = []
    with contextlib.suppress(OSError):
        for info in sorted((paths.proc_driver_nvidia / "gpus").glob("*/information")):
            match = re.search(r"Device Minor:\s*(\d+)", info.read_text())
            if match:
                minors.append(int(match.group(1)))
    return minors


def _device_nodes_check(opts: DoctorOptions, facts: _Facts) -> Check:
    if why := _skip_kernel(opts):
        return Check("device-nodes", "skip", why)
    paths = opts.paths
    minors = sorted({g.minor for g in facts.gpus}) if facts.gpus else _proc_minors(paths)
    required = [paths.nvidiactl] + [paths.dev_nvidia(m) for m in minors]
    if _loaded(paths, "nvidia_uvm"):
        required += [paths.nvidia_uvm, paths.nvidia_uvm_tools]
    majors = _majors(paths)
    frontend = majors.get("nvidia-frontend", majors.get("nvidia"))
    problems: list[str] = []
    modes: list[str] = []
    for node in required:
        problem, mode = checks.device_node_problem(node, marker_ok=opts.marker_nodes)
        if problem:
            problems.append(f"/dev/{node.name} {problem}")
            continue
        if mode != 0o666:
            modes.append(f"/dev/{node.name} has mode {mode:04o}")
        on_frontend = node.name == "nvidiactl" or node.name.removeprefix("nvidia").isdigit()
        if frontend is not None and on_frontend:
            major = _node_major(node)
            if major is not None and major != frontend:
                problems.append(f"/dev/{node.name} has major {major}, the driver has {frontend}")
    optional, _ = checks.device_node_problem(paths.nvidia_modeset, marker_ok=opts.marker_nodes)
    if problems:
        return Check(
            "device-nodes",
            "fail",
            "; ".join(problems),
            "create them: gpunode-driver-loader init (it makes the nodes), or nvidia-modprobe -c0 -u; "
            "nvidia-uvm nodes appear only after the first CUDA use otherwise",
        )
    if modes:
        return Check(
            "device-nodes",
            "fail",
            "; ".join(modes) + " (the driver creates them 0666)",
            "chmod 0666 /dev/nvidia*; check the NVreg_DeviceFileMode/UID/GID module parameters",
        )
    shown = ", ".join(f"/dev/{n.name}" for n in required)
    if optional:
        return Check(
            "device-nodes", "warn", f"{shown} ok; /dev/nvidia-modeset {optional}", "nvidia-modprobe -m"
        )
    return Check("device-nodes", "ok", f"{shown} (0666)")


def _persistence_check(opts: DoctorOptions) -> Check:
    if why := _skip_kernel(opts):
        return Check("persistence", "skip", why)
    paths = opts.paths
    fix = (
        "start nvidia-persistenced (systemctl enable --now nvidia-persistenced); without it the driver "
        "tears GPU state down whenever the last client exits"
    )
    candidates = [paths.host(p) for p in PERSISTENCED_PIDS] + [paths.driver(PERSISTENCED_PIDS[0])]
    for pid_file in candidates:
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if (paths.proc / str(pid)).is_dir():
            return Check("persistence", "ok", f"nvidia-persistenced running (pid {pid})")
        return Check("persistence", "warn", f"{pid_file} names pid {pid}, which is gone", fix)
    return Check("persistence", "warn", "nvidia-persistenced is not running (no pid file)", fix)


async def _mig_check(opts: DoctorOptions, facts: _Facts, node_labels: NodeLabels | None) -> Check:
    if facts.nvml is None:
        return Check("mig", "skip", "NVML unavailable")
    capable = [(g.index, g.mig) for g in facts.gpus if g.mig is not None]
    if not capable:
        return Check("mig", "skip", "no MIG-capable GPU")
    pending = [index for index, mode in capable if mode.current != mode.pending]
    modes = ", ".join(f"{index}:{'on' if mode.current else 'off'}" for index, mode in capable)
    if pending:
        return Check(
            "mig",
            "fail",
            f"MIG mode change pending on GPU {', '.join(map(str, pending))} (mode {modes})",
            "reset those GPUs (nvidia-smi -r -i N with no process on them) or reboot",
        )
    name, source = opts.mig_config, "--mig-config"
    if name is None and node_labels is not None:
        try:
            name = (await node_labels()).get(MIG_CONFIG_LABEL)
        except Exception as exc:  # any API failure only makes this check skip
            return Check(
                "mig", "warn", f"MIG mode {modes}; node labels unreadable: {exc}", "check --kubeconfig"
            )
        source = f"label {MIG_CONFIG_LABEL}"
    if not name:
        return Check("mig", "skip", f"MIG mode {modes}; no config selected (--mig-config or the node label)")
    from gpunode.api.mig_config import UnknownConfig, load_spec
    from gpunode.mig.plan import DesiredGpu, Infeasible, plan_node
    from gpunode.mig.selection import SelectionError, desired_per_gpu, no_gpu_matched
    from gpunode.mig.state import identity, read_states, select_gpus

    file_hint = opts.mig_config_file or "the default layouts"
    try:
        if opts.mig_config_file:
            spec = load_spec(opts.mig_config_file)
        else:
            from gpunode.mig.layouts import default_spec

            spec = default_spec()
        entries = spec.select(name)
        ids = [identity(g) for g in facts.gpus]
        chosen = desired_per_gpu(name, entries, ids)
        unmatched = no_gpu_matched(name, entries, ids)
        desired = {i: DesiredGpu(d.mig_enabled, dict(d.devices)) for i, d in chosen.items()}
        states = await read_states(facts.nvml, select_gpus(facts.gpus, desired))
        plan = plan_node(states, desired)
    except (ConfigError, UnknownConfig, SelectionError, Infeasible) as exc:
        return Check("mig", "fail", f"config {name!r} ({source}): {exc}", f"fix the config in {file_hint}")
    if unmatched is not None:  # mig-parted's rule: success, nothing changed; worth a look all the same
        return Check(
            "mig", "warn", f"{unmatched} ({source})", f"select a config for this node's GPUs in {file_hint}"
        )
    if plan.empty:
        return Check("mig", "ok", f"layout matches {name!r} ({source}); MIG mode {modes}")
    file_flag = f" -f {opts.mig_config_file}" if opts.mig_config_file else ""
    return Check(
        "mig",
        "fail",
        f"layout differs from {name!r} ({source}): " + "; ".join(plan.describe()),
        f"gpunode-mig apply{file_flag} -c {name} (with the MIG manager running, look at the "
        "nvidia.com/mig.config.state label and its log)",
    )


FABRIC_FIX = (
    "the NVLink fabric is trained by the fabric manager (GB200 NVL: nvidia-imex and the NVLink switch "
    "trays' NVLink Subnet Manager/fabric manager): check `nvidia-smi -q -d FABRIC` (state, status, "
    "clique), that those services run, and the switch trays and cables; GPUs join the fabric once it trains"
)


async def _fabric_check(facts: _Facts) -> Check:
    """NVLink fabric registration (GB200 NVL and the like) of every GPU: trained, healthy, one clique."""
    from gpunode.nvml import errors

    if facts.nvml is None:
        return Check("fabric", "skip", "NVML unavailable")
    infos = {}
    for gpu in facts.gpus:
        try:
            info = await facts.nvml.fabric_info(gpu.index)
        except errors.NvmlError as exc:
            return Check("fabric", "fail", f"GPU {gpu.index}: fabric info unreadable ({exc})", FABRIC_FIX)
        if info is not None and info.state != "not-supported":
            infos[gpu.index] = info
    if not infos:
        return Check("fabric", "skip", "no GPU on an NVLink fabric (GB200 NVL and the like)")
    failed = [f"GPU {i} (status {f.status})" for i, f in infos.items() if f.state == "completed" and f.status]
    untrained = [f"GPU {i} ({f.state})" for i, f in infos.items() if f.state != "completed"]
    degraded = [
        f"GPU {i} ({f.health or 'degraded bandwidth'})"
        for i, f in infos.items()
        if f.attached and (f.degraded_bandwidth or f.health in ("unhealthy", "limited-capacity"))
    ]
    cliques = sorted({f.clique for f in infos.values() if f.clique is not None})
    if failed:
        return Check("fabric", "fail", "fabric registration failed: " + ", ".join(failed), FABRIC_FIX)
    if len(cliques) > 1:
        return Check("fabric", "fail", "GPUs disagree on their clique: " + ", ".join(cliques), FABRIC_FIX)
    if untrained:
        return Check("fabric", "warn", "fabric not trained yet: " + ", ".join(untrained), FABRIC_FIX)
    if degraded:
        return Check("fabric", "warn", "fabric degraded: " + ", ".join(degraded), FABRIC_FIX)
    return Check("fabric", "ok", f"{len(infos)} GPUs on the NVLink fabric, clique {cliques[0]}")


def _plugin_check(opts: DoctorOptions, facts: _Facts) -> Check:
    paths = opts.paths
    if not facts.kube_node:
        return Check(
            "device-plugin", "skip", f"no kubelet directory {paths.kubelet_dir}: not a Kubernetes node"
        )
    kubelet = paths.kubelet_socket
    if not checks.socket_accepts(kubelet):
        return Check(
            "device-plugin",
            "fail",
            f"{kubelet} missing or not accepting: the kubelet's device manager is not serving",
            "check the kubelet (systemctl status kubelet); point --kubelet-dir at its root directory",
        )
    sockets = checks.plugin_sockets(paths)
    start = "start gpunode-device-plugin (DaemonSet or systemd unit); it serves nvidia-gpu.sock"
    if not sockets:
        return Check("device-plugin", "fail", f"no nvidia-*.sock in {paths.device_plugin_dir}", start)
    stale = [s.name for s in sockets if not checks.socket_accepts(s)]
    if stale:
        return Check(
            "device-plugin",
            "fail",
            f"stale socket(s) nobody serves: {', '.join(stale)}",
            "restart the plugin",
        )
    names = ", ".join(s.name for s in sockets)
    kubelet_mtime = kubelet.stat().st_mtime
    older = [s.name for s in sockets if s.stat().st_mtime < kubelet_mtime]
    if older:
        return Check(
            "device-plugin",
            "warn",
            f"{', '.join(older)} older than kubelet.sock: the kubelet restarted after the plugin registered",
            "the plugin re-registers when kubelet.sock is recreated; restart it if this persists",
        )
    return Check("device-plugin", "ok", f"kubelet.sock and {names} serving")


def _cdi_check(opts: DoctorOptions, facts: _Facts, runtime_files: bool) -> Check:
    specs = checks.load_cdi_specs(opts.paths)
    broken = [s.error for s in specs if s.error]
    ours = [s for s in specs if s.kind == opts.cdi_kind]
    if broken:
        return Check("cdi", "fail", "; ".join(broken), REGENERATE_CDI)
    if not ours:
        where = " or ".join(str(d) for d in opts.paths.cdi_dirs)
        if not facts.kube_node and not runtime_files:
            return Check("cdi", "skip", f"no CDI spec of kind {opts.cdi_kind} and no container runtime here")
        return Check("cdi", "fail", f"no CDI spec of kind {opts.cdi_kind} in {where}", REGENERATE_CDI)
    files = ", ".join(str(s.path.name) for s in ours)
    if facts.nvml is None:
        return Check("cdi", "warn", f"{files} present; not compared (NVML unavailable)", "fix the nvml check")
    missing = checks.cdi_missing(ours, facts.devices, opts.cdi_kind)
    if missing:
        return Check("cdi", "fail", f"{files} lacks " + ", ".join(d.label for d in missing), REGENERATE_CDI)
    stale = sorted({v for s in ours for v in s.libcuda_versions} - {facts.driver_version})
    if stale and facts.driver_version:
        return Check(
            "cdi",
            "fail",
            f"{files} mounts libcuda.so.{stale[0]} but the driver is {facts.driver_version}",
            REGENERATE_CDI,
        )
    return Check("cdi", "ok", f"{files} lists all {len(facts.devices)} devices")


def _runtime_check(opts: DoctorOptions, facts: _Facts, configs: checks.RuntimeConfigs) -> Check:
    name = opts.runtime_name
    configure = (
        "gpunode-toolkit runtime configure --runtime containerd (enables CDI; or nvidia-ctk runtime "
        f"configure --runtime=containerd --cdi.enabled), then restart the runtime; legacy: a handler {name!r}"
    )
    if configs.errors:
        return Check("runtime", "fail", "; ".join(configs.errors), "fix the file's syntax")
    engines = configs.has(name)
    if engines:
        extra = sorted({h for e in engines for h in configs.handlers[e] if h.startswith("nvidia")} - {name})
        more = f" (also {', '.join(extra)})" if extra else ""
        return Check("runtime", "ok", f"handler {name!r} in {', '.join(engines)}{more}")
    if configs.cdi:  # the default path: the runtime injects the CDI devices, no handler needed
        where = ", ".join(f"{e} ({p})" for e, p in sorted(configs.cdi.items()))
        return Check("runtime", "ok", f"CDI enabled in {where}; no runtime handler needed")
    if not configs.files:
        if not facts.kube_node:
            return Check("runtime", "skip", "no container runtime configuration here")
        return Check("runtime", "fail", "no containerd, CRI-O or Docker configuration found", configure)
    files = ", ".join(str(f) for f in configs.files)
    return Check("runtime", "fail", f"no runtime handler {name!r} in {files}", configure)


def _labels_check(opts: DoctorOptions, facts: _Facts) -> Check:
    path = opts.paths.host(opts.gfd_output_file)
    start = "start gpunode-feature-discovery (it writes GFD_OUTPUT_FILE for NFD)"
    try:
        st = path.stat()
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        if not facts.kube_node and not path.parent.is_dir():
            return Check("labels", "skip", "no NFD features directory: not a Kubernetes node")
        return Check("labels", "fail", f"{opts.gfd_output_file} missing", start)
    except OSError as exc:
        return Check("labels", "fail", f"{opts.gfd_output_file}: {exc.strerror}", start)
    age = opts.clock() - st.st_mtime
    if opts.gfd_sleep_interval is not None and age > 2 * opts.gfd_sleep_interval:
        return Check(
            "labels",
            "fail",
            f"{opts.gfd_output_file} is {age:.0f} s old (interval {opts.gfd_sleep_interval:g} s): stale",
            "feature discovery stopped updating it: check that gpunode-feature-discovery runs, and its log",
        )
    count = re.search(r"^nvidia\.com/gpu\.count=(\S*)", text, re.MULTILINE)
    if count is None:
        return Check("labels", "fail", f"{opts.gfd_output_file} has no nvidia.com/gpu.count", start)
    return Check("labels", "ok", f"gpu.count={count.group(1)}, updated {age:.0f} s ago")


def _exporter_check(opts: DoctorOptions, facts: _Facts) -> Check:
    if opts.exporter_port is None:
        return Check("exporter", "skip", "not checked (--exporter-port -1)")
    url = f"http://127.0.0.1:{opts.exporter_port}/metrics"
    start = f"start gpunode-exporter (or dcgm-exporter) on port {opts.exporter_port}; see its log"
    if facts.exporter_status == 0:
        if not facts.kube_node:
            return Check(
                "exporter", "skip", f"{url} not answering ({facts.exporter_body}); not a Kubernetes node"
            )
        return Check("exporter", "fail", f"{url} not answering ({facts.exporter_body})", start)
    if facts.exporter_status != 200:
        return Check("exporter", "fail", f"{url} answers {facts.exporter_status}", start)
    if re.search(r"^DCGM_FI_DEV_GPU_UTIL\{", facts.exporter_body, re.MULTILINE):
        return Check("exporter", "ok", f"{url} serves DCGM_FI_DEV_GPU_UTIL")
    if "DCGM_FI_" in facts.exporter_body:
        return Check(
            "exporter",
            "warn",
            f"{url} answers without DCGM_FI_DEV_GPU_UTIL (MIG GPUs do not report it)",
            "check the exporter's counters file",
        )
    return Check("exporter", "fail", f"{url} answers without DCGM_FI_* metrics", start)


_XID_LINE = re.compile(r"^DCGM_FI_DEV_XID_ERRORS\{([^}]*)\}\s+(\S+)", re.MULTILINE)


def _exporter_xids(body: str) -> list[tuple[str, int]]:
    found = []
    for labels, value in _XID_LINE.findall(body):
        gpu = re.search(r'gpu="([^"]*)"', labels)
        with contextlib.suppress(ValueError):
            xid = int(float(value))
            if xid:
                found.append((gpu.group(1) if gpu else "?", xid))
    return found


async def _watch_xids(nvml: Nvml, window: float) -> tuple[list[tuple[str, int]], str]:
    from gpunode.nvml import errors
    from gpunode.nvml.api import EVENT_XID, EventKind

    found: list[tuple[str, int]] = []
    ready = asyncio.Event()

    async def collect() -> None:
        async for event in nvml.events(EVENT_XID, ready=ready):
            if event.kind is EventKind.XID and event.xid is not None:
                found.append((str(event.gpu_index), event.xid))

    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(collect(), timeout=window)
    except errors.NvmlError as exc:
        return found, f"NVML events unavailable ({exc})"
    return found, ""


def _xid_check(opts: DoctorOptions, facts: _Facts, events: list[tuple[str, int]] | None, note: str) -> Check:
    from gpunode.nvml.xids import APPLICATION_XIDS

    exported = _exporter_xids(facts.exporter_body) if facts.exporter_status == 200 else []
    if events is None and facts.exporter_status != 200:
        return Check("xid", "skip", "neither NVML events nor the exporter available")
    seen = sorted(set((events or []) + exported))
    if not seen:
        sources = []
        if events is not None:
            sources.append(f"no XID during a {opts.xid_window:g} s watch")
        if facts.exporter_status == 200:
            sources.append("exporter reports none")
        return Check("xid", "ok", "; ".join(sources) + (f"; {note}" if note else ""))
    text = ", ".join(f"XID {x} on GPU {g}" for g, x in seen)
    if all(x in APPLICATION_XIDS for _, x in seen):
        return Check(
            "xid",
            "warn",
            text,
            "application errors (the GPU itself is fine): look at the workload that used the GPU",
        )
    return Check(
        "xid",
        "fail",
        text,
        "the GPU needs attention: drain the node, reset the GPU (nvidia-smi -r) or reboot, and look the "
        "code up in NVIDIA's XID catalog; XID 79/74/48/94/95 often mean hardware or firmware faults",
    )


# ----------------------------------------------------------------------------------------------- runner


async def diagnose(
    opts: DoctorOptions, open_nvml: checks.NvmlOpener, node_labels: NodeLabels | None = None
) -> list[Check]:
    """Run every check; never raises for what it finds (a broken node is a result, not an error)."""
    facts = _Facts(kube_node=opts.paths.kubelet_root.is_dir())
    results = [await _nvml_check(facts, open_nvml)]
    try:
        xid_task: asyncio.Task[tuple[list[tuple[str, int]], str]] | None = None
        if facts.nvml is not None and opts.xid_window > 0:
            xid_task = asyncio.create_task(_watch_xids(facts.nvml, opts.xid_window), name="xid-watch")
        if opts.exporter_port is not None:
            url = f"http://127.0.0.1:{opts.exporter_port}/metrics"
            facts.exporter_status, facts.exporter_body = await asyncio.to_thread(
                checks.http_get, url, opts.http_timeout
            )
        configs = checks.read_runtime_configs(opts.paths)
        results += [
            _nouveau_check(opts),
            _modules_check(opts),
            _device_nodes_check(opts, facts),
            _persistence_check(opts),
            await _mig_check(opts, facts, node_labels),
            await _fabric_check(facts),
            _plugin_check(opts, facts),
            _cdi_check(opts, facts, bool(configs.files)),
            _runtime_check(opts, facts, configs),
            _labels_check(opts, facts),
            _exporter_check(opts, facts),
        ]
        events, note = (await xid_task) if xid_task is not None else (None, "")
        results.append(_xid_check(opts, facts, events, note))
    finally:
        if facts.nvml is not None:
            await facts.nvml.close()
    return results


def render_table(results: Sequence[Check]) -> str:
    width = max(len(c.name) for c in results)
    lines = [f"{'CHECK':<{width}}  STATUS  DETAIL"]
    for c in results:
        lines.append(f"{c.name:<{width}}  {c.status.upper():<6}  {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"{'':<{width}}  {'':<6}  fix: {c.fix}")
    counts = {s: sum(1 for c in results if c.status == s) for s in ("ok", "warn", "fail", "skip")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def render_json(results: Sequence[Check]) -> str:
    return json.dumps(
        {"ok": not any(c.status == "fail" for c in results), "checks": [asdict(c) for c in results]},
        indent=2,
    )


@dataclass(frozen=True)
class DoctorSettings:
    """`gpunode doctor`'s flags."""

    common: CommonSettings = group(CommonSettings)
    json: bool = setting("--json", type=bool, default=False, help="print JSON instead of the table")
    host_root: str | None = setting(
        "--host-root", env=("GPUNODE_HOST_ROOT", "HOST_ROOT"), help="where the host's / is (default /)"
    )
    kubelet_dir: str = setting(
        "--kubelet-dir", env="KUBELET_DIR", default="/var/lib/kubelet", help="the kubelet's directory"
    )
    kubeconfig: str | None = setting(
        "--kubeconfig", env="KUBECONFIG", help="read the node's nvidia.com/mig.config label"
    )
    mig_config: str | None = setting(
        "--mig-config", env="MIG_CONFIG", metavar="NAME", help="the MIG layout this node should have"
    )
    mig_config_file: str | None = setting(
        "--mig-config-file", env="MIG_PARTED_CONFIG_FILE", metavar="FILE", help="mig-parted v1 file"
    )
    exporter_port: int = setting(
        "--exporter-port", env="DCGM_EXPORTER_PORT", type=int, default=9400, help="-1: not checked"
    )
    gfd_output_file: str = setting(
        "--gfd-output-file", env="GFD_OUTPUT_FILE", default=GFD_OUTPUT, help="the GFD label file"
    )
    gfd_sleep_interval: str = setting(
        "--gfd-sleep-interval", env="GFD_SLEEP_INTERVAL", default="60s", help="GFD's interval"
    )
    xid_window: float = setting(
        "--xid-window", type=float, default=2.0, metavar="SECONDS", help="how long to watch for XIDs"
    )
    nvidia_runtime_name: str = setting(
        "--nvidia-runtime-name", env="NVIDIA_RUNTIME_NAME", default=checks.DEFAULT_RUNTIME_NAME
    )
    cdi_kind: str = setting(
        "--cdi-kind", env="GPUNODE_CDI_KIND", default=checks.DEFAULT_CDI_KIND, help="kind of the CDI spec"
    )


def parser() -> SettingsParser[DoctorSettings]:
    return SettingsParser(DoctorSettings, prog="gpunode doctor", description=__doc__)


def options(s: DoctorSettings) -> DoctorOptions:
    """DoctorOptions from the settings (a ValueError names the bad one)."""
    common = s.common
    try:
        sleep = _interval(s.gfd_sleep_interval)
    except ValueError as exc:
        raise ValueError(f"--gfd-sleep-interval {s.gfd_sleep_interval!r}: {exc}") from None
    return DoctorOptions(
        paths=HostPaths(s.host_root or "/", common.driver_root, s.kubelet_dir),
        simulated=common.simulate is not None or common.sim_state is not None,
        host_given=s.host_root is not None and Path(s.host_root) != Path("/"),
        mig_config=s.mig_config,
        mig_config_file=s.mig_config_file,
        exporter_port=None if s.exporter_port < 0 else s.exporter_port,
        gfd_output_file=s.gfd_output_file,
        gfd_sleep_interval=sleep,
        xid_window=s.xid_window,
        runtime_name=s.nvidia_runtime_name,
        cdi_kind=s.cdi_kind,
    )


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    from gpunode.common.logging import configure_logging
    from gpunode.common.runtime import run

    env = os.environ if environ is None else environ
    parsed = parser().parse(argv, env)
    s, common = parsed.settings, parsed.settings.common
    try:
        opts = options(s)
    except ValueError as exc:
        print(f"gpunode doctor: error: {exc}", file=sys.stderr)
        return 2
    level = common.log_level if parsed.sources.get("log_level") != "default" else "warning"
    configure_logging(common.log_format, level, agent="gpunode-doctor", node=common.node_name)

    async def open_nvml() -> Nvml:
        from gpunode.agent.nvml import open_nvml as opener

        return await opener(opts.paths.driver_dir, common.simulate, common.sim_state)

    node_labels: NodeLabels | None = None
    if s.kubeconfig and common.node_name:
        kubeconfig, node_name = s.kubeconfig, common.node_name

        async def labels() -> Mapping[str, str]:
            from gpunode.kube.client import Kube

            kube = Kube.connect(node_name, kubeconfig, timeout=5.0, attempts=1)
            try:
                return (await kube.get_node()).labels
            finally:
                await kube.aclose()

        node_labels = labels

    async def doctor() -> int:
        results = await diagnose(opts, open_nvml, node_labels)
        print(render_json(results) if s.json else render_table(results), flush=True)
        return 1 if any(c.status == "fail" for c in results) else 0

    return run(doctor())

"""The operator validator's components (reference section 3) and the node facts they and the doctor read.

Each component deletes its own status file first and writes it again only when its check passes
(NVIDIA's contract, so upstream operands waiting on ``/run/nvidia/validations`` work with ours):

========== ==================================================================== =================
component  check                                                                status file
========== ==================================================================== =================
driver     NVML loads, the driver version is readable, every GPU answers, and   ``driver-ready``
           ``/dev/nvidiactl`` + ``/dev/nvidiaN`` exist (NVML only on the         (env file)
           simulator)
toolkit    the CDI spec lists every NVML GPU and MIG device, and/or the         ``toolkit-ready``
           container runtime config has the ``nvidia`` handler
plugin     our device plugin's socket(s) accept connections in the kubelet's     ``plugin-ready``
           device-plugins directory; its ``/readyz`` says ready when reachable
cuda       a real CUDA driver-API round trip (cuInit, cuMemAlloc, HtoD, DtoH)    ``cuda-ready``
           on every device; ``skipped`` (no file) without a GPU or CUDA, and
           always on the simulator
========== ==================================================================== =================

The readers below (CDI specs, runtime configs, plugin sockets, device nodes, HTTP) are self-contained:
they parse the files themselves and share nothing with the toolkit's writers, so they also catch a
writer's bugs. Nothing here touches the filesystem, NVML or sockets at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import glob
import json
import os
import socket
import stat
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpunode.common.atomic import atomic_write
from gpunode.common.errors import ConfigError
from gpunode.common.hostpaths import HostPaths

if TYPE_CHECKING:
    from gpunode.nvml.api import Nvml

__all__ = [
    "COMPONENTS",
    "CdiSpec",
    "CheckOutcome",
    "DeviceRef",
    "RuntimeConfigs",
    "ValidatorOptions",
    "cdi_missing",
    "cuda_round_trip",
    "device_node_problem",
    "http_get",
    "load_cdi_specs",
    "nvml_devices",
    "plugin_sockets",
    "read_runtime_configs",
    "run_component",
    "socket_accepts",
    "status_file",
    "wait_for",
]

COMPONENTS = ("driver", "toolkit", "plugin", "cuda")
TOOLKIT_CHECKS = ("cdi", "runtime")
DEFAULT_CDI_KIND = "nvidia.com/gpu"
DEFAULT_RUNTIME_NAME = "nvidia"

CheckStatus = Literal["passed", "failed", "skipped"]
Doc = Mapping[str, Any]  # a parsed JSON, YAML or TOML document (CDI specs, runtime configs)


def status_file(component: str) -> str:
    """NVIDIA's status file name: ``driver-ready``, ``toolkit-ready``, ``plugin-ready``, ``cuda-ready``."""
    return f"{component}-ready"


@dataclass(frozen=True)
class CheckOutcome:
    status: CheckStatus
    detail: str

    @classmethod
    def passed(cls, detail: str) -> CheckOutcome:
        return cls("passed", detail)

    @classmethod
    def failed(cls, detail: str) -> CheckOutcome:
        return cls("failed", detail)

    @classmethod
    def skipped(cls, detail: str) -> CheckOutcome:
        return cls("skipped", detail)


# ------------------------------------------------------------------------------------------ NVML facts


@dataclass(frozen=True)
class DeviceRef:
    """A device a CDI spec must name: a full GPU (``mig_index`` None) or a MIG device."""

    gpu_index: int
    uuid: str
    minor: int
    mig_index: int | None = None
    mig_enabled: bool = False  # for a full GPU: MIG mode is on (its MIG devices are what gets used)

    @property
    def index_name(self) -> str:
        """The CDI index name: ``"0"`` or ``"0:1"``."""
        return str(self.gpu_index) if self.mig_index is None else f"{self.gpu_index}:{self.mig_index}"

    @property
    def label(self) -> str:
        kind = "GPU" if self.mig_index is None else "MIG device"
        return f"{kind} {self.index_name} ({self.uuid})"


async def nvml_devices(nvml: Nvml) -> list[DeviceRef]:
    """Every GPU and every MIG device NVML reports, as CDI names them."""
    out: list[DeviceRef] = []
    for gpu in await nvml.gpus():
        out.append(DeviceRef(gpu.index, gpu.uuid, gpu.minor, mig_enabled=gpu.mig_enabled))
        if gpu.mig_enabled:
            for dev in await nvml.mig_devices(gpu.index):
                out.append(DeviceRef(gpu.index, dev.uuid, gpu.minor, mig_index=dev.index))
    return out


# ------------------------------------------------------------------------------------------ CDI specs


@dataclass(frozen=True)
class CdiSpec:
    path: Path
    kind: str = ""
    devices: frozenset[str] = frozenset()
    libcuda_versions: frozenset[str] = frozenset()  # from mounted libcuda.so.<version> host paths
    error: str = ""  # unreadable or not a CDI spec


def _mount_versions(doc: Doc) -> set[str]:
    versions: set[str] = set()
    edits = [doc.get("containerEdits")] + [
        d.get("containerEdits") for d in doc.get("devices") or [] if isinstance(d, dict)
    ]
    for edit in edits:
        if not isinstance(edit, dict):
            continue
        for mount in edit.get("mounts") or []:
            if not isinstance(mount, dict):
                continue
            name = os.path.basename(str(mount.get("hostPath", "")))
            if name.startswith("libcuda.so.") and name.count(".") >= 3:
                versions.add(name.removeprefix("libcuda.so."))
    return versions


def parse_cdi_spec(path: Path, text: str) -> CdiSpec:
    try:
        if path.suffix == ".json":
            doc = json.loads(text)
        else:
            from gpunode.common.safeyaml import parse_yaml  # size, depth and alias limits

            doc = parse_yaml(text, str(path))
    except ConfigError as exc:
        return CdiSpec(path, error=f"cannot parse {path}: {exc.problems[0]}")
    except Exception as exc:  # any parser error: report it, never crash the check
        return CdiSpec(path, error=f"cannot parse {path}: {str(exc).splitlines()[0] if str(exc) else exc}")
    if not isinstance(doc, dict) or "kind" not in doc or "cdiVersion" not in doc:
        return CdiSpec(path, error=f"{path} is not a CDI spec (no cdiVersion/kind)")
    names = frozenset(str(d["name"]) for d in doc.get("devices") or [] if isinstance(d, dict) and "name" in d)
    return CdiSpec(path, str(doc["kind"]), names, frozenset(_mount_versions(doc)))


def load_cdi_specs(paths: HostPaths) -> list[CdiSpec]:
    """Every spec file in ``/etc/cdi`` and ``/var/run/cdi`` (YAML or JSON), parsed."""
    specs = []
    for directory in paths.cdi_dirs:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.suffix not in (".yaml", ".yml", ".json") or not entry.is_file():
                continue
            try:
                text = entry.read_text(encoding="utf-8")
            except OSError as exc:
                specs.append(CdiSpec(entry, error=f"cannot read {entry}: {exc.strerror}"))
                continue
            specs.append(parse_cdi_spec(entry, text))
    return specs


def cdi_missing(specs: Iterable[CdiSpec], devices: Iterable[DeviceRef], kind: str) -> list[DeviceRef]:
    """Devices that no spec of ``kind`` names (by index name or UUID).

    A GPU in MIG mode need not be named itself: its MIG devices are what containers get.
    """
    names: set[str] = set()
    for spec in specs:
        if spec.kind == kind:
            names |= spec.devices
    return [
        d
        for d in devices
        if not (d.mig_index is None and d.mig_enabled) and d.index_name not in names and d.uuid not in names
    ]


# ------------------------------------------------------------------------------------ runtime configs


@dataclass
class RuntimeConfigs:
    """The container runtime configuration files found, and the runtime handlers each defines."""

    files: list[Path] = field(default_factory=list)
    handlers: dict[str, dict[str, Path]] = field(default_factory=dict)  # engine -> handler -> file
    errors: list[str] = field(default_factory=list)
    # engine -> the file that makes it read CDI specs (containerd: enable_cdi; CRI-O always does)
    cdi: dict[str, Path] = field(default_factory=dict)

    def engines(self) -> list[str]:
        return sorted(self.handlers)

    def has(self, name: str) -> list[str]:
        """The engines whose configuration defines handler ``name``."""
        return sorted(engine for engine, names in self.handlers.items() if name in names)

    def _add(self, engine: str, names: Iterable[str], path: Path) -> None:
        found = self.handlers.setdefault(engine, {})
        for name in names:
            found[name] = path


CONTAINERD_CONFIGS = (
    "/etc/containerd/config.toml",
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
)
CONTAINERD_DROP_INS = ("/etc/containerd/conf.d",)
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_INS = "/etc/crio/crio.conf.d"
DOCKER_CONFIG = "/etc/docker/daemon.json"


def _toml(path: Path, out: RuntimeConfigs) -> Doc | None:
    try:
        with path.open("rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        out.errors.append(f"{path}: {exc}")
        return None
    out.files.append(path)
    return doc


def _containerd_runtimes(doc: Doc) -> list[str]:
    """Runtime names under any CRI plugin: ``cri`` (v1), ``io.containerd.grpc.v1.cri`` (v2) or
    ``io.containerd.cri.v1.runtime`` (v3)."""
    names: list[str] = []
    plugins = doc.get("plugins")
    if not isinstance(plugins, dict):
        return names
    for plugin in plugins.values():
        if not isinstance(plugin, dict):
            continue
        runtimes = (plugin.get("containerd") or {}).get("runtimes")
        if isinstance(runtimes, dict):
            names += [str(n) for n in runtimes]
    return names


def _containerd_cdi(doc: Doc) -> bool:
    """Whether a containerd config sets ``enable_cdi = true`` in a CRI plugin (containerd 1.7+)."""
    plugins = doc.get("plugins")
    if not isinstance(plugins, dict):
        return False
    return any(isinstance(p, dict) and p.get("enable_cdi") is True for p in plugins.values())


def _imports(paths: HostPaths, config: Path, doc: Doc) -> list[Path]:
    found: list[Path] = []
    imports = doc.get("imports")
    if not isinstance(imports, list):
        return found
    for pattern in imports:
        text = str(pattern)
        host_pattern = text if text.startswith("/") else str(Path("/etc/containerd") / text)
        local = paths.host(host_pattern) if host_pattern.startswith("/") else config.parent / text
        found += sorted(Path(p) for p in glob.glob(str(local)))
    return found


def read_runtime_configs(paths: HostPaths) -> RuntimeConfigs:
    """containerd (config.toml, its ``imports`` and ``conf.d`` drop-ins, k3s/rke2), CRI-O (crio.conf and
    ``crio.conf.d``) and Docker (daemon.json)."""
    out = RuntimeConfigs()
    seen: set[Path] = set()
    for host_path in CONTAINERD_CONFIGS:
        config = paths.host(host_path)
        doc = _toml(config, out)
        if doc is None:
            continue
        seen.add(config)
        out._add("containerd", _containerd_runtimes(doc), config)
        if _containerd_cdi(doc):
            out.cdi["containerd"] = config
        for extra in _imports(paths, config, doc):
            if extra in seen:
                continue
            seen.add(extra)
            sub = _toml(extra, out)
            if sub is not None:
                out._add("containerd", _containerd_runtimes(sub), extra)
                if _containerd_cdi(sub):
                    out.cdi["containerd"] = extra
    for drop_dir in CONTAINERD_DROP_INS:
        for extra in sorted(paths.host(drop_dir).glob("*.toml")):
            if extra in seen:
                continue
            seen.add(extra)
            sub = _toml(extra, out)
            if sub is not None:
                out._add("containerd", _containerd_runtimes(sub), extra)
                if _containerd_cdi(sub):
                    out.cdi["containerd"] = extra
    crio_files = [paths.host(CRIO_CONFIG)]
    with contextlib.suppress(OSError):
        crio_files += sorted(p for p in paths.host(CRIO_DROP_INS).iterdir() if p.is_file())
    for config in crio_files:
        doc = _toml(config, out)
        if doc is None:
            continue
        runtimes = ((doc.get("crio") or {}).get("runtime") or {}).get("runtimes") or {}
        out._add("crio", [str(n) for n in runtimes] if isinstance(runtimes, dict) else [], config)
        out.cdi.setdefault("crio", config)  # CRI-O 1.23 and later reads CDI specs whatever it says
    docker = paths.host(DOCKER_CONFIG)
    try:
        daemon = json.loads(docker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        out.errors.append(f"{docker}: {exc}")
    else:
        out.files.append(docker)
        runtimes = daemon.get("runtimes") if isinstance(daemon, dict) else None
        out._add("docker", [str(n) for n in runtimes] if isinstance(runtimes, dict) else [], docker)
    return out


# ---------------------------------------------------------------------------------- sockets, nodes, HTTP


def plugin_sockets(paths: HostPaths) -> list[Path]:
    """Our device plugin's sockets: ``nvidia-gpu.sock``, ``nvidia-mig-1g.5gb.sock``, ... (NVIDIA's names)."""
    try:
        return sorted(p for p in paths.device_plugin_dir.glob("nvidia-*.sock"))
    except OSError:
        return []


def socket_accepts(path: Path, timeout: float = 1.0) -> bool:
    """Whether a server listens on the Unix socket ``path`` (a stale socket file refuses)."""
    if not path.is_socket():
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except OSError:
        return False
    finally:
        sock.close()
    return True


def device_node_problem(path: Path, *, marker_ok: bool = False) -> tuple[str, int]:
    """(problem, permission bits) of a device node; problem "" when ``path`` is a character device.

    ``marker_ok`` accepts the fake host's marker files (a regular file holding ``c MAJOR:MINOR``).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return ("missing", 0)
    except OSError as exc:
        return (f"unreadable ({exc.strerror})", 0)
    if stat.S_ISCHR(st.st_mode):
        return ("", stat.S_IMODE(st.st_mode))
    if marker_ok and stat.S_ISREG(st.st_mode):
        with contextlib.suppress(OSError):
            if path.read_text(encoding="ascii", errors="replace").startswith("c "):
                return ("", stat.S_IMODE(st.st_mode))
    return ("not a character device", stat.S_IMODE(st.st_mode))


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 with the reason as body when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, str(reason)


# ------------------------------------------------------------------------------------------ CUDA


class CudaError(Exception):
    pass


def _cuda_library(paths: HostPaths) -> ctypes.CDLL | None:
    candidates = [str(d / "libcuda.so.1") for d in paths.driver_lib_dirs()] + ["libcuda.so.1"]
    for candidate in candidates:
        if "/" in candidate and not os.path.exists(candidate):
            continue
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    return None


def cuda_round_trip(paths: HostPaths, size: int = 1 << 20) -> CheckOutcome:
    """cuInit, then on every CUDA device: context, cuMemAlloc, host->device->host copy, compare, free.

    ``skipped`` when libcuda cannot be loaded (no CUDA driver here); ``failed`` with CUDA's error name
    for anything else.
    """
    lib = _cuda_library(paths)
    if lib is None:
        return CheckOutcome.skipped("libcuda.so.1 is not loadable here (no CUDA driver)")
    c_dev = ctypes.c_uint64
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(c_dev), ctypes.c_size_t]
    lib.cuMemcpyHtoD_v2.argtypes = [c_dev, ctypes.c_void_p, ctypes.c_size_t]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, c_dev, ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [c_dev]
    lib.cuCtxCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
    lib.cuCtxDestroy_v2.argtypes = [ctypes.c_void_p]

    def check(name: str, rc: int) -> None:
        if rc == 0:
            return
        text = ctypes.c_char_p()
        with contextlib.suppress(Exception):
            lib.cuGetErrorName(rc, ctypes.byref(text))
        raise CudaError(f"{name} failed: {(text.value or b'').decode() or 'CUDA error'} ({rc})")

    try:
        check("cuInit", lib.cuInit(0))
        count = ctypes.c_int()
        check("cuDeviceGetCount", lib.cuDeviceGetCount(ctypes.byref(count)))
        if count.value == 0:
            return CheckOutcome.failed("CUDA sees no device although NVML reports GPUs")
        pattern = bytes(range(256)) * (size // 256)
        for ordinal in range(count.value):
            dev = ctypes.c_int()
            check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), ordinal))
            ctx = ctypes.c_void_p()
            check("cuCtxCreate", lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
            try:
                ptr = c_dev()
                check("cuMemAlloc", lib.cuMemAlloc_v2(ctypes.byref(ptr), len(pattern)))
                try:
                    src = ctypes.create_string_buffer(pattern, len(pattern))
                    dst = ctypes.create_string_buffer(len(pattern))
                    check("cuMemcpyHtoD", lib.cuMemcpyHtoD_v2(ptr, src, len(pattern)))
                    check("cuMemcpyDtoH", lib.cuMemcpyDtoH_v2(dst, ptr, len(pattern)))
                    if dst.raw != pattern:
                        return CheckOutcome.failed(f"CUDA device {ordinal}: data read back differs")
                finally:
                    lib.cuMemFree_v2(ptr)
            finally:
                lib.cuCtxDestroy_v2(ctx)
    except CudaError as exc:
        return CheckOutcome.failed(str(exc))
    except AttributeError as exc:
        return CheckOutcome.failed(f"libcuda lacks a driver API function: {exc}")
    plural = "s" if count.value != 1 else ""
    return CheckOutcome.passed(f"{len(pattern) >> 10} KiB round trip on {count.value} CUDA device{plural}")


# ------------------------------------------------------------------------------------------ components


NvmlOpener = Callable[[], Awaitable["Nvml"]]


@dataclass(frozen=True)
class ValidatorOptions:
    paths: HostPaths
    validations_dir: Path  # as seen from here (under the host root)
    driver_root: str = "/"  # the host path of the driver root (for driver-ready)
    simulated: bool = False
    toolkit_checks: tuple[str, ...] = TOOLKIT_CHECKS
    runtime_name: str = DEFAULT_RUNTIME_NAME
    cdi_kind: str = DEFAULT_CDI_KIND
    plugin_http_port: int | None = 9451  # None: do not ask /readyz
    with_workload: bool = True
    cuda_timeout: float = 120.0
    marker_nodes: bool = False  # accept the fake host's marker files as device nodes (tests)


async def run_component(component: str, opts: ValidatorOptions, open_nvml: NvmlOpener) -> CheckOutcome:
    """Remove the component's status file, check, and write the file again only if the check passed."""
    target = opts.validations_dir / status_file(component)
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    checks = {"driver": _driver, "toolkit": _toolkit, "plugin": _plugin, "cuda": _cuda}
    outcome = await checks[component](opts, open_nvml)
    if outcome.status == "passed":
        content = ""
        if component == "driver":
            from gpunode.api.readiness import driver_ready_text

            content = driver_ready_text(host_driver=opts.driver_root == "/", driver_root=opts.driver_root)
        opts.validations_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(target, content, 0o644)
    return outcome


async def _with_nvml(open_nvml: NvmlOpener) -> tuple[Nvml | None, str]:
    """(nvml, "") or (None, why it did not load)."""
    from gpunode.nvml import errors

    try:
        return await open_nvml(), ""
    except (errors.NvmlError, OSError) as exc:
        return None, f"NVML did not load: {exc}"


async def _driver(opts: ValidatorOptions, open_nvml: NvmlOpener) -> CheckOutcome:
    from gpunode.nvml import errors

    nvml, why = await _with_nvml(open_nvml)
    if nvml is None:
        return CheckOutcome.failed(why)
    try:
        system = await nvml.system()
        gpus = await nvml.gpus()
        if not gpus:
            return CheckOutcome.failed(f"driver {system.driver_version} loaded but NVML finds no GPU")
        lost = await nvml.lost_gpus()
        if lost:
            return CheckOutcome.failed(f"GPU {', '.join(map(str, lost))} does not answer (lost)")
        for gpu in gpus:
            await nvml.telemetry(gpu.index)
    except errors.NvmlError as exc:
        return CheckOutcome.failed(f"NVML query failed: {exc}")
    finally:
        await nvml.close()
    if not opts.simulated:
        nodes = [opts.paths.nvidiactl] + [opts.paths.dev_nvidia(g.minor) for g in gpus]
        bad = []
        for node in nodes:
            problem, _mode = device_node_problem(node, marker_ok=opts.marker_nodes)
            if problem and opts.paths.driver_root != Path("/"):  # NVIDIA's container driver: its own /dev
                alt = opts.paths.driver("/dev") / node.name
                problem, _mode = device_node_problem(alt, marker_ok=opts.marker_nodes)
            if problem:
                bad.append(f"/dev/{node.name} {problem}")
        if bad:
            return CheckOutcome.failed("device nodes: " + "; ".join(bad))
    where = " (simulated)" if opts.simulated else ""
    return CheckOutcome.passed(f"driver {system.driver_version}, {len(gpus)} GPUs answer{where}")


def _cdi_outcome(opts: ValidatorOptions, devices: Sequence[DeviceRef]) -> CheckOutcome:
    specs = load_cdi_specs(opts.paths)
    broken = [s.error for s in specs if s.error]
    ours = [s for s in specs if s.kind == opts.cdi_kind]
    if not ours:
        where = " or ".join(str(d) for d in opts.paths.cdi_dirs)
        extra = f" ({'; '.join(broken)})" if broken else ""
        return CheckOutcome.failed(f"no CDI spec of kind {opts.cdi_kind} in {where}{extra}")
    missing = cdi_missing(ours, devices, opts.cdi_kind)
    if missing:
        return CheckOutcome.failed(
            "the CDI spec lacks " + ", ".join(d.label for d in missing) + f" ({ours[0].path})"
        )
    return CheckOutcome.passed(
        f"CDI spec lists all {len(devices)} devices ({', '.join(str(s.path) for s in ours)})"
    )


def _runtime_outcome(opts: ValidatorOptions) -> CheckOutcome:
    configs = read_runtime_configs(opts.paths)
    engines = configs.has(opts.runtime_name)
    if engines:
        return CheckOutcome.passed(
            f"runtime handler {opts.runtime_name!r} configured for {', '.join(engines)}"
        )
    if configs.cdi:  # the default path: the runtime injects the CDI devices, no handler needed
        return CheckOutcome.passed(
            "CDI enabled for " + ", ".join(f"{e} ({p})" for e, p in sorted(configs.cdi.items()))
        )
    if not configs.files:
        extra = f" ({'; '.join(configs.errors)})" if configs.errors else ""
        return CheckOutcome.failed(f"no container runtime configuration found{extra}")
    return CheckOutcome.failed(
        f"no runtime handler {opts.runtime_name!r} in "
        + ", ".join(str(f) for f in configs.files)
        + (f" ({'; '.join(configs.errors)})" if configs.errors else "")
    )


async def _toolkit(opts: ValidatorOptions, open_nvml: NvmlOpener) -> CheckOutcome:
    results: list[CheckOutcome] = []
    if "cdi" in opts.toolkit_checks:
        nvml, why = await _with_nvml(open_nvml)
        if nvml is None:
            return CheckOutcome.failed(why)
        from gpunode.nvml import errors

        try:
            devices = await nvml_devices(nvml)
        except errors.NvmlError as exc:
            return CheckOutcome.failed(f"NVML query failed: {exc}")
        finally:
            await nvml.close()
        results.append(_cdi_outcome(opts, devices))
    if "runtime" in opts.toolkit_checks:
        results.append(_runtime_outcome(opts))
    failed = [r.detail for r in results if r.status == "failed"]
    if failed:
        return CheckOutcome.failed("; ".join(failed))
    return CheckOutcome.passed("; ".join(r.detail for r in results))


async def _plugin(opts: ValidatorOptions, open_nvml: NvmlOpener) -> CheckOutcome:
    directory = opts.paths.device_plugin_dir
    sockets = plugin_sockets(opts.paths)
    if not sockets:
        return CheckOutcome.failed(f"no device plugin socket (nvidia-*.sock) in {directory}")
    accepting = await asyncio.to_thread(lambda: [s for s in sockets if socket_accepts(s)])
    stale = [s.name for s in sockets if s not in accepting]
    if stale:
        return CheckOutcome.failed(f"device plugin socket(s) not accepting connections: {', '.join(stale)}")
    detail = f"device plugin serving on {', '.join(s.name for s in sockets)}"
    if opts.plugin_http_port is not None:
        status, body = await asyncio.to_thread(
            http_get, f"http://127.0.0.1:{opts.plugin_http_port}/readyz", 2.0
        )
        if status == 0:
            detail += f"; /readyz on port {opts.plugin_http_port} not reachable ({body}), not checked"
        elif status != 200:
            return CheckOutcome.failed(f"device plugin /readyz answers {status}: {body.strip()[:200]}")
        else:
            detail += "; /readyz ok"
    return CheckOutcome.passed(detail)


async def _cuda(opts: ValidatorOptions, open_nvml: NvmlOpener) -> CheckOutcome:
    if not opts.with_workload:
        return CheckOutcome.skipped("workload disabled (--with-workload=false)")
    if opts.simulated:
        return CheckOutcome.skipped("simulated node: no CUDA workload can run")
    nvml, why = await _with_nvml(open_nvml)
    if nvml is None:
        return CheckOutcome.skipped(f"no GPU here ({why})")
    try:
        gpus = await nvml.gpus()
    finally:
        await nvml.close()
    if not gpus:
        return CheckOutcome.skipped("NVML reports no GPU")
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(cuda_round_trip, opts.paths), timeout=opts.cuda_timeout
        )
    except TimeoutError:
        return CheckOutcome.failed(f"the CUDA round trip did not finish in {opts.cuda_timeout:g} s")


# ------------------------------------------------------------------------------------------ --wait-for


async def _watch(directory: Path, changed: asyncio.Event) -> None:
    from gpunode.common.fswatch import watch_directory

    try:
        async for _event in watch_directory(directory):
            changed.set()
    except (OSError, ImportError):
        return  # no inotify here: the poll carries on alone


async def wait_for(
    names: Sequence[str],
    directory: Path,
    *,
    timeout: float = 300.0,
    progress_every: float = 5.0,
    poll: float = 2.0,
    out: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Wait until every file in ``names`` exists in ``directory``; the names still missing at the timeout
    (``timeout`` 0: wait forever). inotify on the directory wakes it at once; a slow poll backs it up
    (a directory that does not exist yet, or a filesystem without inotify)."""
    start = clock()
    with contextlib.suppress(OSError):
        await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    changed = asyncio.Event()
    watcher = asyncio.create_task(_watch(directory, changed), name="watch-validations")
    try:
        await asyncio.sleep(0)  # let the watch start before the first look
        next_report = start + progress_every
        while True:
            missing = [n for n in names if not (directory / n).exists()]
            now = clock()
            if not missing:
                return []
            if timeout > 0 and now - start >= timeout:
                return missing
            if now >= next_report:
                out(f"waiting for {', '.join(missing)} ({now - start:.0f} s)")
                next_report = now + progress_every
            wake = min(poll, next_report - now)
            if timeout > 0:
                wake = min(wake, start + timeout - now)
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=max(wake, 0.01))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher

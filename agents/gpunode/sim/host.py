"""A fake host tree for the driver loader, with fake kmod and NVIDIA tools that act on it.

:class:`FakeHost` builds, under a base directory::

    host/                  the host root: proc/devices, proc/sys/kernel/osrelease, proc/driver/nvidia,
                           sys/module/*, dev/, run/, etc/modprobe.d, lib/modules/<kver>/..., var/run
    bin/                   fake modprobe, rmmod, depmod, nvidia-installer, dkms, nvidia-persistenced,
                           nvidia-smi: small Python programs that change host/ the way the real tools
                           change a machine, append their argv to fake/calls.log, and fail on demand
    drivers/               the module parameter directory (``<module>.conf``)
    fake/                  config.json, calls.log, fail/<tool>.json, crash/<tool>.json

The fake ``modprobe`` loads a module only if ``modules.dep`` of the tree it is given (``-d``) lists it,
creates ``/sys/module/<m>/{refcnt,initstate,parameters,holders}`` (applying ``options`` lines from the
modprobe.d directory, ``-C``), bumps the refcount of the module it depends on, and registers the char
majors in ``/proc/devices`` and ``/proc/driver/nvidia/{version,gpus,capabilities}``; ``rmmod`` refuses
while the refcount is above zero. ``nvidia-persistenced`` forks a real daemon (its ``comm`` is
``nvidia-persiste``) that writes the pid file and leaves on SIGTERM.

Failure on demand: :meth:`FakeHost.fail` (the tool prints the given stderr and exits non-zero when its
argv contains ``match``); :meth:`FakeHost.crash` (the tool SIGKILLs its caller, once: a crash between
steps). Nothing here imports asyncio at import time (the fake tools import this module), nor ever the
driver loader: its callers point the loader's real host operations at :attr:`FakeHost.paths` and
:attr:`FakeHost.bin`, recording marker-file device nodes in :attr:`FakeHost.mknods` if they like.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpunode.common.hostpaths import HostPaths

__all__ = ["KERNEL", "FakeHost", "tool_main"]

KERNEL = "5.15.0-100-generic"
DRIVER_VERSION = "580.65.06"
TOOLS = ("modprobe", "rmmod", "depmod", "nvidia-installer", "dkms", "nvidia-persistenced", "nvidia-smi")
NVIDIA_MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-peermem", "nvidia-drm")
DEPENDS = {
    "nvidia_uvm": "nvidia",
    "nvidia_modeset": "nvidia",
    "nvidia_peermem": "nvidia",
    "nvidia_drm": "nvidia_modeset",
}
HOST_MODULES = ("i2c_core", "ipmi_msghandler", "ipmi_devintf")
MAJORS = {"nvidia-frontend": 195, "nvidia-caps": 235, "nvidia-caps-imex-channels": 234, "nvidia-uvm": 508}
BASE_DEVICES = (
    "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n  5 /dev/tty\n 10 misc\n 89 i2c\n"
    "128 ptm\n136 pts\n180 usb\n226 drm\n"
)
BLOCK_DEVICES = "\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"


def _sysfs(module: str) -> str:
    return module.replace("-", "_")


class FakeHost:
    """A host tree under ``base``; ``FakeHost(tmp_path)`` in a test."""

    def __init__(
        self,
        base: Path,
        *,
        kernel: str = KERNEL,
        gpus: int = 2,
        driver_root: str = "/",
        tools: Iterable[str] = TOOLS,
        os_id: str = "ubuntu",
    ) -> None:
        self.base = Path(base)
        self.root = self.base / "host"
        self.bin = self.base / "bin"
        self.params_dir = self.base / "drivers"
        self.state = self.base / "fake"
        self.kernel = kernel
        self.driver_root = driver_root
        self.driver_dir = self.root / driver_root.lstrip("/") if driver_root != "/" else self.root
        self.gpus = [f"0000:{0x07 + 0x10 * i:02x}:00.0" for i in range(gpus)]
        self.mknods: list[tuple[str, int, int, int]] = []  # for the loader's marker_mknod(host.mknods)
        for sub in ("proc/sys/kernel", "sys/module", "dev", "run", "etc/modprobe.d", "var/run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("fail", "crash"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        self.bin.mkdir(parents=True, exist_ok=True)
        self.params_dir.mkdir(parents=True, exist_ok=True)
        (self.root / "proc/sys/kernel/osrelease").write_text(kernel + "\n")
        (self.root / "proc/devices").write_text(BASE_DEVICES + BLOCK_DEVICES)
        (self.root / "etc/os-release").write_text(f'NAME="Fake"\nID={os_id}\nVERSION_ID="22.04"\n')
        self.driver_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "root": str(self.root),
            "driver_dir": str(self.driver_dir),
            "kernel": kernel,
            "gpus": self.gpus,
            "version": DRIVER_VERSION,
        }
        (self.state / "config.json").write_text(json.dumps(config, indent=2))
        for tool in tools:
            self.install_tool(tool)

    # ------------------------------------------------------------------------------ wiring

    @property
    def paths(self) -> HostPaths:
        from gpunode.common.hostpaths import HostPaths

        return HostPaths(root=self.root, driver_root=self.driver_root)

    def cli_args(self, *, nodes: bool | None = None) -> list[str]:
        """Flags that point ``gpunode-driver-loader init|unload`` at this host (no HTTP, no udev wait)."""
        create = can_mknod(self.base) if nodes is None else nodes
        return [
            "--host-root",
            str(self.root),
            "--driver-root",
            self.driver_root,
            "--bin-dir",
            str(self.bin),
            "--module-params-dir",
            str(self.params_dir),
            f"--create-device-nodes={str(create).lower()}",
        ]

    def install_tool(self, name: str) -> Path:
        agents = Path(__file__).resolve().parents[2]
        script = self.bin / name
        script.write_text(
            f"#!{sys.executable} -IS\n"
            "import sys\n"
            f"sys.path.insert(0, {str(agents)!r})\n"
            "from gpunode.sim.host import tool_main\n"
            f"sys.exit(tool_main({str(self.state)!r}, {name!r}, sys.argv[1:]))\n"
        )
        script.chmod(0o755)
        return script

    def remove_tool(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.bin / name).unlink()

    # ------------------------------------------------------------------------------ scenarios

    def add_precompiled(self, kernel: str | None = None, *, index: bool = True) -> Path:
        """The driver root's ready-made modules for ``kernel`` (with ``modules.dep`` unless not ``index``)."""
        tree = self.driver_dir / "lib/modules" / (kernel or self.kernel)
        target = tree / "kernel/drivers/video"
        target.mkdir(parents=True, exist_ok=True)
        for module in NVIDIA_MODULES:
            (target / f"{module}.ko").write_text(f"fake {module} module\n")
        if index:
            _depmod(tree)
        return target

    def add_headers(self, kernel: str | None = None) -> Path:
        """``/usr/src/linux-headers-<k>`` and the ``/lib/modules/<k>/build`` link to it, as on Ubuntu."""
        k = kernel or self.kernel
        headers = self.root / "usr/src" / f"linux-headers-{k}"
        headers.mkdir(parents=True, exist_ok=True)
        (headers / "Makefile").write_text("# fake kernel headers\n")
        build = self.root / "lib/modules" / k / "build"
        build.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            build.unlink()
        build.symlink_to(f"/usr/src/linux-headers-{k}")
        return headers

    def load_nouveau(self, *, in_use: bool = False) -> None:
        _load(self.root, "nouveau", {})
        if in_use:
            self.set_refcnt("nouveau", 2)

    def builtin_nouveau(self) -> None:
        (self.root / "sys/module/nouveau/parameters").mkdir(parents=True, exist_ok=True)

    def preinstall_host_driver(self, version: str = "550.54.15") -> None:
        """A driver the host itself installed and loaded (and its nvidia-smi)."""
        self.load(["nvidia", "nvidia-uvm", "nvidia-modeset"], version=version)
        smi = self.root / "usr/bin/nvidia-smi"
        smi.parent.mkdir(parents=True, exist_ok=True)
        smi.write_text("#!/bin/sh\necho host nvidia-smi\n")
        smi.chmod(0o755)

    def load(self, modules: Sequence[str], *, version: str = DRIVER_VERSION) -> None:
        """Modules loaded as the fake modprobe would (no log entry)."""
        config = self.config()
        config["version"] = version
        for module in modules:
            _load_with_deps(config, _sysfs(module), {})

    def add_process(self, pid: int, comm: str, devices: Sequence[str]) -> None:
        """A process under the host's /proc holding ``devices`` open (``/proc/<pid>/fd`` links)."""
        proc = self.root / "proc" / str(pid)
        (proc / "fd").mkdir(parents=True, exist_ok=True)
        (proc / "comm").write_text(comm + "\n")
        (proc / "fd/0").symlink_to("/dev/null")
        for number, device in enumerate(devices, 3):
            (proc / "fd" / str(number)).symlink_to(device)

    def set_refcnt(self, module: str, count: int) -> None:
        (self.root / "sys/module" / _sysfs(module) / "refcnt").write_text(f"{count}\n")

    def add_mig_caps(
        self, gpu: int = 0, instances: Sequence[tuple[int, int]] = ((1, 0), (2, 0))
    ) -> list[int]:
        """MIG capability files for GPU instances (gi, ci): their ``access`` files and minors."""
        base = self.root / "proc/driver/nvidia/capabilities" / f"gpu{gpu}" / "mig"
        minors = []
        for gi, ci in instances:
            gi_minor = 3 + gpu * 100 + gi * 10
            ci_minor = gi_minor + 1 + ci
            (base / f"gi{gi}" / f"ci{ci}").mkdir(parents=True, exist_ok=True)
            (base / f"gi{gi}" / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\n")
            (base / f"gi{gi}" / f"ci{ci}" / "access").write_text(
                f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\n"
            )
            minors += [gi_minor, ci_minor]
        return minors

    def params(self, module: str, text: str) -> Path:
        path = self.params_dir / f"{module}.conf"
        path.write_text(text)
        return path

    def fail(self, tool: str, stderr: str, *, code: int = 1, match: str | None = None) -> None:
        rule = {"stderr": stderr, "code": code, "match": match}
        (self.state / "fail" / f"{tool}.json").write_text(json.dumps(rule))

    def clear_fail(self, tool: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.state / "fail" / f"{tool}.json").unlink()

    def stubborn_persistenced(self) -> None:
        """The next fake persistenced ignores SIGTERM (unload must give up after its timeout)."""
        (self.state / "persistenced-ignores-sigterm").write_text("")

    def crash(self, tool: str, match: str) -> None:
        """The next ``tool`` call whose argv contains ``match`` SIGKILLs its caller (once)."""
        (self.state / "crash" / f"{tool}.json").write_text(json.dumps({"match": match}))

    # ------------------------------------------------------------------------------ inspection

    def config(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.state / "config.json").read_text())
        return loaded

    def calls(self, tool: str | None = None) -> list[list[str]]:
        try:
            lines = (self.state / "calls.log").read_text().splitlines()
        except FileNotFoundError:
            return []
        records = [json.loads(line) for line in lines if line.strip()]
        return [r["argv"] for r in records if tool is None or r["tool"] == tool]

    def modprobe_loads(self) -> list[str]:
        """The module of every ``modprobe`` call that loads NVIDIA modules, in call order."""
        out = []
        for argv in self.calls("modprobe"):
            if "-r" in argv or "-a" in argv:
                continue
            out.append(argv[-1])
        return out

    def loaded(self) -> list[str]:
        module_dir = self.root / "sys/module"
        return sorted(p.name for p in module_dir.iterdir() if (p / "refcnt").exists())

    def persistenced_pid(self) -> int | None:
        try:
            return int((self.root / "var/run/nvidia-persistenced/nvidia-persistenced.pid").read_text())
        except (OSError, ValueError):
            return None

    def kill_daemons(self) -> None:
        """Stop a fake persistenced left running (test teardown)."""
        pid = self.persistenced_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def can_mknod(directory: Path) -> bool:
    """Whether this process may create character devices (root with CAP_MKNOD) in ``directory``."""
    probe = Path(directory) / ".mknod-probe"
    try:
        os.mknod(probe, 0o600 | 0o020000, os.makedev(1, 3))
    except OSError:
        return False
    probe.unlink()
    return True


# ===================================================================================== the fake tools


def tool_main(state_dir: str, tool: str, argv: list[str]) -> int:
    state = Path(state_dir)
    with open(state / "calls.log", "a") as log:
        log.write(json.dumps({"tool": tool, "argv": argv, "pid": os.getpid()}) + "\n")
    config = json.loads((state / "config.json").read_text())
    crash = state / "crash" / f"{tool}.json"
    if crash.exists():
        rule = json.loads(crash.read_text())
        if rule.get("match") is None or rule["match"] in argv:
            crash.unlink()
            os.kill(os.getppid(), signal.SIGKILL)
            return 137
    fail = state / "fail" / f"{tool}.json"
    if fail.exists():
        rule = json.loads(fail.read_text())
        if rule.get("match") is None or rule["match"] in argv:
            sys.stderr.write(rule["stderr"] + "\n")
            return int(rule.get("code", 1))
    handler = {
        "modprobe": _modprobe,
        "rmmod": _rmmod,
        "depmod": _depmod_main,
        "nvidia-installer": _installer,
        "dkms": _dkms,
        "nvidia-persistenced": _persistenced,
        "nvidia-smi": _smi,
    }[tool]
    return handler(config, argv)


def _root(config: dict[str, Any]) -> Path:
    return Path(config["root"])


def _modprobe(config: dict[str, Any], argv: list[str]) -> int:
    dirname, confdir, kernel = config["driver_dir"], None, config["kernel"]
    remove, names, args = False, [], iter(argv)
    for arg in args:
        if arg == "-d":
            dirname = next(args)
        elif arg == "-C":
            confdir = next(args)
        elif arg == "-S":
            kernel = next(args)
        elif arg == "-r":
            remove = True
        elif arg in ("-a", "-q", "-v"):
            continue
        else:
            names.append(arg)
    if remove:
        return _rmmod(config, names)
    root = _root(config)
    options = _options(Path(confdir) if confdir else root / "etc/modprobe.d")
    tree = Path(dirname) / "lib/modules" / kernel
    try:
        indexed = (tree / "modules.dep").read_text()
    except OSError:
        indexed = ""
    for name in names:
        module = _sysfs(name)
        if module in HOST_MODULES:
            continue
        if f"/{module.replace('_', '-')}.ko" not in indexed and f"/{module}.ko" not in indexed:
            sys.stderr.write(f"modprobe: FATAL: Module {name} not found in directory {tree}\n")
            return 1
        _load_with_deps(config, module, options)
    return 0


def _load_with_deps(config: dict[str, Any], module: str, options: dict[str, list[str]]) -> None:
    root = _root(config)
    if (root / "sys/module" / module / "refcnt").exists():
        return
    base = DEPENDS.get(module)
    if base is not None:
        _load_with_deps(config, base, options)
    _load(root, module, options)
    if base is not None:
        base_dir = root / "sys/module" / base
        count = int((base_dir / "refcnt").read_text())
        (base_dir / "refcnt").write_text(f"{count + 1}\n")
        (base_dir / "holders" / module).mkdir(parents=True, exist_ok=True)
    _register(config, module, loading=True)


def _load(root: Path, module: str, options: dict[str, list[str]]) -> None:
    directory = root / "sys/module" / module
    (directory / "parameters").mkdir(parents=True, exist_ok=True)
    (directory / "holders").mkdir(exist_ok=True)
    (directory / "initstate").write_text("live\n")
    for option in options.get(module, []):
        key, _, value = option.partition("=")
        (directory / "parameters" / key).write_text(value.strip('"') + "\n")
    (directory / "refcnt").write_text("0\n")


def _options(confdir: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    files = sorted(confdir.glob("*.conf")) if confdir.is_dir() else [confdir] if confdir.is_file() else []
    for path in files:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "options":
                found.setdefault(_sysfs(parts[1]), []).extend(parts[2:])
    return found


def _register(config: dict[str, Any], module: str, *, loading: bool) -> None:
    """What loading/removing a module does to /proc (majors, driver files)."""
    root = _root(config)
    devices = root / "proc/devices"
    names = {
        "nvidia": ("nvidia-frontend", "nvidia-caps", "nvidia-caps-imex-channels"),
        "nvidia_uvm": ("nvidia-uvm",),
    }.get(module, ())
    if names:
        text = devices.read_text()
        chars, _, block = text.partition("\nBlock devices:")
        lines = [line for line in chars.splitlines() if not any(line.endswith(" " + n) for n in names)]
        if loading:
            lines += [f"{MAJORS[n]:>3} {n}" for n in names]
        devices.write_text("\n".join(lines) + "\n\nBlock devices:" + block)
    if module != "nvidia":
        return
    driver = root / "proc/driver/nvidia"
    if not loading:
        _rmtree(driver)
        return
    version = config.get("version", DRIVER_VERSION)
    (driver / "gpus").mkdir(parents=True, exist_ok=True)
    (driver / "version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  (fake)\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
    )
    for minor, bdf in enumerate(config["gpus"]):
        (driver / "gpus" / bdf).mkdir(parents=True, exist_ok=True)
        (driver / "gpus" / bdf / "information").write_text(
            f"Model: \t\t NVIDIA A100-SXM4-40GB\nGPU UUID: \t GPU-fake-{minor}\nBus Type: \t PCIe\n"
            f"Bus Location: \t {bdf}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
    caps = driver / "capabilities/mig"
    caps.mkdir(parents=True, exist_ok=True)
    (caps / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    (caps / "monitor").write_text("DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


def _rmtree(path: Path) -> None:
    if not path.exists():
        return
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_dir() and not child.is_symlink():
            child.rmdir()
        else:
            child.unlink()
    path.rmdir()


def _rmmod(config: dict[str, Any], argv: list[str]) -> int:
    root = _root(config)
    for name in (a for a in argv if not a.startswith("-")):
        module = _sysfs(name)
        directory = root / "sys/module" / module
        if not (directory / "refcnt").exists():
            sys.stderr.write(f"rmmod: ERROR: Module {module} is not currently loaded\n")
            return 1
        count = int((directory / "refcnt").read_text() or "0")
        if count > 0:
            holders = (
                sorted(p.name for p in (directory / "holders").iterdir())
                if (directory / "holders").is_dir()
                else []
            )
            by = f" by {','.join(holders)}" if holders else ""
            sys.stderr.write(f"rmmod: ERROR: Module {module} is in use{by}\n")
            return 1
        _rmtree(directory)
        base = DEPENDS.get(module)
        if base is not None and (root / "sys/module" / base / "refcnt").exists():
            base_dir = root / "sys/module" / base
            count = int((base_dir / "refcnt").read_text())
            (base_dir / "refcnt").write_text(f"{max(0, count - 1)}\n")
            with contextlib.suppress(OSError):
                (base_dir / "holders" / module).rmdir()
        _register(config, module, loading=False)
    return 0


def _depmod(tree: Path) -> None:
    entries = sorted(str(p.relative_to(tree)) for p in tree.rglob("*.ko"))
    (tree / "modules.dep").write_text("".join(f"{entry}:\n" for entry in entries))


def _depmod_main(config: dict[str, Any], argv: list[str]) -> int:
    base, rest = config["driver_dir"], []
    args = iter(argv)
    for arg in args:
        if arg == "-b":
            base = next(args)
        elif not arg.startswith("-"):
            rest.append(arg)
    kernel = rest[0] if rest else config["kernel"]
    tree = Path(base) / "lib/modules" / kernel
    if not tree.is_dir():
        sys.stderr.write(f"depmod: ERROR: could not open directory {tree}: No such file or directory\n")
        return 1
    _depmod(tree)
    return 0


def _installer(config: dict[str, Any], argv: list[str]) -> int:
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    kernel = opts.get("--kernel-name", config["kernel"])
    source = opts.get("--kernel-source-path")
    if not source or not Path(source).is_dir():
        sys.stderr.write(
            f"ERROR: Unable to find the kernel source tree for the currently running kernel {kernel}\n"
        )
        return 1
    target = Path(
        opts.get(
            "--kernel-install-path",
            Path(config["driver_dir"]) / "lib/modules" / kernel / "kernel/drivers/video",
        )
    )
    target.mkdir(parents=True, exist_ok=True)
    for module in NVIDIA_MODULES:
        (target / f"{module}.ko").write_text(f"built {module} for {kernel} ({opts.get('-m', 'default')})\n")
    _depmod(Path(config["driver_dir"]) / "lib/modules" / kernel)
    print(f"Installation of the kernel module for the NVIDIA driver (kernel {kernel}) is complete.")
    return 0


def _dkms(config: dict[str, Any], argv: list[str]) -> int:
    if not argv or argv[0] != "install" or "-k" not in argv:
        sys.stderr.write("Error! fake dkms only knows: dkms install nvidia/<version> -k <kernel>\n")
        return 2
    kernel = argv[argv.index("-k") + 1]
    tree = Path(config["driver_dir"]) / "lib/modules" / kernel
    target = tree / "updates/dkms"
    target.mkdir(parents=True, exist_ok=True)
    for module in NVIDIA_MODULES:
        (target / f"{module}.ko").write_text(f"dkms {module} for {kernel}\n")
    _depmod(tree)
    print(f"{argv[1]}: installed for {kernel}")
    return 0


def _smi(config: dict[str, Any], argv: list[str]) -> int:
    if not (_root(config) / "sys/module/nvidia/refcnt").exists():
        sys.stderr.write(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n"
        )
        return 9
    print(f"| NVIDIA-SMI {config.get('version', DRIVER_VERSION)}  (fake) | {len(config['gpus'])} GPUs |")
    return 0


def _persistenced(config: dict[str, Any], argv: list[str]) -> int:
    pid_file = _root(config) / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
        sys.stderr.write(f"nvidia-persistenced failed to initialize: already running (pid {pid})\n")
        return 1
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    stubborn = (Path(config["root"]).parent / "fake" / "persistenced-ignores-sigterm").exists()
    child = os.fork()
    if child == 0:  # the daemon
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        with contextlib.suppress(OSError):
            Path("/proc/self/comm").write_text("nvidia-persistenced")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)

        def stop(_sig: int, _frame: object) -> None:
            with contextlib.suppress(OSError):
                pid_file.unlink()
            os._exit(0)

        signal.signal(signal.SIGTERM, signal.SIG_IGN if stubborn else stop)
        tmp = pid_file.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()}\n")
        os.replace(tmp, pid_file)
        while True:
            signal.pause()
    os.waitpid(child, 0)
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    return 0

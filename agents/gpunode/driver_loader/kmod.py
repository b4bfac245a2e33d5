"""Host operations behind one small interface: commands, device nodes, processes; and kmod state.

:class:`HostOps` is what the loader needs from the machine. :class:`RealHostOps` runs the real tools
(``modprobe``, ``rmmod``, ``depmod``, ``nvidia-installer``, ``dkms``, ``nvidia-persistenced``) through
asyncio subprocesses with an argv list, never a shell, keeping only the last 64 KiB of each output
stream (a build log of gigabytes costs no more), and creates device nodes with ``os.mknod``;
tests use it too, pointed at fake executables with ``bin_dir`` and given a recording ``mknod``.

Tool lookup, first match wins: an explicit path (``--modprobe`` ...); with ``--bin-dir`` only that
directory; otherwise NVIDIA's tools in the driver root, then ``$PATH``, then the host root, and kmod's
tools in ``$PATH``, then the host root's ``sbin``/``bin`` directories.

The read-only helpers below (:func:`loaded_modules`, :func:`refcount`, :func:`process_users`) read the
host's ``/sys`` and ``/proc`` through :class:`~gpunode.common.hostpaths.HostPaths`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpunode.common.bounds import TAIL_BYTES, Tail, clip, clip_tail, communicate
from gpunode.common.hostpaths import HostPaths
from gpunode.driver_loader.modules import UNLOAD_ORDER, expected_refs
from gpunode.driver_loader.ops import DriverUser

__all__ = [
    "NVIDIA_TOOLS",
    "TOOLS",
    "CommandResult",
    "HostOps",
    "RealHostOps",
    "holders",
    "loaded_modules",
    "module_users",
    "process_users",
    "refcount",
]

NVIDIA_TOOLS = ("nvidia-installer", "nvidia-persistenced", "nvidia-smi")
TOOLS = ("modprobe", "rmmod", "depmod", "dkms", *NVIDIA_TOOLS)
_BIN_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin", "usr/local/sbin")
_SBIN_DIRS = ("usr/sbin", "sbin", "usr/bin", "bin", "usr/local/sbin", "usr/local/bin")

Mknod = Callable[[str, int, int], None]
_SAID_CHARS = 2000  # of a tool's output in an error message (its end: where it says why it failed)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        """``modprobe nvidia exited 1: <stderr>`` (the tool's own words, for errors and status)."""
        name = " ".join([Path(self.argv[0]).name, *self.argv[1:]]) if self.argv else "?"
        said = clip_tail((self.stderr.strip() or self.stdout.strip()).replace("\n", " | "), _SAID_CHARS)
        return f"`{clip(name, 1000)}` exited {self.returncode}" + (f": {said}" if said else "")


class HostOps(Protocol):
    """What the loader does to the machine (everything else is reading files under the host root)."""

    def which(self, tool: str) -> str | None:
        """The executable for ``tool`` (one of :data:`TOOLS`), or None when there is none."""
        ...

    async def run(self, argv: Sequence[str], *, timeout: float = 300.0) -> CommandResult:
        """Run a command to completion and capture its output (never raises for a failing command)."""
        ...

    async def start_daemon(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        """Start a self-daemonizing program and wait for the starter to exit (not for the daemon)."""
        ...

    def mknod(self, path: Path, mode: int, major: int, minor: int) -> None:
        """Create the character device ``path`` (replacing whatever is there)."""
        ...

    def node_matches(self, path: Path, major: int, minor: int) -> bool:
        """Whether ``path`` already is that character device."""
        ...

    def pid_alive(self, pid: int) -> bool: ...

    def process_name(self, pid: int) -> str | None: ...

    def kill(self, pid: int, sig: int = signal.SIGTERM) -> None: ...


class RealHostOps:
    """:class:`HostOps` on this machine: real processes; ``mknod`` injectable (tests, non-root)."""

    def __init__(
        self,
        paths: HostPaths,
        *,
        tools: Mapping[str, str] | None = None,
        bin_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        mknod: Mknod | None = None,
    ) -> None:
        self.paths = paths
        self.tools = {k: v for k, v in (tools or {}).items() if v}
        self.bin_dir = Path(bin_dir) if bin_dir else None
        self.environ = dict(os.environ if environ is None else environ)
        self._mknod = mknod if mknod is not None else _os_mknod
        self._found: dict[str, str | None] = {}

    # ------------------------------------------------------------------------------ lookup

    def which(self, tool: str) -> str | None:
        if tool in self.tools:
            return self.tools[tool]
        if tool not in self._found:
            self._found[tool] = self._search(tool)
        return self._found[tool]

    def _search(self, tool: str) -> str | None:
        if self.bin_dir is not None:
            return _executable(self.bin_dir / tool)
        path_env = self.environ.get("PATH", os.defpath)
        if tool in NVIDIA_TOOLS:
            for sub in _BIN_DIRS:
                found = _executable(self.paths.driver_dir / sub / tool)
                if found:
                    return found
        found = shutil.which(tool, path=path_env)
        if found:
            return found
        for sub in _SBIN_DIRS:
            found = _executable(self.paths.root / sub / tool)
            if found:
                return found
        return None

    # ------------------------------------------------------------------------------ commands

    async def run(self, argv: Sequence[str], *, timeout: float = 300.0) -> CommandResult:
        args = tuple(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.environ,
                start_new_session=True,  # its own process group: a timeout kills its children too
            )
        except OSError as exc:
            return CommandResult(args, 127, "", f"cannot run {args[0]}: {exc.strerror or exc}")
        try:
            out, err = await asyncio.wait_for(communicate(proc), timeout)
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return CommandResult(args, -9, "", f"timed out after {timeout:g}s and was killed")
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            raise
        return CommandResult(args, proc.returncode or 0, out.text(), err.text())

    async def start_daemon(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        # stderr goes to a file, not a pipe: the daemon keeps its inherited descriptors open, and a pipe
        # would never reach end-of-file while it lives.
        args = tuple(argv)
        with tempfile.TemporaryFile() as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *args,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=err,
                    env=self.environ,
                    start_new_session=True,
                )
            except OSError as exc:
                return CommandResult(args, 127, "", f"cannot run {args[0]}: {exc.strerror or exc}")
            try:
                code = await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                return CommandResult(args, -9, "", f"did not detach within {timeout:g}s and was killed")
            size = err.seek(0, os.SEEK_END)
            err.seek(max(0, size - TAIL_BYTES))  # only the tail: the rest is counted
            tail = Tail()
            tail.total = max(0, size - TAIL_BYTES)
            tail.feed(err.read(TAIL_BYTES))
            return CommandResult(args, code, "", tail.text())

    # ------------------------------------------------------------------------------ nodes

    def mknod(self, path: Path, mode: int, major: int, minor: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():
                raise IsADirectoryError(f"{path} is a directory, not a device node")
            path.unlink()
        self._mknod(str(path), stat.S_IFCHR | mode, os.makedev(major, minor))
        with contextlib.suppress(OSError):  # a marker file from a test double may be read-only
            os.chmod(path, mode)  # mknod's mode is filtered by the umask

    def node_matches(self, path: Path, major: int, minor: int) -> bool:
        try:
            st = path.lstat()
        except OSError:
            return False
        if stat.S_ISCHR(st.st_mode):
            return os.major(st.st_rdev) == major and os.minor(st.st_rdev) == minor
        if stat.S_ISREG(st.st_mode) and self._mknod is not _os_mknod:  # a test double's marker file
            with contextlib.suppress(OSError):
                return path.read_text().strip() == f"c {major}:{minor}"
        return False

    # ------------------------------------------------------------------------------ processes

    def pid_alive(self, pid: int) -> bool:
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _state(pid) not in ("Z", "X")

    def process_name(self, pid: int) -> str | None:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return None

    def kill(self, pid: int, sig: int = signal.SIGTERM) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _os_mknod(path: str, mode: int, device: int) -> None:
    os.mknod(path, mode, device)


def _executable(path: Path) -> str | None:
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _state(pid: int) -> str:
    """The one-letter process state from /proc (Z: a zombie counts as gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return text.rsplit(")", 1)[-1].split()[0] if ")" in text else "?"


def marker_mknod(record: list[tuple[str, int, int, int]] | None = None) -> Mknod:
    """A ``mknod`` for tests and unprivileged runs: a regular file ``c MAJOR:MINOR``, recorded."""

    def make(path: str, mode: int, device: int) -> None:
        major, minor = os.major(device), os.minor(device)
        Path(path).write_text(f"c {major}:{minor}\n")
        if record is not None:
            record.append((path, mode & 0o7777, major, minor))

    return make


# ------------------------------------------------------------------------------ kmod state


def loaded_modules(paths: HostPaths, names: Sequence[str] = UNLOAD_ORDER) -> tuple[str, ...]:
    """Which of ``names`` (sysfs spelling) are loaded as modules (``/sys/module/<m>/refcnt`` exists)."""
    return tuple(name for name in names if (paths.sys_module(name) / "refcnt").exists())


def refcount(paths: HostPaths, module: str) -> int:
    try:
        return int((paths.sys_module(module) / "refcnt").read_text().strip() or "0")
    except (OSError, ValueError):
        return 0


def holders(paths: HostPaths, module: str) -> list[str] | None:
    """The modules using ``module`` (``/sys/module/<m>/holders``), or None where sysfs has no list."""
    try:
        return sorted(entry.name for entry in (paths.sys_module(module) / "holders").iterdir())
    except OSError:
        return None


def module_users(paths: HostPaths) -> list[DriverUser]:
    """References on our modules that our own modules do not explain (reference 1.7's rule)."""
    present = loaded_modules(paths)
    ours = set(UNLOAD_ORDER)
    users: list[DriverUser] = []
    for module in present:
        held_by = holders(paths, module)
        for other in held_by or ():
            if other not in ours:
                users.append(DriverUser("module", other, detail=f"uses {module}"))
        count = refcount(paths, module)
        expected = expected_refs(module, present, held_by)
        if count > expected:
            users.append(
                DriverUser(
                    "module",
                    module,
                    detail=f"refcnt {count}, {expected} from loaded NVIDIA modules",
                )
            )
    return users


def process_users(paths: HostPaths, *, exclude: Sequence[int] = ()) -> list[DriverUser]:
    """Processes holding ``/dev/nvidia*`` open, from ``/proc/<pid>/fd`` links under the host root."""
    users: list[DriverUser] = []
    skip = {*exclude, os.getpid()}
    try:
        entries = list(os.scandir(paths.proc))
    except OSError:
        return users
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        fd_dir = Path(entry.path) / "fd"
        try:
            fds = list(os.scandir(fd_dir))
        except OSError:  # gone, or not ours to read
            continue
        held: set[str] = set()
        for fd in fds:
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                held.add(target)
        if held:
            try:
                name = (Path(entry.path) / "comm").read_text().strip()
            except OSError:
                name = "?"
            users.append(DriverUser("process", name, pid=int(entry.name), detail=", ".join(sorted(held))))
    return sorted(users, key=lambda u: u.pid or 0)

"""One MPS control daemon: start ``nvidia-cuda-mps-control -d``, set its limits, watch it, quit it.

As NVIDIA's mps-control-daemon does for each shared resource: create the pipe and log directories,
start the control daemon with ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY`` and
``CUDA_VISIBLE_DEVICES`` (the resource's GPUs), pipe ``set_default_device_pinned_mem_limit`` and
``set_default_active_thread_percentage`` into the control binary, check it answers
``get_default_active_thread_percentage``, then write ``<root>/<resource>/.started``. Stopping pipes
``quit`` and removes ``.started``. Alive = the pid in ``nvidia-cuda-mps-control.pid`` exists and the
control socket is there (two system calls: no process is started to watch it).

The GPUs' compute mode (``EXCLUSIVE_PROCESS`` before the start, ``DEFAULT`` after the stop) is the
agent's business (:mod:`gpunode.mps.agent`, through :mod:`gpunode.mps.computemode`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpunode.api.mps import CONTROL_BINARY, DaemonPlan, MpsRoot

__all__ = ["BINARY_DIRS", "ControlDaemon", "MpsCommandError", "find_control_binary"]

#: Where the control binary is looked for under the driver root, in order.
BINARY_DIRS = ("usr/bin", "usr/local/bin", "usr/local/nvidia/bin", "bin", "usr/sbin")
#: The driver root's library directories, searched first by the daemon and its servers (libcuda).
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64", "usr/lib")
COMMAND_TIMEOUT = 30.0


class MpsCommandError(RuntimeError):
    """The control binary failed (message: the command and what it printed)."""


def find_control_binary(driver_root: str) -> tuple[Path | None, list[str]]:
    """``nvidia-cuda-mps-control`` under ``driver_root`` (None when absent) and the places looked at."""
    looked = []
    for sub in BINARY_DIRS:
        path = Path(driver_root) / sub / CONTROL_BINARY
        looked.append(str(path))
        if path.is_file() and os.access(path, os.X_OK):
            return path, looked
    return None, looked


def _zombie(pid: int) -> bool:
    """Exited but not reaped (its parent, PID 1 of a container, may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def driver_env(driver_root: str, binary: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """PATH (the control daemon finds ``nvidia-cuda-mps-server`` beside itself) and, for a driver root
    other than ``/``, LD_LIBRARY_PATH with the root's library directories (NVIDIA chroots instead)."""
    env = {"PATH": os.pathsep.join(p for p in (str(binary.parent), environ.get("PATH", "")) if p)}
    if Path(driver_root).resolve() != Path("/"):
        libs = [str(Path(driver_root) / d) for d in LIBRARY_DIRS if (Path(driver_root) / d).is_dir()]
        if libs:
            env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, *filter(None, [environ.get("LD_LIBRARY_PATH")])])
    return env


class ControlDaemon:
    """The control daemon of one :class:`DaemonPlan` under ``root``, run with ``binary``."""

    def __init__(
        self,
        plan: DaemonPlan,
        root: MpsRoot,
        binary: Path,
        environ: Mapping[str, str],
        driver_root: str = "/",
    ) -> None:
        self.plan = plan
        self.root = root
        self.binary = binary
        self.env = {**environ, **plan.env(root), **driver_env(driver_root, binary, environ)}

    @property
    def resource(self) -> str:
        return self.plan.resource

    async def _run(self, args: Sequence[str], stdin: str | None) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            str(self.binary),
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # a daemon forked by -d must not share our process group
        )
        try:
            out, _ = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), COMMAND_TIMEOUT
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise MpsCommandError(
                f"{self.binary} {' '.join(args)}: no answer in {COMMAND_TIMEOUT:.0f} s"
            ) from None
        return proc.returncode or 0, out.decode("utf-8", "replace").strip()

    async def command(self, *commands: str) -> str:
        """Pipe ``commands`` (one per line) into the control binary; its output. Raises on failure."""
        code, out = await self._run([], "\n".join(commands) + "\n")
        if code != 0:
            raise MpsCommandError(f"{'; '.join(commands)}: exit {code}: {out or 'no output'}")
        return out

    def pid(self) -> int | None:
        try:
            return int(Path(self.root.pid_file(self.resource)).read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        """The daemon's pid exists and its control socket is there."""
        pid = self.pid()
        if pid is None or not os.path.exists(self.root.control_socket(self.resource)):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return not _zombie(pid)

    async def start(self) -> None:
        """Start the daemon (a leftover one of this pipe directory is told to quit first), set the
        limits, check it answers, write ``.started``. Raises :class:`MpsCommandError`/``OSError``."""
        dirs = (self.root.pipe_dir(self.resource), self.root.log_dir(self.resource), self.root.shm_dir)
        for directory in dirs:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        self.forget_started()
        if self._has_socket():
            with contextlib.suppress(MpsCommandError):
                await self.command("quit")  # a daemon left by an earlier run: NVIDIA's -d would fail
        code, out = await self._run(["-d"], None)
        if code != 0:
            raise MpsCommandError(f"{self.binary} -d: exit {code}: {out or 'no output'}")
        await self.command(*self.plan.commands())
        await self.command("get_default_active_thread_percentage")  # NVIDIA's health check
        self._mark_started()

    def _has_socket(self) -> bool:
        return os.path.exists(self.root.control_socket(self.resource))

    def _mark_started(self) -> None:
        Path(self.root.started_file(self.resource)).touch()

    def started(self) -> bool:
        """Running with its limits set: alive and ``.started`` written."""
        return self.alive() and os.path.exists(self.root.started_file(self.resource))

    def forget_started(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root.started_file(self.resource))

    async def stop(self) -> str:
        """``quit`` (the daemon ends its servers and leaves) and remove ``.started``; the output."""
        self.forget_started()
        if not self.alive():
            return ""
        return await self.command("quit")

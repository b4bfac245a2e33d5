"""A fake ``nvidia-cuda-mps-control`` for the simulated host: real processes, a real control socket.

It behaves like NVIDIA's binary for what gpunode uses:

* ``nvidia-cuda-mps-control -d`` starts the control daemon in the background (double fork, new session)
  and returns 0 once it listens. The daemon takes ``CUDA_MPS_PIPE_DIRECTORY`` (default
  ``/tmp/nvidia-mps``) and ``CUDA_MPS_LOG_DIRECTORY`` (default ``/var/log/nvidia-mps``) from its
  environment, creates the ``control`` socket and ``nvidia-cuda-mps-control.pid`` in the pipe directory
  and appends every command to ``control.log`` in the log directory. A second ``-d`` on the same pipe
  directory fails (exit 1) while the first one lives.
* ``nvidia-cuda-mps-control`` (no argument) reads commands from stdin, one per line, sends each to the
  daemon of ``CUDA_MPS_PIPE_DIRECTORY`` and prints the answers; exit 1 when no daemon answers or a
  command fails.
* Commands: ``set_default_active_thread_percentage N`` / ``get_default_active_thread_percentage``
  (printed as ``N.0``), ``set_default_device_pinned_mem_limit DEV LIMIT`` /
  ``get_default_device_pinned_mem_limit DEV`` (``LIMIT`` like ``2048M`` or ``2G``), ``get_server_list``
  (empty: no client has connected), ``quit`` (the daemon removes its socket and pid file and exits).
  Anything else is answered with an error.

Environment knobs for tests: ``GPUNODE_FAKE_MPS_FAIL`` (a command word: that command fails). Imports only
the standard library, so each client start is quick. :func:`install` writes the executable into a
driver root (``<root>/usr/bin/nvidia-cuda-mps-control``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

__all__ = ["BINARY", "install", "main"]

BINARY = "nvidia-cuda-mps-control"
DEFAULT_PIPE = "/tmp/nvidia-mps"
DEFAULT_LOG = "/var/log/nvidia-mps"
_LIMIT = re.compile(r"^([0-9]+)([MG]?)$", re.IGNORECASE)


def install(driver_root: Path, *, python: str = sys.executable) -> Path:
    """Write the fake binary to ``<driver_root>/usr/bin/nvidia-cuda-mps-control``; returns its path."""
    target = Path(driver_root) / "usr" / "bin" / BINARY
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"#!{python}\nimport sys\nfrom gpunode.sim.mps_control import main\nsys.exit(main())\n")
    target.chmod(0o755)
    return target


def _dirs() -> tuple[Path, Path]:
    return (
        Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE),
        Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG),
    )


# ------------------------------------------------------------------------------------------- daemon


class _Daemon:
    def __init__(self, pipe: Path, log: Path) -> None:
        self.pipe, self.log = pipe, log
        self.threads: float = 100.0
        self.limits: dict[str, str] = {}
        self.fail = os.environ.get("GPUNODE_FAKE_MPS_FAIL", "")

    def record(self, line: str) -> None:
        with open(self.log / "control.log", "a", encoding="utf-8") as f:
            f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}\n")

    def answer(self, command: str) -> tuple[str, bool]:
        """(reply, quit)."""
        words = command.split()
        if not words:
            return "", False
        self.record(f"CMD {command}")
        name, args = words[0], words[1:]
        if name == self.fail:
            return f"Error: {name} failed", False
        if name == "quit":
            return "", True
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.threads:.1f}", False
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                return f"Error: invalid percentage {args[0]!r}", False
            if not 0 < value <= 100:
                return f"Error: percentage {args[0]} out of range", False
            self.threads = value
            return f"{value:.1f}", False
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            if not _LIMIT.match(args[1]):
                return f"Error: invalid memory limit {args[1]!r}", False
            self.limits[args[0]] = args[1].upper() if args[1][-1:].isalpha() else args[1] + "M"
            return "", False
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return self.limits.get(args[0], "0M"), False
        if name == "get_server_list" and not args:
            return "", False
        return f"Error: unrecognized command {command!r}", False

    def serve(self, server: socket.socket) -> None:
        control, pid_file = self.pipe / "control", self.pipe / "nvidia-cuda-mps-control.pid"

        def leave(*_: object) -> None:
            for path in (control, pid_file):
                with contextlib.suppress(OSError):
                    path.unlink()
            self.record("Exit")
            os._exit(0)

        signal.signal(signal.SIGTERM, leave)
        self.record("Startup")
        while True:
            conn, _ = server.accept()
            with conn:
                data = b""
                while not data.endswith(b"\n") and len(data) < 4096:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                reply, done = self.answer(data.decode("utf-8", "replace").strip())
                with contextlib.suppress(OSError):
                    conn.sendall(reply.encode() + b"\n")
            if done:
                server.close()
                leave()


def _start_daemon() -> int:
    pipe, log = _dirs()
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    control = pipe / "control"
    if _ask(control, "get_server_list") is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    with contextlib.suppress(FileNotFoundError):
        control.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(control))
    server.listen(16)
    read_end, write_end = os.pipe()
    if os.fork() > 0:  # the caller: wait until the daemon has written its pid file
        os.close(write_end)
        server.close()
        ok = os.read(read_end, 1) == b"1"
        os.close(read_end)
        return 0 if ok else 1
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")
    os.write(write_end, b"1")
    os.close(write_end)
    _Daemon(pipe, log).serve(server)
    return 0


# ------------------------------------------------------------------------------------------- client


def _ask(control: Path, command: str) -> str | None:
    """The daemon's answer, or None when no daemon listens on ``control``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(control))
            s.sendall(command.encode() + b"\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError:
        return None
    return data.decode("utf-8", "replace").rstrip("\n")


def _client() -> int:
    pipe, _ = _dirs()
    control = pipe / "control"
    status = 0
    for line in sys.stdin.read().splitlines():
        command = line.strip()
        if not command:
            continue
        reply = _ask(control, command)
        if reply is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        if reply:
            print(reply)
        if reply.startswith("Error"):
            status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["-d"]:
        return _start_daemon()
    if args in (["-h"], ["--help"]):
        print(f"usage: {BINARY} [-d]")
        return 0
    if args:
        print(f"{BINARY}: unknown arguments {' '.join(args)}", file=sys.stderr)
        return 1
    return _client()


if __name__ == "__main__":
    sys.exit(main())

"""`gpunode fake-host`: the README's way to rehearse the driver loader, end to end through the CLIs."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

LOADER = [sys.executable, "-m", "gpunode.driver_loader.cli"]


def test_fake_host_then_init_status_unload(gpunode_cmd: list[str], tmp_path: Path) -> None:
    base = tmp_path / "fh"
    made = subprocess.run(
        [*gpunode_cmd, "fake-host", str(base), "--precompiled"], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    commands = [
        shlex.split(line.strip())[1:] for line in made.stdout.splitlines() if "gpunode-driver-loader" in line
    ]
    assert [c[0] for c in commands] == ["init", "status", "unload"]
    try:
        init = subprocess.run(
            [*LOADER, *commands[0], "--http-port", "-1"], capture_output=True, text=True, timeout=60
        )
        assert init.returncode == 0, init.stderr
        assert (base / "host/run/nvidia/validations/.driver-ctr-ready").exists()
        status = subprocess.run([*LOADER, *commands[1]], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0
        assert "readiness" in status.stdout
        unload = subprocess.run([*LOADER, *commands[2]], capture_output=True, text=True, timeout=60)
        assert unload.returncode == 0, unload.stderr
        assert not (base / "host/sys/module/nvidia").exists()
    finally:  # a fake persistenced left behind by a failed run
        pidfile = base / "host/var/run/nvidia-persistenced/nvidia-persistenced.pid"
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)


def test_fake_host_refuses_a_non_empty_directory(gpunode_cmd: list[str], tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    r = subprocess.run([*gpunode_cmd, "fake-host", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2

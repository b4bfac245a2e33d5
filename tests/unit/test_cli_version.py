"""`gpunode --version` and `gpunode version` print the same line and exit 0."""

from __future__ import annotations

import subprocess

from gpunode import __version__


def test_version_flag_and_command_agree(gpunode_cmd: list[str]) -> None:
    flag = subprocess.run([*gpunode_cmd, "--version"], capture_output=True, text=True, timeout=60)
    command = subprocess.run([*gpunode_cmd, "version"], capture_output=True, text=True, timeout=60)
    assert flag.returncode == 0, flag.stderr
    assert command.returncode == 0, command.stderr
    assert flag.stdout == command.stdout == f"gpunode {__version__}\n"

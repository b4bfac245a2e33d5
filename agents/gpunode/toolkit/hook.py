"""gpunode's CDI hook program: where it lives, and installing it on the host.

The CDI spec's ``createContainer`` hooks (library links, the container's ``ld.so.cache``, CUDA forward
compatibility) run on the host, started by the container runtime, before the container does. The
program is ``gpunode-cdi-hook``, a POSIX sh script shipped in this package (it needs only ``sh``,
``awk``, ``ln``, ``mkdir``, ``mv``, ``rm``, ``readlink`` and the host's ``ldconfig``, so hosts without Python,
such as those of the DaemonSet path, run it). ``gpunode-toolkit cdi generate`` installs it at
:data:`DEFAULT_HOOK_PATH` (under ``--host-root``) before writing a spec that names it;
``gpunode-toolkit hook install|uninstall`` do it on their own. docs/cdi.md has the trade-offs.

Install is atomic (a temporary file in the same directory, then a rename: a runtime starting a
container meanwhile runs the old or the new program, never half of one) and idempotent (unchanged
bytes and mode: nothing written). Uninstall removes only a file that is gpunode's hook
(:data:`MARKER`), and the default directory when it is left empty.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from importlib import resources
from pathlib import Path

from gpunode.common.atomic import atomic_write, fsync_dir

__all__ = [
    "DEFAULT_HOOK_DIR",
    "DEFAULT_HOOK_PATH",
    "HOOK_NAME",
    "MARKER",
    "NVIDIA_HOOK_NAMES",
    "hook_problem",
    "hook_program",
    "install_hook",
    "is_gpunode_hook",
    "uninstall_hook",
]

HOOK_NAME = "gpunode-cdi-hook"
DEFAULT_HOOK_DIR = "/usr/local/gpunode/bin"
DEFAULT_HOOK_PATH = f"{DEFAULT_HOOK_DIR}/{HOOK_NAME}"
NVIDIA_HOOK_NAMES = ("nvidia-cdi-hook", "nvidia-ctk")
MARKER = b"# gpunode-hook-version:"
MODE = 0o755


def hook_program() -> bytes:
    """The hook program's bytes, as shipped in this package."""
    return resources.files("gpunode.toolkit").joinpath(HOOK_NAME).read_bytes()


def is_gpunode_hook(host_path: str) -> bool:
    """Whether a ``--hook-path`` names gpunode's hook (by file name), which the toolkit installs."""
    return posixpath.basename(host_path) == HOOK_NAME


def hook_problem(local: Path, host_path: str) -> str | None:
    """Why the program at ``local`` (``host_path`` on the host) cannot run as a hook, or None."""
    try:
        st = local.stat()
    except FileNotFoundError:
        return f"--hook-path {host_path}: no such program on the host (looked at {local})"
    except OSError as exc:
        return f"--hook-path {host_path}: cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return f"--hook-path {host_path}: not a regular file ({local})"
    if not st.st_mode & 0o111:
        return f"--hook-path {host_path}: not executable ({local})"
    return None


def install_hook(local: Path) -> bool:
    """Write the hook program at ``local`` (mode 0755, directories made 0755); True when it changed."""
    local.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    return atomic_write(local, hook_program(), MODE, only_if_changed=True)


def _ours(local: Path) -> bool:
    try:
        with local.open("rb") as f:
            return MARKER in f.read(64 * 1024)
    except OSError:
        return False


def uninstall_hook(local: Path, *, default_dir: Path | None = None) -> bool:
    """Remove gpunode's hook at ``local``; True when removed. ``OSError`` when it cannot be; a file that
    is not gpunode's hook is left alone (``ValueError``). ``default_dir`` (the default install
    directory, as this process sees it) is removed too when the removal leaves it empty, and its
    parent ``gpunode`` directory likewise."""
    if not local.exists() and not local.is_symlink():
        return False
    if local.is_symlink() or not _ours(local):
        raise ValueError(f"{local} is not gpunode's hook program; left in place")
    local.unlink()
    fsync_dir(local.parent)
    if default_dir is not None and local.parent == default_dir:
        for directory in (default_dir, default_dir.parent):
            with contextlib.suppress(OSError):  # not empty: someone else's files
                os.rmdir(directory)
    return True

"""gpunode-toolkit hook: install or remove gpunode's CDI hook program on the host.

    gpunode-toolkit hook install   [--hook-path /usr/local/gpunode/bin/gpunode-cdi-hook] [--host-root DIR]
    gpunode-toolkit hook uninstall [--hook-path PATH] [--host-root DIR]

`cdi generate` installs the hook itself before writing a spec that runs it; these verbs are for
installing it ahead of time (an image build, a configuration tool) and for removing it with the rest
of gpunode. install writes the program atomically (mode 0755) and changes nothing when it is current;
uninstall removes it only when the file there is gpunode's hook (and the default directory when empty).

Exit 0 on success ("installed", "no change", "removed", "not installed"), 1 when the file cannot be
written or removed (or is not gpunode's hook), 2 on bad usage.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpunode.agent.main import AgentContext, AgentSpec, verbs_main
from gpunode.common.hostpaths import HostPaths
from gpunode.common.logging import get_logger
from gpunode.toolkit.hook import DEFAULT_HOOK_DIR, install_hook, is_gpunode_hook, uninstall_hook
from gpunode.toolkit.settings import HookSettings

__all__ = ["INSTALL", "SPECS", "UNINSTALL", "main"]

PROG = "gpunode-toolkit hook"


def _local(s: HookSettings) -> Path:
    if not os.path.isabs(s.hook_path):
        raise ValueError(f"--hook-path {s.hook_path!r}: must be an absolute path on the host")
    if not is_gpunode_hook(s.hook_path):
        raise ValueError(f"--hook-path {s.hook_path!r}: gpunode's hook is installed as .../gpunode-cdi-hook")
    return HostPaths(root=s.host_root).host(s.hook_path)


def start_install(ctx: AgentContext[HookSettings]) -> int:
    local = _local(ctx.settings)
    try:
        changed = install_hook(local)
    except OSError as exc:
        print(
            f"{PROG} install: error: cannot write {exc.filename or local}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    if changed:
        get_logger("gpunode.toolkit.hook").info(
            "cdi_hook_installed", path=ctx.settings.hook_path, local=str(local)
        )
    print(f"installed {local}" if changed else "no change")
    return 0


def start_uninstall(ctx: AgentContext[HookSettings]) -> int:
    s = ctx.settings
    local = _local(s)
    default_dir = HostPaths(root=s.host_root).host(DEFAULT_HOOK_DIR)
    try:
        removed = uninstall_hook(local, default_dir=default_dir)
    except (OSError, ValueError) as exc:
        print(f"{PROG} uninstall: error: {exc}", file=sys.stderr)
        return 1
    if removed:
        get_logger("gpunode.toolkit.hook").info("cdi_hook_removed", path=s.hook_path, local=str(local))
    print(f"removed {local}" if removed else "not installed")
    return 0


INSTALL = AgentSpec(
    name="toolkit",
    console_script="gpunode-toolkit",
    verb="hook install",
    settings_type=HookSettings,
    start=start_install,
    description=__doc__,
    errors_with_verb=True,
    uses_nvml=False,
)
UNINSTALL = AgentSpec(
    name="toolkit",
    console_script="gpunode-toolkit",
    verb="hook uninstall",
    settings_type=HookSettings,
    start=start_uninstall,
    description=__doc__,
    errors_with_verb=True,
    uses_nvml=False,
)
SPECS: Mapping[str, AgentSpec[HookSettings]] = {"install": INSTALL, "uninstall": UNINSTALL}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    return verbs_main(PROG, SPECS, argv, environ, usage=__doc__)

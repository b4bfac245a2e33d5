"""What each verb prints, and its exit code: ``init`` (dry run, one shot, daemon), ``unload``, ``status``.

Exit 0 on success, 1 on failure (the reason on stderr); the usage errors (exit 2) are the command
line's, in :mod:`gpunode.driver_loader.cli`.
"""

from __future__ import annotations

import json
import sys

from gpunode.common.hostpaths import HostPaths
from gpunode.driver_loader import kmod
from gpunode.driver_loader.daemon import HealthDaemon
from gpunode.driver_loader.loader import DriverLoader
from gpunode.driver_loader.ops import DriverInUse
from gpunode.driver_loader.readiness import Files
from gpunode.driver_loader.steps import LoaderError

__all__ = ["run_init", "run_unload", "show_status"]


async def run_init(
    loader: DriverLoader, *, oneshot: bool, dry_run: bool, http_port: int | None, http_host: str | None = None
) -> int:
    if dry_run:
        plan = loader.plan()
        print("\n".join(plan.describe()))
        return 0
    if not oneshot:
        return await HealthDaemon(loader).serve(http_port=http_port, http_host=http_host)
    try:
        await loader.init()
    except (LoaderError, DriverInUse) as exc:
        print(f"gpunode-driver-loader: init failed: {exc}", file=sys.stderr)
        return 1
    return 0


async def run_unload(loader: DriverLoader) -> int:
    try:
        await loader.unload()
    except DriverInUse as exc:
        print(f"gpunode-driver-loader: refusing to unload: {exc}", file=sys.stderr)
        for user in exc.users:
            print(f"  {user}", file=sys.stderr)
        return 1
    except LoaderError as exc:
        print(f"gpunode-driver-loader: unload failed: {exc}", file=sys.stderr)
        return 1
    print("NVIDIA driver unloaded")
    return 0


def show_status(host_root: str, *, as_json: bool) -> int:
    """``status``: 0 when the last command is done/serving, 1 when it failed or never ran."""
    from gpunode.driver_loader.readiness import read_status, render_status

    path = Files(HostPaths(root=host_root)).status
    try:
        doc = read_status(path)
    except (OSError, ValueError) as exc:
        print(f"gpunode-driver-loader: no status at {path} ({exc}); has init run?", file=sys.stderr)
        return 1
    pid = doc.get("pid")
    alive = isinstance(pid, int) and kmod.RealHostOps(HostPaths()).pid_alive(pid)
    if as_json:
        print(json.dumps({**doc, "processAlive": alive}, indent=2))
    else:
        print(render_status(doc, alive=alive))
    failed = any(s.get("state") == "failed" for s in doc["steps"]) or doc.get("phase") == "failed"
    return 1 if failed else 0

"""After a MIG change, tell the device plugin and feature discovery on this node (SIGHUP) so they
re-read the layout: the processes are found by program name, console scripts started through their
interpreter included."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from gpunode.common.logging import Logger

__all__ = ["find_agents", "notify_agents"]


def find_agents(names: Sequence[str], *, own_pid: int | None = None) -> list[int]:
    """Pids of processes whose program is one of ``names``: argv[0]'s basename, or argv[1]'s when
    argv[0] is a Python interpreter (a console script started through its ``#!`` line)."""
    import psutil

    wanted = set(names)
    me = os.getpid() if own_pid is None else own_pid
    found: list[int] = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            argv = proc.info.get("cmdline") or []
        except (psutil.Error, AttributeError):
            continue
        if not argv or proc.pid == me:
            continue
        prog = os.path.basename(argv[0])
        if prog not in wanted and prog.startswith("python") and len(argv) > 1:
            prog = os.path.basename(argv[1])
        if prog in wanted:
            found.append(proc.pid)
    return sorted(found)


def notify_agents(names: Sequence[str], log: Logger) -> list[int]:
    """SIGHUP the device plugin and feature discovery on this node, so they re-read the MIG layout."""
    told: list[int] = []
    for pid in find_agents(names):
        try:
            os.kill(pid, signal.SIGHUP)
            told.append(pid)
        except OSError as exc:
            log.warning("mig_notify_failed", pid=pid, error=str(exc))
    log.info("mig_agents_notified", pids=told, programs=list(names))
    return told

"""The driver loader's real host operations pointed at a :class:`gpunode.sim.host.FakeHost`."""

from __future__ import annotations

from gpunode.driver_loader.kmod import RealHostOps, marker_mknod
from gpunode.sim.host import FakeHost


def host_ops(host: FakeHost, *, marker_nodes: bool = True) -> RealHostOps:
    """The real host operations pointed at the fake tools (and, by default, marker-file nodes)."""
    return RealHostOps(
        host.paths, bin_dir=host.bin, mknod=marker_mknod(host.mknods) if marker_nodes else None
    )

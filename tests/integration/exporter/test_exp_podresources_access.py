"""An unreadable pod-resources directory (the kubelet makes it 0750 root; a non-root exporter may not enter
it) costs the exporter its pod labels, never its life: the client raises PodResourcesUnavailable, which the
sampler turns into series without pod labels, and it reads pods again once it may."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpunode.exporter.podresources import PodResourcesClient, PodResourcesUnavailable
from gpunode.sim.podresources import FakePodResources

PODS = [
    {
        "name": "train",
        "namespace": "ml",
        "containers": [
            {"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["G"]}]}
        ],
    }
]


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakePodResources]:
    fake = FakePodResources(tmp_path / "pod-resources" / "kubelet.sock")
    fake.set_pods(PODS)
    await fake.start()
    yield fake
    await fake.stop()


def _deny(monkeypatch: pytest.MonkeyPatch, socket: Path) -> None:
    """Make ``socket``'s directory unenterable: for real (mode 0) when not root; root passes any mode
    check, so there the stat the kernel would refuse raises EACCES as it would."""
    if os.geteuid() != 0:
        socket.parent.chmod(0)
        return
    real_stat = Path.stat

    def stat(self: Path, *, follow_symlinks: bool = True) -> os.stat_result:
        if self == socket:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(Path, "stat", stat)


async def test_a_socket_it_may_not_reach_is_unavailable_not_fatal(
    kubelet: FakePodResources, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = PodResourcesClient(kubelet.socket, timeout=0.5)
    try:
        assert [p.name for p in (await client.list()).pod_resources] == ["train"]
        with monkeypatch.context() as m:
            _deny(m, kubelet.socket)
            with pytest.raises(PodResourcesUnavailable) as info:
                await client.list()
            assert info.value.reason == PodResourcesUnavailable.NO_ACCESS
            assert "Permission denied" in str(info.value)
            assert str(kubelet.socket) in str(info.value)
        kubelet.socket.parent.chmod(0o750)
        assert [p.name for p in (await client.list()).pod_resources] == ["train"]  # access back: pods back
    finally:
        kubelet.socket.parent.chmod(0o750)
        await client.close()

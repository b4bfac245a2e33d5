"""The device plugin against a fake kubelet: real gRPC over Unix sockets, a shared simulated node."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpunode.device_plugin.health import XidPolicy
from gpunode.nvml import errors, mig
from gpunode.sim.kubelet import FakeKubelet
from gpunode.sim.nvml.state import ProcessState
from helpers.waiting import SkewedClock, logged, until

Starter = Any  # the start_plugin fixture (see conftest.py)

GPU = "nvidia.com/gpu"


def sliced(replicas: int) -> str:
    return SHARED_PLAIN.format(replicas=replicas)


SHARED_PLAIN = """
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


async def eventually(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_registers_and_advertises_every_gpu_with_numa(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    r = await start_plugin("dgx-a100")
    plugin = kubelet.plugins[GPU]
    assert plugin.endpoint == "nvidia-gpu.sock"
    assert plugin.options.get_preferred_allocation_available
    assert not plugin.options.pre_start_required
    assert len(kubelet.healthy(GPU)) == 8
    gpus = {g.uuid: g for g in r.plugin.gpus}
    assert {i: plugin.numa[i] for i in plugin.devices} == {u: [g.numa_node] for u, g in gpus.items()}
    sock = kubelet.dir / "nvidia-gpu.sock"
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600


async def test_options_and_prestart(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    await start_plugin()
    stub = kubelet.plugins[GPU].stub
    opts = await stub.GetDevicePluginOptions(pb.Empty())
    assert opts.get_preferred_allocation_available
    assert (
        await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["x"]))
        == pb.PreStartContainerResponse()
    )


@pytest.mark.parametrize(
    ("strategies", "check"),
    [
        pytest.param(("envvar",), "env", id="envvar"),
        pytest.param(("volume-mounts",), "mounts", id="volume-mounts"),
        pytest.param(("cdi-annotations",), "annotations", id="cdi-annotations"),
        pytest.param(("cdi-cri",), "cdi", id="cdi-cri"),
        pytest.param(("envvar", "cdi-cri"), "env+cdi", id="envvar+cdi-cri"),
    ],
)
async def test_allocate_answers_per_device_list_strategy(
    start_plugin: Starter, kubelet: FakeKubelet, strategies: tuple[str, ...], check: str
) -> None:
    await start_plugin(overrides={"device_list_strategies": strategies})
    ids = sorted(kubelet.healthy(GPU))[:2]
    resp = (await kubelet.allocate(GPU, ids)).container_responses[0]
    if "env" in check:
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
    else:
        assert "NVIDIA_VISIBLE_DEVICES" not in resp.envs or check == "mounts"
    if check == "mounts":
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
        assert [m.container_path for m in resp.mounts] == [
            f"/var/run/nvidia-container-devices/{i}" for i in ids
        ]
        assert all(m.host_path == "/dev/null" for m in resp.mounts)
    if check == "annotations":
        ((key, value),) = resp.annotations.items()
        assert key.startswith("cdi.k8s.io/nvidia-device-plugin_")
        assert value == ",".join(f"k8s.device-plugin.nvidia.com/gpu={i}" for i in ids)
    if "cdi" in check:
        assert [d.name for d in resp.cdi_devices] == [f"k8s.device-plugin.nvidia.com/gpu={i}" for i in ids]


async def test_pass_device_specs_and_index_ids(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    dev = tmp_path / "devroot"
    (dev / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm"):  # no nvidia-uvm-tools, no nvidia-modeset on this node
        (dev / "dev" / name).touch()
    r = await start_plugin(
        overrides={"pass_device_specs": True, "device_id_strategy": "index", "dev_root": str(dev)}
    )
    by_index = {str(g.index): g.uuid for g in r.plugin.gpus}
    resp = (await kubelet.allocate(GPU, [by_index["5"], by_index["2"]])).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "5,2"
    assert [(d.container_path, d.host_path, d.permissions) for d in resp.devices] == [
        ("/dev/nvidiactl", f"{dev}/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", f"{dev}/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia5", f"{dev}/dev/nvidia5", "rw"),
        ("/dev/nvidia2", f"{dev}/dev/nvidia2", "rw"),
    ]


async def test_preferred_allocation_follows_nvlink(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    r = await start_plugin("mixed")
    a100s = [g.uuid for g in r.plugin.gpus if "A100" in g.name]
    everything = sorted(kubelet.healthy(GPU))
    assert sorted(await kubelet.preferred(GPU, everything, [], 2)) == sorted(a100s)
    t4 = next(g.uuid for g in r.plugin.gpus if "T4" in g.name)
    chosen = await kubelet.preferred(GPU, everything, [t4], 2)
    assert t4 in chosen
    assert len(chosen) == 2


async def test_unknown_ids_are_invalid_argument(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    await start_plugin()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await kubelet.allocate(GPU, ["GPU-nope", sorted(kubelet.healthy(GPU))[0]])
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-nope" in (exc.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await kubelet.preferred(GPU, ["GPU-nope", "GPU-other"], [], 1)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-nope" in (exc.value.details() or "")
    assert "GPU-other" in (exc.value.details() or "")


SHARED = """
version: v1
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: {fail}
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


async def test_time_slicing_replicas_and_policies(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    r = await start_plugin("a30x4", config=SHARED.format(fail="false", replicas=4))
    ids = sorted(kubelet.healthy(GPU))
    assert len(ids) == 16
    assert all("::" in i for i in ids)
    two = await kubelet.preferred(GPU, ids, [], 2)
    assert len({i.split("::")[0] for i in two}) == 2  # distributed: two physical GPUs
    resp = (await kubelet.allocate(GPU, [ids[0], ids[1]])).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ids[0].split("::")[0]  # replicas of one GPU: one entry
    # packed: with GPU 0 half used, the next replica comes from GPU 0 again
    r.plugin.state.settings = r.plugin.state.settings.__class__(
        **{**r.plugin.state.settings.__dict__, "shared_allocation_policy": "packed"}
    )
    gpu0 = ids[0].split("::")[0]
    available = [i for i in ids if not (i.startswith(gpu0) and i.endswith(("::0", "::1")))]
    (one,) = await kubelet.preferred(GPU, available, [], 1)
    assert one.startswith(gpu0)


async def test_fail_requests_greater_than_one(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    await start_plugin("t4x4", config=SHARED.format(fail="true", replicas=2))
    ids = sorted(kubelet.healthy(GPU))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await kubelet.allocate(GPU, ids[:2])
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "maximum request size for shared resources is 1; found 2" in (exc.value.details() or "")
    assert (await kubelet.allocate(GPU, ids[:1])).container_responses[0].envs


async def test_fatal_xid_marks_every_replica_unhealthy_then_recovers(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    r = await start_plugin("t4x4", config=SHARED.format(fail="false", replicas=3), recovery_period=0.6)
    gpu1 = next(g.uuid for g in r.plugin.gpus if g.index == 1)
    with r.mutate() as st:
        st.inject_xid(1, 13)  # application error: ignored
        st.inject_xid(1, 32)  # invalid push buffer: fatal, recoverable
    await kubelet.wait_for(lambda: len(kubelet.unhealthy(GPU)) == 3)
    assert {i.split("::")[0] for i in kubelet.unhealthy(GPU)} == {gpu1}
    marked = time.monotonic()
    await kubelet.wait_for(lambda: not kubelet.unhealthy(GPU), timeout=5)
    assert time.monotonic() - marked >= 0.4  # not before the hold-down period (0.6 s, less our lag)


async def test_reset_required_xid_does_not_recover(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    clock = SkewedClock()
    r = await start_plugin("t4x4", recovery_period=0.2, clock=clock)
    with r.mutate() as st:
        st.inject_xid(2, 48)
    await kubelet.wait_for(lambda: len(kubelet.unhealthy(GPU)) == 1)
    clock.advance(1.0)  # the hold-down period is long over ...
    await r.probe_passes(3)  # ... for several probe passes
    assert len(kubelet.unhealthy(GPU)) == 1


async def test_lost_gpu_is_unhealthy_and_recovers_after_it_returns(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    clock = SkewedClock()
    r = await start_plugin("dgx-a100", recovery_period=0.3, clock=clock)
    with r.mutate() as st:
        st.lose(6)
    await kubelet.wait_for(lambda: len(kubelet.unhealthy(GPU)) == 1)
    clock.advance(1.0)  # longer than the hold-down period, for several probe passes
    await r.probe_passes(3)
    assert len(kubelet.unhealthy(GPU)) == 1  # still lost: no recovery
    with r.mutate() as st:
        st.restore(6)
    await kubelet.wait_for(lambda: not kubelet.unhealthy(GPU), timeout=5)


async def test_health_checks_can_be_disabled(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    r = await start_plugin("t4x4", policy=XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "all"}))
    with r.mutate() as st:
        st.inject_xid(0, 79)
    await until(lambda: r.calls.events >= 1)  # the plugin has handled the XID event
    assert not kubelet.unhealthy(GPU)


async def test_kubelet_restart_reregisters_within_a_second(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    await start_plugin()
    for _ in range(3):
        before = time.monotonic()
        await kubelet.restart()
        plugin = await kubelet.wait_registered(GPU, after=before, timeout=1.0)
        assert len(plugin.devices) == 8
        assert (kubelet.dir / "nvidia-gpu.sock").exists()


async def test_kubelet_down_for_a_while(
    start_plugin: Starter, kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    await start_plugin()
    await kubelet.stop()
    for entry in kubelet.dir.iterdir():
        entry.unlink()
    # the plugin notices its socket went and retries while the kubelet is away
    await until(lambda: "kubelet_unavailable" in logged(caplog))
    before = time.monotonic()
    await kubelet.start()
    await kubelet.wait_registered(GPU, after=before, timeout=2.0)


async def test_deleted_plugin_socket_is_recreated(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    await start_plugin()
    before = time.monotonic()
    (kubelet.dir / "nvidia-gpu.sock").unlink()
    await kubelet.wait_registered(GPU, after=before, timeout=2.0)
    assert (kubelet.dir / "nvidia-gpu.sock").exists()


async def test_registering_before_the_kubelet_exists(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await kubelet.stop()
    r = await start_plugin(wait=None)
    await until(lambda: "kubelet_unavailable" in logged(caplog))  # a registration attempt failed
    assert not r.plugin.ready.is_set()
    before = time.monotonic()
    await kubelet.start()
    await kubelet.wait_registered(GPU, after=before, timeout=3.0)
    await asyncio.wait_for(r.plugin.ready.wait(), 2)


async def test_config_reload_good_then_bad(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    r = await start_plugin("a30x4", config=SHARED.format(fail="false", replicas=2))
    assert len(kubelet.healthy(GPU)) == 8
    path = r.plugin.opts.config_file
    assert path is not None
    registrations = len(kubelet.registrations)
    path.write_text(SHARED.format(fail="false", replicas=4))  # a content change, noticed by the watch
    await kubelet.wait_for(lambda: len(kubelet.healthy(GPU)) == 16)
    assert (
        len(kubelet.registrations) == registrations
    )  # same resource: new list on the stream, no re-register
    path.write_text(sliced(1))
    await eventually(lambda: r.plugin.base_metrics.error_count("config") >= 1)
    assert len(kubelet.healthy(GPU)) == 16  # the last good config stays in force
    path.write_text("version: v1\nflags: [not, a, mapping\n")
    await eventually(lambda: r.plugin.base_metrics.error_count("config") >= 2)
    assert len(kubelet.healthy(GPU)) == 16
    assert len(kubelet.registrations) == registrations  # nothing re-registered for a rejected config


async def test_sighup_style_reload_renames_the_resource(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    r = await start_plugin("t4x4", config=SHARED.format(fail="false", replicas=2))
    path = r.plugin.opts.config_file
    assert path is not None
    r.plugin._config_digest = "stale"  # make the file watch skip; reload() is what SIGHUP calls
    path.write_text(
        SHARED.format(fail="false", replicas=2) + "    renameByDefault: true\n".replace("    ", "    ")
    )
    path.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 2\n"
    )
    await r.plugin.reload()
    shared = await kubelet.wait_registered("nvidia.com/gpu.shared", timeout=3)
    assert len(shared.devices) == 8
    await kubelet.wait_for(lambda: kubelet.plugins[GPU].ended or not kubelet.plugins[GPU].devices)


def _enable_mig_and_create(state: object, gpu: int, enum: int, count: int) -> None:
    st = state  # SimNodeState
    ret, _ = st.set_mig_mode(gpu, 1)  # type: ignore[attr-defined]
    assert ret == 0
    st.reset_gpu(gpu)  # type: ignore[attr-defined]
    for _ in range(count):
        ret, gi = st.create_gi(gpu, enum, None)  # type: ignore[attr-defined]
        assert ret == 0
        slices = mig.GI_ENUMS[enum][0]
        ci_enum = next(e for e, c in mig.CI_ENUMS.items() if c == slices)
        assert st.create_ci(gpu, gi, ci_enum, None)[0] == 0  # type: ignore[attr-defined]


async def test_mig_change_at_runtime_with_mixed_strategy(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    r = await start_plugin("dgx-h100", overrides={"mig_strategy": "mixed"})
    assert len(kubelet.healthy(GPU)) == 8
    with r.mutate() as st:
        _enable_mig_and_create(st, 0, mig.GI_3_SLICE, 2)
    mig_plugin = await kubelet.wait_registered("nvidia.com/mig-3g.40gb", timeout=5)
    await kubelet.wait_for(lambda: len(kubelet.healthy(GPU)) == 7)
    assert len(mig_plugin.devices) == 2
    assert all(i.startswith("MIG-") for i in mig_plugin.devices)
    resp = (
        await kubelet.allocate("nvidia.com/mig-3g.40gb", sorted(mig_plugin.devices)[:1])
    ).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    # the layout goes away again: the MIG resource is withdrawn (capacity 0 at once), not left stale
    with r.mutate() as st:
        for gi in list(st.gpus[0].gis):
            for ci in list(gi.cis):
                st.destroy_ci(0, gi.id, ci.id)
            st.destroy_gi(0, gi.id)
    await kubelet.wait_for(
        lambda: (
            kubelet.plugins["nvidia.com/mig-3g.40gb"].ended
            or not kubelet.plugins["nvidia.com/mig-3g.40gb"].devices
        )
    )


async def test_mig_single_strategy_advertises_mig_devices_as_gpus(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    def layout(st: object) -> None:
        for gpu in range(4):
            _enable_mig_and_create(st, gpu, mig.GI_1_SLICE, 4)

    await start_plugin("a30x4", overrides={"mig_strategy": "single"}, prepare=layout)
    await kubelet.wait_for(lambda: len(kubelet.healthy(GPU)) == 16)
    assert all(i.startswith("MIG-") for i in kubelet.healthy(GPU))


async def test_mig_single_strategy_rejects_mixed_profiles_at_start(start_plugin: Starter) -> None:
    def layout(st: object) -> None:
        _enable_mig_and_create(st, 0, mig.GI_1_SLICE, 1)
        _enable_mig_and_create(st, 1, mig.GI_2_SLICE, 1)
        _enable_mig_and_create(st, 2, mig.GI_1_SLICE, 1)
        _enable_mig_and_create(st, 3, mig.GI_1_SLICE, 1)

    r = await start_plugin("a30x4", overrides={"mig_strategy": "single"}, prepare=layout, wait=None)
    with pytest.raises(ExceptionGroup) as exc:
        await r.task
    assert "more than one MIG" in str(exc.value.exceptions[0])


async def test_fail_on_init_error_true_fails(start_plugin: Starter) -> None:
    r = await start_plugin(prepare=lambda st: setattr(st, "init_fault", "driver-not-loaded"), wait=None)
    with pytest.raises(ExceptionGroup) as exc:
        await r.task
    assert isinstance(exc.value.exceptions[0], errors.InitFailed)


async def test_fail_on_init_error_false_stays_up_until_nvml_works(
    start_plugin: Starter, kubelet: FakeKubelet
) -> None:
    r = await start_plugin(
        overrides={"fail_on_init_error": False},
        prepare=lambda st: setattr(st, "init_fault", "driver-not-loaded"),
        wait=None,
        nvml_retry_interval=0.2,
    )
    await until(lambda: r.calls.opens >= 3)  # NVML failed to open, and failed again on two retries
    assert not r.task.done()
    assert GPU not in kubelet.plugins
    http = r.plugin.http
    assert http is not None
    ok, checks = http.readiness()
    assert not ok
    assert ("nvml", False) in [(c[0], c[1]) for c in checks]
    with r.mutate() as st:
        st.restore()
    await kubelet.wait_registered(GPU, timeout=3)


async def test_metrics_and_readiness_over_http(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    r = await start_plugin("t4x4")
    http = r.plugin.http
    assert http is not None
    await kubelet.allocate(GPU, sorted(kubelet.healthy(GPU))[:1])
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"{http.url}/metrics", timeout=5).read().decode()
    )
    assert 'gpunode_device_plugin_devices{health="Healthy",resource="nvidia.com/gpu"} 4.0' in body
    assert 'gpunode_device_plugin_allocations_total{resource="nvidia.com/gpu"} 1.0' in body
    assert 'gpunode_device_plugin_registrations_total{resource="nvidia.com/gpu"} 1.0' in body
    assert "gpunode_device_plugin_last_registration_timestamp_seconds" in body
    ready = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"{http.url}/readyz", timeout=5).read().decode()
    )
    assert "registered" in ready


async def test_process_with_a_busy_gpu_keeps_serving(start_plugin: Starter, kubelet: FakeKubelet) -> None:
    r = await start_plugin("t4x4")
    with r.mutate() as st:
        st.gpus[0].processes.append(ProcessState(pid=1234, used_mib=100))
    assert len(kubelet.healthy(GPU)) == 4
    assert json.loads(r.state.read_text())["gpus"][0]["processes"]


async def test_numa_comes_from_sysfs_and_mig_nodes_from_mig_minors(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    # sysfs says GPU 0 (bus 0x07) is on NUMA node 1, although NVML reports 3: sysfs wins, as NVIDIA's does
    pci = host / "sys/bus/pci/devices/0000:07:00.0"
    pci.mkdir(parents=True)
    (pci / "numa_node").write_text("1\n")
    caps = host / "proc/driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text("config 1\nmonitor 2\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n")
    dev = tmp_path / "devroot"

    def layout(st: object) -> None:
        _enable_mig_and_create(st, 0, mig.GI_3_SLICE, 1)  # GI 2 at placement 4

    r = await start_plugin(
        "dgx-a100",
        overrides={"mig_strategy": "mixed", "pass_device_specs": True, "dev_root": str(dev)},
        prepare=layout,
        wait="nvidia.com/mig-3g.20gb",
    )
    gpu0 = next(g.uuid for g in r.plugin.gpus if g.index == 0)
    await kubelet.wait_registered(GPU)
    assert kubelet.plugins[GPU].numa.get(gpu0) is None  # GPU 0 is in MIG mode: only its MIG device
    mig_dev = kubelet.plugins["nvidia.com/mig-3g.20gb"]
    (mig_id,) = mig_dev.devices
    assert mig_dev.numa[mig_id] == [1]
    resp = (await kubelet.allocate("nvidia.com/mig-3g.20gb", [mig_id])).container_responses[0]
    assert [d.container_path for d in resp.devices] == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]


async def test_ready_is_notified_to_systemd_once_registered(
    start_plugin: Starter, kubelet: FakeKubelet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    await start_plugin("t4x4")
    messages: list[str] = []

    def received_ready() -> bool:
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except BlockingIOError:
                return any("READY=1" in m for m in messages)

    await until(received_ready)
    sock.close()
    assert any("READY=1" in m and "nvidia.com/gpu" in m for m in messages), messages

"""gpunode-driver-loader against fake host trees, with the fake kmod/NVIDIA tools run as real processes.

In-process (the loader with the real host operations, marker-file device nodes) and as a real CLI
process: a clean host, nouveau (unloadable, in use, built in), a host driver, precompiled modules
present and absent, builds with nvidia-installer and DKMS, missing headers, modules in use at unload,
a crash between two modprobes and the rerun, a failing modprobe, the digest fast path, bad input, the
daemon's health loop and its HTTP endpoint, the single-instance lock, and the upgrade command's wiring.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.common.settings import resolve
from gpunode.driver_loader.cli import main
from gpunode.driver_loader.config import init_config
from gpunode.driver_loader.daemon import HealthDaemon
from gpunode.driver_loader.loader import DriverLoader
from gpunode.driver_loader.ops import DriverInUse, DriverOps
from gpunode.driver_loader.settings import InitSettings
from gpunode.driver_loader.steps import LoaderError
from gpunode.sim.host import KERNEL, FakeHost
from helpers.fakehost import host_ops
from helpers.waiting import wait_until

SCRIPT = Path(sys.executable).parent / "gpunode-driver-loader"
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "gpunode.driver_loader.cli"]
LOADED = ["nvidia", "nvidia_modeset", "nvidia_uvm"]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[FakeHost]:
    fake = FakeHost(tmp_path)
    yield fake
    fake.kill_daemons()


def make_loader(host: FakeHost, **values: Any) -> DriverLoader:
    base: dict[str, Any] = {
        "host_root": str(host.root),
        "driver_root": host.driver_root,
        "module_params_dir": str(host.params_dir),
        "udev_timeout": 0,
    }
    settings, _ = resolve(InitSettings, {**base, **values}, {})
    loader = DriverLoader(init_config(settings), host_ops(host))
    return loader


async def init(host: FakeHost, **values: Any) -> DriverLoader:
    loader = make_loader(host, **values)
    await loader.init()
    return loader


def status(host: FakeHost) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((host.root / "run/nvidia/gpunode-driver/status.json").read_text())
    return doc


def states(host: FakeHost) -> dict[str, str]:
    return {s["name"]: s["state"] for s in status(host)["steps"]}


def validations(host: FakeHost) -> dict[str, str]:
    directory = host.root / "run/nvidia/validations"
    return {p.name: p.read_text() for p in directory.iterdir()} if directory.is_dir() else {}


def cli(
    host: FakeHost, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KERNEL_", "GPU_DIRECT", "FORCE_", "DRIVER_"))
    }
    environ.update({"LOG_FORMAT": "json", **(env or {})})
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=environ, timeout=timeout, check=False
    )


# ------------------------------------------------------------------------------------ init


async def test_clean_host_loads_in_order_and_writes_everything(host: FakeHost) -> None:
    host.add_precompiled()
    host.params("nvidia", "# GSP firmware off\nNVreg_EnableGpuFirmware=0\n")
    loader = await init(host)
    assert host.modprobe_loads() == ["nvidia", "nvidia-uvm", "nvidia-modeset"]
    assert host.loaded() == LOADED
    assert all(s == "done" or s == "skipped" for s in states(host).values())
    assert states(host)["load-modules"] == "done"
    assert status(host)["phase"] == "done"
    conf = (host.root / "etc/modprobe.d/nvidia-gpunode.conf").read_text()
    assert "options nvidia NVreg_EnableGpuFirmware=0 NVreg_CoherentGPUMemoryMode=driver\n" in conf
    params = host.root / "sys/module/nvidia/parameters"
    assert (params / "NVreg_EnableGpuFirmware").read_text() == "0\n"  # modprobe applied our options
    assert (params / "NVreg_CoherentGPUMemoryMode").read_text() == "driver\n"
    made = {Path(path).name: (major, minor) for path, _, major, minor in host.mknods}
    assert made == {
        "nvidiactl": (195, 255),
        "nvidia0": (195, 0),
        "nvidia1": (195, 1),
        "nvidia-modeset": (195, 254),
        "nvidia-uvm": (508, 0),
        "nvidia-uvm-tools": (508, 1),
        "nvidia-cap1": (235, 1),
        "nvidia-cap2": (235, 2),
    }
    assert validations(host) == {
        ".driver-ctr-ready": "GDRCOPY_ENABLED: false\nGDS_ENABLED: false\nGPU_DIRECT_RDMA_ENABLED: false\n",
        "driver-ready": "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n"
        "NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n",
        ".driver-daemons-status": "Ready\n",
    }
    pid = host.persistenced_pid()
    assert pid is not None
    assert loader.ops.pid_alive(pid)
    assert host.calls("nvidia-persistenced") == [["--persistence-mode"]]
    assert host.calls("nvidia-smi") == [[]]
    assert (host.root / "run/nvidia/nvidia-driver.state").read_text() == loader.cfg.digest
    assert await loader.digest_matches()
    assert await loader.users() == []


async def test_rdma_loads_peermem_last(host: FakeHost) -> None:
    host.add_precompiled()
    await init(host, gpu_direct_rdma=True)
    assert host.modprobe_loads() == ["nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-peermem"]
    assert validations(host)[".driver-ctr-ready"].endswith("GPU_DIRECT_RDMA_ENABLED: true\n")


async def test_mig_capability_nodes(host: FakeHost) -> None:
    host.add_precompiled()
    loader = await init(host)
    minors = host.add_mig_caps(1, [(3, 0)])
    await HealthDaemon(loader).health_check()
    caps = {Path(p).name: (major, minor, mode) for p, mode, major, minor in host.mknods if "cap" in p}
    for minor in minors:
        assert caps[f"nvidia-cap{minor}"] == (235, minor, 0o444)
    assert caps["nvidia-cap1"] == (235, 1, 0o400)


async def test_driver_root_elsewhere(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, driver_root="/run/nvidia/driver")
    try:
        host.add_precompiled()
        firmware = host.root / "sys/module/firmware_class/parameters/path"
        firmware.parent.mkdir(parents=True)
        firmware.write_text("\n")
        await init(host)
        loads = [argv for argv in host.calls("modprobe") if "-a" not in argv]
        assert loads[0][:2] == ["-d", str(host.driver_dir)]
        assert host.calls("modprobe")[0][-4:] == ["-a", "i2c_core", "ipmi_msghandler", "ipmi_devintf"]
        assert firmware.read_text() == "/run/nvidia/driver/lib/firmware"
        ready = validations(host)["driver-ready"]
        assert "NVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/run/nvidia/driver\n" in ready
    finally:
        host.kill_daemons()


async def test_nouveau_is_unloaded_first(host: FakeHost) -> None:
    host.add_precompiled()
    host.load_nouveau()
    await init(host)
    assert host.calls("rmmod") == [["nouveau"]]
    assert "nouveau" not in host.loaded()
    assert states(host)["nouveau"] == "done"
    assert host.loaded() == LOADED


@pytest.mark.parametrize("write", [False, True], ids=["steps-only", "write-blacklist"])
async def test_nouveau_in_use_stops_with_the_blacklist_steps(host: FakeHost, write: bool) -> None:
    host.add_precompiled()
    host.load_nouveau(in_use=True)
    loader = make_loader(host, write_nouveau_blacklist=write)
    with pytest.raises(LoaderError) as caught:
        await loader.init()
    message = str(caught.value)
    assert "nouveau cannot be unloaded" in message
    assert "Module nouveau is in use" in message  # rmmod's own words
    assert "update-initramfs -u" in message
    assert "reboot" in message
    blacklist = host.root / "etc/modprobe.d/blacklist-nouveau.conf"
    if write:
        assert blacklist.read_text() == "blacklist nouveau\noptions nouveau modeset=0\n"
        assert f"done: wrote {blacklist}" in message
    else:
        assert not blacklist.exists()
        assert "--write-nouveau-blacklist" in message
    assert host.modprobe_loads() == []
    assert states(host)["nouveau"] == "failed"
    assert states(host)["load-modules"] == "pending"
    assert ".driver-ctr-ready" not in validations(host)


async def test_builtin_nouveau(host: FakeHost) -> None:
    host.add_precompiled()
    host.builtin_nouveau()
    with pytest.raises(LoaderError, match="built into the kernel"):
        await init(host)
    assert host.calls("rmmod") == []


async def test_host_driver_only_writes_readiness(host: FakeHost) -> None:
    host.preinstall_host_driver("550.54.15")
    loader = await init(host)
    assert host.calls() == []  # not a single tool ran
    assert await loader.host_driver() == "550.54.15"
    assert validations(host)["driver-ready"].startswith("IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\n")
    got = states(host)
    assert got.pop("host-driver") == "done"
    assert got.pop("readiness") == "done"
    assert set(got.values()) == {"skipped"}
    assert "550.54.15" in status(host)["steps"][0]["detail"]


async def test_build_with_the_installer_when_no_precompiled_modules(host: FakeHost) -> None:
    host.add_headers()
    await init(host, kernel_module_type="open")
    (argv,) = host.calls("nvidia-installer")
    assert f"--kernel-name={KERNEL}" in argv
    assert f"--kernel-source-path={host.root}/usr/src/linux-headers-{KERNEL}" in argv
    assert f"--kernel-install-path={host.root}/lib/modules/{KERNEL}/kernel/drivers/video" in argv
    assert "-m=kernel-open" in argv
    assert host.loaded() == LOADED
    assert status(host)["moduleSource"] == "installer"


async def test_build_with_dkms(host: FakeHost) -> None:
    host.add_headers()
    host.remove_tool("nvidia-installer")
    await init(host, driver_version="580.65.06")
    assert host.calls("dkms") == [["install", "nvidia/580.65.06", "-k", KERNEL]]
    assert host.loaded() == LOADED


async def test_precompiled_set_without_an_index_gets_depmod(host: FakeHost) -> None:
    host.add_precompiled(index=False)
    await init(host)
    assert host.calls("depmod") == [["-b", str(host.root), KERNEL]]
    assert host.loaded() == LOADED


async def test_no_headers_is_a_clear_error(host: FakeHost) -> None:
    loader = make_loader(host)
    with pytest.raises(LoaderError) as caught:
        await loader.init()
    message = str(caught.value)
    assert f"kernel {KERNEL}" in message
    assert f"linux-headers-{KERNEL}" in message  # the package to install (os-release ID=ubuntu)
    assert states(host)["module-source"] == "failed"
    assert status(host)["phase"] == "failed"
    assert host.modprobe_loads() == []
    assert ".driver-ctr-ready" not in validations(host)


async def test_precompiled_only_never_builds(host: FakeHost) -> None:
    host.add_headers()
    with pytest.raises(LoaderError, match="never builds"):
        await init(host, kernel_module_type="precompiled")
    assert host.calls("nvidia-installer") == []


async def test_failing_modprobe(host: FakeHost) -> None:
    host.add_precompiled()
    host.fail("modprobe", "modprobe: ERROR: could not insert 'nvidia': Invalid argument", match="nvidia")
    with pytest.raises(LoaderError, match="could not insert 'nvidia': Invalid argument"):
        await init(host)
    step = next(s for s in status(host)["steps"] if s["name"] == "load-modules")
    assert step["state"] == "failed"
    assert "could not insert 'nvidia': Invalid argument" in step["detail"]
    assert ".driver-ctr-ready" not in validations(host)
    assert "driver-ready" not in validations(host)


async def test_nvidia_smi_failure_blocks_readiness(host: FakeHost) -> None:
    host.add_precompiled()
    host.fail(
        "nvidia-smi", "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error", code=255
    )
    with pytest.raises(LoaderError, match=r"not usable.*Unknown Error"):
        await init(host)
    assert states(host)["readiness"] == "failed"
    assert "driver-ready" not in validations(host)


async def test_device_node_creation_can_be_turned_off(host: FakeHost) -> None:
    host.add_precompiled()
    await init(host, create_device_nodes=False)
    step = next(s for s in status(host)["steps"] if s["name"] == "device-nodes")
    assert step["state"] == "skipped"
    assert "would create nvidiactl 195:255" in step["detail"]
    assert host.mknods == []


# ------------------------------------------------------------------------------------ digest


async def test_fast_path_second_init_calls_no_modprobe(host: FakeHost) -> None:
    host.add_precompiled()
    await init(host)
    before = len(host.calls())
    loader = await init(host)
    assert host.calls()[before:] == []  # no modprobe, no persistenced start, no nvidia-smi
    got = states(host)
    assert got["module-source"] == got["module-params"] == got["unload-previous"] == "skipped"
    assert "matches the loaded driver" in status(host)["steps"][2]["detail"]
    assert await loader.digest_matches()


async def test_operator_digest_is_recorded_and_compared(host: FakeHost) -> None:
    host.add_precompiled()
    await init(host, driver_config_digest="operator-digest-1")
    assert (host.root / "run/nvidia/nvidia-driver.state").read_text() == "operator-digest-1"
    loads = len(host.modprobe_loads())
    await init(host, driver_config_digest="operator-digest-1")
    assert len(host.modprobe_loads()) == loads
    await init(host, driver_config_digest="operator-digest-2")
    assert host.calls("rmmod") == [["nvidia_modeset"], ["nvidia_uvm"], ["nvidia"]]
    assert len(host.modprobe_loads()) == loads + 3


async def test_force_reinstall_and_changed_parameters_reload(host: FakeHost) -> None:
    host.add_precompiled()
    await init(host)
    await init(host, force_reinstall=True)
    assert host.calls("rmmod") == [["nvidia_modeset"], ["nvidia_uvm"], ["nvidia"]]
    host.params("nvidia-uvm", "uvm_perf_prefetch_enable=0\n")
    await init(host)
    assert len(host.calls("rmmod")) == 6
    assert (host.root / "sys/module/nvidia_uvm/parameters/uvm_perf_prefetch_enable").read_text() == "0\n"


async def test_reload_refused_while_in_use(host: FakeHost) -> None:
    host.add_precompiled()
    await init(host)
    host.add_process(4242, "python3", ["/dev/nvidia0"])
    with pytest.raises(DriverInUse, match=r"python3 \(pid 4242, /dev/nvidia0\)"):
        await init(host, force_reinstall=True)
    assert states(host)["unload-previous"] == "failed"
    assert host.calls("rmmod") == []


# ------------------------------------------------------------------------------------ unload


async def test_unload_removes_modules_in_reverse_order(host: FakeHost) -> None:
    host.add_precompiled()
    loader = await init(host, gpu_direct_rdma=True)
    pid = host.persistenced_pid()
    assert pid is not None
    await loader.unload()
    assert host.calls("rmmod") == [["nvidia_peermem"], ["nvidia_modeset"], ["nvidia_uvm"], ["nvidia"]]
    assert host.loaded() == []
    assert validations(host) == {}
    assert not (host.root / "run/nvidia/nvidia-driver.state").exists()
    wait_until(lambda: not loader.ops.pid_alive(pid), timeout=5)
    assert status(host)["command"] == "unload"
    assert set(states(host).values()) == {"done"}
    assert not await loader.loaded()


async def test_unload_refused_for_processes_lists_them(host: FakeHost) -> None:
    host.add_precompiled()
    loader = await init(host)
    host.add_process(4242, "python3", ["/dev/nvidia0", "/dev/nvidiactl"])
    host.add_process(4343, "dcgm-exporter", ["/dev/nvidiactl"])
    with pytest.raises(DriverInUse) as caught:
        await loader.unload()
    assert [str(u) for u in caught.value.users] == [
        "python3 (pid 4242, /dev/nvidia0, /dev/nvidiactl)",
        "dcgm-exporter (pid 4343, /dev/nvidiactl)",
    ]
    assert host.calls("rmmod") == []
    assert host.loaded() == LOADED
    assert "driver-ready" in validations(host)  # refused: nothing changed
    assert host.persistenced_pid() is not None
    assert states(host)["check-processes"] == "failed"
    assert next(str(u) for u in await loader.users()).startswith("python3")


async def test_unload_refused_for_module_references_restarts_persistenced(host: FakeHost) -> None:
    host.add_precompiled()
    loader = await init(host)
    first = host.persistenced_pid()
    host.set_refcnt("nvidia", 5)  # 2 from uvm and modeset, 3 from something else
    with pytest.raises(DriverInUse, match=r"module nvidia \(refcnt 5, 2 from loaded NVIDIA modules\)"):
        await loader.unload()
    assert host.calls("rmmod") == []
    second = host.persistenced_pid()
    assert second is not None
    assert second != first  # stopped to look, started again when refused
    assert loader.ops.pid_alive(second)
    assert states(host)["check-modules"] == "failed"


async def test_unload_gives_up_on_a_persistenced_that_will_not_stop(host: FakeHost) -> None:
    host.stubborn_persistenced()
    host.add_precompiled()
    loader = await init(host)
    loader.cfg = type(loader.cfg)(**{**loader.cfg.__dict__, "persistenced_stop_timeout": 0.3})
    with pytest.raises(LoaderError, match=r"still running 0\.3 s after SIGTERM"):
        await loader.unload()
    assert host.loaded() == LOADED


async def test_driver_ops_protocol(host: FakeHost) -> None:
    host.add_precompiled()
    ops: DriverOps = make_loader(host)
    assert await ops.host_driver() is None
    assert not await ops.loaded()
    await ops.load()
    assert await ops.loaded()
    assert await ops.digest_matches()
    await ops.unload()
    assert not await ops.loaded()


# ------------------------------------------------------------------------------------ daemon


async def test_daemon_keeps_the_driver_healthy(host: FakeHost) -> None:
    host.add_precompiled()
    loader = make_loader(host, health_interval=0.05)
    daemon = HealthDaemon(loader)
    task = asyncio.create_task(daemon.serve())
    try:
        await _until(lambda: loader.ready and status(host)["phase"] == "serving")
        first = host.persistenced_pid()
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await _until(lambda: host.persistenced_pid() not in (None, first))
        await _until(lambda: daemon.persistenced_restarts == 1)
        (host.root / "dev/nvidia-uvm").unlink()
        await _until(lambda: (host.root / "dev/nvidia-uvm").exists())
        host.fail("modprobe", "modprobe: FATAL: nope", match="nvidia-modeset")
        rmmod = await asyncio.create_subprocess_exec(str(host.bin / "rmmod"), "nvidia_modeset")
        assert await rmmod.wait() == 0
        await _until(lambda: not loader.ready)
        assert ".driver-ctr-ready" not in validations(host)  # unhealthy: readiness removed
        assert status(host)["health"]["state"] == "unhealthy"
        assert "FATAL: nope" in status(host)["health"]["detail"]
        host.clear_fail("modprobe")
        await _until(lambda: loader.ready)  # the health check loaded it again
        assert "nvidia_modeset" in host.loaded()
        assert ".driver-ctr-ready" in validations(host)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert status(host)["phase"] == "stopped"
    assert set(validations(host)) == {"driver-ready"}  # what NVIDIA's preStop removes is gone
    assert host.loaded() == LOADED  # modules stay loaded on stop


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_cli_daemon_http_and_sigterm(host: FakeHost) -> None:
    host.add_precompiled()
    port = _free_port()
    args = [*CLI, "init", *host.cli_args(), "--http-port", str(port), "--health-interval", "0.2"]
    env = {**os.environ, "INVOCATION_ID": "x"}  # listen on 127.0.0.1 as under systemd
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until(lambda: _get(port, "/readyz")[0] == 200, timeout=20)
        assert "driver: ok" in _get(port, "/readyz")[1]
        assert _get(port, "/healthz")[0] == 200
        assert "gpunode_driver_ready 1.0" in _get(port, "/metrics")[1]
        busy = cli(host, "init", "--oneshot", *host.cli_args())
        assert busy.returncode == 1
        assert "another driver loader" in busy.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert status(host)["phase"] == "stopped"
    assert host.loaded() == LOADED


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


# ------------------------------------------------------------------------------------ the CLI


def test_cli_crash_between_modprobes_then_rerun_converges(host: FakeHost) -> None:
    host.add_precompiled()
    host.crash("modprobe", "nvidia-uvm")  # SIGKILL the loader when it asks for nvidia-uvm
    crashed = cli(host, "init", "--oneshot", *host.cli_args())
    assert crashed.returncode == -signal.SIGKILL
    assert host.loaded() == ["nvidia"]
    assert states(host)["load-modules"] == "running"
    report = cli(host, "status", "--host-root", str(host.root))
    assert "is gone" in report.stdout
    rerun = cli(host, "init", "--oneshot", *host.cli_args())
    assert rerun.returncode == 0, rerun.stderr
    assert host.loaded() == LOADED
    # nvidia was loaded once; nvidia-uvm's first request died with the loader; nothing was removed
    assert host.modprobe_loads() == ["nvidia", "nvidia-uvm", "nvidia-uvm", "nvidia-modeset"]
    assert host.calls("rmmod") == []
    assert "matches the loaded driver" in status(host)["steps"][2]["detail"]
    assert status(host)["phase"] == "done"


def test_cli_failing_modprobe_exit_1_with_stderr(host: FakeHost) -> None:
    host.add_precompiled()
    host.fail(
        "modprobe",
        "modprobe: ERROR: could not insert 'nvidia_uvm': Unknown symbol in module",
        match="nvidia-uvm",
    )
    result = cli(host, "init", "--oneshot", *host.cli_args())
    assert result.returncode == 1
    assert "could not insert 'nvidia_uvm': Unknown symbol in module" in result.stderr
    report = cli(host, "status", "--host-root", str(host.root), "--json")
    assert report.returncode == 1
    doc = json.loads(report.stdout)
    assert doc["phase"] == "failed"
    assert "Unknown symbol" in next(s for s in doc["steps"] if s["name"] == "load-modules")["detail"]
    assert "driver-ready" not in validations(host)


def test_cli_fast_path_and_status(host: FakeHost) -> None:
    host.add_precompiled()
    assert cli(host, "init", "--oneshot", *host.cli_args()).returncode == 0
    loads = host.modprobe_loads()
    second = cli(host, "init", "--oneshot", *host.cli_args())
    assert second.returncode == 0, second.stderr
    assert host.modprobe_loads() == loads
    events = [json.loads(line) for line in second.stderr.splitlines() if line.startswith("{")]
    steps = [e for e in events if e["event"] in ("step_started", "step_done", "step_skipped")]
    assert steps[0]["progress"] == "1/10"
    assert steps[-1]["progress"] == "10/10"
    human = cli(host, "status", "--host-root", str(host.root))
    assert human.returncode == 0
    assert "init (pid" in human.stdout
    assert "10/10 readiness" in human.stdout


def test_cli_unload_refused_exit_1_listing_users(host: FakeHost) -> None:
    host.add_precompiled()
    assert cli(host, "init", "--oneshot", *host.cli_args()).returncode == 0
    host.add_process(4242, "python3", ["/dev/nvidia0"])
    refused = cli(host, "unload", *host.cli_args()[:6])
    assert refused.returncode == 1
    assert "python3 (pid 4242, /dev/nvidia0)" in refused.stderr
    assert host.loaded() == LOADED
    (host.root / "proc/4242/fd/3").unlink()
    done = cli(host, "unload", *host.cli_args()[:6])
    assert done.returncode == 0, done.stderr
    assert host.loaded() == []


def test_cli_dry_run_changes_nothing(host: FakeHost) -> None:
    host.add_precompiled()
    result = cli(host, "init", "--dry-run", *host.cli_args())
    assert result.returncode == 0
    assert "load nvidia, nvidia-uvm, nvidia-modeset" in result.stdout
    assert host.calls() == []
    assert not (host.root / "run/nvidia/gpunode-driver").exists()


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        pytest.param(["--host-root", "/nonexistent/host"], {}, ["/nonexistent/host", "fix:"], id="host-root"),
        pytest.param(
            ["--kernel-module-type", "dkms"], {}, ["invalid choice", "proprietary"], id="module-type-flag"
        ),
        pytest.param(
            [],
            {"KERNEL_MODULE_TYPE": "fancy"},
            ["KERNEL_MODULE_TYPE", "must be one of"],
            id="module-type-env",
        ),
    ],
)
def test_cli_bad_input_exit_2(host: FakeHost, args: list[str], env: dict[str, str], words: list[str]) -> None:
    result = cli(host, "init", "--oneshot", *host.cli_args(), *args, env=env)
    assert result.returncode == 2
    for word in words:
        assert word in result.stderr
    assert host.calls() == []


@pytest.mark.parametrize(
    ("content", "words"),
    [
        pytest.param(b"\xff\xfe garbage", ["cannot read", "fix:"], id="not-utf8"),
        pytest.param(None, ["cannot read", "Is a directory", "fix:"], id="directory"),
        pytest.param(b"NVreg_X=1 $(oops)\n", ["line 1", "fix:"], id="bad-token"),
    ],
)
def test_cli_unreadable_params_file_exit_2(host: FakeHost, content: bytes | None, words: list[str]) -> None:
    path = host.params_dir / "nvidia.conf"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    result = cli(host, "init", "--oneshot", *host.cli_args())
    assert result.returncode == 2
    assert str(path) in result.stderr
    for word in words:
        assert word in result.stderr


def test_cli_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert main(["--help"]) == 0
    with pytest.raises(SystemExit) as caught:
        main(["init", "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--kernel-module-type",
        "KERNEL_MODULE_TYPE",
        "--gpu-direct-rdma",
        "GPU_DIRECT_RDMA_ENABLED",
        "--driver-config-digest",
        "--write-nouveau-blacklist",
        "--oneshot",
        "--http-port",
        "--bin-dir",
    ):
        assert flag in out


def test_cli_status_without_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--host-root", str(tmp_path)]) == 1
    assert "has init run?" in capsys.readouterr().err


@pytest.mark.skipif(
    not (Path(__file__).parents[3] / "agents/gpunode/driver_loader/upgrade.py").exists(),
    reason="the driver manager (upgrade.py) is not there yet",
)
def test_cli_upgrade_has_both_flag_sets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["upgrade", "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--enable-gpu-pod-eviction",
        "--force-reinstall",
        "--kernel-module-type",
        "--host-root",
        "--bin-dir",
    ):
        assert flag in out

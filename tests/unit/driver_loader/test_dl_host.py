"""Readiness files, status, lock, kmod state (refcount rule, /proc scan), tool lookup, device nodes."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from gpunode.common.hostpaths import HostPaths
from gpunode.driver_loader import devnodes, kmod
from gpunode.driver_loader.readiness import (
    Files,
    InstanceLock,
    LoaderBusy,
    LockFileRefused,
    StatusBook,
    read_status,
    render_status,
)
from gpunode.sim.host import FakeHost
from helpers.fakehost import host_ops

# ------------------------------------------------------------------------------------ readiness


def test_files_write_and_remove_readiness(tmp_path: Path) -> None:
    files = Files(HostPaths(root=tmp_path))
    files.write_readiness(rdma=False, host_driver=False, driver_root="/")
    files.daemons_status(True)
    assert files.ready()
    assert (tmp_path / "run/nvidia/validations/.driver-daemons-status").read_text() == "Ready\n"
    removed = files.remove_readiness(daemons_status=False)
    assert {p.name for p in removed} == {".driver-ctr-ready", "driver-ready"}
    assert (tmp_path / "run/nvidia/validations/.driver-daemons-status").exists()
    files.record_digest("abc")
    assert files.state.read_text() == "abc"
    assert files.recorded_digest() == "abc"
    files.forget_digest()
    assert files.recorded_digest() is None


def test_status_book_records_every_change_atomically(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    seen: list[str] = []
    book = StatusBook.create(tmp_path / "s/status.json", "init", ["a", "b"], clock=lambda: now[0])
    book.on_change = lambda b: seen.append(
        json.loads((tmp_path / "s/status.json").read_text())["steps"][0]["state"]
    )
    book.set("a", "running")
    now[0] += 1.5
    book.set("a", "done", "did a")
    book.set("b", "failed", "b broke")
    book.finish("failed")
    doc = read_status(tmp_path / "s/status.json")
    assert seen == ["running", "done", "done", "done"]
    assert doc["phase"] == "failed"
    assert doc["command"] == "init"
    assert doc["pid"] == os.getpid()
    a, b = doc["steps"]
    assert a == {
        "name": "a",
        "state": "done",
        "detail": "did a",
        "startedAt": "2023-11-14T22:13:20.000Z",
        "finishedAt": "2023-11-14T22:13:21.500Z",
    }
    assert b["state"] == "failed"
    assert b["startedAt"] == b["finishedAt"]
    text = render_status(doc, alive=False)
    assert "init (pid" in text
    assert "1/2 a" in text
    assert "failed" in text
    assert "b broke" in text


def test_render_status_notes_a_dead_process() -> None:
    doc = {
        "command": "init",
        "pid": 99999999,
        "phase": "running",
        "steps": [{"name": "x", "state": "running"}],
    }
    assert "is gone" in render_status(doc, alive=False)
    assert "is gone" not in render_status(doc, alive=True)


def test_read_status_rejects_other_json(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text("[]")
    with pytest.raises(ValueError, match="not a driver loader status"):
        read_status(tmp_path / "s.json")


def test_instance_lock_is_exclusive(tmp_path: Path) -> None:
    first, second = (
        InstanceLock(tmp_path / "run/nvidia-driver.pid"),
        InstanceLock(tmp_path / "run/nvidia-driver.pid"),
    )
    first.acquire()
    assert (tmp_path / "run/nvidia-driver.pid").read_text().strip() == str(os.getpid())
    with pytest.raises(LoaderBusy, match=f"pid {os.getpid()}"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


@pytest.mark.parametrize("planted", ["symlink", "dangling", "hardlink", "fifo"])
def test_instance_lock_refuses_a_planted_file(tmp_path: Path, planted: str) -> None:
    lock = tmp_path / "run/nvidia-driver.pid"
    lock.parent.mkdir(parents=True)
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    if planted == "symlink":
        lock.symlink_to(victim)
    elif planted == "dangling":
        lock.symlink_to(tmp_path / "created-as-root")
    elif planted == "hardlink":
        os.link(victim, lock)
    else:
        os.mkfifo(lock)
    with pytest.raises(LockFileRefused, match="refusing to open it as root") as info:
        InstanceLock(lock).acquire()
    assert str(lock) in str(info.value)
    assert victim.read_text() == "root:secret\n"  # neither truncated nor written
    assert not (tmp_path / "created-as-root").exists()


# ------------------------------------------------------------------------------------ kmod state


def _module(root: Path, name: str, refcnt: int, holders: list[str] | None = None) -> None:
    d = root / "sys/module" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "refcnt").write_text(f"{refcnt}\n")
    if holders is not None:
        (d / "holders").mkdir(exist_ok=True)
        for h in holders:
            (d / "holders" / h).mkdir(exist_ok=True)


@pytest.mark.parametrize(
    ("modules", "users"),
    [
        pytest.param(
            {"nvidia": (2, None), "nvidia_uvm": (0, None), "nvidia_modeset": (0, None)}, [], id="idle"
        ),
        pytest.param(
            {"nvidia": (3, None), "nvidia_uvm": (0, None), "nvidia_modeset": (0, None)},
            ["module nvidia (refcnt 3, 2 from loaded NVIDIA modules)"],
            id="nvidia-held",
        ),
        pytest.param(
            {"nvidia": (2, None), "nvidia_uvm": (1, None), "nvidia_modeset": (0, None)},
            ["module nvidia_uvm (refcnt 1, 0 from loaded NVIDIA modules)"],
            id="uvm-held",
        ),
        pytest.param(
            {"nvidia": (2, ["nvidia_uvm", "gdrdrv"]), "nvidia_uvm": (0, [])},
            ["module gdrdrv (uses nvidia)", "module nvidia (refcnt 2, 1 from loaded NVIDIA modules)"],
            id="foreign-holder",
        ),
        pytest.param(
            {"nvidia_modeset": (1, ["nvidia_drm"]), "nvidia_drm": (0, []), "nvidia": (1, None)}, [], id="drm"
        ),
    ],
)
def test_module_users_rule(
    tmp_path: Path, modules: dict[str, tuple[int, list[str] | None]], users: list[str]
) -> None:
    for name, (count, holders) in modules.items():
        _module(tmp_path, name, count, holders)
    assert [str(u) for u in kmod.module_users(HostPaths(root=tmp_path))] == users


def test_process_users_from_fd_links(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.add_process(4242, "python3", ["/dev/nvidia0", "/dev/nvidiactl"])
    host.add_process(4243, "bash", ["/dev/pts/0"])
    host.add_process(4244, "nvidia-persiste", ["/dev/nvidiactl"])
    found = kmod.process_users(host.paths, exclude=[4244])
    assert [str(u) for u in found] == ["python3 (pid 4242, /dev/nvidia0, /dev/nvidiactl)"]


# ------------------------------------------------------------------------------------ RealHostOps


def _exe(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_tool_lookup_order(tmp_path: Path) -> None:
    root = tmp_path / "host"
    driver = root / "run/nvidia/driver"
    paths = HostPaths(root=root, driver_root="/run/nvidia/driver")
    smi_driver = _exe(driver / "usr/bin/nvidia-smi")
    _exe(root / "usr/bin/nvidia-smi")
    host_modprobe = _exe(root / "sbin/modprobe")
    ops = kmod.RealHostOps(paths, environ={"PATH": str(tmp_path / "empty")})
    assert ops.which("nvidia-smi") == str(smi_driver)  # NVIDIA's tools: the driver root first
    assert ops.which("modprobe") == str(host_modprobe)  # kmod: $PATH, then the host root
    assert ops.which("dkms") is None
    explicit = kmod.RealHostOps(paths, tools={"modprobe": "/opt/modprobe"}, environ={"PATH": ""})
    assert explicit.which("modprobe") == "/opt/modprobe"
    only = kmod.RealHostOps(paths, bin_dir=tmp_path / "bin", environ={"PATH": os.environ["PATH"]})
    assert only.which("modprobe") is None
    assert only.which("nvidia-smi") is None
    _exe(tmp_path / "bin/modprobe")
    assert kmod.RealHostOps(paths, bin_dir=tmp_path / "bin").which("modprobe") == str(
        tmp_path / "bin/modprobe"
    )


async def test_run_captures_output_and_never_uses_a_shell(tmp_path: Path) -> None:
    ops = kmod.RealHostOps(HostPaths(root=tmp_path))
    script = _exe(tmp_path / "t", '#!/bin/sh\necho out; echo "err $1" >&2; exit 3\n')
    result = await ops.run([str(script), "a; touch hacked"])
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err a; touch hacked\n")
    assert not (tmp_path / "hacked").exists()
    assert result.describe() == "`t a; touch hacked` exited 3: err a; touch hacked"
    missing = await ops.run([str(tmp_path / "nope")])
    assert missing.returncode == 127
    assert "cannot run" in missing.stderr
    slow = _exe(tmp_path / "slow", "#!/bin/sh\nsleep 30\n")
    started = time.monotonic()
    timed_out = await ops.run([str(slow)], timeout=0.3)
    assert timed_out.returncode == -9
    assert "timed out" in timed_out.stderr
    assert time.monotonic() - started < 10


async def test_run_keeps_a_bounded_tail_of_a_chatty_tool(tmp_path: Path) -> None:
    ops = kmod.RealHostOps(HostPaths(root=tmp_path))
    script = _exe(
        tmp_path / "chatty",
        "#!/bin/sh\nyes building | head -c 20000000 >&2\necho 'error: no headers' >&2\nexit 1\n",
    )
    result = await ops.run([str(script)])
    assert result.returncode == 1
    assert len(result.stderr) < 70_000
    assert result.stderr.startswith("[")  # how much was left out
    assert "earlier bytes left out" in result.stderr
    said = result.describe()
    assert said.endswith("error: no headers")
    assert len(said) < 2200


def test_marker_mknod_and_node_matches(tmp_path: Path) -> None:
    record: list[tuple[str, int, int, int]] = []
    ops = kmod.RealHostOps(HostPaths(root=tmp_path), mknod=kmod.marker_mknod(record))
    node = tmp_path / "dev/nvidiactl"
    node.parent.mkdir()
    assert not ops.node_matches(node, 195, 255)
    ops.mknod(node, 0o666, 195, 255)
    assert record == [(str(node), 0o666, 195, 255)]
    assert ops.node_matches(node, 195, 255)
    assert not ops.node_matches(node, 195, 254)
    real = kmod.RealHostOps(HostPaths(root=tmp_path))
    assert not real.node_matches(node, 195, 255)  # a regular file is no device for the real one


def test_pid_alive_and_name() -> None:
    ops = kmod.RealHostOps(HostPaths())
    assert ops.pid_alive(os.getpid())
    assert not ops.pid_alive(0)
    assert ops.process_name(os.getpid())


# ------------------------------------------------------------------------------------ device nodes


def test_plan_nodes_after_loading(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, gpus=3)
    host.load(["nvidia", "nvidia-uvm", "nvidia-modeset"])
    minors = host.add_mig_caps(0, [(1, 0)])
    loaded = kmod.loaded_modules(host.paths)
    nodes = {
        n.path.relative_to(host.root).as_posix(): (n.major, n.minor, n.mode)
        for n in devnodes.plan_nodes(host.paths, loaded)
    }
    assert nodes == {
        "dev/nvidiactl": (195, 255, 0o666),
        "dev/nvidia0": (195, 0, 0o666),
        "dev/nvidia1": (195, 1, 0o666),
        "dev/nvidia2": (195, 2, 0o666),
        "dev/nvidia-modeset": (195, 254, 0o666),
        "dev/nvidia-uvm": (508, 0, 0o666),
        "dev/nvidia-uvm-tools": (508, 1, 0o666),
        "dev/nvidia-caps/nvidia-cap1": (235, 1, 0o400),
        "dev/nvidia-caps/nvidia-cap2": (235, 2, 0o444),
        **{f"dev/nvidia-caps/nvidia-cap{m}": (235, m, 0o444) for m in minors},
    }


def test_plan_nodes_without_a_uvm_major_is_an_error(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.load(["nvidia"])
    (host.root / "sys/module/nvidia_uvm").mkdir()
    (host.root / "sys/module/nvidia_uvm/refcnt").write_text("0\n")
    with pytest.raises(devnodes.NodeError, match="no nvidia-uvm major"):
        devnodes.plan_nodes(host.paths, kmod.loaded_modules(host.paths))


async def test_ensure_nodes_creates_missing_and_wrong_ones_only(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.load(["nvidia", "nvidia-uvm"])
    ops = host_ops(host)
    nodes = devnodes.plan_nodes(host.paths, kmod.loaded_modules(host.paths))
    created, by_udev = await devnodes.ensure_nodes(host.paths, ops, nodes, udev_timeout=0)
    assert len(created) == len(nodes)
    assert by_udev == []
    assert await devnodes.ensure_nodes(host.paths, ops, nodes, udev_timeout=0) == ([], [])
    (host.root / "dev/nvidia-uvm").write_text("c 507:0\n")  # a stale node from an earlier uvm major
    created, _ = await devnodes.ensure_nodes(host.paths, ops, nodes, udev_timeout=0)
    assert [str(n) for n in created] == ["nvidia-uvm 508:0"]
    (host.root / "dev/nvidiactl").unlink()
    would, _ = await devnodes.ensure_nodes(host.paths, ops, nodes, create=False)
    assert [str(n) for n in would] == ["nvidiactl 195:255"]
    assert not (host.root / "dev/nvidiactl").exists()


async def test_ensure_nodes_waits_for_udev_first(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.load(["nvidia"])
    (host.root / "run/udev").mkdir(parents=True)
    (host.root / "run/udev/control").write_text("")
    ops = host_ops(host)
    nodes = [n for n in devnodes.plan_nodes(host.paths, ["nvidia"]) if n.path.name == "nvidiactl"]

    def udev() -> None:
        time.sleep(0.2)
        (host.root / "dev/nvidiactl").write_text("c 195:255\n")

    thread = threading.Thread(target=udev)
    thread.start()
    created, by_udev = await devnodes.ensure_nodes(host.paths, ops, nodes, udev_timeout=5)
    thread.join()
    assert created == []
    assert [str(n) for n in by_udev] == ["nvidiactl 195:255"]
    assert host.mknods == []


def test_wait_for_udev_times_out(tmp_path: Path) -> None:
    started = time.monotonic()
    assert devnodes.wait_for_udev([tmp_path / "never"], 0.3) is False
    assert 0.25 <= time.monotonic() - started < 5
    (tmp_path / "there").write_text("")
    assert devnodes.wait_for_udev([tmp_path / "there"], 5) is True

"""A hostile config swapped in while an agent runs: the last good config stays, health keeps answering,
and the next good file still applies (a deeply nested file once stopped every later reload; an alias
bomb hung the event loop, so the liveness probe restarted the pod straight back into it)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpunode.api.plugin_config import PluginConfig
from gpunode.common.config import load_config
from gpunode.common.logging import get_logger
from gpunode.kube.labelconfig import InForce, LabelConfig, LabelConfigOptions
from helpers.hostile import INPUTS, clean_env
from helpers.waiting import EventLog, wait_until

BIN = Path(sys.executable).parent
HOSTILE = ["alias-bomb", "deep-nesting", "huge-int", "2MiB-file", "non-utf8"]
MEMORY = 1 << 30  # RLIMIT_AS of the agent: a regression fails the test instead of the machine


def sliced(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


def swap(path: Path, content: bytes) -> None:
    """Replace ``path`` at once, as a ConfigMap update does (a rename, never a half-written file)."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str, timeout: float = 1.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        return str(resp.read().decode())


def healthy_devices(port: int) -> int:
    for line in get(port, "/metrics").splitlines():
        if line.startswith("gpunode_device_plugin_devices{") and 'health="Healthy"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return -1


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.fixture
def agent(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, int, EventLog, subprocess.Popen[str]]]:
    """A device plugin process serving t4x4 (no kubelet) with a watched config file: 2 replicas per GPU."""
    root = tmp_path_factory.mktemp("h")  # short: a unix socket path has at most 107 bytes
    (root / "var/lib/kubelet/device-plugins").mkdir(parents=True)
    cfg = tmp_path / "config" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(sliced(2))
    port = free_port()
    argv = [str(BIN / "gpunode-device-plugin"), "--simulate", "t4x4", "--kubelet-socket", ""]
    argv += [
        "--host-root",
        str(root),
        "--http-port",
        str(port),
        "--config-file",
        str(cfg),
        "--log-format",
        "json",
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**clean_env(), "LOG_FORMAT": "json"},
        preexec_fn=_limit,
    )
    log = EventLog(proc.stdout)  # type: ignore[arg-type]
    try:
        wait_until(lambda: _serving(port) == 8, timeout=20)
        yield cfg, port, log, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serving(port: int) -> int:
    """Healthy devices once the endpoint answers, else -1."""
    try:
        return healthy_devices(port)
    except OSError:
        return -1


def test_device_plugin_survives_hostile_reloads_and_takes_the_next_good_one(
    agent: tuple[Path, int, EventLog, subprocess.Popen[str]],
) -> None:
    cfg, port, log, proc = agent
    for i in range(20):  # the file watch starts after /metrics answers: touch the file until it is seen
        swap(cfg, f"{sliced(2)}# {i}\n".encode())
        with contextlib.suppress(AssertionError):
            log.wait_for("config_reloaded", 1, timeout=0.5)
            break
    assert log.count("config_reloaded") >= 1
    reloads = log.count("config_reloaded")
    for n, hostile in enumerate(HOSTILE, start=1):
        swap(cfg, INPUTS[hostile]())
        deadline = time.monotonic() + 10
        while log.count("config_rejected") < n:  # /healthz answers all along, within a second each time
            assert time.monotonic() < deadline, f"{hostile}: not rejected within 10 s"
            assert proc.poll() is None, log.text()
            started = time.monotonic()
            get(port, "/healthz")
            assert time.monotonic() - started < 1.0
            time.sleep(0.05)
        rejected = log.events("config_rejected")[-1]
        assert str(cfg) in rejected["error"], rejected
        assert healthy_devices(port) == 8  # the last good config stays in force
    assert psutil.Process(proc.pid).memory_info().rss < 200 << 20
    swap(cfg, sliced(3).encode())  # and a good file still applies afterwards
    wait_until(lambda: healthy_devices(port) == 12, timeout=10)
    log.wait_for("config_reloaded", reloads + 1, timeout=10)  # logged just after the new devices
    assert log.count("config_reloaded") == reloads + 1
    proc.send_signal(signal.SIGHUP)  # SIGHUP re-reads it too
    log.wait_for("config_reloaded", reloads + 2, timeout=10)
    assert healthy_devices(port) == 12
    assert proc.poll() is None


def test_feature_discovery_keeps_the_last_good_config_on_sighup(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(sliced(2))
    labels = tmp_path / "labels"
    port = free_port()
    argv = [str(BIN / "gpunode-feature-discovery"), "--simulate", "t4x4", "--sleep-interval", "60s"]
    argv += ["--output-file", str(labels), "--host-root", str(tmp_path), "--http-port", str(port)]
    argv += ["--config-file", str(cfg), "--log-format", "json", "--no-timestamp"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(), preexec_fn=_limit
    )
    log = EventLog(proc.stdout)  # type: ignore[arg-type]
    try:
        wait_until(lambda: "nvidia.com/gpu.replicas=2" in _read(labels), timeout=20)
        for n, hostile in enumerate(HOSTILE, start=1):
            swap(cfg, INPUTS[hostile]())
            proc.send_signal(signal.SIGHUP)
            log.wait_for("config_rejected", n, timeout=10)
            started = time.monotonic()
            get(port, "/healthz")
            assert time.monotonic() - started < 1.0
            assert str(cfg) in log.events("config_rejected")[-1]["error"]
            assert "nvidia.com/gpu.replicas=2" in _read(labels)
        swap(cfg, sliced(3).encode())
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "nvidia.com/gpu.replicas=3" in _read(labels), timeout=10)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# ---------------------------------------------------------- the label-chosen config directory, in process


async def test_label_config_keeps_the_config_in_force_and_takes_the_next_good_one(tmp_path: Path) -> None:
    """The controller both agents use for a ConfigMap directory: a hostile file is a load error (never
    a RecursionError escaping the reload), the config in force stays, a good file applies again."""
    (tmp_path / "default").write_text(sliced(2))
    errors: list[str] = []
    applied: list[PluginConfig | None] = []

    def load(path: Path | None) -> PluginConfig | None:
        return load_config(path, PluginConfig) if path is not None else None

    async def apply(config: PluginConfig | None, chosen: InForce) -> str | None:
        applied.append(config)
        return None

    lc = LabelConfig(
        LabelConfigOptions(tmp_path, default_config="default"),
        load,
        log=get_logger("test"),
        count_error=errors.append,
    )
    loaded = await lc.first()
    lc.took(loaded.chosen)
    in_force = lc.in_force
    for n, hostile in enumerate(HOSTILE, start=1):
        swap(tmp_path / "default", INPUTS[hostile]())
        await lc.reload(apply)
        assert errors.count("config") == n
        assert lc.in_force == in_force
        assert applied == []
    swap(tmp_path / "default", sliced(3).encode())
    await lc.reload(apply)
    assert len(applied) == 1
    assert applied[0] is not None
    assert lc.in_force != in_force

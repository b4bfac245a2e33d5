"""gpunode-validator: each component writes its status file on success and removes it on failure;
cuda is skipped on the simulator; --wait-for sees a file that appears later and times out naming it."""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpunode.nvml import errors
from gpunode.validator import checks, cli

Node = Any  # the conftest's Node builder (fixture `node`)


def ready(node: Node, component: str) -> Path:
    directory: Path = node.paths.validations_dir
    return directory / checks.status_file(component)


def stale_file(node: Node, component: str) -> Path:
    path = ready(node, component)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("left over\n")
    return path


async def test_driver_writes_nvidia_env_file(node: Node) -> None:
    outcome = await checks.run_component("driver", node.validator(), node.open_nvml)
    assert outcome.status == "passed", outcome
    text = ready(node, "driver").read_text()
    assert text.splitlines() == [
        "IS_HOST_DRIVER=true",
        "NVIDIA_DRIVER_ROOT=/",
        "DRIVER_ROOT_CTR_PATH=/host",
        "NVIDIA_DEV_ROOT=/",
        "DEV_ROOT_CTR_PATH=/host",
    ]
    assert ready(node, "driver").stat().st_mode & 0o777 == 0o644


async def test_driver_container_root_in_env_file(node: Node) -> None:
    opts = node.validator(driver_root="/run/nvidia/driver")
    assert (await checks.run_component("driver", opts, node.open_nvml)).status == "passed"
    assert "NVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/run/nvidia/driver\n" in (
        ready(node, "driver").read_text()
    )


async def test_driver_checks_device_nodes_off_the_simulator(node: Node) -> None:
    opts = node.validator(simulated=False)
    assert (await checks.run_component("driver", opts, node.open_nvml)).status == "passed"
    (node.host.root / "dev/nvidia3").unlink()
    outcome = await checks.run_component("driver", opts, node.open_nvml)
    assert outcome.status == "failed"
    assert "/dev/nvidia3 missing" in outcome.detail
    assert not ready(node, "driver").exists()


async def test_driver_failure_removes_the_file(node: Node) -> None:
    async def broken() -> Any:
        raise errors.DriverNotLoaded("Driver Not Loaded")

    stale = stale_file(node, "driver")
    outcome = await checks.run_component("driver", node.validator(), broken)
    assert outcome.status == "failed"
    assert "NVML did not load" in outcome.detail
    assert not stale.exists()


async def test_toolkit_cdi_and_runtime(node: Node) -> None:
    assert (await checks.run_component("toolkit", node.validator(), node.open_nvml)).status == "passed"
    assert ready(node, "toolkit").read_text() == ""
    node.write("/var/run/cdi/nvidia.yaml", node.spec(["0", "1", "2"]))
    outcome = await checks.run_component("toolkit", node.validator(), node.open_nvml)
    assert outcome.status == "failed"
    assert "GPU 3" in outcome.detail
    assert not ready(node, "toolkit").exists()
    only_runtime = node.validator(toolkit_checks=("runtime",))
    assert (await checks.run_component("toolkit", only_runtime, node.open_nvml)).status == "passed"
    (node.host.root / "etc/containerd/conf.d/99-nvidia.toml").unlink()
    outcome = await checks.run_component("toolkit", only_runtime, node.open_nvml)
    assert outcome.status == "failed"
    assert "'nvidia'" in outcome.detail


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = self.server.code  # type: ignore[attr-defined]
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok\n" if code == 200 else b"devices: not registered\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_plugin_socket_and_readyz(node: Node) -> None:
    assert (await checks.run_component("plugin", node.validator(), node.open_nvml)).status == "passed"
    assert ready(node, "plugin").exists()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    server.code = 503  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        opts = node.validator(plugin_http_port=server.server_address[1])
        outcome = await checks.run_component("plugin", opts, node.open_nvml)
        assert outcome.status == "failed"
        assert "503" in outcome.detail
        server.code = 200  # type: ignore[attr-defined]
        assert (await checks.run_component("plugin", opts, node.open_nvml)).status == "passed"
    finally:
        server.shutdown()
        server.server_close()
    node.stop_listening("nvidia-gpu.sock")
    outcome = await checks.run_component("plugin", node.validator(), node.open_nvml)
    assert outcome.status == "failed"
    assert "nvidia-gpu.sock" in outcome.detail
    assert not ready(node, "plugin").exists()


async def test_cuda_is_skipped_on_the_simulator(node: Node) -> None:
    stale = stale_file(node, "cuda")
    outcome = await checks.run_component("cuda", node.validator(), node.open_nvml)
    assert outcome.status == "skipped"
    assert not stale.exists()


def test_cli_component_and_skip(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--sim-state", str(node.state), "--host-root", str(node.host.root), "--log-level", "error"]
    assert cli.main([*base, "--component", "cuda"], {}) == 0
    out = capsys.readouterr().out
    assert "cuda: skipped" in out
    assert "passed" not in out
    assert not ready(node, "cuda").exists()
    assert cli.main(base, {"COMPONENT": "driver"}) == 0
    assert ready(node, "driver").exists()
    assert cli.main(["--host-root", str(node.host.root)], {}) == 2


def test_cli_wait_for_sees_a_late_file(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    directory = node.paths.validations_dir

    def later() -> None:
        time.sleep(0.3)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "toolkit-ready").write_text("")

    writer = threading.Thread(target=later)
    writer.start()
    started = time.monotonic()
    args = ["--host-root", str(node.host.root), "--wait-for", "toolkit", "--timeout", "10"]
    assert cli.main([*args, "--log-level", "error"], {}) == 0
    writer.join()
    assert time.monotonic() - started < 3
    assert "found toolkit-ready" in capsys.readouterr().out


def test_cli_wait_for_times_out_naming_the_file(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--host-root", str(node.host.root), "--timeout", "0.3", "--log-level", "error"]
    assert cli.main(args, {"WAIT_FOR": "driver,.driver-ctr-ready"}) == 1
    err = capsys.readouterr().err
    assert "timed out" in err
    assert str(node.paths.validations_dir / "driver-ready") in err
    assert ".driver-ctr-ready" in err


async def test_wait_for_reports_progress(tmp_path: Path) -> None:
    lines: list[str] = []

    async def later() -> None:
        await asyncio.sleep(0.25)
        (tmp_path / "driver-ready").write_text("")

    task = asyncio.create_task(later())
    missing = await checks.wait_for(
        ["driver-ready"], tmp_path, timeout=5, progress_every=0.1, out=lines.append
    )
    await task
    assert missing == []
    assert lines
    assert lines[0].startswith("waiting for driver-ready (")


async def test_wait_for_polls_without_inotify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_watch(directory: Path, changed: asyncio.Event) -> None:
        return None

    monkeypatch.setattr(checks, "_watch", no_watch)
    target = tmp_path / "plugin-ready"
    loop = asyncio.get_running_loop()
    loop.call_later(0.1, target.write_text, "")
    assert await checks.wait_for(["plugin-ready"], tmp_path, timeout=3, poll=0.05, out=lambda _s: None) == []
    assert target.exists()

"""A healthy GPU node on disk: a FakeHost with the driver loaded, a simulated NVML (a30x4), device nodes,
persistenced, a CDI spec, a containerd config with the nvidia runtime, a GFD label file, a kubelet
directory with listening sockets and a fake exporter. Tests break one thing at a time.

The validator's and the doctor's integration tests build one per test (their conftest's `node` fixture)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpunode.agent.nvml import open_nvml
from gpunode.common.hostpaths import HostPaths
from gpunode.doctor import DoctorOptions
from gpunode.sim import nvml as sim
from gpunode.sim.host import FakeHost, can_mknod
from gpunode.validator import checks

GPUS = 4  # the a30x4 preset
DRIVER = "550.54.15"  # the simulator's driver version
KUBELET_DIR = "/k"  # short: unix socket paths are limited to 107 bytes
METRICS = (
    '# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0"} 12\n'
    '# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-0"} 0\n'
)
CONTAINERD = """version = 2
imports = ["/etc/containerd/conf.d/*.toml"]
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
"""
DROP_IN = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""


def cdi_spec(names: list[str], version: str = DRIVER) -> str:
    devices = "".join(
        f'  - name: "{n}"\n    containerEdits:\n      deviceNodes: [{{path: /dev/nvidia{n}}}]\n'
        for n in names
    )
    return (
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        + devices
        + "  - name: all\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia0}]\n"
        + "containerEdits:\n  mounts:\n"
        + f"    - {{hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{version},"
        + f" containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{version}}}\n"
    )


class _Metrics(BaseHTTPRequestHandler):
    body = METRICS

    def do_GET(self) -> None:
        data = self.server.body.encode()  # type: ignore[attr-defined]
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Node:
    base: Path
    host: FakeHost = field(init=False)
    state: Path = field(init=False)
    markers: bool = field(init=False)
    listeners: dict[str, socket.socket] = field(default_factory=dict)
    exporter: ThreadingHTTPServer | None = None
    exporter_port: int = 0

    def __post_init__(self) -> None:
        self.host = FakeHost(self.base, gpus=GPUS)
        self.host.load(["nvidia", "nvidia-uvm", "nvidia-modeset"], version=DRIVER)
        self.state = self.base / "sim.json"
        sim.init_state_file(self.state, "a30x4")
        self.markers = not can_mknod(self.base)
        self.paths = HostPaths(self.host.root, "/", KUBELET_DIR)
        dev = self.host.root / "dev"
        for name, major, minor in [
            ("nvidiactl", 195, 255),
            ("nvidia-modeset", 195, 254),
            ("nvidia-uvm", 508, 0),
            ("nvidia-uvm-tools", 508, 1),
        ] + [(f"nvidia{i}", 195, i) for i in range(GPUS)]:
            self.mknod(dev / name, major, minor)
        pid = os.getpid()  # a live process standing in for nvidia-persistenced
        pid_file = self.host.root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(f"{pid}\n")
        self.host.add_process(pid, "nvidia-persiste", [])
        self.write("/var/run/cdi/nvidia.yaml", cdi_spec([str(i) for i in range(GPUS)]))
        self.write("/etc/containerd/config.toml", CONTAINERD)
        self.write("/etc/containerd/conf.d/99-nvidia.toml", DROP_IN)
        self.write(
            "/etc/kubernetes/node-feature-discovery/features.d/gfd",
            f"nvidia.com/gpu.count={GPUS}\nnvidia.com/gpu.product=NVIDIA-A30\n",
        )
        self.listen("kubelet.sock")
        os.utime(self.paths.kubelet_socket, (1_000_000, 1_000_000))
        self.listen("nvidia-gpu.sock")
        self.start_exporter()

    # -- building ------------------------------------------------------------------------------------
    def mknod(self, path: Path, major: int, minor: int, mode: int = 0o666) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        if self.markers:
            path.write_text(f"c {major}:{minor}\n")
        else:
            os.mknod(path, 0o600 | 0o020000, os.makedev(major, minor))
        os.chmod(path, mode)

    def write(self, host_path: str, text: str) -> Path:
        path = self.paths.host(host_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def listen(self, name: str) -> Path:
        path = self.paths.device_plugin_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen(8)
        self.listeners[name] = sock
        return path

    def stop_listening(self, name: str) -> None:
        self.listeners.pop(name).close()  # the socket file stays: a stale socket

    def start_exporter(self, body: str = METRICS) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
        server.body = body  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        self.exporter, self.exporter_port = server, server.server_address[1]

    def stop_exporter(self) -> None:
        if self.exporter is not None:
            self.exporter.shutdown()
            self.exporter.server_close()
            self.exporter = None

    def close(self) -> None:
        self.stop_exporter()
        for sock in self.listeners.values():
            sock.close()

    gpus = GPUS
    metrics = METRICS

    def spec(self, names: list[str], version: str = DRIVER) -> str:
        return cdi_spec(names, version)

    # -- using ---------------------------------------------------------------------------------------
    def options(self, **changes: Any) -> DoctorOptions:
        values: dict[str, Any] = dict(
            paths=self.paths,
            simulated=True,
            host_given=True,
            mig_config="all-disabled",
            exporter_port=self.exporter_port,
            xid_window=0.1,
            marker_nodes=self.markers,
        )
        values.update(changes)
        return DoctorOptions(**values)

    def validator(self, **changes: Any) -> checks.ValidatorOptions:
        values: dict[str, Any] = dict(
            paths=self.paths,
            validations_dir=self.paths.validations_dir,
            simulated=True,
            plugin_http_port=None,
            marker_nodes=self.markers,
        )
        values.update(changes)
        return checks.ValidatorOptions(**values)

    async def open_nvml(self) -> Any:
        return await open_nvml(None, None, self.state)

    def cli_args(self) -> list[str]:
        return [
            "--sim-state",
            str(self.state),
            "--host-root",
            str(self.host.root),
            "--kubelet-dir",
            KUBELET_DIR,
            "--exporter-port",
            str(self.exporter_port),
            "--xid-window",
            "0.1",
            "--mig-config",
            "all-disabled",
        ]

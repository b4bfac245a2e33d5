"""`gpunode-toolkit cdi generate --also-kind ...,k8s.device-plugin.nvidia.com/imex-channel` as a process,
as the rendered toolkit DaemonSet runs it: beside the GPU specs, the spec the device plugin's IMEX channel
names (``k8s.device-plugin.nvidia.com/imex-channel=<N>``) resolve against, from the channel nodes; no
channel, no file. And ``--class imex-channel`` runs no hook and opens no NVML, so ``--no-install-hook`` is
no error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.deploy.render import PLUGIN_CDI_KIND, PLUGIN_IMEX_KIND
from gpunode.device_plugin.allocation import allocate_response
from gpunode.device_plugin.settings import PluginSettings

TOOLKIT = str(Path(sys.executable).parent / "gpunode-toolkit")
DRIVER_ROOT = "/run/nvidia/driver"
VERSION = "550.54.15"  # the simulator's driver


def fake_host(root: Path) -> Path:
    """The driver's libraries and control nodes under the driver root (stand-in files)."""
    base = root / DRIVER_ROOT.lstrip("/")
    lib = base / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libnvidia-ml", "libcuda"):
        (lib / f"{name}.so.{VERSION}").write_text("")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{VERSION}")
    (base / "dev").mkdir()
    for node in ("nvidiactl", "nvidia-uvm"):
        (base / "dev" / node).write_text("")
    return root


def add_channel(host: Path, n: int) -> Path:
    """A stand-in channel node (``c MAJOR:MINOR``), where the driver loader makes it under the dev root."""
    path = host / DRIVER_ROOT.lstrip("/") / f"dev/nvidia-caps-imex-channels/channel{n}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"c 234:{n}\n")
    return path


@pytest.fixture
def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("GPUNODE_", "NVIDIA_"))}
    out["LOG_FORMAT"] = "json"
    return out


def toolkit(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLKIT, *args], env=env, capture_output=True, text=True, timeout=60)


def generate_as_rendered(host: Path, cdi: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    also = f"{PLUGIN_CDI_KIND},{PLUGIN_IMEX_KIND}"  # what render puts on the toolkit's cdi-generate
    return toolkit(
        ["cdi", "generate", "--simulate", "t4x4", "--host-root", str(host), "--driver-root", DRIVER_ROOT,
         "--output", str(cdi / "nvidia.json"), "--also-kind", also],
        env,
    )  # fmt: skip


def test_the_plugins_imex_names_resolve_beside_the_gpu_specs(tmp_path: Path, env: dict[str, str]) -> None:
    host, cdi = fake_host(tmp_path / "host"), tmp_path / "cdi"
    add_channel(host, 0)
    out = generate_as_rendered(host, cdi, env)
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in cdi.iterdir())
    imex_file = "k8s.device-plugin.nvidia.com-imex-channel.json"
    assert names == ["k8s.device-plugin.nvidia.com-gpu.json", imex_file, "nvidia.json"]
    doc = json.loads((cdi / imex_file).read_text())
    assert doc["kind"] == PLUGIN_IMEX_KIND
    assert [d["name"] for d in doc["devices"]] == ["0", "all"]
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [
        {
            "path": "/dev/nvidia-caps-imex-channels/channel0",
            "hostPath": f"{DRIVER_ROOT}/dev/nvidia-caps-imex-channels/channel0",
        }
    ]
    assert "containerEdits" not in doc  # no driver mounts or hooks: the GPU spec carries them
    gpu = json.loads((cdi / "k8s.device-plugin.nvidia.com-gpu.json").read_text())
    assert gpu["kind"] == PLUGIN_CDI_KIND
    assert len(gpu["devices"]) == 9  # 4 GPUs by index and by UUID, and all: the GPU spec as before
    # the names the device plugin hands out with imex.channelIDs [0] resolve in the files written
    resolvable = {
        f"{d['kind']}={dev['name']}"
        for d in (json.loads(p.read_text()) for p in cdi.iterdir())
        for dev in d["devices"]
    }
    settings = PluginSettings(device_list_strategies=("cdi-cri",), imex_channel_ids=(0,))
    alloc = allocate_response([], settings, dev_root_exists=lambda p: True, annotation_key="cdi.k8s.io/x")
    assert alloc.cdi_devices == [f"{PLUGIN_IMEX_KIND}=0"]
    assert set(alloc.cdi_devices) <= resolvable


def test_no_channel_no_file_and_a_stale_one_removed(tmp_path: Path, env: dict[str, str]) -> None:
    host, cdi = fake_host(tmp_path / "host"), tmp_path / "cdi"
    imex_spec = cdi / "k8s.device-plugin.nvidia.com-imex-channel.json"
    channel = add_channel(host, 0)
    assert generate_as_rendered(host, cdi, env).returncode == 0
    assert imex_spec.is_file()
    channel.unlink()  # the channel is gone (driver reloaded without it): its names must not resolve
    out = generate_as_rendered(host, cdi, env)
    assert out.returncode == 0, out.stderr
    assert not imex_spec.exists()
    assert sorted(p.name for p in cdi.iterdir()) == ["k8s.device-plugin.nvidia.com-gpu.json", "nvidia.json"]
    events = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    assert any(e.get("event") == "cdi_spec_no_devices" and e.get("removed") is True for e in events), events
    again = generate_as_rendered(host, cdi, env)  # nothing there, nothing to do
    assert again.returncode == 0, again.stderr
    assert not imex_spec.exists()


def test_imex_class_needs_no_hook_and_no_nvml(tmp_path: Path, env: dict[str, str]) -> None:
    host = tmp_path / "host"
    add_channel(host, 1)
    out_file = tmp_path / "imex.yaml"
    # no --simulate and no driver: an IMEX channel spec is read from the channel nodes only
    out = toolkit(
        ["cdi", "generate", "--vendor", "k8s.device-plugin.nvidia.com", "--class", "imex-channel",
         "--host-root", str(host), "--driver-root", DRIVER_ROOT, "--output", str(out_file),
         "--no-install-hook"],
        env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "channel1" in out_file.read_text()
    assert not (host / "usr").exists()  # no hook installed (and none needed)


def test_an_imex_spec_takes_no_gpu_kind_beside_it(tmp_path: Path, env: dict[str, str]) -> None:
    out = toolkit(
        ["cdi", "generate", "--class", "imex-channel", "--host-root", str(tmp_path),
         "--output", str(tmp_path / "imex.yaml"), "--also-kind", PLUGIN_CDI_KIND],
        env,
    )  # fmt: skip
    assert out.returncode == 2
    assert f"--also-kind {PLUGIN_CDI_KIND}" in out.stderr
    assert "only other imex-channel kinds" in out.stderr
    assert not (tmp_path / "imex.yaml").exists()

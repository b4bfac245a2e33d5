"""`gpunode-toolkit cdi generate --class imex-channel` as a process: the spec of the IMEX channel nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOLKIT = str(Path(sys.executable).parent / "gpunode-toolkit")


def test_generate_imex_channel_spec_for_the_device_plugins_kind(tmp_path: Path) -> None:
    channels = tmp_path / "dev/nvidia-caps-imex-channels"
    channels.mkdir(parents=True)
    (channels / "channel0").write_text("c 234:0\n")
    (channels / "channel3").write_text("c 234:3\n")
    spec = tmp_path / "imex.json"
    out = subprocess.run(
        [TOOLKIT, "cdi", "generate", "--simulate", "t4x4", "--vendor", "k8s.device-plugin.nvidia.com",
         "--class", "imex-channel", "--host-root", str(tmp_path), "--output", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(spec.read_text())
    assert doc["kind"] == "k8s.device-plugin.nvidia.com/imex-channel"
    assert [d["name"] for d in doc["devices"]] == ["0", "3", "all"]
    assert doc["devices"][1]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia-caps-imex-channels/channel3"}
    ]
    assert "containerEdits" not in doc  # no driver mounts, no hooks: NVML and the driver root are not read

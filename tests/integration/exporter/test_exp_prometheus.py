"""The exposition checked by Prometheus' own tools: `promtool check metrics`, and a real Prometheus server
(Debian's `prometheus` package; `.ci/run` installs it) scraping the exporter on loopback."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.sim import nvml as sim

EXPORTER = str(Path(sys.executable).parent / "gpunode-exporter")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

if not (PROMETHEUS and PROMTOOL):
    if os.environ.get("CI"):
        raise RuntimeError("CI must have Debian's prometheus package (.ci/run installs it)")
    pytest.skip("prometheus/promtool not installed (apt-get install prometheus)", allow_module_level=True)

# dcgm-exporter's names are a compatibility contract that Prometheus' style lint dislikes; these are
# the only complaints allowed (dcgm-exporter's counters are typed counter and have no `_total`).
ALLOWED_LINT = (
    re.compile(r"label names should be written in 'snake_case' not 'camelCase'$"),
    re.compile(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'$"),
    re.compile(r'^DCGM_FI_[A-Z0-9_]+ counter metrics should have "_total" suffix$'),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        data: bytes = resp.read()
        return data


@pytest.fixture(scope="module")
def exporter_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    state = tmp_path_factory.mktemp("node") / "node.json"
    sim.init_state_file(state, "dgx-a100")
    port = free_port()
    proc = subprocess.Popen(
        [
            EXPORTER,
            "--sim-state",
            str(state),
            "-a",
            f"127.0.0.1:{port}",
            "-c",
            "1000",
            "--node-name",
            "node-a",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            get(f"http://127.0.0.1:{port}/readyz")
            break
        except OSError:
            assert proc.poll() is None, "exporter exited"
            assert time.monotonic() < deadline, "exporter did not start"
            time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(10)


def test_promtool_accepts_the_exposition(exporter_port: int) -> None:
    body = get(f"http://127.0.0.1:{exporter_port}/metrics")
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=30)
    problems = (result.stdout + result.stderr).decode().splitlines()
    assert result.returncode in (0, 3), problems  # 1 would be a parse error
    unexpected = [p for p in problems if p.strip() and not any(rx.search(p) for rx in ALLOWED_LINT)]
    assert unexpected == []


def test_a_real_prometheus_scrapes_all_eight_gpus(exporter_port: int, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n"
        "- job_name: gpunode\n  honor_labels: true\n"
        f"  static_configs:\n  - targets: ['127.0.0.1:{exporter_port}']\n"
    )
    assert PROMETHEUS is not None
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        query = urllib.parse.urlencode({"query": "DCGM_FI_DEV_GPU_UTIL"})
        deadline = time.monotonic() + 60
        results: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            try:
                answer = json.loads(get(f"http://127.0.0.1:{port}/api/v1/query?{query}"))
                results = answer["data"]["result"]
                if len(results) == 8:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert len(results) == 8, results
        labels = [r["metric"] for r in results]
        assert sorted(int(m["gpu"]) for m in labels) == list(range(8))  # type: ignore[index]
        for m in labels:
            assert m["modelName"] == "NVIDIA A100-SXM4-40GB"  # type: ignore[index]
            assert m["Hostname"] == "node-a"  # type: ignore[index]
            assert str(m["UUID"]).startswith("GPU-")  # type: ignore[index]
            assert m["DCGM_FI_DRIVER_VERSION"] == "550.54.15"  # type: ignore[index]
    finally:
        proc.terminate()
        proc.wait(20)

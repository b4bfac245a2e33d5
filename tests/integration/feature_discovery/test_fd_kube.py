"""`gpunode-feature-discovery` with the Kubernetes API: NodeFeature output and the config chosen by the
node label, as a real process against the test API server on a shared simulated node."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.sim import nvml as sim
from gpunode.sim.apiserver import FakeApiServer
from helpers.waiting import EventLog, wait_until

FD = str(Path(sys.executable).parent / "gpunode-feature-discovery")
NODE = "gpu-node-1"
NS = "gpu-operator"
NF = f"nvidia-features-for-{NODE}"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node(NODE)
        server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


@pytest.fixture
def start(node: Path, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def run(*args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [FD, "--sim-state", str(node), "--kubeconfig", str(tmp_path / "kubeconfig"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(p)
        return p

    yield run
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def features(api: FakeApiServer) -> dict[str, Any] | None:
    return api.get("nodefeatures", NF, NS)


def nodefeature_writes(api: FakeApiServer) -> int:
    """Requests that could change a NodeFeature (anything but reading one)."""
    return sum(1 for r in api.requests if "/nodefeatures" in r.path and r.method not in ("GET", "HEAD"))


def test_oneshot_publishes_a_node_feature_not_a_file(node: Path, api: FakeApiServer, tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    r = subprocess.run(
        [
            FD,
            "--sim-state",
            str(node),
            "--oneshot",
            "--use-node-feature-api",
            "--node-name",
            NODE,
            "--namespace",
            NS,
            "--kubeconfig",
            str(tmp_path / "kubeconfig"),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    obj = features(api)
    assert obj is not None
    assert obj["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    assert obj["metadata"]["labels"]["nfd.node.kubernetes.io/node-name"] == NODE
    labels = obj["spec"]["labels"]
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert not out.exists()


def test_env_vars_as_the_gpu_operator_sets_them(node: Path, api: FakeApiServer, tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "GFD_USE_NODE_FEATURE_API": "true",
        "NODE_NAME": NODE,
        "NAMESPACE": NS,
        "KUBECONFIG": str(tmp_path / "kubeconfig"),
        "GFD_ONESHOT": "true",
        "GPUNODE_SIM_STATE": str(node),
    }
    r = subprocess.run([FD], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert features(api) is not None


def test_without_a_node_name_it_exits_2_explaining_node_name(
    node: Path, api: FakeApiServer, tmp_path: Path
) -> None:
    r = subprocess.run(
        [
            FD,
            "--sim-state",
            str(node),
            "--use-node-feature-api",
            "--kubeconfig",
            str(tmp_path / "kubeconfig"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 2
    assert "NODE_NAME" in r.stderr
    assert features(api) is None  # never nvidia-features-for- (empty name)


def test_updates_only_on_change_owned_by_pod_and_daemonset_kept_on_exit(
    start: Callable[..., subprocess.Popen[str]], node: Path, api: FakeApiServer
) -> None:
    api.add_daemonset(
        NS, "gpunode-feature-discovery", {}, {"app.kubernetes.io/name": "gpunode-feature-discovery"}
    )
    assert api.wait_for(lambda: len(api.pods(NODE)) == 1)
    pod = api.pods(NODE)[0]
    args = ("--use-node-feature-api", "--node-name", NODE, "--namespace", NS, "--http-port", "-1")
    p = start(*args, "--pod-name", pod["metadata"]["name"], "--sleep-interval", "0.3s")
    assert p.stdout is not None
    log = EventLog(p.stdout)
    wait_until(lambda: features(api) is not None)
    obj = features(api)
    assert obj is not None
    owners = {(o["kind"], o["name"], bool(o.get("controller"))) for o in obj["metadata"]["ownerReferences"]}
    assert owners == {
        ("DaemonSet", "gpunode-feature-discovery", True),
        ("Pod", pod["metadata"]["name"], False),
    }
    version = obj["metadata"]["resourceVersion"]
    writes = nodefeature_writes(api)
    log.wait_for("labels_unchanged", count=3)  # several passes, nothing changed: no writes
    assert nodefeature_writes(api) == writes
    assert features(api)["metadata"]["resourceVersion"] == version  # type: ignore[index]
    with sim.SimNode.open(node).mutate() as st:
        st.lose(3)
    wait_until(lambda: features(api)["spec"]["labels"]["nvidia.com/gpu.count"] == "7")  # type: ignore[index]
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    assert features(api) is not None  # never deleted on exit: no labels blinking on restart


def test_forbidden_is_explained_and_retried_until_granted(
    start: Callable[..., subprocess.Popen[str]], api: FakeApiServer
) -> None:
    api.forbid("create", "nodefeatures")
    p = start("--use-node-feature-api", "--node-name", NODE, "--namespace", NS, "--http-port", "-1")
    wait_until(lambda: any(r.status == 403 for r in api.requests))
    wait_until(lambda: sum(r.status == 403 for r in api.requests) >= 2)  # refused again: it retried
    assert p.poll() is None  # no crash loop
    api.allow_all()
    wait_until(lambda: features(api) is not None, timeout=15)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=10)
    failed = [json.loads(line) for line in out.splitlines() if '"output_failed"' in line]
    assert failed
    assert '"create"' in failed[0]["error"]
    assert '"nodefeatures"' in failed[0]["error"]


def test_unreachable_api_server_means_not_ready_and_no_crash(
    start: Callable[..., subprocess.Popen[str]], api: FakeApiServer, tmp_path: Path
) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(cfg.read_text().replace(api.url, "http://127.0.0.1:9"))  # discard port: refused
    p = start("--use-node-feature-api", "--node-name", NODE, "--http-port", "0", "--log-level", "debug")
    assert p.stdout is not None
    port = None
    deadline = time.monotonic() + 15
    while port is None and time.monotonic() < deadline:
        line = p.stdout.readline()
        if '"http_listening"' in line:
            port = json.loads(line)["port"]
    assert port is not None, "no http_listening event"

    def readyz() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    wait_until(lambda: readyz()[0] == 503 and "kube" in readyz()[1], timeout=15)
    assert p.poll() is None


def configs(tmp_path: Path) -> Path:
    d = tmp_path / "available-configs"
    d.mkdir()
    (d / "default").write_text("version: v1\n")
    sliced = "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    (d / "sliced").write_text("version: v1\n" + sliced)
    return d


def test_the_node_label_chooses_the_config_live(
    start: Callable[..., subprocess.Popen[str]], api: FakeApiServer, tmp_path: Path
) -> None:
    d = configs(tmp_path)
    out = tmp_path / "gfd"
    p = start(
        "--config-file",
        str(d),
        "--node-name",
        NODE,
        "-o",
        str(out),
        "--http-port",
        "-1",
        "--sleep-interval",
        "60s",
    )
    assert p.stdout is not None
    log = EventLog(p.stdout)
    wait_until(lambda: out.exists())
    assert "nvidia.com/gpu.replicas=1" in out.read_text().splitlines()
    api.patch_node(NODE, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "sliced"}}})
    changed = time.monotonic()
    wait_until(lambda: "nvidia.com/gpu.replicas=4" in out.read_text().splitlines(), timeout=5)
    assert time.monotonic() - changed < 2.5
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-SHARED" in out.read_text().splitlines()
    failed = log.count("config_selection_failed")
    api.patch_node(NODE, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "nope"}}})
    log.wait_for("config_selection_failed", count=failed + 1)  # it saw the label and chose to keep
    assert "nvidia.com/gpu.replicas=4" in out.read_text().splitlines()  # keep-last-good
    api.patch_node(NODE, {"metadata": {"labels": {"nvidia.com/device-plugin.config": None}}})
    wait_until(lambda: "nvidia.com/gpu.replicas=1" in out.read_text().splitlines(), timeout=5)

"""`gpunode-mig-manager` as a real process: against the test API server with operand DaemonSets on a
shared simulated DGX A100, and on bare metal with a selected-config file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.sim import nvml as sim
from gpunode.sim.apiserver import FakeApiServer
from helpers import mig_crash
from helpers.waiting import wait_until

MANAGER = str(Path(sys.executable).parent / "gpunode-mig-manager")
REPO = Path(__file__).resolve().parents[3]
NODE = "node-1"
NS = "gpu-operator"
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
REASON = "nvidia.com/mig.config.state-reason"
RECORD = "nvidia.com/gpunode.operands-paused"
DEPLOY = "nvidia.com/gpu.deploy."
OPERANDS = {
    "device-plugin": "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery": "gpu-feature-discovery",
    "dcgm-exporter": "nvidia-dcgm-exporter",
}
# Never SIGHUP a real device plugin someone else runs on this machine: tell a made-up program instead.
NOTIFY_NAME = f"gpunode-test-agent-{os.getpid()}"

CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  impossible:
    - devices: [2]
      mig-enabled: true
      mig-devices: {"3g.20gb": 3}
"""


# -- fixtures and helpers ---------------------------------------------------------------------------------
@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        labels = {DEPLOY + name: "true" for name in (*OPERANDS, "dcgm")}
        labels[DEPLOY + "nvsm"] = "false"
        server.add_node(NODE, labels=labels)
        for name, app in OPERANDS.items():
            server.add_daemonset(NS, app, {DEPLOY + name: "true"}, {"app": app})
        server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


class Manager:
    """One manager process; its JSON log goes to a file (read it with :meth:`events`)."""

    def __init__(
        self, args: list[str], log: Path, env: dict[str, str] | None = None, kill_after: int | None = None
    ) -> None:
        self.log = log
        self.out = log.open("a")
        full_env = {**os.environ, "GPUNODE_MIG_NOTIFY_PROCESSES": NOTIFY_NAME, "LOG_FORMAT": "json"}
        # kill_after: through the crash helper, which SIGKILLs the manager right after that MIG step
        command = (
            [MANAGER] if kill_after is None else [*mig_crash.COMMAND, str(kill_after), "gpunode-mig-manager"]
        )
        self.proc = subprocess.Popen(
            [*command, *args], stdout=self.out, stderr=subprocess.STDOUT, env={**full_env, **(env or {})}
        )

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if name is None or event.get("event") == name:
                out.append(event)
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.out.close()
        return self.proc.returncode


@pytest.fixture
def start(node: Path, config: Path, tmp_path: Path) -> Iterator[Any]:
    started: list[Manager] = []

    def run(
        *args: str, env: dict[str, str] | None = None, kube: bool = True, kill_after: int | None = None
    ) -> Manager:
        base = ["--sim-state", str(node), "--config-file", str(config), "--http-port", "-1"]
        base += ["--journal-file", str(tmp_path / "journal.json")]
        if kube:
            base += [
                "--kubeconfig",
                str(tmp_path / "kubeconfig"),
                "--node-name",
                NODE,
                "--operand-timeout",
                "3",
            ]
        m = Manager([*base, *args], tmp_path / f"manager-{len(started)}.log", env, kill_after)
        started.append(m)
        return m

    yield run
    for m in started:
        m.stop()


def labels(api: FakeApiServer) -> dict[str, str]:
    return dict(api.node(NODE)["metadata"].get("labels") or {})


def node_annotations(api: FakeApiServer) -> dict[str, str]:
    return dict(api.node(NODE)["metadata"].get("annotations") or {})


def state(api: FakeApiServer) -> str | None:
    return labels(api).get(STATE_LABEL)


def select(api: FakeApiServer, name: str) -> None:
    api.patch_node(NODE, {"metadata": {"labels": {CONFIG_LABEL: name}}})


def devices(node: Path) -> list[int]:
    """MIG devices (compute instances) per GPU."""
    return [sum(len(gi.cis) for gi in g.gis) for g in sim.SimNode.open(node).state.gpus]


def layout(node: Path) -> list[tuple[int, list[tuple[int, int, int]]]]:
    st = sim.SimNode.open(node).state
    return [(g.mig_current, sorted((gi.profile, gi.start, len(gi.cis)) for gi in g.gis)) for g in st.gpus]


def operand_pods(api: FakeApiServer) -> set[str]:
    return {p["metadata"]["labels"].get("app", "") for p in api.pods(NODE)}


def node_patches(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH" and r.path.endswith(f"/nodes/{NODE}"))


class Recorder:
    """Every distinct (state, device-plugin label) the node goes through, seen from outside."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.seen: list[tuple[str | None, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        version = -1
        while not self._stop.is_set():
            self.api.wait_for(lambda v=version: self.api.resource_version != v, timeout=0.2)  # type: ignore[misc]
            version = self.api.resource_version
            now = labels(self.api)
            snap = (now.get(STATE_LABEL), now.get(DEPLOY + "device-plugin"))
            if not self.seen or self.seen[-1] != snap:
                self.seen.append(snap)

    def states(self) -> list[str | None]:
        out: list[str | None] = []
        for st, _ in self.seen:
            if not out or out[-1] != st:
                out.append(st)
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def operands_back(api: FakeApiServer) -> bool:
    now = labels(api)
    return (
        all(now.get(DEPLOY + name) == "true" for name in (*OPERANDS, "dcgm"))
        and now.get(DEPLOY + "nvsm") == "false"
        and RECORD not in node_annotations(api)
        and operand_pods(api) == set(OPERANDS.values())
    )


# -- Kubernetes mode --------------------------------------------------------------------------------------
def test_label_applies_with_operands_paused_then_restored(start: Any, api: FakeApiServer, node: Path) -> None:
    m = start("--http-port", "0")
    wait_until(lambda: bool(m.events("mig_config_unset")), timeout=15)
    assert state(api) is None  # an unset label: nothing written
    recorder = Recorder(api)
    try:
        select(api, "all-balanced")
        wait_until(lambda: state(api) == "success", timeout=15)
        wait_until(lambda: operands_back(api), timeout=5)
    finally:
        recorder.stop()
    assert devices(node) == [4] * 8
    assert recorder.states() == [None, "pending", "success"]
    assert (None, "true") in recorder.seen[:1]
    assert ("pending", "paused-for-mig-change") in recorder.seen
    assert REASON not in node_annotations(api)
    wait_until(lambda: bool(m.events("mig_reconfigure_finished")), timeout=5)  # logged after the label
    events = [e["event"] for e in m.events() if e["event"].startswith("mig_")]
    assert events.index("mig_reconfigure_started") < events.index("mig_config_state")
    assert "mig_reconfigure_finished" in events
    finished = m.events("mig_reconfigure_finished")[-1]
    assert finished["state"] == "success"
    assert finished["duration_s"] > 0
    # readiness and metrics
    port = m.events("http_listening")[0]["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
        body = r.read().decode()
        assert r.status == 200
    assert "kube" in body
    assert "nvml" in body
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert 'gpunode_mig_reconfigure_total{result="success"} 1.0' in metrics
    assert 'gpunode_mig_config_state{state="success"} 1.0' in metrics
    assert 'gpunode_mig_config_state{state="pending"} 0.0' in metrics


def test_configs_that_cannot_apply_fail_without_pausing_anything(
    start: Any, api: FakeApiServer, node: Path
) -> None:
    select(api, "all-balanced")
    m = start()
    wait_until(lambda: state(api) == "success", timeout=15)
    wait_until(lambda: operands_back(api), timeout=5)
    before, patches = layout(node), node_patches(api)
    select(api, "impossible")
    wait_until(lambda: state(api) == "failed", timeout=15)
    reason = node_annotations(api)[REASON]
    assert "GPU 2" in reason
    assert "\n" not in reason
    assert node_patches(api) == patches + 1  # the state, and nothing else: no operand was paused
    assert layout(node) == before
    assert operands_back(api)

    select(api, "no-such-layout")
    wait_until(
        lambda: node_annotations(api).get(REASON, "").startswith('unknown MIG config "no-such-layout"'), 10
    )
    assert node_annotations(api)[REASON] == (
        'unknown MIG config "no-such-layout"; the configs are: '
        "all-disabled, all-enabled, all-balanced, all-1g.5gb, impossible"
    )
    assert state(api) == "failed"
    assert node_patches(api) == patches + 2
    assert layout(node) == before
    assert m.proc.poll() is None  # never a crash


def test_a_pod_that_stays_fails_naming_it_and_restores_the_operands(
    start: Any, api: FakeApiServer, node: Path
) -> None:
    api.add_pod(NS, "stubborn-plugin", node=NODE, labels={"app": "nvidia-device-plugin-daemonset"})
    before = layout(node)
    start()
    select(api, "all-balanced")
    wait_until(lambda: state(api) == "failed", timeout=20)
    reason = node_annotations(api)[REASON]
    assert f"{NS}/stubborn-plugin" in reason
    assert "operand labels restored" in reason
    wait_until(lambda: operands_back(api), timeout=5)
    assert layout(node) == before


def test_a_failure_is_retried_by_the_reassert_once_its_cause_is_gone(
    start: Any, api: FakeApiServer, node: Path
) -> None:
    api.add_pod(NS, "stubborn-plugin", node=NODE, labels={"app": "nvidia-device-plugin-daemonset"})
    select(api, "all-balanced")
    start("--reassert-interval", "1")
    wait_until(lambda: state(api) == "failed", timeout=20)
    api.delete("pods", "stubborn-plugin", NS)
    wait_until(lambda: state(api) == "success", timeout=20)  # no relabelling
    assert devices(node) == [4] * 8
    assert REASON not in node_annotations(api)
    wait_until(lambda: operands_back(api), timeout=5)


def test_killed_while_paused_the_next_start_restores_and_converges(
    start: Any, api: FakeApiServer, node: Path, tmp_path: Path
) -> None:
    first = start(kill_after=3)
    wait_until(lambda: bool(first.events("mig_config_unset")), timeout=15)
    select(api, "all-balanced")
    assert first.proc.wait(20) == -signal.SIGKILL
    assert state(api) == "pending"
    assert labels(api)[DEPLOY + "device-plugin"] == "paused-for-mig-change"
    assert RECORD in node_annotations(api)
    assert (tmp_path / "journal.json").exists()
    second = start()
    wait_until(lambda: state(api) == "success", timeout=20)
    wait_until(lambda: operands_back(api), timeout=5)
    assert devices(node) == [4] * 8
    assert not (tmp_path / "journal.json").exists()
    assert second.events("operands_restore_interrupted")


def test_a_failing_pre_apply_config_hook_fails_and_changes_nothing(
    start: Any, api: FakeApiServer, node: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "refuse"
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(
        "version: v1\nhooks:\n  pre-apply-config:\n"
        "    - command: /bin/sh\n"
        f'      args: ["-c", "if [ -e {marker} ]; then echo refused >&2; exit 3; fi"]\n'
    )
    select(api, "all-balanced")
    start("--hooks-file", str(hooks))
    wait_until(lambda: state(api) == "success", timeout=15)
    before = layout(node)
    marker.touch()
    select(api, "all-1g.5gb")
    wait_until(lambda: state(api) == "failed", timeout=15)
    reason = node_annotations(api)[REASON]
    assert "pre-apply-config" in reason
    assert "refused" in reason
    assert layout(node) == before
    wait_until(lambda: operands_back(api), timeout=5)


def test_sighup_rereads_the_config_file(start: Any, api: FakeApiServer, node: Path, config: Path) -> None:
    select(api, "later")
    m = start()
    wait_until(lambda: state(api) == "failed", timeout=15)
    config.write_text(
        CONFIG + '  later:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {"1g.5gb": 7}\n'
    )
    m.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: state(api) == "success", timeout=15)
    assert devices(node) == [7] * 8


def test_without_a_node_name_it_exits_2_explaining_node_name(node: Path, config: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    r = subprocess.run(
        [MANAGER, "--sim-state", str(node), "--config-file", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert r.returncode == 2
    assert "NODE_NAME" in r.stderr


# -- bare metal -------------------------------------------------------------------------------------------
FAKE_AGENT = """\
import signal, sys, time
signal.signal(signal.SIGHUP, lambda *_: open(sys.argv[1], "a").write("hup\\n"))
open(sys.argv[1] + ".ready", "w").close()
while True:
    time.sleep(1)
"""


def test_bare_metal_follows_the_selected_config_file(start: Any, node: Path, tmp_path: Path) -> None:
    agent = tmp_path / NOTIFY_NAME
    agent.write_text(FAKE_AGENT)
    told = tmp_path / "told"
    fake = subprocess.Popen([sys.executable, str(agent), str(told)])
    try:
        wait_until(lambda: Path(str(told) + ".ready").exists(), timeout=10)
        selected = tmp_path / "etc" / "selected-config"
        selected.parent.mkdir()
        selected.write_text('[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=all-balanced"\n')
        state_file = tmp_path / "run" / "state.json"
        start("--selected-config-file", str(selected), "--state-file", str(state_file), kube=False)

        def written() -> dict[str, Any]:
            try:
                loaded: dict[str, Any] = json.loads(state_file.read_text())
                return loaded
            except (OSError, ValueError):
                return {}

        wait_until(lambda: written().get("state") == "success", timeout=15)
        assert written()["config"] == "all-balanced"
        assert devices(node) == [4] * 8
        wait_until(lambda: told.exists(), timeout=5)  # the agents were told
        tmp = selected.with_suffix(".tmp")
        tmp.write_text("all-1g.5gb\n")
        tmp.replace(selected)
        wait_until(
            lambda: written().get("config") == "all-1g.5gb" and written().get("state") == "success", 15
        )
        assert devices(node) == [7] * 8
        selected.write_text("impossible\n")
        wait_until(lambda: written().get("state") == "failed", timeout=15)
        assert "GPU 2" in written()["reason"]
        assert devices(node) == [7] * 8
    finally:
        fake.kill()
        fake.wait()


FAKE_SYSTEMCTL = """\
#!/bin/sh
echo "$@" >> {log}
for unit; do :; done  # the unit comes last, after --
case "$1 $unit" in
  "show nvidia-dcgm.service") printf 'LoadState=loaded\\nActiveState=active\\nType=simple\\n';;
  "show kubelet.service") printf 'LoadState=loaded\\nActiveState=active\\nType=simple\\n';;
  "show nvsm.service") printf 'LoadState=not-found\\nActiveState=inactive\\n';;
  show*) exit 1;;
esac
exit 0
"""


def test_oneshot_with_host_clients_stopped_around_the_change(
    node: Path, config: Path, tmp_path: Path
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "systemctl.log"
    (bindir / "systemctl").write_text(FAKE_SYSTEMCTL.format(log=calls))
    (bindir / "systemctl").chmod(0o755)
    clients = tmp_path / "clients.yaml"
    clients.write_text("version: v1\nsystemd-services:\n  - nvidia-dcgm.service\n  - nvsm.service\n")
    selected = tmp_path / "selected"
    selected.write_text("all-balanced\n")
    state_file = tmp_path / "state.json"
    args = [MANAGER, "--sim-state", str(node), "--config-file", str(config), "--oneshot"]
    args += ["--selected-config-file", str(selected), "--state-file", str(state_file)]
    args += ["--journal-file", str(tmp_path / "journal.json"), "--gpu-clients-file", str(clients)]
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "GPUNODE_MIG_NOTIFY_PROCESSES": NOTIFY_NAME,
    }
    env |= {"WITH_SHUTDOWN_HOST_GPU_CLIENTS": "true", "GPUNODE_MIG_HOST_CLIENTS_SETTLE": "0"}
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(state_file.read_text())["state"] == "success"
    assert devices(node) == [4] * 8
    acted = [line for line in calls.read_text().splitlines() if not line.startswith("show")]
    # a mode change: the kubelet goes too; everything comes back in reverse order
    assert acted == [  # unit names after --: arguments, never options
        "stop -- nvidia-dcgm.service",
        "stop -- kubelet.service",
        "start -- kubelet.service",
        "start -- nvidia-dcgm.service",
    ]

    selected.write_text("no-such-layout\n")
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    written = json.loads(state_file.read_text())
    assert written["state"] == "failed"
    assert written["reason"].startswith('unknown MIG config "no-such-layout"')


# -- the systemd unit -------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    text = (REPO / "systemd" / "gpunode-mig-manager.service").read_text()
    unit = tmp_path / "gpunode-mig-manager.service"
    unit.write_text(text.replace("ExecStart=/usr/bin/gpunode-mig-manager", f"ExecStart={MANAGER}"))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "gpunode-mig-manager.service" not in r.stderr, r.stderr
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    exposure = float(r.stdout.split("Overall exposure level for gpunode-mig-manager.service:")[1].split()[0])
    assert exposure <= 2.8, r.stdout  # 3.2 before issue 14 (IPAddressDeny, PrivateMounts, no CAP_KILL)


def test_a_config_matching_no_gpu_is_success_with_the_reason(
    start: Any, api: FakeApiServer, node: Path, config: Path
) -> None:
    """mig-parted's rule (issue 18): state success, nothing changed, the reason annotation says why."""
    config.write_text(
        CONFIG
        + '  all-1g.18gb:\n    - device-filter: "0x233510DE"\n      devices: all\n'
        + '      mig-enabled: true\n      mig-devices: {"1g.18gb": 7}\n'
    )
    before = layout(node)
    select(api, "all-1g.18gb")
    m = start()
    wait_until(lambda: state(api) == "success", timeout=15)
    reason = node_annotations(api)[REASON]
    assert reason.startswith('config "all-1g.18gb" matches no GPU on this node, so nothing was changed')
    assert "0x233510DE" in reason
    assert layout(node) == before
    assert operands_back(api)  # nothing paused
    select(api, "all-balanced")  # a config that matches: success, and the note is gone
    wait_until(lambda: devices(node) == [4] * 8 and state(api) == "success", timeout=20)
    wait_until(lambda: REASON not in node_annotations(api), timeout=5)
    assert m.proc.poll() is None

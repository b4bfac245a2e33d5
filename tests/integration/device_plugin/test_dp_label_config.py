"""`gpunode-device-plugin --config-file DIR`: the node label picks the config, live, without a sidecar.

The real plugin process runs on a simulated dgx-a100 (8 GPUs) against the fake kubelet and the fake API
server; the config directory is laid out the way the kubelet lays out a ConfigMap volume (files are
symlinks ``name -> ..data/name``; an update writes a new timestamped directory and swaps ``..data``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.sim.apiserver import FakeApiServer
from gpunode.sim.kubelet import FakeKubelet

PLUGIN = str(Path(sys.executable).parent / "gpunode-device-plugin")
PLUGIN_DIR = "var/lib/kubelet/device-plugins"
GPU = "nvidia.com/gpu"
NODE = "node-1"
LABEL = "nvidia.com/device-plugin.config"
STATE = "nvidia.com/device-plugin.config.state"
APPLIED = "nvidia.com/device-plugin.config.applied"
NO_SHARING = "version: v1\nflags:\n  migStrategy: none\n"


def sliced(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


class ConfigMapVolume:
    """A directory updated the way the kubelet's atomic writer updates a ConfigMap volume."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True)

    def write(self, files: dict[str, str]) -> None:
        self.generation += 1
        stamp = f"..2026_01_01_00_00_{self.generation:02d}.{time.monotonic_ns()}"
        (self.root / stamp).mkdir()
        for name, text in files.items():
            (self.root / stamp / name).write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        os.symlink(stamp, self.root / "..data_tmp")
        os.replace(self.root / "..data_tmp", data)  # the atomic switch
        for name in files:
            if not (self.root / name).is_symlink():
                os.symlink(f"..data/{name}", self.root / name)
        for entry in self.root.iterdir():
            if entry.is_symlink() and not entry.name.startswith(".") and entry.name not in files:
                entry.unlink()
        if old is not None:
            shutil.rmtree(self.root / old)


class Plugin:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                out.append(event)
        return out

    def output(self) -> str:
        return self.log.read_text()[-4000:]

    def http_port(self) -> int | None:
        found = self.events("http_listening")
        return int(found[0]["port"]) if found else None

    def readyz(self) -> tuple[int, str]:
        port = self.http_port()
        assert port is not None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


async def eventually(
    predicate: Callable[[], bool], timeout: float, what: str, plugin: Plugin | None = None
) -> float:
    """Poll until ``predicate`` holds; the seconds it took. Fails naming ``what`` (and the plugin's log)."""
    started = time.monotonic()
    while not predicate():
        if plugin is not None and plugin.proc.poll() is not None:
            code = plugin.proc.returncode
            raise AssertionError(f"plugin exited {code} waiting for {what}:\n{plugin.output()}")
        if time.monotonic() - started > timeout:
            tail = plugin.output() if plugin is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tail}")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@pytest.fixture
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dp")  # short: a unix socket path has at most 107 bytes
    (root / PLUGIN_DIR).mkdir(parents=True)
    return root


@pytest.fixture
async def kubelet(host: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(host / PLUGIN_DIR)
    await k.start()
    yield k
    await k.stop()


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node(NODE)
        # what a kubelet reports and lightkube's Node model requires (the fake leaves some out)
        info = {
            "architecture": "amd64",
            "bootID": "b00t",
            "containerRuntimeVersion": "containerd://2.0.0",
            "kernelVersion": "6.8.0",
            "kubeProxyVersion": "v1.31.0",
            "kubeletVersion": "v1.31.0",
            "machineID": "m4ch1ne",
            "operatingSystem": "linux",
            "osImage": "Ubuntu 24.04",
            "systemUUID": "5y5-uu1d",
        }
        server.patch_node(NODE, {"status": {"nodeInfo": info}})
        yield server


@pytest.fixture
def configs(host: Path) -> ConfigMapVolume:
    volume = ConfigMapVolume(host / "available-configs")
    volume.write({"default": NO_SHARING, "sliced": sliced(4)})
    return volume


Launch = Callable[..., Plugin]


@pytest.fixture
def launch(host: Path, kubelet: FakeKubelet) -> Iterator[Launch]:
    started: list[Plugin] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Plugin:
        log = host / f"plugin-{len(started)}.log"
        argv = [
            PLUGIN,
            *("--simulate", "dgx-a100", "--sim-state", str(host / "node.json")),
            *("--kubelet-socket", str(kubelet.socket), "--host-root", str(host)),
            *("--http-port", "0", "--log-format", "json", "--kube-api-timeout", "2"),
            *args,
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        plugin = Plugin(proc, log)
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        if plugin.proc.poll() is None:
            plugin.proc.send_signal(signal.SIGTERM)
            try:
                assert plugin.proc.wait(10) == 0, plugin.output()
            except subprocess.TimeoutExpired:
                plugin.proc.kill()
                raise


def annotations(api: FakeApiServer) -> dict[str, str]:
    return dict(api.node(NODE)["metadata"].get("annotations") or {})


def node_patches(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH" and r.path.endswith(f"/nodes/{NODE}"))


async def test_label_picks_the_config_live_and_the_node_says_which(
    api: FakeApiServer, kubelet: FakeKubelet, configs: ConfigMapVolume, host: Path, launch: Launch
) -> None:
    kubeconfig = api.write_kubeconfig(host / "kubeconfig")
    dp = launch("--config-file", str(configs.root), "--node-name", NODE, "--kubeconfig", str(kubeconfig))
    gpus = lambda: len(kubelet.healthy(GPU))  # noqa: E731

    # no label: the fallback "named" picks `default`, no sharing
    await eventually(lambda: gpus() == 8, 10, "8 GPUs from the default config", dp)
    await eventually(
        lambda: annotations(api).get(STATE) == "applied" and annotations(api).get(APPLIED) == "default",
        5,
        "applied=default on the node",
        dp,
    )
    selected = dp.events("config_selected")[-1]
    assert (selected["name"], selected["source"]) == ("default", "named")

    # relabel: time-slicing with 4 replicas, live
    api.patch_node(NODE, {"metadata": {"labels": {LABEL: "sliced"}}})
    took = await eventually(lambda: gpus() == 32, 5, "32 replicas after the relabel", dp)
    assert took < 2.5, f"the relabel took {took:.2f}s"
    await eventually(lambda: annotations(api).get(APPLIED) == "sliced", 3, "applied=sliced", dp)
    assert annotations(api)[STATE] == "applied"
    assert dp.events("config_selected")[-1]["source"] == "label"

    # a label naming no file: keep what is in force, say why on the node
    api.patch_node(NODE, {"metadata": {"labels": {LABEL: "nope"}}})
    await eventually(lambda: annotations(api).get(STATE, "").startswith("failed: "), 3, "state failed", dp)
    state = annotations(api)[STATE]
    assert f'config "nope" not found in {configs.root} (have: default, sliced)' in state, state
    assert annotations(api)[APPLIED] == "sliced"
    assert gpus() == 32
    assert dp.events("config_selection_failed")
    assert dp.proc.poll() is None

    # the ConfigMap's content changes (new ..data): the config in force follows it
    configs.write({"default": NO_SHARING, "sliced": sliced(2)})
    await eventually(lambda: gpus() == 16, 3, "16 replicas after the ConfigMap update", dp)

    # back to a valid label: applied again
    api.patch_node(NODE, {"metadata": {"labels": {LABEL: "sliced"}}})
    await eventually(lambda: annotations(api).get(STATE) == "applied", 3, "state applied again", dp)

    # bad content: rejected, the last good config stays, the node says why
    configs.write({"default": NO_SHARING, "sliced": sliced(1)})
    await eventually(lambda: bool(dp.events("config_rejected")), 3, "config_rejected", dp)
    await eventually(lambda: annotations(api).get(STATE, "").startswith("failed: "), 3, "state failed", dp)
    state = annotations(api)[STATE]
    assert state.startswith(f"failed: {configs.root}/sliced: "), state
    assert "sharing.timeSlicing.resources[0].replicas" in state, state
    assert "\n" not in state
    assert gpus() == 16
    assert annotations(api)[APPLIED] == "sliced"

    # fixed content: applied
    configs.write({"default": NO_SHARING, "sliced": sliced(3)})
    await eventually(lambda: gpus() == 24, 3, "24 replicas after the fix", dp)
    await eventually(lambda: annotations(api).get(STATE) == "applied", 3, "state applied after the fix", dp)

    # SIGHUP reads the chosen file again; nothing changed, so the node is left alone
    reloads = len(dp.events("config_reloaded"))
    dp.proc.send_signal(signal.SIGHUP)
    await eventually(lambda: len(dp.events("config_reloaded")) > reloads, 3, "a reload on SIGHUP", dp)
    assert gpus() == 24

    # only changed values were ever written: default/applied, sliced, failed, applied, failed, applied
    assert node_patches(api) == 6, [r for r in api.requests if r.method == "PATCH"]
    _, body = dp.readyz()
    assert "kube: ok" in body, body


async def test_a_label_naming_a_missing_config_at_start_serves_the_default_chain(
    api: FakeApiServer, kubelet: FakeKubelet, configs: ConfigMapVolume, host: Path, launch: Launch
) -> None:
    api.patch_node(NODE, {"metadata": {"labels": {LABEL: "big"}}})
    kubeconfig = api.write_kubeconfig(host / "kubeconfig")
    env = {**os.environ, "NODE_NAME": NODE, "KUBECONFIG": str(kubeconfig), "CONFIG_FILE": str(configs.root)}
    dp = launch(env=env)
    await eventually(lambda: len(kubelet.healthy(GPU)) == 8, 10, "8 GPUs from the default chain", dp)
    await eventually(lambda: annotations(api).get(APPLIED) == "default", 5, "applied=default", dp)
    assert annotations(api)[STATE] == (
        f'failed: config "big" not found in {configs.root} (have: default, sliced)'
    )
    # the ConfigMap gains the file the label names: it applies without a restart
    configs.write({"default": NO_SHARING, "sliced": sliced(4), "big": sliced(8)})
    await eventually(lambda: len(kubelet.healthy(GPU)) == 64, 5, "64 replicas once big exists", dp)
    await eventually(lambda: annotations(api).get(STATE) == "applied", 3, "state applied", dp)
    assert annotations(api)[APPLIED] == "big"


async def test_a_labelled_config_refused_at_start_serves_the_default_chain_until_fixed(
    api: FakeApiServer, kubelet: FakeKubelet, configs: ConfigMapVolume, host: Path, launch: Launch
) -> None:
    configs.write({"default": NO_SHARING, "sliced": "version: v1\nsharing: [oops\n"})
    api.patch_node(NODE, {"metadata": {"labels": {LABEL: "sliced"}}})
    kubeconfig = api.write_kubeconfig(host / "kubeconfig")
    dp = launch("--config-file", str(configs.root), "--node-name", NODE, "--kubeconfig", str(kubeconfig))
    await eventually(lambda: len(kubelet.healthy(GPU)) == 8, 10, "8 GPUs from the default chain", dp)
    await eventually(lambda: annotations(api).get(APPLIED) == "default", 5, "applied=default", dp)
    assert annotations(api)[STATE].startswith(f"failed: {configs.root}/sliced: "), annotations(api)
    assert len(dp.events("config_rejected")) == 1  # refused once, not again for the same content
    configs.write({"default": NO_SHARING, "sliced": sliced(4)})
    await eventually(lambda: len(kubelet.healthy(GPU)) == 32, 5, "32 replicas once sliced is fixed", dp)
    await eventually(lambda: annotations(api).get(STATE) == "applied", 3, "state applied", dp)
    assert annotations(api)[APPLIED] == "sliced"


async def test_an_unreachable_api_server_at_start_serves_the_default_config_not_ready(
    kubelet: FakeKubelet, configs: ConfigMapVolume, host: Path, launch: Launch
) -> None:
    with FakeApiServer() as gone:
        kubeconfig = gone.write_kubeconfig(host / "kubeconfig")  # then it stops: the port is closed
    dp = launch("--config-file", str(configs.root), "--node-name", NODE, "--kubeconfig", str(kubeconfig))
    await eventually(lambda: len(kubelet.healthy(GPU)) == 8, 10, "8 GPUs without the API server", dp)
    assert dp.events("node_label_unknown")
    assert dp.events("config_selected")[-1]["name"] == "default"
    await eventually(lambda: dp.http_port() is not None, 3, "the HTTP endpoint", dp)
    status, body = dp.readyz()
    assert status == 503, body
    assert "kube: failing" in body, body
    assert "registered: ok" in body, body


def test_a_config_directory_without_a_node_name_exits_2_naming_NODE_NAME(
    configs: ConfigMapVolume, host: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBECONFIG")}
    out = subprocess.run(
        [PLUGIN, "--simulate", "t4x4", "--kubelet-socket", "", "--config-file", str(configs.root)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "NODE_NAME" in out.stderr
    assert str(configs.root) in out.stderr

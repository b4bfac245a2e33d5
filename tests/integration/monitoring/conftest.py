"""One real scrape of gpunode's running agents, shared by the monitoring tests.

Started once per session, side by side: the kubelet emulator and the device plugin on it, the exporter,
feature discovery and the MIG manager (applying ``all-3g.40gb``) on one simulated DGX H100, a second
exporter on a simulated T4 node (retired pages), and gpunode-operator on the test API server (two
NFD-labelled GPU nodes, one in driver upgrade state ``upgrade-failed`` and one in ``drain-required``; one
reconcile made to fail, so the error counters have series). Each agent's ``/metrics`` is read once
everything has settled and parsed into the series Prometheus would store, with the ``job`` and
``instance`` labels a scrape adds.

The alert rules' unit tests and the dashboard's query check take their series from here, never from a
hand-written list: a metric or label renamed in an agent, or misspelt in a rule, fails them.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpunode.api.clusterpolicy_crd import crd
from gpunode.sim import nvml as sim
from gpunode.sim.apiserver import FakeApiServer

BIN = Path(sys.executable).parent
NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
UPGRADE = "nvidia.com/gpu-driver-upgrade-state"
OPERATOR = [
    sys.executable,
    "-c",
    "import sys; from gpunode.deploy.operator_cli import main; sys.exit(main())",
]
# Every DCGM field the rules and the dashboard read (the default counters file leaves some out).
COUNTERS = """\
DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, Total number of NVLink bandwidth counters for all lanes.
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_RETIRED_PENDING, counter, Total number of pages pending retirement.
DCGM_FI_DEV_ROW_REMAP_PENDING, gauge, Whether remapping of rows is pending.
DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, Whether remapping of rows has failed.
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors.
DCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, Current clock event reasons.
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total number of NVLink flow-control CRC errors.
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, counter, Total number of NVLink retries.
DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.
"""


SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)( \S+)?$")
LABEL = re.compile(r'(?P<name>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)",?')
UNESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]


@dataclass
class Scrape:
    """Every series of every agent's /metrics: ``by_name[name]`` -> the series of that name."""

    texts: dict[str, str] = field(default_factory=dict)  # job -> the exposition text
    by_name: dict[str, list[Series]] = field(default_factory=dict)
    declared: set[str] = field(default_factory=set)  # sample names the # TYPE lines announce

    def known(self, name: str) -> bool:
        """Whether an agent exposes ``name``: a sample of it, or a family declared without samples yet
        (a labelled counter nothing has counted)."""
        return name in self.by_name or name in self.declared

    def add(self, job: str, instance: str, text: str) -> None:
        """Each sample line as Prometheus stores it: the name exactly as written (client_python's parser
        would add ``_total`` to dcgm-exporter's counters, which Prometheus does not)."""
        self.texts[job] = text
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split(" ", 3)
                suffixes = {"counter": ("", "_total"), "histogram": ("_bucket", "_sum", "_count")}
                self.declared.update(family + s for s in suffixes.get(kind, ("",)))
            if not line or line.startswith("#"):
                continue
            m = SAMPLE.match(line)
            assert m, f"{job}: unparsable sample line {line!r}"
            labels = {"job": job, "instance": instance}
            for lm in LABEL.finditer(m["labels"] or ""):
                labels[lm["name"]] = UNESCAPE.sub(lambda e: {"n": "\n"}.get(e[1], e[1]), lm["value"])
            self.by_name.setdefault(m["name"], []).append(Series(m["name"], labels))

    def pick(self, name: str, **match: str) -> Series:
        """The first scraped series ``name`` whose labels include ``match``; the test fails naming what
        the agents do expose when there is none."""
        found = self.by_name.get(name)
        if not found:
            near = sorted(n for n in self.by_name if n.split("_")[:3] == name.split("_")[:3])
            pytest.fail(f"no agent exposes {name!r} (similar: {near or 'none'})")
        for s in found:
            if all(s.labels.get(k) == v for k, v in match.items()):
                return s
        pytest.fail(f"no {name} series has labels {match}; scraped: {[s.labels for s in found][:5]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body: bytes = resp.read()
        return body.decode()


def wait_for(
    what: str, check: Callable[[], bool], procs: list[subprocess.Popen[bytes]], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"exited while waiting for {what}: {dead}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="session")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    if not shutil.which("promtool") and not os.environ.get("CI"):
        pytest.skip("promtool not installed (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("monitoring")
    state = tmp / "node.json"
    sim.init_state_file(state, "dgx-h100")
    counters = tmp / "counters.csv"
    counters.write_text(COUNTERS)
    kubelet_dir = tmp / "kubelet"
    kubelet_dir.mkdir()
    selected = tmp / "selected"
    selected.write_text('[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=all-3g.40gb"\n')
    mig_config = Path(sim.__file__).parents[2] / "mig" / "default-config.yaml"
    t4 = tmp / "t4.json"  # a Turing node: retired pages rather than row remapping
    sim.init_state_file(t4, "t4x4")
    jobs = ("device-plugin", "exporter", "exporter-t4", "feature-discovery", "mig-manager")
    ports = {job: free_port() for job in jobs}
    ports["operator"] = free_port()
    environ = {**os.environ, "GPUNODE_MIG_NOTIFY_PROCESSES": "no-such-process-monitoring-test"}
    log = (tmp / "agents.log").open("wb")
    procs: list[subprocess.Popen[bytes]] = []

    def start(*argv: str | Path) -> None:
        procs.append(subprocess.Popen([str(a) for a in argv], stdout=log, stderr=log, env=environ))

    api = FakeApiServer().start()
    try:
        api.add_node("gpu-0", labels={"kubernetes.io/hostname": "gpu-0", **NFD, UPGRADE: "upgrade-failed"})
        # the upgrade controller on: gpu-0 stays failed (no retry asked), gpu-1 stays done (its driver pod
        # is the newest); with autoUpgrade off it would remove both labels
        api.add_node("gpu-1", labels={"kubernetes.io/hostname": "gpu-1", **NFD, UPGRADE: "upgrade-done"})
        api.apply("CustomResourceDefinition", crd(), manager="test")
        policy = {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy"},
        }
        upgrades = {"driver": {"upgradePolicy": {"autoUpgrade": True}}}
        api.apply("ClusterPolicy", {**policy, "spec": upgrades}, manager="test")
        kubeconfig = tmp / "kubeconfig"
        api.write_kubeconfig(kubeconfig)

        start(BIN / "gpunode", "dev", "kubelet", "--dir", kubelet_dir)
        wait_for("the kubelet emulator", lambda: (kubelet_dir / "kubelet.sock").exists(), procs, 15)
        start(
            BIN / "gpunode-device-plugin", "--sim-state", state,
            "--kubelet-socket", kubelet_dir / "kubelet.sock",
            "--http-port", ports["device-plugin"], "--http-address", "127.0.0.1",
        )  # fmt: skip
        start(
            BIN / "gpunode-exporter", "--sim-state", state, "-a", f"127.0.0.1:{ports['exporter']}",
            "-c", "1000", "-f", counters, "--node-name", "gpu-0",
        )  # fmt: skip
        start(
            BIN / "gpunode-exporter", "--sim-state", t4, "-a", f"127.0.0.1:{ports['exporter-t4']}",
            "-c", "1000", "-f", counters, "--node-name", "gpu-1",
        )  # fmt: skip
        start(
            BIN / "gpunode-feature-discovery", "--sim-state", state, "-o", tmp / "gfd",
            "--machine-type-file", tmp / "none", "--sleep-interval", "60s",
            "--http-port", ports["feature-discovery"], "--http-address", "127.0.0.1",
        )  # fmt: skip
        start(
            BIN / "gpunode-mig-manager", "--sim-state", state, "--config-file", mig_config,
            "--journal-file", tmp / "journal.json", "--selected-config-file", selected,
            "--state-file", tmp / "mig-state.json",
            "--http-port", ports["mig-manager"], "--http-address", "127.0.0.1",
        )  # fmt: skip
        start(
            *OPERATOR, "--kubeconfig", kubeconfig, "--namespace", "gpunode",
            "--http-address", "127.0.0.1", "--http-port", ports["operator"],
        )  # fmt: skip

        def metrics(job: str) -> str:
            path = "/metrics"
            return get(f"http://127.0.0.1:{ports[job]}{path}")

        def has(job: str, needle: str) -> Callable[[], bool]:
            return lambda: needle in metrics(job)

        wait_for("the operator's status", has("operator", "gpunode_operator_clusterpolicy_ready{"), procs, 40)
        # one failed reconcile: a spec change that changes the device plugin's DaemonSet, whose apply is
        # refused once (403: not retried by the client, so the pass fails and is counted)
        api.fail_next(1, status=403, method="PATCH", path_contains="daemonsets")
        env = [{"name": "MONITORING_TEST", "value": "1"}]
        api.apply(
            "ClusterPolicy", {**policy, "spec": {**upgrades, "devicePlugin": {"env": env}}}, manager="test"
        )
        wait_for("a counted operator error", has("operator", "gpunode_errors_total{"), procs, 20)
        wait_for(
            "the registration", has("device-plugin", "gpunode_device_plugin_registrations_total{"), procs, 20
        )
        wait_for("the exporter's sample", has("exporter", "DCGM_FI_DEV_GPU_TEMP{"), procs, 20)
        wait_for("the T4 exporter's sample", has("exporter-t4", "DCGM_FI_DEV_RETIRED_PENDING{"), procs, 20)
        wait_for("feature discovery", has("feature-discovery", 'loop="labeling"'), procs, 20)
        wait_for(
            "the MIG manager", has("mig-manager", 'gpunode_mig_config_state{state="success"} 1.0'), procs, 30
        )
        wait_for("the MIG devices' series", has("exporter", 'GPU_I_ID="'), procs, 20)
        scraped = Scrape()
        for job, port in ports.items():
            scraped.add(f"gpunode-{job}", f"127.0.0.1:{port}", metrics(job))
        yield scraped
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        log.close()
        api.stop()

"""`gpunode demo`: the agents, as real processes, on a simulated node in a temporary directory.

Every step runs the same command a user would (`gpunode sim init`, `gpunode-feature-discovery`,
`gpunode-mig`, `gpunode-device-plugin`, `gpunode-exporter`, `gpunode-toolkit`, `gpunode doctor`); the
device plugin registers with the bundled kubelet emulator (`gpunode dev kubelet` serves the same one).
Ports are chosen by the kernel (port 0, read back from the agent's `http_listening` log event), every
agent's log goes to a file in the temporary directory, and everything started is stopped at the end,
also after a failure or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpunode.sim.kubelet import FakeKubelet

# console script -> module with main(), used when the script is not installed next to this Python
_MODULES = {
    "gpunode": "gpunode.cli",
    "gpunode-device-plugin": "gpunode.device_plugin.cli",
    "gpunode-feature-discovery": "gpunode.feature_discovery.cli",
    "gpunode-exporter": "gpunode.exporter.cli",
    "gpunode-mig": "gpunode.mig.cli",
    "gpunode-toolkit": "gpunode.toolkit.cli",
}
MIG_LAYOUT = "all-balanced"
XID_GPU = 3


class DemoError(RuntimeError):
    """A step failed; the message says which and where its log is."""


def _command(name: str) -> list[str]:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [found]
    code = f"import sys; from {_MODULES[name]} import main; sys.exit(main())"
    return [sys.executable, "-c", code]


@dataclass
class Agent:
    name: str
    proc: asyncio.subprocess.Process
    log: Path
    log_file: IO[bytes]


@dataclass
class Demo:
    tmp: Path
    preset: str
    agents: list[Agent] = field(default_factory=list)
    kubelet: FakeKubelet | None = None

    def __post_init__(self) -> None:
        self.state = self.tmp / "node.json"
        self.host = self.tmp / "host"  # the node's host tree (sim init): /sys, /proc, /dev, kubelet dir, CDI
        self.plugin_dir = self.host / "var/lib/kubelet/device-plugins"
        self.labels_file = self.host / "etc/kubernetes/node-feature-discovery/features.d/gfd"
        self.cdi_spec = self.host / "var/run/cdi/nvidia.yaml"
        self.logs = self.tmp / "logs"
        self.logs.mkdir()
        self.env = {**os.environ, "LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1"}
        for inherited in ("GPUNODE_SIM_STATE", "GPUNODE_SIMULATE", "GPUNODE_HOST_ROOT", "KUBECONFIG"):
            self.env.pop(inherited, None)

    # -- running commands ------------------------------------------------------------------------------
    def _show(self, name: str, args: tuple[str, ...]) -> None:
        line = shlex.join([name, *args]).replace(str(self.tmp), "$DEMO")
        print(f"$ {line}", flush=True)

    async def cmd(self, name: str, *args: str, check: bool = True) -> tuple[int, str]:
        """Run one command to its end; its stdout is returned, its stderr (the logs) kept in a file."""
        self._show(name, args)
        log = self.logs / f"{name}-{len(list(self.logs.iterdir()))}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *_command(name), *args, stdout=asyncio.subprocess.PIPE, stderr=err, env=self.env
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise
        rc = proc.returncode if proc.returncode is not None else -1
        if check and rc != 0:
            raise DemoError(f"{name} exited {rc}:\n{out.decode()}{log.read_text()[-2000:]}")
        return rc, out.decode()

    async def start(self, name: str, *args: str) -> tuple[Agent, int]:
        """Start a long-running agent; wait until it logs `http_listening` and return the port it got."""
        self._show(name, args)
        log = self.logs / f"{name}.log"
        log_file = log.open("wb")
        proc = await asyncio.create_subprocess_exec(
            *_command(name), *args, stdout=log_file, stderr=log_file, env=self.env
        )
        agent = Agent(name, proc, log, log_file)
        self.agents.append(agent)
        listening = await self.wait_log(agent, "http_listening", 20.0)
        return agent, int(str(listening["port"]))

    async def wait_log(self, agent: Agent, event: str, timeout: float) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in agent.log.read_text(errors="replace").splitlines():
                if f'"event": "{event}"' in line:
                    with contextlib.suppress(ValueError):
                        parsed: dict[str, object] = json.loads(line)
                        return parsed
            if agent.proc.returncode is not None:
                raise DemoError(f"{agent.name} exited {agent.proc.returncode}; log:\n{self.tail(agent)}")
            await asyncio.sleep(0.05)
        raise DemoError(f"{agent.name} did not log {event} within {timeout:.0f} s; log:\n{self.tail(agent)}")

    @staticmethod
    def tail(agent: Agent) -> str:
        return "\n".join(agent.log.read_text(errors="replace").splitlines()[-15:])

    async def stop_all(self) -> list[tuple[str, int]]:
        """SIGTERM every agent (newest first), wait for each, SIGKILL one that outstays 15 s."""
        codes: list[tuple[str, int]] = []
        for agent in reversed(self.agents):
            if agent.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    agent.proc.send_signal(signal.SIGTERM)
        for agent in reversed(self.agents):
            try:
                await asyncio.wait_for(agent.proc.wait(), 15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    agent.proc.kill()
                await agent.proc.wait()
            agent.log_file.close()
            codes.append((agent.name, agent.proc.returncode if agent.proc.returncode is not None else -1))
        self.agents.clear()
        if self.kubelet is not None:
            await self.kubelet.stop()
            self.kubelet = None
        return codes

    # -- the walkthrough -------------------------------------------------------------------------------
    async def walk(self) -> None:
        s = str(self.state)
        print(f"DEMO={self.tmp}  (state file, host tree and agent logs; removed at the end)")

        section(f"1. A simulated {self.preset} node")
        await self.cmd("gpunode", "sim", "init", self.preset, "--state", s, "--host-root", str(self.host))
        print((await self.cmd("gpunode", "sim", "show", "--state", s))[1].rstrip())

        section("2. Node labels: gpunode-feature-discovery --oneshot")
        machine = self.tmp / "product_name"
        machine.write_text("DGX A100 (simulated)\n")
        self.labels_file.parent.mkdir(parents=True)
        await self.cmd(
            "gpunode-feature-discovery", "--sim-state", s, "--oneshot", "--mig-strategy", "mixed",
            "--output-file", str(self.labels_file), "--machine-type-file", str(machine),
            "--host-root", str(self.host), "--http-port", "-1",
        )  # fmt: skip
        print(self.labels_file.read_text().rstrip())

        section(f"3. MIG layout {MIG_LAYOUT}: gpunode-mig apply, then export")
        journal = self.tmp / "mig-journal.json"
        _, out = await self.cmd(
            "gpunode-mig", "apply", "-c", MIG_LAYOUT, "--sim-state", s, "--journal-file", str(journal)
        )
        print(out.rstrip())
        print((await self.cmd("gpunode-mig", "export", "--sim-state", s))[1].rstrip())
        self.plugin_dir.mkdir(parents=True)
        await self.plugin_and_allocate(s)
        exporter_port = await self.exporter(s)
        await self.xid(s)
        await self.doctor(s, exporter_port)

    async def plugin_and_allocate(self, s: str) -> None:
        section("4. Device plugin, registered with the kubelet emulator")
        self.kubelet = FakeKubelet(self.plugin_dir)
        await self.kubelet.start()
        print(f"kubelet emulator serving {self.kubelet.socket}".replace(str(self.tmp), "$DEMO"))
        plugin, _ = await self.start(
            "gpunode-device-plugin", "--mig-strategy", "mixed", "--sim-state", s,
            "--host-root", str(self.host), "--kubelet-socket", str(self.kubelet.socket),
            "--http-port", "0", "--device-list-strategy", "envvar,cdi-annotations",
            "--pass-device-specs",
        )  # fmt: skip
        advertised = (await self.wait_log(plugin, "resources", 20.0))["advertised"]
        assert isinstance(advertised, dict)
        for resource in sorted(advertised):
            await self.kubelet.wait_registered(str(resource), timeout=20.0)
        print(f"{'resource':<28}{'devices':>8}{'healthy':>9}")
        total = 0
        for resource in sorted(self.kubelet.plugins):
            devices = self.kubelet.plugins[resource].devices
            total += len(devices)
            print(f"{resource:<28}{len(devices):>8}{len(self.kubelet.healthy(resource)):>9}")
        print(f"{total} MIG devices advertised in all")

        section("5. Allocate one MIG device (the kubelet's Allocate RPC)")
        resource = min(self.kubelet.plugins)
        device = sorted(self.kubelet.healthy(resource))[0]
        print(f"Allocate {resource}: [{device}]")
        resp = await self.kubelet.allocate(resource, [device])
        edits = resp.container_responses[0]
        print("envs:")
        for key, value in sorted(edits.envs.items()):
            print(f"  {key}={value}")
        print("devices:")
        for d in edits.devices:
            print(f"  {d.host_path} -> {d.container_path} ({d.permissions})")
        print("mounts:" + ("" if edits.mounts else " none"))
        for m in edits.mounts:
            print(f"  {m.host_path} -> {m.container_path}{' (ro)' if m.read_only else ''}")
        print("annotations (CDI):" + ("" if edits.annotations else " none"))
        for key, value in sorted(edits.annotations.items()):
            print(f"  {key}={value}")

    async def exporter(self, s: str) -> int:
        section("6. Metrics: gpunode-exporter (dcgm-exporter's names and labels)")
        _, port = await self.start(
            "gpunode-exporter", "--sim-state", s, "--address", "127.0.0.1:0", "--collect-interval", "1000"
        )
        lines = await self.scrape(port, "DCGM_FI_DEV_GPU_TEMP{", 20.0)
        wanted = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED")
        print(f"GET http://127.0.0.1:{port}/metrics (a few of {len(lines)} lines)")
        for prefix in wanted:
            print(next(x for x in lines if x.startswith(prefix + "{")))
        for line in [x for x in lines if 'GPU_I_PROFILE="' in x][:2]:
            print(line)
        return port

    async def scrape(self, port: int, needle: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{port}/metrics"
        while True:
            with contextlib.suppress(OSError):
                body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
                lines = [x for x in body.decode().splitlines() if x and not x.startswith("#")]
                if any(needle in x for x in lines):
                    return lines
            if time.monotonic() > deadline:
                raise DemoError(f"{url} never showed {needle}")
            await asyncio.sleep(0.2)

    async def xid(self, s: str) -> None:
        section(f"7. XID 79 (fell off the bus) on GPU {XID_GPU}: its devices go Unhealthy")
        kubelet = self.kubelet
        assert kubelet is not None
        await self.cmd("gpunode", "sim", "xid", "--state", s, "--gpu", str(XID_GPU), "--xid", "79")

        def some_unhealthy() -> bool:
            return any(kubelet.unhealthy(r) for r in kubelet.plugins)

        await kubelet.wait_for(some_unhealthy, timeout=20.0)
        await asyncio.sleep(0.3)  # let the other resources' streams deliver their updates too
        print("the kubelet emulator now holds:")
        for resource in sorted(kubelet.plugins):
            for device in sorted(kubelet.unhealthy(resource)):
                print(f"  {resource} {device} Unhealthy")
            print(f"  {resource}: {len(kubelet.healthy(resource))} Healthy left")

    async def doctor(self, s: str, exporter_port: int) -> None:
        section("8. gpunode doctor (after gpunode-toolkit sets up CDI and containerd in the host tree)")
        await self.cmd(
            "gpunode-toolkit", "cdi", "generate", "--sim-state", s, "--output", str(self.cdi_spec),
            "--host-root", str(self.host), "--allow-missing-libraries",  # the hook goes into the host tree
        )  # fmt: skip
        containerd = self.host / "etc/containerd"
        containerd.mkdir(parents=True)
        (containerd / "config.toml").write_text("# the demo's containerd config\nversion = 2\n")
        await self.cmd(
            "gpunode-toolkit", "runtime", "configure", "--runtime", "containerd",
            "--config", str(containerd / "config.toml"),
            "--drop-in-config", str(containerd / "conf.d/99-nvidia.toml"), "--restart-mode", "none",
        )  # fmt: skip
        rc, out = await self.cmd(
            "gpunode", "doctor", "--sim-state", s, "--host-root", str(self.host),
            "--mig-config", MIG_LAYOUT, "--exporter-port", str(exporter_port),
            "--gfd-output-file", "/etc/kubernetes/node-feature-discovery/features.d/gfd",
            "--xid-window", "1", check=False,
        )  # fmt: skip
        print(out.rstrip())
        print(f"(doctor exit code {rc}: 1 means a check failed. Expected here: XID 79 on GPU {XID_GPU} was")
        print(" just injected; the simulated host tree runs no nvidia-persistenced, a warning)")


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


async def _main(preset: str) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpunode-demo-") as tmp:
        demo = Demo(Path(tmp), preset)
        failure: BaseException | None = None
        try:
            await demo.walk()
        except (DemoError, TimeoutError, AssertionError, StopIteration) as exc:
            failure = exc
        finally:
            section("9. Stopping everything")
            for name, code in await demo.stop_all():
                print(f"{name} stopped (exit code {code})")
            print("kubelet emulator stopped; temporary directory removed")
    if failure is not None:
        print(f"\ndemo failed: {failure}", file=sys.stderr)
        return 1
    print(f"\ndemo finished in {time.monotonic() - started:.1f} s")
    return 0


def run(preset: str = "dgx-a100") -> int:
    from gpunode.sim import nvml as sim

    try:
        sim.get_preset(preset)
    except sim.UnknownPreset as exc:  # a usage error: say so before anything starts
        print(f"gpunode demo: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(preset))
    except KeyboardInterrupt:
        return 130

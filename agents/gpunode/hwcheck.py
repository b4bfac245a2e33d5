"""`gpunode dev hw-check` (`make hw-check`): the agents on this machine's real GPUs next to the simulator.

On a machine with an NVIDIA GPU and driver it runs every agent read-only, once against real NVML and once
against the simulator preset of the same product (chosen from NVML's product name, e.g. ``NVIDIA H200``
-> ``hgx-h200``; ``--preset`` overrides), and prints where the two differ:

* ``gpunode-feature-discovery --oneshot``: the labels;
* ``gpunode-exporter``: one scrape of ``/metrics``: which series exist and with which labels (values are
  live telemetry and never compared);
* ``gpunode-device-plugin`` with no kubelet (``--kubelet-socket ""``) for a few seconds: the resources and
  device counts it would advertise;
* ``gpunode-toolkit cdi generate`` to a temporary file (``--no-install-hook``: nothing is installed): the
  device names and their device nodes;
* ``gpunode-mig export``: the MIG layout;
* ``gpunode doctor --json``: each check's status.

UUIDs, serial numbers, PCI bus ids and telemetry values are masked before comparing. Nothing here changes
the GPU: no MIG mode or layout change, no clocks, no persistence mode, no reset, no module load; every
file an agent writes (labels, CDI spec, device plugin sockets) goes to a temporary directory whose ``sys``,
``proc``, ``dev``, ``usr`` ... are links to the real ones (``--host-root``), which is removed at the end.
The simulated side gets its own host tree (``gpunode sim init --host-root``). Each step has a deadline;
the whole check takes well under 3 minutes and says what it could not check.

Exit 0: no difference; 1: differences (or a step failed); 2: no NVIDIA driver ("no NVIDIA driver: ..."),
or bad usage. ``--real-sim PRESET`` (``GPUNODE_HWCHECK_REAL_SIM``) stands a simulated node with that
preset in for the real machine: how the check's own tests run it on machines without GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.sim import hosttree
from gpunode.sim.nvml.node import init_state_file
from gpunode.sim.nvml.presets import PRESETS, UnknownPreset, get_preset, preset_names

__all__ = ["choose_preset", "main", "mask"]

PROG = "gpunode dev hw-check"
STEP_TIMEOUT = 45.0  # seconds for one agent run
TOTAL_BUDGET = 170.0  # seconds for the whole check: it finishes within 3 minutes whatever hangs
PLUGIN_WATCH = 4.0  # how long the device plugin runs after it has advertised
INHERITED = ("GPUNODE_SIM_STATE", "GPUNODE_SIMULATE", "GPUNODE_HOST_ROOT", "KUBECONFIG", "NODE_NAME")
OWN_PATHS = ("var/lib/kubelet/device-plugins",)  # the temporary root's own directories; the rest links
NOT_COMPARED = (
    "telemetry values, UUIDs, serial numbers and PCI bus ids (masked on both sides by design)",
    "the CDI spec's driver library mounts and hooks (the simulator has no driver files)",
    "changes: MIG reconfiguration, clocks, persistence, resets (hw-check changes nothing)",
    "health events over time (doctor watches XIDs for 1 s only)",
)

_UUID = re.compile(
    r"\b(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_BARE_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_BUS = re.compile(r"\b[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b")
_SERIAL = re.compile(r"\b\d{10,}\b")
_AGO = re.compile(r"\b\d+(\.\d+)? ?(ms|s|seconds?|min|minutes?) ago\b")


class HwCheckError(Exception):
    """Exit 2 with this message (no driver, bad usage)."""


def mask(text: str) -> str:
    """``text`` with UUIDs, PCI bus ids and serial numbers replaced by placeholders."""
    text = _UUID.sub(lambda m: f"{m[1]}-<uuid>", text)
    text = _BARE_UUID.sub("<uuid>", text)
    text = _BUS.sub("<bus-id>", text)
    return _SERIAL.sub("<serial>", text)


def choose_preset(product: str, gpu_count: int) -> str | None:
    """The preset whose GPUs are all ``product``, the one with ``gpu_count`` GPUs first (else the most)."""
    matches = [
        name
        for name, preset in PRESETS.items()
        if preset.gpus and all(s.product.name == product for s in preset.gpus)
    ]
    if not matches:
        return None
    return sorted(matches, key=lambda n: (len(PRESETS[n].gpus) != gpu_count, -len(PRESETS[n].gpus), n))[0]


# ---------------------------------------------------------------------------------------- the sides


@dataclass
class Side:
    """One node the agents run on: the real machine (``state`` None) or a simulated one."""

    name: str  # "real" or "preset"
    work: Path
    host_root: Path
    state: Path | None
    driver_root: str = "/"  # the real side's driver root (NVIDIA_DRIVER_ROOT), for every agent
    results: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def sim_args(self) -> list[str]:
        """The flags that point an agent at this node: the simulator's state, or the real driver root."""
        if self.state is not None:
            return ["--sim-state", str(self.state)]
        return ["--driver-root", self.driver_root] if self.driver_root != "/" else []


def _real_host_root(directory: Path, own: Sequence[str] = OWN_PATHS) -> Path:
    """A root that shows the real ``/`` (links to every entry) except along the ``own`` paths, which are
    directories of this root (their other entries again links): agents read the host through it and the
    only place they write (the device plugin's sockets) is here."""
    directory.mkdir(parents=True)
    _mirror(directory, Path("/"))
    for path in own:
        here, there = directory, Path("/")
        for part in Path(path).parts:
            here, there = here / part, there / part
            if here.is_symlink():
                here.unlink()
                here.mkdir()
                _mirror(here, there)
            here.mkdir(exist_ok=True)
    return directory


def _mirror(directory: Path, real: Path) -> None:
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(real)):
            target = directory / entry
            if not target.exists() and not target.is_symlink():
                target.symlink_to(real / entry)


def _simulated(work: Path, preset: str, name: str) -> Side:
    state = work / f"{name}.json"
    root = work / f"{name}-host"
    node = init_state_file(state, preset)
    hosttree.build(root, node)
    hosttree.link(state, root)
    return Side(name, work, root, state)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in INHERITED}
    env.update(LOG_FORMAT="json", PYTHONUNBUFFERED="1")
    return env


def _command(name: str) -> list[str]:
    local = Path(sys.executable).parent / name
    return [str(local)] if local.exists() else [name]


async def _spawn(argv: Sequence[str], **kwargs: Any) -> Any:
    """Start ``argv``; a cancellation that lands while the process is being created waits for it and
    kills it, so the check's deadline never leaves an agent behind."""
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(*_command(argv[0]), *argv[1:], **kwargs))
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await _kill(await spawn)
        raise


async def _run(argv: Sequence[str], timeout: float = STEP_TIMEOUT) -> tuple[int, str, str]:
    proc = await _spawn(argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env())
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        await _kill(proc)
        return -1, "", f"did not finish within {timeout:.0f} s"
    except BaseException:  # the check's own deadline: no agent is left behind
        await _kill(proc)
        raise
    return proc.returncode if proc.returncode is not None else -1, out.decode(), err.decode()


async def _long_running(argv: Sequence[str], event: str, log: Path) -> tuple[dict[str, Any] | None, Any]:
    """Start an agent, wait for its JSON log ``event``; returns (the event or None, the process)."""
    handle = log.open("wb")
    proc = await _spawn(argv, stdout=handle, stderr=handle, env=_env())
    deadline = time.monotonic() + STEP_TIMEOUT
    try:
        while time.monotonic() < deadline and proc.returncode is None:
            record = _find_event(log, event)
            if record is not None:
                return record, proc
            await asyncio.sleep(0.1)
    except BaseException:  # the check's own deadline: no agent is left behind
        await _kill(proc)
        raise
    return None, proc


async def _kill(proc: Any) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await asyncio.shield(proc.wait())


def _find_event(log: Path, event: str) -> dict[str, Any] | None:
    """The first JSON log record of ``event`` in ``log``."""
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == event:
                return record
    return None


async def _stop(proc: Any) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            await _kill(proc)
        except BaseException:  # cancelled while it stops: kill it rather than leave it behind
            await _kill(proc)
            raise


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return mask(lines[-1])[:300] if lines else "no output"


# ---------------------------------------------------------------------------------------- the steps


async def step_labels(side: Side) -> None:
    out_file = side.work / f"{side.name}-labels"
    rc, _, err = await _run(
        ["gpunode-feature-discovery", *side.sim_args(), "--oneshot", "--output-file", str(out_file),
         "--host-root", str(side.host_root), "--http-port", "-1"]
    )  # fmt: skip
    if rc != 0 or not out_file.exists():
        side.failures["labels"] = f"gpunode-feature-discovery exited {rc}: {_tail(err)}"
        return
    labels = dict(line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line)
    labels.pop("nvidia.com/gfd.timestamp", None)
    side.results["labels"] = {k: mask(v) for k, v in labels.items()}


async def step_exporter(side: Side) -> None:
    log = side.work / f"{side.name}-exporter.log"
    listening, proc = await _long_running(
        ["gpunode-exporter", *side.sim_args(), "--address", "127.0.0.1:0", "--collect-interval", "1000"],
        "http_listening",
        log,
    )
    try:
        if listening is None:
            side.failures["exporter"] = (
                f"gpunode-exporter never listened: {_tail(log.read_text(errors='replace'))}"
            )
            return
        url = f"http://127.0.0.1:{listening['port']}/metrics"
        series: dict[str, set[str]] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
                series = _series(body)
                if any(name.startswith("DCGM_FI_") for name in series):
                    break
            await asyncio.sleep(0.5)
        if not series:
            side.failures["exporter"] = f"no series at {url} within 20 s"
            return
        side.results["exporter"] = series
    finally:
        await _stop(proc)


def _series(body: str) -> dict[str, set[str]]:
    """metric name -> the label-key sets of its series (``"gpu,UUID,..."``), values ignored."""
    out: dict[str, set[str]] = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        keys = ",".join(sorted(re.findall(r'(\w+)="', rest.partition("}")[0]))) if rest else ""
        out.setdefault(name.split()[0], set()).add(keys)
    return out


async def step_device_plugin(side: Side) -> None:
    log = side.work / f"{side.name}-device-plugin.log"
    (side.host_root / "var/lib/kubelet/device-plugins").mkdir(parents=True, exist_ok=True)
    resources, proc = await _long_running(
        ["gpunode-device-plugin", *side.sim_args(), "--kubelet-socket", "", "--http-port", "-1",
         "--host-root", str(side.host_root), "--mig-strategy", "mixed"],
        "resources",
        log,
    )  # fmt: skip
    try:
        if resources is None:
            side.failures["device-plugin"] = f"nothing advertised: {_tail(log.read_text(errors='replace'))}"
            return
        await asyncio.sleep(PLUGIN_WATCH)  # a few seconds serving: health events and probes run meanwhile
        side.results["device-plugin"] = {str(k): int(v) for k, v in dict(resources["advertised"]).items()}
    finally:
        await _stop(proc)


async def step_cdi(side: Side) -> None:
    spec_file = side.work / f"{side.name}-cdi.json"
    argv = ["gpunode-toolkit", "cdi", "generate", *side.sim_args(), "--output", str(spec_file),
            "--host-root", str(side.host_root), "--no-install-hook", "--disable-hook", "all"]  # fmt: skip
    if side.state is not None:
        argv += ["--allow-missing-libraries"]  # the simulator has no driver files
    rc, _, err = await _run(argv)
    if rc != 0 or not spec_file.exists():
        side.failures["cdi"] = f"gpunode-toolkit cdi generate exited {rc}: {_tail(err)}"
        return
    spec = json.loads(spec_file.read_text())
    devices = {
        mask(f"{spec['kind']}={d['name']}"): sorted(
            n["path"] for n in d.get("containerEdits", {}).get("deviceNodes", [])
        )
        for d in spec.get("devices", [])
    }
    common = sorted(n["path"] for n in spec.get("containerEdits", {}).get("deviceNodes", []))
    side.results["cdi"] = {"devices": devices, "control nodes": common}


async def step_mig(side: Side) -> None:
    rc, out, err = await _run(["gpunode-mig", "export", *side.sim_args()])
    if rc != 0:
        side.failures["mig"] = f"gpunode-mig export exited {rc}: {_tail(err)}"
        return
    side.results["mig"] = mask(out)


async def step_doctor(side: Side) -> None:
    rc, out, err = await _run(
        ["gpunode", "doctor", "--json", *side.sim_args(), "--host-root", str(side.host_root),
         "--exporter-port", "-1", "--xid-window", "1"]
    )  # fmt: skip
    try:
        report = json.loads(out)
    except ValueError:
        side.failures["doctor"] = f"gpunode doctor exited {rc} without a report: {_tail(err)}"
        return
    root = str(side.host_root)
    side.results["doctor"] = {
        c["name"]: (
            c["status"],
            _AGO.sub("<age>", mask(str(c.get("detail", "")).replace(root, "<host-root>"))),
        )
        for c in report["checks"]
    }


STEPS = (
    ("labels", step_labels),
    ("exporter", step_exporter),
    ("device-plugin", step_device_plugin),
    ("cdi", step_cdi),
    ("mig", step_mig),
    ("doctor", step_doctor),
)


# ---------------------------------------------------------------------------------------- comparing


def _mapping_diff(real: Mapping[str, Any], preset: Mapping[str, Any]) -> list[str]:
    lines = []
    for key in sorted(set(real) | set(preset)):
        if key not in preset:
            lines.append(f"  only real:   {key}={real[key]}")
        elif key not in real:
            lines.append(f"  only preset: {key}={preset[key]}")
        elif real[key] != preset[key]:
            lines.append(f"  {key}: real {real[key]} | preset {preset[key]}")
    return lines


def compare(step: str, real: Any, preset: Any) -> list[str]:
    """The differences of one step's results, one line each ([] when equal)."""
    if step == "exporter":
        return _mapping_diff(
            {k: " / ".join(sorted(v)) or "(no labels)" for k, v in real.items()},
            {k: " / ".join(sorted(v)) or "(no labels)" for k, v in preset.items()},
        )
    if step == "cdi":
        lines = _mapping_diff({k: ", ".join(v) for k, v in real["devices"].items()},
                              {k: ", ".join(v) for k, v in preset["devices"].items()})  # fmt: skip
        if real["control nodes"] != preset["control nodes"]:
            lines.append(f"  control nodes: real {real['control nodes']} | preset {preset['control nodes']}")
        return lines
    if step == "mig":
        diff = difflib.unified_diff(
            preset.splitlines(), real.splitlines(), "preset", "real", lineterm="", n=1
        )
        return [f"  {line}" for line in diff]
    if step == "doctor":
        return _mapping_diff({k: f"{s} ({d})" for k, (s, d) in real.items()},
                             {k: f"{s} ({d})" for k, (s, d) in preset.items()})  # fmt: skip
    return _mapping_diff(real, preset)


# ---------------------------------------------------------------------------------------- the command


async def _both(step: str, run_step: Any, sides: Sequence[Side], left: float) -> bool:
    """Run ``step`` on both sides at once; False when ``left`` seconds were not enough (the unfinished
    side's agents are stopped before this returns)."""
    if left < 5:
        return False
    tasks = [asyncio.create_task(run_step(side), name=f"{step}-{side.name}") for side in sides]
    _, pending = await asyncio.wait(tasks, timeout=left)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)  # every task ended, its agents stopped
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # a bug in a step: not a difference to report
    return not pending


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--preset", help="compare with this preset instead of the one matching the GPU's name")
    p.add_argument(
        "--real-sim",
        default=os.environ.get("GPUNODE_HWCHECK_REAL_SIM") or None,
        metavar="PRESET",
        help="stand a simulated node with PRESET in for the real machine (tests) "
        "[env $GPUNODE_HWCHECK_REAL_SIM]",
    )
    p.add_argument(
        "--driver-root",
        default=os.environ.get("NVIDIA_DRIVER_ROOT") or "/",
        metavar="DIR",
        help="where the real driver's files are (/run/nvidia/driver with the driver container) "
        "[env $NVIDIA_DRIVER_ROOT] (default: /)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    return p


async def _real_product(driver_root: str) -> tuple[str, int, str]:
    """(product name, GPU count, driver version) from real NVML; :class:`HwCheckError` without a driver."""
    from gpunode.nvml.errors import NvmlError
    from gpunode.nvml.real import RealNvml

    try:
        nvml = await RealNvml.open(None if driver_root == "/" else driver_root)
    except (NvmlError, OSError) as exc:
        raise HwCheckError(
            f"no NVIDIA driver: NVML could not start ({exc}); install and load the NVIDIA driver "
            "(lsmod | grep nvidia; nvidia-smi) or use --real-sim PRESET to rehearse on the simulator"
        ) from None
    try:
        gpus = await nvml.gpus()
        system = await nvml.system()
    finally:
        await nvml.close()
    if not gpus:
        raise HwCheckError("no NVIDIA driver: NVML started but reports no GPU")
    return gpus[0].name, len(gpus), system.driver_version


async def check(args: argparse.Namespace, work: Path) -> int:
    started = time.monotonic()
    if args.real_sim:
        real_preset = get_preset(args.real_sim)
        product, count = real_preset.gpus[0].product.name, len(real_preset.gpus)
        real = _simulated(work, args.real_sim, "real")
        where = f"a simulated {args.real_sim} node standing in for the real machine (--real-sim)"
    else:
        product, count, driver = await _real_product(args.driver_root)
        real = Side("real", work, _real_host_root(work / "real-host"), None, driver_root=args.driver_root)
        where = f"this machine: {count} x {product}, driver {driver} (real NVML)"
    chosen = args.preset or choose_preset(product, count)
    if chosen is None:
        raise HwCheckError(
            f"no preset has {product!r} GPUs; pass --preset NAME (one of: {', '.join(preset_names())})"
        )
    get_preset(chosen)
    preset = _simulated(work, chosen, "preset")
    print(f"real:   {where}")
    print(f"preset: {chosen} ({PRESETS[chosen].description})")
    if len(PRESETS[chosen].gpus) != count:
        print(f"note: the preset has {len(PRESETS[chosen].gpus)} GPUs, the real side {count}: counts differ")
    differences = 0
    deadline = started + TOTAL_BUDGET
    for step, run_step in STEPS:
        left = deadline - time.monotonic()
        if not await _both(step, run_step, (real, preset), left):
            for side in (real, preset):
                side.failures.setdefault(step, f"the check's {TOTAL_BUDGET:.0f} s budget ran out")
        failed = [f"{s.name}: {s.failures[step]}" for s in (real, preset) if step in s.failures]
        if failed:
            differences += 1
            print(f"\n== {step}: could not check")
            for line in failed:
                print(f"  {line}")
            continue
        lines = compare(step, real.results[step], preset.results[step])
        differences += bool(lines)
        print(f"\n== {step}: " + (f"{len(lines)} difference(s)" if lines else "same"))
        for line in lines:
            print(line)
    print("\nnot compared: " + "; ".join(NOT_COMPARED))
    verdict = "no differences" if not differences else f"{differences} step(s) differ or could not run"
    print(f"hw-check finished in {time.monotonic() - started:.1f} s: {verdict}")
    return 1 if differences else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    keep = args.keep
    work = Path(tempfile.mkdtemp(prefix="gpunode-hw-check-"))
    try:
        return asyncio.run(check(args, work))
    except (HwCheckError, UnknownPreset) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    finally:
        if keep:
            print(f"(kept {work})")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)

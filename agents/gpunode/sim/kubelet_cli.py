"""`gpunode dev kubelet --dir DIR`: the kubelet emulator on DIR/kubelet.sock, for device plugin authors.

It serves the kubelet's `Registration` service (Device Plugin API v1beta1) until interrupted, dials back
every plugin that registers, keeps one `ListAndWatch` stream per resource and prints each registration and
each device list update (counts by health, and which devices changed health).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import signal
import sys
from pathlib import Path

from gpunode.sim.kubelet import FakeKubelet


def add_arguments(dev: argparse.ArgumentParser) -> None:
    """The sub-commands of `gpunode dev`."""
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="COMMAND")
    kubelet = dev_sub.add_parser(
        "kubelet",
        help="serve the kubelet's device plugin Registration service on DIR/kubelet.sock",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kubelet.add_argument(
        "--dir",
        required=True,
        type=Path,
        help="the device plugin directory (like /var/lib/kubelet/device-plugins); created if missing",
    )
    # `gpunode dev cluster` runs gpunode.devcluster (the umbrella hands it over before parsing: it needs the
    # operator, above this layer); listed here for `gpunode dev --help`.
    dev_sub.add_parser("cluster", help="rehearse gpunode-operator on a simulated cluster (--nodes N)")
    dev_sub.add_parser("hw-check", help="every agent on real NVML vs the matching preset (read-only)")


def _say(text: str) -> None:
    print(text, flush=True)


def _summary(devices: dict[str, str]) -> str:
    healthy = sum(1 for h in devices.values() if h == "Healthy")
    return f"{len(devices)} devices, {healthy} Healthy, {len(devices) - healthy} Unhealthy"


async def _report(kubelet: FakeKubelet) -> None:
    """Print every registration and every device list the plugins send (polling the emulator's state)."""
    seen_regs = 0
    seen: dict[str, tuple[int, dict[str, str], bool]] = {}  # resource -> (updates, devices, ended)
    while True:
        with contextlib.suppress(TimeoutError):
            await kubelet.wait_for(functools.partial(_changed, kubelet, seen_regs, seen), timeout=1.0)
        for resource, _ in kubelet.registrations[seen_regs:]:
            plugin = kubelet.plugins.get(resource)
            endpoint = plugin.endpoint if plugin else "?"
            _say(f"registered {resource} (endpoint {endpoint})")
        seen_regs = len(kubelet.registrations)
        for resource, plugin in list(kubelet.plugins.items()):
            updates, before, ended = seen.get(resource, (0, {}, False))
            if plugin.updates != updates:
                changed = sorted(i for i, h in plugin.devices.items() if before.get(i, h) != h)
                detail = "".join(f"\n  {i}: {plugin.devices[i]}" for i in changed)
                _say(f"ListAndWatch {resource}: {_summary(plugin.devices)}{detail}")
            if plugin.ended and not ended:
                _say(f"ListAndWatch {resource}: stream ended (the kubelet marks its devices unhealthy)")
            seen[resource] = (plugin.updates, dict(plugin.devices), plugin.ended)


def _changed(kubelet: FakeKubelet, seen_regs: int, seen: dict[str, tuple[int, dict[str, str], bool]]) -> bool:
    if len(kubelet.registrations) != seen_regs:
        return True
    for resource, plugin in kubelet.plugins.items():
        updates, _, ended = seen.get(resource, (0, {}, False))
        if plugin.updates != updates or plugin.ended != ended:
            return True
    return False


async def serve(plugin_dir: Path) -> int:
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    _say(f"kubelet emulator serving {kubelet.socket} (Device Plugin API v1beta1); Ctrl-C to stop")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reporter = asyncio.create_task(_report(kubelet), name="report")
    try:
        await stop.wait()
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        await kubelet.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    _say("kubelet emulator stopped")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(serve(args.dir))
    except OSError as exc:
        print(f"gpunode dev kubelet: {exc}", file=sys.stderr)
        return 1

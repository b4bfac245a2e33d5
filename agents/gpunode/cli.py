"""`gpunode`: the umbrella command (sim, demo, doctor, render, dev, test-apiserver, fake-host, version)."""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Protocol, cast

from gpunode import __version__
from gpunode.common.settings import SettingsParser, setting

# The commands of the simulated world: (module, help). Their modules load only when one of them runs, so
# `gpunode version` and the rest never import gpunode.sim.
SIM_COMMANDS = {
    "sim": ("gpunode.sim.nvml.cli", "drive a simulated GPU node shared through a state file"),
    "test-apiserver": (
        "gpunode.sim.apiserver_cli",
        "serve a test Kubernetes API server on 127.0.0.1 (nodes, pods, NodeFeatures) until interrupted",
    ),
    "fake-host": ("gpunode.sim.host_cli", "build a fake host tree for gpunode-driver-loader to work on"),
    "dev": (
        "gpunode.sim.kubelet_cli",
        "development helpers (dev kubelet: a kubelet emulator; dev cluster: rehearse gpunode-operator)",
    ),
}


@dataclass(frozen=True)
class DemoSettings:
    """`gpunode demo`'s flags."""

    preset: str = setting("--preset", default="dgx-a100", default_help="")


class _Tool(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _sim_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None, name: str
) -> _Tool | None:
    """Add the simulated world's command `name`; its flags (and its module, returned) only if it is the
    `command` given: the others need just their help line."""
    module, help_text = SIM_COMMANDS[name]
    parser = sub.add_parser(name, help=help_text)
    if command != name:
        return None
    tool = cast(_Tool, importlib.import_module(module))
    tool.add_arguments(parser)
    return tool


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "doctor":  # its own settings (flags with env vars): hand everything over
        from gpunode.doctor import main as doctor

        return doctor(raw[1:])
    if raw and raw[0] == "render":  # the ClusterPolicy renderer has its own flags too
        from gpunode.deploy.render_cli import main as render

        return render(raw[1:])
    if raw[:2] == ["dev", "cluster"]:  # needs the operator and the renderer: a commands-layer module
        from gpunode.devcluster import main as dev_cluster

        return dev_cluster(raw[2:])
    if raw[:2] == ["dev", "hw-check"]:  # runs every agent on real NVML and on the matching preset
        from gpunode.hwcheck import main as hw_check

        return hw_check(raw[2:])
    command = raw[0] if raw else None
    parser = argparse.ArgumentParser(
        prog="gpunode", description="GPU node agents and their simulated GPU node"
    )
    parser.add_argument("--version", action="version", version=f"gpunode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim = _sim_command(sub, command, "sim")
    demo = sub.add_parser("demo", help="walk through the simulated dgx-a100 node")
    demo_flags = SettingsParser(DemoSettings, prog="gpunode demo", parser=demo)
    sub.add_parser("version", help="print the version")
    sub.add_parser("doctor", help="check this node end to end and say what to fix (gpunode doctor --help)")
    sub.add_parser("render", help="Kubernetes manifests from a ClusterPolicy (gpunode render --help)")
    tools = [_sim_command(sub, command, name) for name in ("test-apiserver", "fake-host", "dev")]
    args = parser.parse_args(argv)
    for tool in (sim, *tools):
        if tool is not None:  # the simulated world's command given
            return tool.run(args)
    if args.command == "version":
        print(f"gpunode {__version__}")
        return 0
    if args.command == "demo":
        from gpunode import demo as demo_mod

        settings, _sources = demo_flags.resolve(vars(args), {}, None)
        return demo_mod.run(settings.preset)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse allows only the commands above


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

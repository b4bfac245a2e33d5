"""`gpunode`: the umbrella command (sim, demo, doctor, render, dev, test-apiserver, fake-host, version)."""

from __future__ import annotations

import argparse
import sys

from gpunode import __version__


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "doctor":  # its own flags (FlagSet with env vars): hand everything over
        from gpunode.validator.doctor import main as doctor

        return doctor(raw[1:])
    if raw and raw[0] == "render":  # the ClusterPolicy renderer has its own flags too
        from gpunode.deploy.render_cli import main as render

        return render(raw[1:])
    from gpunode.nvml.sim import cli as sim_cli

    parser = argparse.ArgumentParser(
        prog="gpunode", description="GPU node agents and their simulated GPU node"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim_cli.add_parser(sub)
    demo = sub.add_parser("demo", help="walk through the simulated dgx-a100 node")
    demo.add_argument("--preset", default="dgx-a100")
    sub.add_parser("version", help="print the version")
    sub.add_parser("doctor", help="check this node end to end and say what to fix (gpunode doctor --help)")
    sub.add_parser("render", help="Kubernetes manifests from a ClusterPolicy (gpunode render --help)")
    from gpunode.testing import apiserver_cli, fake_host_cli, kubelet_cli

    apiserver_cli.add_parser(sub)
    fake_host_cli.add_parser(sub)
    kubelet_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "dev":
        return kubelet_cli.run(args)
    if args.command == "test-apiserver":
        return apiserver_cli.run(args)
    if args.command == "fake-host":
        return fake_host_cli.run(args)
    if args.command == "version":
        print(f"gpunode {__version__}")
        return 0
    if args.command == "demo":
        from gpunode import demo as demo_mod

        return demo_mod.run(args.preset)
    return sim_cli.run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

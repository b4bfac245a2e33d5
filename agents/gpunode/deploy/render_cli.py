"""``gpunode render``: a ClusterPolicy -> Kubernetes manifests (multi-document YAML).

    gpunode render --policy FILE [--strict] [--images] [--namespace NS] [--image IMAGE] [-o DIR|-]

``-o -`` (the default) prints every manifest; ``-o DIR`` writes ``common.yaml`` and one file per agent, each
atomically (a symlink at a file's name is replaced, not followed).
``--images`` prints the images the policy needs, one a line (for air-gapped mirroring). Exit 2 for a
malformed policy (file, YAML path, reason), or with ``--strict`` for unknown or unsupported fields.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gpunode.api.clusterpolicy import load_policy
from gpunode.common.atomic import atomic_write
from gpunode.common.errors import ConfigError
from gpunode.common.settings import SettingsParser, setting
from gpunode.deploy.render import dump_yaml, images, render, render_by_agent

__all__ = ["RenderSettings", "main"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class RenderSettings:
    """`gpunode render`'s flags (no env vars: a policy file says everything)."""

    policy: str = setting("--policy", required=True, metavar="FILE", help="a ClusterPolicy YAML file")
    strict: bool = setting(
        "--strict",
        type=bool,
        default=False,
        negatable=False,
        default_help="",
        help="unknown or unsupported fields are errors (exit 2)",
    )
    images: bool = setting(
        "--images",
        type=bool,
        default=False,
        negatable=False,
        default_help="",
        help="print the images the policy needs and exit",
    )
    namespace: str = setting("--namespace", default="gpunode", help="namespace of the agents")
    image: str | None = setting("--image", help="the gpunode image (default: spec.gpunode, or ours)")
    output: str = setting(
        "--output",
        short="-o",
        default="-",
        default_help="",
        metavar="DIR|-",
        help="a directory, or - for stdout",
    )


def parser() -> SettingsParser[RenderSettings]:
    return SettingsParser(
        RenderSettings,
        prog="gpunode render",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.HelpFormatter,
        allow_abbrev=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse(list(sys.argv[1:] if argv is None else argv), {}).settings
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    if not _DNS_LABEL.match(args.namespace):
        print(f"gpunode render: error: --namespace {args.namespace!r}: not a DNS label", file=sys.stderr)
        return 2
    try:
        loaded = load_policy(args.policy, strict=args.strict)
    except ConfigError as exc:
        print(f"gpunode render: error: {exc}", file=sys.stderr)
        return 2
    for warning in loaded.warnings:
        print(f"gpunode render: warning: {args.policy}: {warning}", file=sys.stderr)
    if args.images:
        for image in images(loaded.policy, args.image):
            print(image)
        return 0
    if args.output == "-":
        sys.stdout.write(dump_yaml(render(loaded.policy, namespace=args.namespace, image=args.image)))
        return 0
    try:
        os.makedirs(args.output, exist_ok=True)
        for key, objs in render_by_agent(loaded.policy, namespace=args.namespace, image=args.image).items():
            # Atomic: a reader (kubectl apply -f DIR) never sees half a file, and a symlink planted at the
            # file's name is replaced, never written through.
            atomic_write(os.path.join(args.output, f"{key}.yaml"), dump_yaml(objs), 0o644)
    except OSError as exc:
        print(f"gpunode render: error: {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0

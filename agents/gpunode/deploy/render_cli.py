"""``gpunode render``: a ClusterPolicy -> Kubernetes manifests (multi-document YAML).

    gpunode render --policy FILE [--strict] [--images] [--namespace NS] [--image IMAGE] [-o DIR|-]

``-o -`` (the default) prints every manifest; ``-o DIR`` writes ``common.yaml`` and one file per agent.
``--images`` prints the images the policy needs, one a line (for air-gapped mirroring). Exit 2 for a
malformed policy (file, YAML path, reason), or with ``--strict`` for unknown or unsupported fields.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from gpunode.api.clusterpolicy import load_policy
from gpunode.common.errors import ConfigError
from gpunode.deploy.render import dump_yaml, images, render, render_by_agent

__all__ = ["main"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpunode render", description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", required=True, metavar="FILE", help="a ClusterPolicy YAML file")
    p.add_argument("--strict", action="store_true", help="unknown or unsupported fields are errors (exit 2)")
    p.add_argument("--images", action="store_true", help="print the images the policy needs and exit")
    p.add_argument("--namespace", default="gpunode", help="namespace of the agents (default: gpunode)")
    p.add_argument("--image", default=None, help="the gpunode image (default: spec.gpunode, or ours)")
    p.add_argument("-o", "--output", default="-", metavar="DIR|-", help="a directory, or - for stdout")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
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
            with open(os.path.join(args.output, f"{key}.yaml"), "w", encoding="utf-8") as fh:
                fh.write(dump_yaml(objs))
    except OSError as exc:
        print(f"gpunode render: error: {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0

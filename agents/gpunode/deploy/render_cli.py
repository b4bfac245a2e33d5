"""``gpunode render``: a ClusterPolicy -> Kubernetes manifests (multi-document YAML).

    gpunode render --policy FILE [--operator] [--strict] [--images] [--namespace NS] [--image IMAGE]
                   [--nfd-image IMAGE] [-o DIR|-]

``-o -`` (the default) prints every manifest; ``-o DIR`` writes ``common.yaml``, ``nfd.yaml`` (with
``spec.nfd.enabled``) and one file per agent, each atomically (a symlink at a file's name is replaced, not
followed). ``--operator`` prints the install of gpunode-operator instead (the ClusterPolicy CRD, the
namespace, the operator with its RBAC, NFD, and the policy itself); with ``-o DIR`` as ``1-crds.yaml``,
``2-operator.yaml``, ``3-nfd.yaml`` and ``4-clusterpolicy.yaml`` (apply order).
``--values FILE`` reads the GPU Operator Helm chart's values instead of a ClusterPolicy and maps them as
NVIDIA's chart does (:mod:`gpunode.api.helm_values`; a key the chart does not have is a warning naming its
YAML path); it cannot be combined with ``--policy``.
With ``--operator`` and neither ``--policy`` nor ``--values``, the policy is the GPU Operator's defaults
(a ClusterPolicy ``cluster-policy`` with an empty spec), as ``helm install`` with no values gives.
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

from gpunode.api.clusterpolicy import LoadedPolicy, load_policy, parse_policy_text
from gpunode.api.helm_values import LoadedValues, load_values
from gpunode.common.atomic import atomic_write
from gpunode.common.errors import ConfigError
from gpunode.common.settings import SettingsParser, setting
from gpunode.deploy.operator_install import render_operator, render_operator_by_part
from gpunode.deploy.render import dump_yaml, images, render, render_by_agent

__all__ = ["RenderSettings", "main"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class RenderSettings:
    """`gpunode render`'s flags (no env vars: a policy file says everything)."""

    policy: str | None = setting("--policy", metavar="FILE", help="a ClusterPolicy YAML file")
    values: str | None = setting(
        "--values",
        metavar="FILE",
        help="the GPU Operator Helm chart's values, mapped to a ClusterPolicy as NVIDIA's chart does "
        "(instead of --policy)",
    )
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
    nfd_image: str | None = setting(
        "--nfd-image", metavar="IMAGE", help="Node Feature Discovery's image (default: the pinned release)"
    )
    operator: bool = setting(
        "--operator",
        type=bool,
        default=False,
        negatable=False,
        default_help="",
        help="print the install of gpunode-operator (CRD, namespace, operator, RBAC, NFD, the policy)",
    )
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


# ``--operator`` alone: the GPU Operator's defaults, as the chart installs them with no values.
DEFAULTS_NAME = "(the GPU Operator's defaults)"
DEFAULT_POLICY = (
    "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata:\n  name: cluster-policy\nspec: {}\n"
)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse(list(sys.argv[1:] if argv is None else argv), {}).settings
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    if not _DNS_LABEL.match(args.namespace):
        print(f"gpunode render: error: --namespace {args.namespace!r}: not a DNS label", file=sys.stderr)
        return 2
    if args.policy is not None and args.values is not None:
        print("gpunode render: error: argument --values: not allowed with argument --policy", file=sys.stderr)
        return 2
    source = args.values if args.values is not None else args.policy
    if source is None and not args.operator:
        print("gpunode render: error: one of the arguments --policy --values is required", file=sys.stderr)
        return 2
    try:
        if source is None:
            source = DEFAULTS_NAME
            loaded: LoadedPolicy | LoadedValues = parse_policy_text(DEFAULT_POLICY, source)
        elif args.values is not None:
            loaded = load_values(args.values, strict=args.strict)
        else:
            loaded = load_policy(source, strict=args.strict)
    except ConfigError as exc:
        print(f"gpunode render: error: {exc}", file=sys.stderr)
        return 2
    for warning in loaded.warnings:
        print(f"gpunode render: warning: {source}: {warning}", file=sys.stderr)
    if isinstance(loaded, LoadedValues) and loaded.outside:
        shown = ", ".join(loaded.outside[:10]) + (
            f" and {len(loaded.outside) - 10} more" if len(loaded.outside) > 10 else ""
        )
        print(
            f"gpunode render: note: {source}: not part of the ClusterPolicy, not used: {shown}",
            file=sys.stderr,
        )
    if args.images:
        for name in images(loaded.policy, args.image, args.nfd_image):
            print(name)
        return 0
    policy, ns, image, nfd_image = loaded.policy, args.namespace, args.image, args.nfd_image
    if args.output == "-":
        if args.operator:
            objs = render_operator(policy, namespace=ns, image=image, nfd_image=nfd_image)
        else:
            objs = render(policy, namespace=ns, image=image, nfd_image=nfd_image)
        sys.stdout.write(dump_yaml(objs))
        return 0
    if args.operator:
        parts = {
            f"{i}-{part}": objs
            for i, (part, objs) in enumerate(
                render_operator_by_part(policy, namespace=ns, image=image, nfd_image=nfd_image).items(), 1
            )
            if objs
        }
    else:
        parts = render_by_agent(policy, namespace=ns, image=image, nfd_image=nfd_image)
    try:
        os.makedirs(args.output, exist_ok=True)
        for key, objs in parts.items():
            # Atomic: a reader (kubectl apply -f DIR) never sees half a file, and a symlink planted at the
            # file's name is replaced, never written through.
            atomic_write(os.path.join(args.output, f"{key}.yaml"), dump_yaml(objs), 0o644)
    except OSError as exc:
        print(f"gpunode render: error: {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0

"""gpunode-toolkit: CDI specs and container runtime configuration for NVIDIA GPUs.

    gpunode-toolkit cdi generate [--output /var/run/cdi/nvidia.yaml] [--watch] [...]
    gpunode-toolkit cdi list
    gpunode-toolkit runtime configure --runtime containerd|crio [--dry-run] [--revert] [...]

Exit 0 on success, 1 on failure, 2 on bad usage or configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpunode.common.cli import split_verb

GROUPS = ("cdi", "runtime")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    split = split_verb("gpunode-toolkit", argv, GROUPS, __doc__)
    if isinstance(split, int):
        return split
    group, rest = split
    if group == "cdi":
        from gpunode.toolkit import cdi_cli

        return cdi_cli.main(rest, environ)
    from gpunode.toolkit import runtime_cli

    return runtime_cli.main(rest, environ)

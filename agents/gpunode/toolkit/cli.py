"""gpunode-toolkit: CDI specs and container runtime configuration for NVIDIA GPUs.

    gpunode-toolkit cdi generate [--output /var/run/cdi/nvidia.yaml] [--watch] [...]
    gpunode-toolkit cdi list
    gpunode-toolkit runtime configure --runtime containerd|crio [--dry-run] [--revert] [...]
    gpunode-toolkit hook install|uninstall [--hook-path PATH] [--host-root DIR]

Exit 0 on success, 1 on failure, 2 on bad usage or configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpunode.agent.main import AgentSpec
from gpunode.common.cli import split_verb
from gpunode.toolkit import cdi_cli, hook_cli, runtime_cli
from gpunode.toolkit.settings import (
    CdiGenerateSettings,
    CdiListSettings,
    ConfigureSettings,
    HookSettings,
    RuntimeSettings,
)

__all__ = ["SPECS", "main"]

Main = Callable[[Sequence[str] | None, Mapping[str, str] | None], int]

#: Each group's own `main` (``gpunode-toolkit GROUP VERB [flags]``).
GROUPS: Mapping[str, Main] = {"cdi": cdi_cli.main, "runtime": runtime_cli.main, "hook": hook_cli.main}

#: Every verb's spec, by ``"GROUP VERB"`` (what the registry lists).
SPECS: Mapping[
    str,
    AgentSpec[CdiGenerateSettings]
    | AgentSpec[CdiListSettings]
    | AgentSpec[ConfigureSettings]
    | AgentSpec[RuntimeSettings]
    | AgentSpec[HookSettings],
] = {
    **{f"cdi {verb}": spec for verb, spec in cdi_cli.SPECS.items()},
    **{f"runtime {verb}": spec for verb, spec in runtime_cli.SPECS.items()},
    **{f"hook {verb}": spec for verb, spec in hook_cli.SPECS.items()},
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    try:
        split = split_verb("gpunode-toolkit", argv, tuple(GROUPS), __doc__)
        if isinstance(split, int):
            return split
        group, rest = split
        return GROUPS[group](rest, environ)
    except BrokenPipeError:  # `gpunode-toolkit ... | head`: the reader left; end quietly
        cdi_cli.print_quietly("")
        return 0

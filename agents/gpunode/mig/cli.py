"""gpunode-mig: apply, assert and export MIG layouts in mig-parted's `version: v1` format.

    gpunode-mig apply  -f config.yaml -c all-balanced [--mode-only] [--skip-reset] [-k hooks.yaml] [--dry-run]
    gpunode-mig assert -f config.yaml -c all-balanced [--mode-only] [--valid-config]
    gpunode-mig export [-o yaml|json] [-l current]
    gpunode-mig generate-config [-f out.yaml] [-o yaml|json]
    gpunode-mig checkpoint -f state.json  |  gpunode-mig restore -f state.json

Exit 0 on success, 1 on failure (nothing changed when a layout is infeasible), 2 on bad usage or config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpunode.agent.main import AgentContext, AgentSpec, Started, verbs_main
from gpunode.common.errors import UsageError
from gpunode.mig.settings import (
    ApplySettings,
    AssertSettings,
    CheckpointSettings,
    ExportSettings,
    GenerateConfigSettings,
    RestoreSettings,
    VerbSettings,
)

__all__ = ["SPECS", "main"]

AGENT = "mig"
PROG = "gpunode-mig"


def _debug_logging(s: VerbSettings) -> None:
    """``--debug`` logs at debug level whatever ``--log-level`` says."""
    if s.debug:
        from gpunode.common.logging import configure_logging

        common = s.common
        configure_logging(common.log_format, "debug", agent=AGENT, node=common.node_name)


def start_apply(ctx: AgentContext[ApplySettings]) -> Started:
    from gpunode.mig import commands

    _debug_logging(ctx.settings)
    selected = commands.load_selected(ctx.settings)
    return Started(lambda: commands.apply(ctx.settings, selected))


def start_assert(ctx: AgentContext[AssertSettings]) -> Started | int:
    from gpunode.mig import commands

    _debug_logging(ctx.settings)
    selected = commands.load_selected(ctx.settings)
    if ctx.settings.valid_config:
        print("Selected MIG configuration is valid")
        return 0
    return Started(lambda: commands.assert_applied(ctx.settings, selected))


def start_export(ctx: AgentContext[ExportSettings]) -> Started:
    from gpunode.mig import commands

    _debug_logging(ctx.settings)
    return Started(lambda: commands.export(ctx.settings))


def start_generate(ctx: AgentContext[GenerateConfigSettings]) -> Started:
    from gpunode.mig import commands

    _debug_logging(ctx.settings)
    return Started(lambda: commands.generate_config(ctx.settings))


def start_checkpoint(ctx: AgentContext[CheckpointSettings]) -> Started:
    from gpunode.mig import commands

    _debug_logging(ctx.settings)
    if not ctx.settings.checkpoint_file:
        raise UsageError("--checkpoint-file (-f) is required")  # before NVML is opened
    return Started(lambda: commands.checkpoint(ctx.settings))


def start_restore(ctx: AgentContext[RestoreSettings]) -> Started:
    from gpunode.mig import commands

    _debug_logging(ctx.settings)
    if not ctx.settings.checkpoint_file:
        raise UsageError("--checkpoint-file (-f) is required")  # before NVML is opened
    return Started(lambda: commands.restore(ctx.settings))


SPECS: dict[str, AgentSpec[Any]] = {  # Any: each verb has its own settings class
    "apply": AgentSpec(AGENT, PROG, ApplySettings, start_apply, __doc__, verb="apply"),
    "assert": AgentSpec(AGENT, PROG, AssertSettings, start_assert, __doc__, verb="assert"),
    "export": AgentSpec(AGENT, PROG, ExportSettings, start_export, __doc__, verb="export"),
    "generate-config": AgentSpec(
        AGENT, PROG, GenerateConfigSettings, start_generate, __doc__, verb="generate-config"
    ),
    "checkpoint": AgentSpec(AGENT, PROG, CheckpointSettings, start_checkpoint, __doc__, verb="checkpoint"),
    "restore": AgentSpec(AGENT, PROG, RestoreSettings, start_restore, __doc__, verb="restore"),
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    return verbs_main(PROG, SPECS, argv, environ, usage=__doc__)

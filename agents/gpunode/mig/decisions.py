"""The MIG manager's pure decisions: what handling a config name comes to (:func:`decide`), the values of
the ``nvidia.com/mig.config.state`` label, and the one-line reasons users read on the node.

Nothing here does I/O; the state machine that acts on a :class:`Decision` is
:class:`gpunode.mig.manager.MigManager`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpunode.common import errors as common_errors
from gpunode.common.errors import ConfigError
from gpunode.mig.apply import RebootRequired
from gpunode.mig.plan import Infeasible
from gpunode.mig.selection import SelectionError
from gpunode.nvml import errors as nvml_errors

__all__ = [
    "AFTER_REBOOT",
    "CONFIG_LABEL",
    "REASON_ANNOTATION",
    "STATES",
    "STATE_LABEL",
    "Decision",
    "State",
    "decide",
    "describe_error",
    "one_line",
    "unknown_config_reason",
]

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
REASON_ANNOTATION = "nvidia.com/mig.config.state-reason"
STATES = ("pending", "rebooting", "success", "failed")
MAX_REASON = 1000
AFTER_REBOOT = "MIG mode change did not take effect after rebooting"

State = Literal["pending", "rebooting", "success", "failed"]


def one_line(text: str, limit: int = MAX_REASON) -> str:
    """``text`` as one line of at most ``limit`` characters (a reason for an annotation or a file)."""
    return common_errors.one_line(text, limit)


def unknown_config_reason(name: str, available: Sequence[str]) -> str:
    return f'unknown MIG config "{name}"; the configs are: {", ".join(available)}'


@dataclass(frozen=True)
class Decision:
    """What handling a config name comes to before anything changes."""

    action: Literal["nothing", "success", "failed", "apply"]
    reason: str = ""
    mode_change: bool = False


def decide(
    name: str | None,
    configs: Sequence[str],
    *,
    applied: bool | None = None,
    plan_error: str | None = None,
    mode_change: bool = False,
    previous_state: str | None = None,
) -> Decision:
    """The decision for config ``name`` given what was found out about it: ``applied`` (the layout is
    in place; None: not checked), ``plan_error`` (why it cannot be planned), ``mode_change`` (a MIG
    mode change is still needed) and the state written before (``rebooting`` guards the reboot loop)."""
    if not name:
        return Decision("nothing")
    if name not in configs:
        return Decision("failed", unknown_config_reason(name, configs))
    if plan_error:
        return Decision("failed", plan_error)
    if applied:
        return Decision("success")
    if mode_change and previous_state == "rebooting":
        return Decision("failed", AFTER_REBOOT, mode_change=True)
    return Decision("apply", mode_change=mode_change)


def describe_error(exc: BaseException) -> str:
    """A failure as the one-line reason users read on the node."""
    if isinstance(exc, Infeasible | SelectionError | RebootRequired | ConfigError):
        return str(exc)
    if isinstance(exc, nvml_errors.NvmlError):
        return f"NVML: {exc}"
    text = str(exc)
    return text if text and type(exc).__module__.startswith("gpunode") else f"{type(exc).__name__}: {text}"

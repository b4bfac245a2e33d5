"""mig-parted's hooks file (``version: v1``, shared/reference/mig.md §1.5), read strictly.

::

    version: v1
    hooks:
      apply-start:      [{command: /bin/bash, args: ["-c", "..."], envs: {K: V}, workdir: /etc/x}]
      pre-apply-mode:   [...]   # only when a MIG mode change is needed
      pre-apply-config: [...]   # only when the MIG devices differ
      apply-exit:       [...]   # always, even after a failure

Commands and working directories must be absolute paths: a hook inherits nothing from its caller's
environment (not even ``PATH``). Running the commands is the MIG agent's business
(``gpunode.mig.hooks.run_hooks``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpunode.common.config import load_config, parse_config_text

__all__ = [
    "HOOK_NAMES",
    "HookCommand",
    "HookName",
    "HooksSpec",
    "load_hooks",
    "parse_hooks",
]

HookName = Literal["apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"]
HOOK_NAMES: tuple[HookName, ...] = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")


class _V1Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class HookCommand(_V1Model):
    """One command of a hook."""

    command: str
    args: tuple[str, ...] = ()
    envs: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None

    @field_validator("command")
    @classmethod
    def _absolute_command(cls, value: str) -> str:
        if not os.path.isabs(value):
            raise ValueError(
                f"must be an absolute path (hooks do not inherit PATH), not {value!r}"
                if value
                else "must be an absolute path, not empty"
            )
        return value

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError(f"must be an absolute path, not {value!r}")
        return value

    @field_validator("envs")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [name for name in value if not name or "=" in name or "\0" in name]
        if bad:
            raise ValueError(f"not valid environment variable names: {', '.join(map(repr, bad))}")
        return value


class _Hooks(_V1Model):
    apply_start: tuple[HookCommand, ...] = Field(default=(), alias="apply-start")
    pre_apply_mode: tuple[HookCommand, ...] = Field(default=(), alias="pre-apply-mode")
    pre_apply_config: tuple[HookCommand, ...] = Field(default=(), alias="pre-apply-config")
    apply_exit: tuple[HookCommand, ...] = Field(default=(), alias="apply-exit")


class _HooksFile(_V1Model):
    version: Literal["v1"]
    hooks: _Hooks = _Hooks()


@dataclass(frozen=True)
class HooksSpec:
    """A validated hooks file: the commands of each hook, in order."""

    source: str
    hooks: Mapping[str, tuple[HookCommand, ...]]  # keyed by the HOOK_NAMES

    def commands(self, name: str) -> tuple[HookCommand, ...]:
        return self.hooks.get(name, ())


def _to_spec(model: _HooksFile, source: str) -> HooksSpec:
    h = model.hooks
    hooks: dict[str, tuple[HookCommand, ...]] = {
        "apply-start": h.apply_start,
        "pre-apply-mode": h.pre_apply_mode,
        "pre-apply-config": h.pre_apply_config,
        "apply-exit": h.apply_exit,
    }
    return HooksSpec(source, hooks)


def parse_hooks(text: str, source: str) -> HooksSpec:
    """Validate hooks ``text`` (YAML or JSON); :class:`ConfigError` lists every problem with its path."""
    return _to_spec(parse_config_text(text, source, _HooksFile), source)


def load_hooks(path: str | os.PathLike[str] | Path) -> HooksSpec:
    """Read and validate a hooks file; an unreadable file is a :class:`ConfigError` too."""
    name = os.fspath(path)
    return _to_spec(load_config(name, _HooksFile), name)

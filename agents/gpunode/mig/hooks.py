"""mig-parted's hooks file (``version: v1``) and running its commands (shared/reference/mig.md §1.5).

::

    version: v1
    hooks:
      apply-start:      [{command: /bin/bash, args: ["-c", "..."], envs: {K: V}, workdir: /etc/x}]
      pre-apply-mode:   [...]   # only when a MIG mode change is needed
      pre-apply-config: [...]   # only when the MIG devices differ
      apply-exit:       [...]   # always, even after a failure

The commands of one hook run in order; the first that fails (non-zero exit, timeout, cannot start)
stops the list with :class:`HookFailed`. As in mig-parted, a hook inherits nothing from our
environment: it sees its own ``envs`` overlaid with the ``MIG_PARTED_*`` values the caller passes
(those win), so commands and their arguments need absolute paths. Which hooks run when, and what a
failing ``apply-exit`` means, is the caller's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpunode.common.config import load_config, parse_config_text

__all__ = [
    "DEFAULT_HOOK_TIMEOUT_S",
    "HOOK_NAMES",
    "HookCommand",
    "HookFailed",
    "HookName",
    "HooksSpec",
    "load_hooks",
    "parse_hooks",
    "run_hooks",
]

HookName = Literal["apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"]
HOOK_NAMES: tuple[HookName, ...] = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
DEFAULT_HOOK_TIMEOUT_S = 300.0
_TAIL_CHARS = 2000
_REAP_S = 5.0  # after a kill, how long to wait for the pipes to close


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


class HookFailed(Exception):
    """A hook command failed: exited non-zero (``returncode``), timed out or could not start (``None``)."""

    def __init__(
        self, name: str, command: str, returncode: int | None, stderr_tail: str, reason: str = ""
    ) -> None:
        self.name = name
        self.command = command
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.reason = reason or f"exited with status {returncode}"
        super().__init__(name, command, returncode, stderr_tail)

    def __str__(self) -> str:
        text = f"{self.name} hook {self.command}: {self.reason}"
        tail = self.stderr_tail.strip()
        return f"{text}: {tail.splitlines()[-1]}" if tail else text


def _tail(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")[-_TAIL_CHARS:]


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The hook runs in its own session, so this reaches whatever it started as well.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _output(talk: asyncio.Task[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    if talk.done() and not talk.cancelled() and talk.exception() is None:
        return talk.result()
    return b"", b""


async def _reap(proc: asyncio.subprocess.Process, talk: asyncio.Task[tuple[bytes, bytes]]) -> None:
    _kill_group(proc)
    try:
        await asyncio.wait_for(asyncio.shield(talk), _REAP_S)
    except (TimeoutError, asyncio.CancelledError):
        talk.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await talk
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), _REAP_S)


async def _run_one(name: str, hook: HookCommand, env: dict[str, str], timeout: float, log: Any) -> None:
    started = time.monotonic()
    log.info("mig_hook_started", hook=name, command=hook.command, args=list(hook.args))
    try:
        proc = await asyncio.create_subprocess_exec(
            hook.command,
            *hook.args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=hook.workdir,
            start_new_session=True,
        )
    except OSError as exc:
        reason = f"cannot start: {exc.strerror or exc}"
        log.info("mig_hook_finished", hook=name, command=hook.command, returncode=None, error=reason)
        raise HookFailed(name, hook.command, None, "", reason) from None
    talk = asyncio.ensure_future(proc.communicate())
    try:
        stdout, stderr = await asyncio.wait_for(asyncio.shield(talk), timeout)
    except TimeoutError:
        await _reap(proc, talk)
        out, err = _output(talk)
        reason = f"timed out after {timeout:g} s"
        log.debug("mig_hook_output", hook=name, command=hook.command, stdout=_tail(out), stderr=_tail(err))
        log.info("mig_hook_finished", hook=name, command=hook.command, returncode=None, error=reason)
        raise HookFailed(name, hook.command, None, _tail(err), reason) from None
    except asyncio.CancelledError:
        await _reap(proc, talk)
        raise
    duration = round(time.monotonic() - started, 3)
    log.debug("mig_hook_output", hook=name, command=hook.command, stdout=_tail(stdout), stderr=_tail(stderr))
    log.info(
        "mig_hook_finished", hook=name, command=hook.command, returncode=proc.returncode, duration_s=duration
    )
    if proc.returncode != 0:
        raise HookFailed(name, hook.command, proc.returncode, _tail(stderr))


async def run_hooks(
    hooks: HooksSpec | None,
    name: HookName | str,
    base_env: Mapping[str, str],
    *,
    log: Any,
    timeout: float = DEFAULT_HOOK_TIMEOUT_S,
) -> None:
    """Run the commands of hook ``name`` in order; the first failure raises :class:`HookFailed`.

    Each command's environment is its ``envs`` overlaid with ``base_env`` (the caller's
    ``MIG_PARTED_*`` values win) and nothing else; it runs in ``workdir`` when set, with stdin closed,
    in a session of its own (killed with everything it started on timeout or cancellation). Output is
    captured and logged at debug level as ``mig_hook_output``. ``hooks`` None: there is nothing to run.
    """
    if name not in HOOK_NAMES:
        raise ValueError(f"unknown hook {name!r}; hooks are {', '.join(HOOK_NAMES)}")
    if hooks is None:
        return
    for hook in hooks.commands(name):
        env = {**hook.envs, **base_env}
        await _run_one(name, hook, env, timeout, log)

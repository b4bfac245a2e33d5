"""Running the commands of mig-parted's hooks file (shared/reference/mig.md §1.5).

The file (``version: v1``: ``apply-start``, ``pre-apply-mode``, ``pre-apply-config``, ``apply-exit``)
is read by :mod:`gpunode.api.mig_hooks`. The commands of one hook run in order; the first that fails
(non-zero exit, timeout, cannot start) stops the list with :class:`HookFailed`. As in mig-parted, a hook
inherits nothing from our environment: it sees its own ``envs`` overlaid with the ``MIG_PARTED_*``
values the caller passes (those win), so commands and their arguments need absolute paths. Which hooks
run when, and what a failing ``apply-exit`` means, is the caller's business. A hook's output is read as
it comes and only its last 64 KiB per stream kept (:class:`gpunode.common.bounds.Tail`), so a hook that
prints gigabytes costs no more memory than one that prints a line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpunode.api.mig_hooks import HOOK_NAMES, HookCommand, HookName, HooksSpec
from gpunode.common.bounds import Tail, communicate

if TYPE_CHECKING:
    from gpunode.common.logging import Logger

__all__ = [
    "DEFAULT_HOOK_TIMEOUT_S",
    "HookFailed",
    "run_hooks",
]

DEFAULT_HOOK_TIMEOUT_S = 300.0
_TAIL_CHARS = 2000
_REAP_S = 5.0  # after a kill, how long to wait for the pipes to close


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


def _tail(tail: Tail) -> str:
    return tail.data.decode("utf-8", errors="replace")[-_TAIL_CHARS:]


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The hook runs in its own session, so this reaches whatever it started as well.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _reap(proc: asyncio.subprocess.Process, talk: asyncio.Task[tuple[Tail, Tail]]) -> None:
    _kill_group(proc)
    try:
        await asyncio.wait_for(asyncio.shield(talk), _REAP_S)
    except (TimeoutError, asyncio.CancelledError):
        talk.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await talk
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), _REAP_S)


async def _run_one(name: str, hook: HookCommand, env: dict[str, str], timeout: float, log: Logger) -> None:
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
    stdout, stderr = Tail(), Tail()  # what was read stays here even when the reading is cut short
    talk = asyncio.ensure_future(communicate(proc, stdout, stderr))
    try:
        await asyncio.wait_for(asyncio.shield(talk), timeout)
    except TimeoutError:
        await _reap(proc, talk)
        reason = f"timed out after {timeout:g} s"
        _log_output(log, name, hook, stdout, stderr)
        log.info("mig_hook_finished", hook=name, command=hook.command, returncode=None, error=reason)
        raise HookFailed(name, hook.command, None, _tail(stderr), reason) from None
    except asyncio.CancelledError:
        await _reap(proc, talk)
        raise
    duration = round(time.monotonic() - started, 3)
    _log_output(log, name, hook, stdout, stderr)
    log.info(
        "mig_hook_finished", hook=name, command=hook.command, returncode=proc.returncode, duration_s=duration
    )
    if proc.returncode != 0:
        raise HookFailed(name, hook.command, proc.returncode, _tail(stderr))


def _log_output(log: Logger, name: str, hook: HookCommand, stdout: Tail, stderr: Tail) -> None:
    log.debug(
        "mig_hook_output",
        hook=name,
        command=hook.command,
        stdout=_tail(stdout),
        stderr=_tail(stderr),
        stdout_bytes=stdout.total,
        stderr_bytes=stderr.total,
    )


async def run_hooks(
    hooks: HooksSpec | None,
    name: HookName | str,
    base_env: Mapping[str, str],
    *,
    log: Logger,
    timeout: float = DEFAULT_HOOK_TIMEOUT_S,
) -> None:
    """Run the commands of hook ``name`` in order; the first failure raises :class:`HookFailed`.

    Each command's environment is its ``envs`` overlaid with ``base_env`` (the caller's
    ``MIG_PARTED_*`` values win) and nothing else; it runs in ``workdir`` when set, with stdin closed,
    in a session of its own (killed with everything it started on timeout or cancellation). Output is
    captured as a bounded tail and logged at debug level as ``mig_hook_output`` (its last 2000
    characters per stream, with the byte counts). ``hooks`` None: there is nothing to run.
    """
    if name not in HOOK_NAMES:
        raise ValueError(f"unknown hook {name!r}; hooks are {', '.join(HOOK_NAMES)}")
    if hooks is None:
        return
    for hook in hooks.commands(name):
        env = {**hook.envs, **base_env}
        await _run_one(name, hook, env, timeout, log)

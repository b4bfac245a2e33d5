"""gpunode.mig.hooks: running the commands of mig-parted's hooks file."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpunode.api.mig_hooks import HooksSpec, parse_hooks
from gpunode.mig.hooks import HookFailed, run_hooks

SH = "/bin/sh"
ENV = "/usr/bin/env"


class RecordingLog:
    """Stands in for a structlog logger: keeps (level, event, fields)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def _record(self, level: str, event: str, **fields: Any) -> None:
        self.records.append((level, event, fields))

    def debug(self, event: str, **fields: Any) -> None:
        self._record("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._record("info", event, **fields)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [fields for _, event, fields in self.records if event == name]


def hooks_file(**hooks: list[dict[str, Any]]) -> HooksSpec:
    return parse_hooks(json.dumps({"version": "v1", "hooks": hooks}), "hooks.yaml")


def sh(script: str, **extra: Any) -> dict[str, Any]:
    return {"command": SH, "args": ["-c", script], **extra}


# ---------------------------------------------------------------------------------------- running


async def test_commands_run_in_order(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = hooks_file(**{"apply-start": [sh(f"echo one >> {out}"), sh(f"echo two >> {out}")]})
    log = RecordingLog()
    await run_hooks(spec, "apply-start", {}, log=log)
    assert out.read_text() == "one\ntwo\n"
    assert [f["hook"] for f in log.events("mig_hook_started")] == ["apply-start", "apply-start"]
    finished = log.events("mig_hook_finished")
    assert [f["returncode"] for f in finished] == [0, 0]
    assert all(level == "debug" for level, event, _ in log.records if event == "mig_hook_output")


async def test_other_hooks_do_not_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = hooks_file(**{"apply-exit": [sh(f"touch {out}")]})
    await run_hooks(spec, "pre-apply-mode", {}, log=RecordingLog())
    await run_hooks(None, "apply-exit", {}, log=RecordingLog())
    assert not out.exists()


async def test_failure_stops_the_list(tmp_path: Path) -> None:
    marker = tmp_path / "second-ran"
    spec = hooks_file(
        **{
            "pre-apply-config": [
                sh("echo working; echo 'kubelet would not stop' >&2; exit 3"),
                sh(f"touch {marker}"),
            ]
        }
    )
    with pytest.raises(HookFailed) as info:
        await run_hooks(spec, "pre-apply-config", {}, log=RecordingLog())
    failure = info.value
    assert (failure.name, failure.command, failure.returncode) == ("pre-apply-config", SH, 3)
    assert failure.stderr_tail == "kubelet would not stop\n"
    assert str(failure) == "pre-apply-config hook /bin/sh: exited with status 3: kubelet would not stop"
    assert not marker.exists()


async def test_environment_is_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUNODE_TEST_PARENT_ONLY", "1")
    spec = hooks_file(
        **{
            "apply-start": [
                {"command": ENV, "envs": {"HOOK_ONLY": "h", "MIG_PARTED_SELECTED_CONFIG": "from-hook"}},
            ]
        }
    )
    log = RecordingLog()
    base = {"MIG_PARTED_SELECTED_CONFIG": "all-balanced", "MIG_PARTED_SKIP_RESET": "false"}
    await run_hooks(spec, "apply-start", base, log=log)
    (output,) = log.events("mig_hook_output")
    seen = dict(line.split("=", 1) for line in output["stdout"].splitlines())
    assert seen == {
        "HOOK_ONLY": "h",
        "MIG_PARTED_SELECTED_CONFIG": "all-balanced",  # the CLI's value wins over the hook's envs
        "MIG_PARTED_SKIP_RESET": "false",
    }
    assert "PATH" not in seen
    assert "GPUNODE_TEST_PARENT_ONLY" not in seen


async def test_workdir(tmp_path: Path) -> None:
    spec = hooks_file(**{"apply-exit": [sh("pwd", workdir=str(tmp_path)), sh("pwd")]})
    log = RecordingLog()
    await run_hooks(spec, "apply-exit", {}, log=log)
    outputs = [f["stdout"].strip() for f in log.events("mig_hook_output")]
    assert outputs[0] == str(tmp_path)
    assert outputs[1] == os.getcwd()


async def test_timeout_kills_the_command() -> None:
    spec = hooks_file(**{"apply-start": [sh("echo slow >&2; exec /bin/sleep 30")]})
    started = asyncio.get_running_loop().time()
    with pytest.raises(HookFailed) as info:
        await run_hooks(spec, "apply-start", {}, log=RecordingLog(), timeout=0.5)
    assert asyncio.get_running_loop().time() - started < 10
    assert info.value.returncode is None
    assert "timed out after 0.5 s" in str(info.value)


async def test_command_that_cannot_start(tmp_path: Path) -> None:
    spec = hooks_file(**{"apply-start": [{"command": str(tmp_path / "missing")}]})
    with pytest.raises(HookFailed, match="cannot start") as info:
        await run_hooks(spec, "apply-start", {}, log=RecordingLog())
    assert info.value.returncode is None


async def test_cancellation_kills_the_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    spec = hooks_file(**{"apply-start": [sh(f"echo $$ > {pidfile}; exec /bin/sleep 30")]})
    task = asyncio.create_task(run_hooks(spec, "apply-start", {}, log=RecordingLog()))
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        await asyncio.sleep(0.02)
    pid = int(pidfile.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_unknown_hook_name() -> None:
    with pytest.raises(ValueError, match="unknown hook 'post-apply'"):
        await run_hooks(None, "post-apply", {}, log=RecordingLog())


async def test_output_is_kept_as_a_bounded_tail() -> None:
    # 8 MB on each stream, then a last line: only the tail is held, the byte counts are logged
    script = "yes o | head -c 8000000; yes e | head -c 8000000 >&2; echo last >&2; exit 3"
    spec = hooks_file(**{"apply-start": [sh(script)]})
    log = RecordingLog()
    with pytest.raises(HookFailed) as info:
        await run_hooks(spec, "apply-start", {}, log=log)
    assert str(info.value).endswith(": last")
    assert len(info.value.stderr_tail) <= 2000
    (output,) = log.events("mig_hook_output")
    assert (output["stdout_bytes"], output["stderr_bytes"]) == (8_000_000, 8_000_005)
    assert len(output["stdout"]) <= 2000

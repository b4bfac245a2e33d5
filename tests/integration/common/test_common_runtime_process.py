"""gpunode.common.runtime in real processes: signals from outside, exit codes 0/1/2, forced exits."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PRELUDE = """
import asyncio, sys, time
from gpunode.common.logging import configure_logging
from gpunode.common.runtime import run
configure_logging("json", "info", "test-agent", "node-1")

def ready(word="ready"):
    print(word, flush=True)
"""

SCRIPTS = {
    "clean": """
        async def worker():
            try:
                await asyncio.sleep(60)
            finally:
                print("worker-cleaned-up", flush=True)

        async def main():
            async with asyncio.TaskGroup() as tg:
                tg.create_task(worker(), name="worker")
                ready()
        sys.exit(run(main))
    """,
    "crash": """
        async def main():
            await asyncio.sleep(0)
            raise RuntimeError("nvml exploded")
        sys.exit(run(main))
    """,
    "config": """
        from gpunode.common.config import ConfigModel, load_config
        from typing import Literal

        class Flags(ConfigModel):
            mig_strategy: Literal["none", "single", "mixed"] = "none"

        class Config(ConfigModel):
            version: Literal["v1"]
            flags: Flags = Flags()

        async def main():
            load_config(sys.argv[1], Config)
        sys.exit(run(main))
    """,
    "stubborn": """
        async def main():
            ready()
            while True:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    ready("ignoring-cancel")
        sys.exit(run(main, grace=float(sys.argv[1])))
    """,
    "stuck-thread": """
        async def main():
            ready()
            await asyncio.to_thread(time.sleep, 60)  # cancelling the await cannot stop the thread
        sys.exit(run(main, grace=0.3))
    """,
}


@dataclass
class Outcome:
    code: int
    stdout: list[str]
    events: list[dict[str, Any]]

    def event(self, name: str) -> dict[str, Any]:
        return next(e for e in self.events if e["event"] == name)


class Agent:
    def __init__(self, script: str, *args: str) -> None:
        code = PRELUDE + textwrap.dedent(SCRIPTS[script])
        env = {k: v for k, v in os.environ.items() if k not in {"NOTIFY_SOCKET", "WATCHDOG_USEC"}}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []

    def wait_for_line(self, expected: str, timeout: float = 10) -> None:
        assert self.proc.stdout is not None
        while True:
            readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not readable:
                self.proc.kill()
                pytest.fail(f"no {expected!r} line within {timeout}s; stderr: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            line = self.proc.stdout.readline().strip()
            if not line:
                pytest.fail(f"process ended before {expected!r}: {self.finish().events}")
            self.lines.append(line)
            if line == expected:
                return

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def finish(self, timeout: float = 10) -> Outcome:
        out, err = self.proc.communicate(timeout=timeout)
        events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        return Outcome(self.proc.returncode, self.lines + out.split(), events)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_with_exit_0(signum: int) -> None:
    agent = Agent("clean")
    agent.wait_for_line("ready")
    agent.signal(signum)
    outcome = agent.finish()
    assert outcome.code == 0
    assert "worker-cleaned-up" in outcome.stdout
    assert outcome.event("shutdown_requested")["signal"] == signal.Signals(signum).name
    assert outcome.event("stopped")["agent"] == "test-agent"


def test_unhandled_exception_exits_1_with_traceback() -> None:
    outcome = Agent("crash").finish()
    assert outcome.code == 1
    fatal = outcome.event("fatal_error")
    assert fatal["error"] == "RuntimeError: nvml exploded"
    assert "Traceback (most recent call last)" in fatal["exception"]
    assert fatal["node"] == "node-1"


def test_config_error_exits_2_naming_file_and_path(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    outcome = Agent("config", str(path)).finish()
    assert outcome.code == 2
    error = outcome.event("config_error")["error"]
    assert error.startswith(str(path))
    assert "flags.migStrategy: must be one of none, single, mixed" in error


def test_second_signal_forces_exit_1() -> None:
    agent = Agent("stubborn", "30")
    agent.wait_for_line("ready")
    agent.signal(signal.SIGTERM)
    agent.wait_for_line("ignoring-cancel")
    agent.signal(signal.SIGTERM)
    outcome = agent.finish()
    assert outcome.code == 1
    assert outcome.event("forced_exit")["reason"] == "second_signal"


def test_grace_timeout_forces_exit_1() -> None:
    agent = Agent("stubborn", "0.3")
    agent.wait_for_line("ready")
    agent.signal(signal.SIGTERM)
    outcome = agent.finish()
    assert outcome.code == 1
    assert outcome.event("forced_exit")["reason"] == "grace_timeout"


def test_stuck_executor_thread_cannot_keep_the_process_alive() -> None:
    agent = Agent("stuck-thread")
    agent.wait_for_line("ready")
    agent.signal(signal.SIGTERM)
    outcome = agent.finish()
    assert outcome.code == 1
    assert outcome.event("forced_exit")["reason"] == "grace_timeout"

"""Hostile config files and every YAML loader entry point as a real process, under a memory and time limit.

Shared by ``tests/hostile`` (assert exit 2, the file named, quickly) and ``benchmarks/hostile_config.py``
(exit code, peak RSS and time, this tree against an older checkout). A run gets ``RLIMIT_AS`` (1 GiB by
default) so an alias bomb cannot take the machine down, and is killed after ``timeout`` seconds.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
GOOD_MIG_CONFIG = REPO / "agents" / "gpunode" / "mig" / "default-config.yaml"
GIB = 1 << 30
TOKEN = "s3cr3t-bearer-token-0123456789"  # planted in kubeconfig inputs: must never reach stderr


# ------------------------------------------------------------------------------------------ the inputs


def alias_bomb() -> bytes:
    """A billion-laughs document (~560 bytes): 9 levels of 9 aliases, 9**9 * 9 strings once expanded."""
    lines = ["version: v1", 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        refs = ",".join([f"*l{i - 1}"] * 9)
        lines.append(f"l{i}: &l{i} [{refs}]")
    return ("\n".join(lines) + "\n").encode()


def deep_nesting(levels: int = 100_000) -> bytes:
    """``x: [[[...]]]``: well-formed, ``levels`` deep."""
    return b"version: v1\nx: " + b"[" * levels + b"]" * levels + b"\n"


def huge_int(digits: int = 5000) -> bytes:
    return b"version: v1\nx: " + b"9" * digits + b"\n"


def huge_file(size: int = 2 << 20) -> bytes:
    """``size`` bytes of small mapping entries: what a loader without a size cap parses for seconds."""
    line = b"k%07d: 1\n"
    n = size // len(line % 0) + 1
    return b"version: v1\n" + b"".join(line % i for i in range(n))


def non_utf8() -> bytes:
    return b"version: v1\nflags:\n  migStrategy: \xff\xfe\n"


def kubeconfig_syntax_error() -> bytes:
    """A kubeconfig whose YAML error is on its bearer token's line (PyYAML's message quotes that line)."""
    return (
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n"
        f"users:\n- name: u\n  user:\n    token: {TOKEN}: oops\n"
    ).encode()


INPUTS: dict[str, Callable[[], bytes]] = {
    "alias-bomb": alias_bomb,
    "deep-nesting": deep_nesting,
    "huge-int": huge_int,
    "2MiB-file": huge_file,
    "non-utf8": non_utf8,
}


# ------------------------------------------------------------------------------------ the entry points


def _dp(tmp: Path, f: Path) -> list[str]:
    common = ["--kubelet-socket", "", "--host-root", str(tmp), "--http-port", "-1"]
    return [str(BIN / "gpunode-device-plugin"), "--simulate", "t4x4", *common, "--config-file", str(f)]


def _fd(tmp: Path, f: Path) -> list[str]:
    common = ["--oneshot", "--output-file", str(tmp / "labels"), "--host-root", str(tmp), "--http-port", "-1"]
    return [str(BIN / "gpunode-feature-discovery"), "--simulate", "t4x4", *common, "--config-file", str(f)]


def _mig_f(tmp: Path, f: Path) -> list[str]:
    return [str(BIN / "gpunode-mig"), "apply", "--simulate", "t4x4", "-f", str(f), "-c", "all-disabled"]


def _mig_k(tmp: Path, f: Path) -> list[str]:
    good = ["-f", str(GOOD_MIG_CONFIG), "-c", "all-disabled", "--journal-file", str(tmp / "journal.json")]
    return [str(BIN / "gpunode-mig"), "apply", "--simulate", "t4x4", *good, "-k", str(f)]


def _manager_g(tmp: Path, f: Path) -> list[str]:
    good = ["-f", str(GOOD_MIG_CONFIG), "--selected-config-file", str(tmp / "selected"), "--oneshot"]
    return [str(BIN / "gpunode-mig-manager"), "--simulate", "t4x4", *good, "-g", str(f)]


def _render(tmp: Path, f: Path) -> list[str]:
    return [str(BIN / "gpunode"), "render", "--policy", str(f)]


def _kubeconfig(tmp: Path, f: Path) -> list[str]:
    kube = ["--use-node-feature-api", "--node-name", "n1", "--host-root", str(tmp)]
    return [
        str(BIN / "gpunode-feature-discovery"),
        "--simulate",
        "t4x4",
        "--oneshot",
        *kube,
        "--kubeconfig",
        str(f),
    ]


ENTRY_POINTS: dict[str, Callable[[Path, Path], list[str]]] = {
    "device-plugin --config-file": _dp,
    "feature-discovery --config-file": _fd,
    "gpunode-mig -f": _mig_f,
    "gpunode-mig -k": _mig_k,
    "mig-manager -g (GPU clients)": _manager_g,
    "gpunode render --policy": _render,
    "--kubeconfig": _kubeconfig,
}


# ------------------------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Outcome:
    returncode: int  # negative: killed by that signal; 124: the time limit
    stderr: str
    seconds: float
    peak_rss_mb: float  # the process's own maximum resident set (wait4), MiB
    timed_out: bool


def clean_env(tree: Path | None = None) -> dict[str, str]:
    """The environment for a run: no simulation or kube variables from the caller; ``tree``: an older
    checkout's ``agents`` in front of this venv's editable install."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUNODE_", "KUBECONFIG", "NODE_NAME"))}
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree / "agents")
    env["LOG_FORMAT"] = "console"
    return env


def run_limited(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    memory: int = GIB,
    timeout: float = 10.0,
    cwd: Path | None = None,
) -> Outcome:
    """Run ``argv`` with ``RLIMIT_AS = memory``, killed after ``timeout`` s; its own peak RSS via wait4."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    err_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"hostile-{os.getpid()}-{time.monotonic_ns()}.err"
    with open(err_path, "w+b") as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env if env is not None else clean_env(),
            cwd=cwd,
            preexec_fn=limit,  # before exec: the limit is the child's alone
        )
        timed_out = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                timed_out = True
                break
            time.sleep(0.005)
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    err_path.unlink()
    code = 124 if timed_out else os.waitstatus_to_exitcode(status)
    return Outcome(code, stderr, seconds, usage.ru_maxrss / 1024, timed_out)

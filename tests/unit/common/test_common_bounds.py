"""gpunode.common.bounds (echoes, lists and subprocess output kept small) and gpunode.common.cmdargs
(values checked before they reach another program's argv)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.common.bounds import Tail, clip, clip_list, clip_tail, communicate, read_head, run_tail
from gpunode.common.cmdargs import release_problem, unit_name_problem


def test_clip_counts_what_it_leaves_out() -> None:
    assert clip("abc", 3) == "abc"
    assert clip("abcdef", 3) == "abc... (3 more characters)"
    assert clip("x" * (4 << 20)) == "x" * 256 + f"... ({(4 << 20) - 256} more characters)"
    assert clip_tail("abcdef", 2) == "(4 earlier characters) ...ef"


def test_clip_list_names_ten_then_counts() -> None:
    assert clip_list(["a", "b"]) == "a, b"
    ids = [f"id{i}" for i in range(25)]
    assert clip_list(ids) == ", ".join(ids[:10]) + " and 15 more"
    huge = clip_list(["y" * 1_000_000] * 3, 2)
    assert len(huge) < 700
    assert huge.endswith(" and 1 more")


def test_tail_keeps_the_end_and_counts_the_rest() -> None:
    tail = Tail(10)
    for _ in range(1000):
        tail.feed(b"0123456789abc")
    assert tail.data == b"3456789abc"  # the last ten bytes fed
    assert tail.total == 13_000
    assert tail.dropped == 12_990
    assert len(tail._buf) <= 20  # trimmed as it goes
    assert tail.text().startswith("[12990 earlier bytes left out] ")
    small = Tail(10)
    small.feed(b"hi")
    assert (small.text(), small.dropped) == ("hi", 0)
    with pytest.raises(ValueError, match="at least one byte"):
        Tail(0)


def test_communicate_reads_both_streams_into_bounded_tails() -> None:
    script = "import sys\nfor _ in range(2000): sys.stdout.write('o' * 1000); sys.stderr.write('e' * 1000)\n"

    async def run() -> tuple[Tail, Tail, int | None]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await communicate(proc)
        return out, err, proc.returncode

    out, err, code = asyncio.run(run())
    assert code == 0
    assert (out.total, err.total) == (2_000_000, 2_000_000)
    assert len(out.data) == len(err.data) == 64 * 1024


def test_run_tail_keeps_the_tail_and_the_status() -> None:
    done = run_tail([sys.executable, "-c", "import sys; print('x' * 300000); sys.exit(3)"], limit=100)
    assert done.returncode == 3
    assert done.stdout.total == 300_001
    assert done.stdout.data == b"x" * 99 + b"\n"
    with pytest.raises(subprocess.TimeoutExpired):
        run_tail([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    with pytest.raises(FileNotFoundError):
        run_tail(["/nonexistent/program"])


def test_read_head_is_bounded_and_does_not_block(tmp_path: Path) -> None:
    assert read_head("/dev/zero", 100) == b"\0" * 100
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_head(fifo) == b""  # no writer: O_NONBLOCK, no hang
    (tmp_path / "real").write_text("123\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_head(tmp_path / "link") == b"123\n"
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        read_head(tmp_path / "link", follow=False)


@pytest.mark.parametrize(
    "name",
    [
        "nvidia-dcgm.service",
        "nvsm",
        "getty@tty1.service",
        "getty@.service",
        "dbus-org.x:y.socket",
        "a\\x2db.mount",
    ],
)
def test_unit_names_accepted(name: str) -> None:
    assert unit_name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("--host=evil", "starts with '-'"),
        ("-M=x", "starts with '-'"),
        ("-H", "starts with '-'"),
        ("", "empty"),
        ("a b.service", "not a systemd unit name"),
        ("x=y", "not a systemd unit name"),
        ("*.service", "not a systemd unit name"),
        ("../x.service", "not a systemd unit name"),
        ("a@b@c.service", "not a systemd unit name"),
        (".service", "no name before .service"),
        ("@i.service", "no name before '@'"),
        ("x" * 300, "at most 255"),
    ],
)
def test_unit_names_refused(name: str, why: str) -> None:
    problem = unit_name_problem(name)
    assert problem is not None
    assert why in problem
    assert len(problem) < 300


@pytest.mark.parametrize("value", ["6.8.0-45-generic", "5.14.0-427.el9.x86_64", "550.90.07", "6.1.0+rt~1"])
def test_releases_accepted(value: str) -> None:
    assert release_problem(value) is None


@pytest.mark.parametrize("value", ["", "-a", "--help", "../../etc", "6.8 0", "a/b", "9" * 65])
def test_releases_refused(value: str) -> None:
    assert release_problem(value, "a kernel release") is not None

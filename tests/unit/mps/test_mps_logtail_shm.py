"""The MPS agent's pure parts: following control.log (bounded, rotation and truncation), tmpfs sizes and
mount points."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpunode.mps.logtail import LogTail
from gpunode.mps.shm import is_mountpoint, parse_size


def append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def test_follows_from_the_end_then_new_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("old 1\nold 2\n")
    tail = LogTail(str(log))
    assert tail.read().lines == []
    append(log, "new 1\nnew ")
    assert tail.read().lines == ["new 1"]
    append(log, "2\n")
    assert tail.read().lines == ["new 2"]  # the partial line kept until its end came


def test_missing_file_then_created_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    tail = LogTail(str(log))
    assert tail.read().lines == []
    log.write_text("first\n")
    assert tail.read().lines == ["first"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param(lambda p: p.write_text("x\n"), "truncated", id="truncated"),
        pytest.param(
            lambda p: (os.rename(p, str(p) + ".1"), p.write_text("a\nb\nc\nd\n")), "rotated", id="rotated"
        ),
    ],
)
def test_truncated_or_rotated_read_again_from_the_start(tmp_path: Path, change: object, reason: str) -> None:
    log = tmp_path / "control.log"
    log.write_text("one line that is long enough\n")
    tail = LogTail(str(log))
    change(log)  # type: ignore[operator]
    got = tail.read()
    assert got.reset == reason
    assert got.lines == (["x"] if reason == "truncated" else ["a", "b", "c", "d"])


def test_long_lines_cut_and_chunks_bounded(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("")
    tail = LogTail(str(log), chunk=16, max_line=8)
    append(log, "0123456789abcdef-tail\nok\n")
    lines: list[str] = []
    cut = 0
    for _ in range(5):  # at most 16 bytes a call
        got = tail.read()
        lines += got.lines
        cut += got.truncated_lines
    assert lines == ["01234567", "ok"]
    assert cut == 1


def test_a_backlog_too_large_is_skipped_and_said(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("")
    tail = LogTail(str(log), max_backlog=100, chunk=1000)
    append(log, "".join(f"line {i:04d}\n" for i in range(100)))  # 1000 bytes
    got = tail.read()
    assert got.skipped == 900
    assert got.lines[-1] == "line 0099"
    assert len(got.lines) <= 10
    assert all(line.startswith("line ") and len(line) == 9 for line in got.lines)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("65536k", True),
        ("1g", True),
        ("512M", True),
        ("1048576", True),
        ("50%", True),
        ("100%", True),
        ("", False),
        ("0", False),
        ("-1m", False),
        ("1t", False),
        ("101%", False),
        ("1 g", False),
    ],
)
def test_tmpfs_sizes(text: str, ok: bool) -> None:
    if ok:
        assert parse_size(text) == text
    else:
        with pytest.raises(ValueError, match="not a tmpfs size"):
            parse_size(text)


def test_mountpoint_from_mountinfo(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    target = tmp_path / "with space" / "shm"
    target.mkdir(parents=True)
    escaped = str(target).replace(" ", "\\040")
    info.write_text(
        "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"42 22 0:39 / {escaped} rw,nosuid,nodev,noexec,relatime shared:9 - tmpfs tmpfs rw,size=65536k\n"
    )
    assert is_mountpoint(str(target), str(info)) == "tmpfs"
    assert is_mountpoint(str(tmp_path), str(info)) is None

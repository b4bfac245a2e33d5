"""gpunode.common.atomic: readers see the old file or the new one, never a partial one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpunode.common.atomic import atomic_write, atomic_write_json


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"\x00binary\xff", b"\x00binary\xff", id="bytes"),
        pytest.param("text ünïcode\n", "text ünïcode\n".encode(), id="str-utf8"),
        pytest.param(b"", b"", id="empty"),
        pytest.param(b"x" * 1_000_000, b"x" * 1_000_000, id="large"),
    ],
)
def test_writes_content_and_leaves_no_temp_files(tmp_path: Path, data: bytes | str, expected: bytes) -> None:
    target = tmp_path / "labels.txt"
    assert atomic_write(target, data) is True
    assert target.read_bytes() == expected
    assert _listing(tmp_path) == ["labels.txt"]


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o640, 0o755], ids=oct)
def test_mode_is_exact_regardless_of_umask(tmp_path: Path, mode: int) -> None:
    old = os.umask(0o077)
    try:
        target = tmp_path / "f"
        atomic_write(target, b"x", mode)
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o7777 == mode


def test_replaces_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("old")
    inode = target.stat().st_ino
    atomic_write(target, "new")
    assert target.read_text() == "new"
    assert target.stat().st_ino != inode  # a new file was renamed over the old one


@pytest.mark.parametrize("failing", ["fsync", "fchmod", "replace", "write"])
def test_failure_keeps_old_content_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = tmp_path / "config.toml"
    target.write_text("old content")

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, "new content")
    monkeypatch.undo()
    assert target.read_text() == "old content"
    assert _listing(tmp_path) == ["config.toml"]


def test_interrupt_also_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "f", "x")
    monkeypatch.undo()
    assert _listing(tmp_path) == []


def test_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "no" / "such" / "f", "x")
    assert _listing(tmp_path) == []


def test_only_if_changed_skips_identical_content(tmp_path: Path) -> None:
    target = tmp_path / "f"
    assert atomic_write(target, "same", 0o644, only_if_changed=True) is True
    inode = target.stat().st_ino
    assert atomic_write(target, "same", 0o644, only_if_changed=True) is False
    assert target.stat().st_ino == inode
    assert atomic_write(target, "same", 0o600, only_if_changed=True) is True  # mode differs
    assert atomic_write(target, "diff", 0o600, only_if_changed=True) is True
    assert target.read_text() == "diff"


def test_json_is_sorted_indented_with_newline(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    atomic_write_json(target, {"b": 1, "a": ["ü", None]})
    text = target.read_text(encoding="utf-8")
    assert text == '{\n  "a": [\n    "ü",\n    null\n  ],\n  "b": 1\n}\n'
    assert json.loads(text) == {"a": ["ü", None], "b": 1}
    assert atomic_write_json(target, {"a": ["ü", None], "b": 1}, only_if_changed=True) is False


def test_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    atomic_write("rel.txt", "x")
    assert (tmp_path / "rel.txt").read_text() == "x"
    assert _listing(tmp_path) == ["rel.txt"]

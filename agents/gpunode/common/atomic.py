"""Replace files that other programs read, so that a reader never sees a partial file.

The new content goes to a temporary file in the same directory (same filesystem, so the rename is
atomic), is flushed to disk, given its final mode, renamed over the target, and the directory entry
itself is then flushed. On any failure the temporary file is removed and the old content stays.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

__all__ = ["atomic_write", "atomic_write_json", "fsync_dir"]

StrPath = str | os.PathLike[str]


def atomic_write(
    path: StrPath,
    data: bytes | str,
    mode: int = 0o644,
    *,
    encoding: str = "utf-8",
    only_if_changed: bool = False,
) -> bool:
    """Atomically make ``path`` contain ``data`` with permissions ``mode``; return True if written.

    With ``only_if_changed`` the file is left untouched (and False returned) when it already holds
    exactly ``data`` with ``mode``, so converged reconcilers do not wake file watchers.
    """
    target = os.fspath(path)
    payload = data.encode(encoding) if isinstance(data, str) else bytes(data)
    if only_if_changed and _unchanged(target, payload, mode):
        return False

    directory, name = os.path.split(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fchmod(fd, mode)  # exact mode, independent of the umask
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
    return True


def atomic_write_json(
    path: StrPath,
    obj: Any,
    mode: int = 0o644,
    *,
    indent: int | None = 2,
    sort_keys: bool = True,
    only_if_changed: bool = False,
) -> bool:
    """:func:`atomic_write` of ``obj`` as JSON (UTF-8, trailing newline, sorted keys by default)."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False) + "\n"
    return atomic_write(path, text, mode, only_if_changed=only_if_changed)


def fsync_dir(directory: StrPath) -> None:
    """Flush a directory's entries to disk; silently skipped where the filesystem cannot do it."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:  # e.g. EINVAL on filesystems without directory fsync
        pass
    finally:
        os.close(dir_fd)


def _unchanged(target: str, payload: bytes, mode: int) -> bool:
    try:
        st = os.stat(target)
        if (st.st_mode & 0o7777) != mode or st.st_size != len(payload):
            return False
        with open(target, "rb") as fh:
            return fh.read() == payload
    except OSError:
        return False

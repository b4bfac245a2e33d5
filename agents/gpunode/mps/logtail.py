"""Follow a control daemon's ``control.log`` (NVIDIA's mps-control-daemon tails it into its own output).

:class:`LogTail` reads what was appended since the last call, in bounded steps: at most ``chunk`` bytes
per call, lines cut at ``max_line`` bytes (the rest of an over-long line is dropped, said by
``truncated``), a backlog larger than ``max_backlog`` skipped (counted, so the agent says how much).
A file replaced (log rotation: another inode) or cut shorter (``truncate``, ``>``) is read again from its
start. Nothing else is kept between calls but the offset, the inode and at most one partial line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["LogTail", "TailRead"]

CHUNK = 64 * 1024
MAX_LINE = 4096
MAX_BACKLOG = 1 << 20


@dataclass
class TailRead:
    """One call's outcome: the complete lines, whether the file was found rotated or truncated, and the
    bytes skipped (a backlog too large to forward)."""

    lines: list[str] = field(default_factory=list)
    reset: str | None = None  # "rotated" or "truncated"
    skipped: int = 0
    truncated_lines: int = 0


class LogTail:
    """``path`` followed from ``offset`` (None: from its end as it is now; a missing file: from 0)."""

    def __init__(
        self,
        path: str,
        *,
        from_end: bool = True,
        chunk: int = CHUNK,
        max_line: int = MAX_LINE,
        max_backlog: int = MAX_BACKLOG,
    ) -> None:
        self.path = path
        self.chunk = chunk
        self.max_line = max_line
        self.max_backlog = max_backlog
        self.inode: int | None = None
        self.offset = 0
        self.partial = b""
        self.dropping = False  # inside an over-long line: drop until its end
        if from_end:
            try:
                st = os.stat(path)
            except OSError:
                return
            self.inode, self.offset = st.st_ino, st.st_size

    def read(self) -> TailRead:
        out = TailRead()
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below; fstat on the same open file
        except OSError:
            return out  # not there (yet, or between a rotation's rename and the new file)
        with f:
            st = os.fstat(f.fileno())
            if self.inode is not None and st.st_ino != self.inode:
                out.reset = "rotated"
            elif st.st_size < self.offset:
                out.reset = "truncated"
            if out.reset is not None or self.inode is None:
                self.offset, self.partial, self.dropping = 0, b"", False
            self.inode = st.st_ino
            pending = st.st_size - self.offset
            if pending > self.max_backlog:
                out.skipped = pending - self.max_backlog
                self.offset += out.skipped
                self.partial, self.dropping = b"", True  # resume at the next line start
            if st.st_size <= self.offset:
                return out
            f.seek(self.offset)
            data = f.read(self.chunk)
        self.offset += len(data)
        self._split(data, out)
        return out

    def _split(self, data: bytes, out: TailRead) -> None:
        parts = data.split(b"\n")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if self.dropping:
                if not last:
                    self.dropping = False  # the over-long (or skipped-into) line ended here
                continue
            buf = self.partial + part
            self.partial = b""
            if last:
                if len(buf) > self.max_line:
                    out.lines.append(self._text(buf[: self.max_line]))
                    out.truncated_lines += 1
                    self.dropping = True
                else:
                    self.partial = buf
                continue
            if len(buf) > self.max_line:
                buf = buf[: self.max_line]
                out.truncated_lines += 1
            text = self._text(buf)
            if text:
                out.lines.append(text)

    @staticmethod
    def _text(raw: bytes) -> str:
        return raw.decode("utf-8", "replace").rstrip("\r").strip()

"""NFD's local-source feature file: `key=value` lines, written atomically, only when something changed.

While the labeler runs the file carries no expiry, so labels never blink. When it stops, the labels stay
but gain a `# +expiry-time=` directive (NFD >= v0.14): a labeler that comes back in time rewrites the file
without it; one that never comes back has its labels expire instead of lingering forever. NVIDIA's GFD
deletes the file on every exit, so every restart makes the node lose its GPU labels (GFD issue #796).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpunode.common.atomic import atomic_write

DEFAULT_OUTPUT = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
MAX_FILE_BYTES = 65536  # NFD ignores larger feature files


class OutputError(Exception):
    """The feature file could not be written (names the path and the reason)."""


def render(labels: Mapping[str, str], expiry: datetime | None = None) -> str:
    lines = []
    if expiry is not None:
        lines.append(f"# +expiry-time={expiry.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    lines += [f"{key}={labels[key]}" for key in sorted(labels)]
    return "".join(line + "\n" for line in lines)


def expiry_after_stop(interval: float, now: datetime | None = None, margin: float = 60.0) -> datetime:
    """When a stopped labeler's labels should go: two intervals and a margin from now."""
    start = now or datetime.now(UTC)
    return start + timedelta(seconds=2 * interval + margin)


class FeatureFile:
    """The output: a file (atomic replace, mode 0644) or, for path "", standard output."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        self.last: str | None = None

    def write(self, labels: Mapping[str, str], expiry: datetime | None = None) -> bool:
        """Write if the content differs from what is there; returns whether it wrote."""
        text = render(labels, expiry)
        size = len(text.encode())
        if size > MAX_FILE_BYTES:
            raise OutputError(f"{self.path}: {size} bytes of labels, over NFD's 64 KiB feature-file limit")
        if self.path is None:
            if text != self.last:
                sys.stdout.write(text)
                sys.stdout.flush()
                self.last = text
                return True
            return False
        try:
            written = atomic_write(self.path, text, mode=0o644, only_if_changed=True)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.last = text
        return written

    def delete(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

"""The two errors that end a process with exit code 2 (usage or configuration).

They live in this dependency-free module so that :mod:`gpunode.common.runtime` can map them to exit
codes without importing pydantic or argparse; import them from :mod:`gpunode.common.config` and
:mod:`gpunode.common.cli` as usual.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["MAX_PROBLEMS", "MAX_PROBLEM_CHARS", "ConfigError", "UsageError", "one_line"]

MAX_PROBLEMS = 20  # problems listed per file; the rest are counted ("... and 3 more problems")
MAX_PROBLEM_CHARS = 500  # one problem's text (a key or value of a hostile file can be a megabyte)


class UsageError(Exception):
    """A bad command line or environment variable; the process exits 2 with this message."""


class ConfigError(Exception):
    """A configuration file (or text) that cannot be used; lists every problem found.

    ``path`` names the file (or the source name given to ``parse_config_text``); ``problems`` holds
    one ``"yaml.path: message"`` string per problem. ``str()`` gives one problem per line.
    At most :data:`MAX_PROBLEMS` are kept, then one ``"... and N more problems"``; ``count`` is the
    number found. Each is cut at :data:`MAX_PROBLEM_CHARS` characters.
    """

    def __init__(self, path: str | os.PathLike[str], problems: Iterable[str]) -> None:
        self.path = os.fspath(path)
        found = [_clip(problem) for problem in problems] or ["invalid configuration"]
        self.count = len(found)
        if len(found) > MAX_PROBLEMS:
            found[MAX_PROBLEMS:] = [f"... and {len(found) - MAX_PROBLEMS} more problems"]
        self.problems: tuple[str, ...] = tuple(found)
        super().__init__(self.path, self.problems)

    def __str__(self) -> str:
        if len(self.problems) == 1:
            return f"{self.path}: {self.problems[0]}"
        lines = [f"{self.path}: {self.count} problems:"]
        lines.extend(f"  {problem}" for problem in self.problems)
        return "\n".join(lines)


def _clip(text: str) -> str:
    if len(text) <= MAX_PROBLEM_CHARS:
        return text
    return f"{text[:MAX_PROBLEM_CHARS]}... ({len(text) - MAX_PROBLEM_CHARS} more characters)"


def one_line(error: BaseException | str, limit: int) -> str:
    """A failure (or any text) as one line of at most ``limit`` characters, for a node annotation or a
    status file: whitespace runs become one space, a ConfigError gives its file and every problem joined
    by "; ", and a longer text is cut and ends in "..."."""
    text = f"{error.path}: {'; '.join(error.problems)}" if isinstance(error, ConfigError) else str(error)
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."

"""dcgm-exporter counters files (``-f`` / ``DCGM_EXPORTER_COLLECTORS``): which metrics to export, and how.

The format is dcgm-exporter's: one ``field, type, help`` line per metric; lines starting with ``#`` and
blank lines are ignored; spaces around each column are dropped. The help column is everything after the
second comma, so it may itself contain commas (or be double-quoted, as a CSV reader would allow). The
field must be one the catalog knows, by its DCGM name or its dcgm-exporter 1.x ``dcgm_*`` name (the metric
then keeps the 1.x name, as dcgm-exporter does with its ``1.x-compatibility-metrics.csv``); the type
is ``gauge``, ``counter`` or ``label``, and ``label`` is only for string fields (it copies the value onto
every series as a label). dcgm-exporter's own synthesised ``DCGM_EXP_*`` metrics are not supported. A
field may appear once.

A hostile file costs little: it is read line by line (a line over 64 KiB is one problem, its rest
skipped unread into memory), at most 20 problems are kept and listed (then ``... and N more
problems``), and each is cut at 500 characters.

Without a file, the packaged ``default-counters.csv`` is used: exactly dcgm-exporter's default set.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TextIO

from gpunode.common.bounds import clip
from gpunode.common.errors import MAX_PROBLEM_CHARS, MAX_PROBLEMS
from gpunode.exporter.catalog import KINDS, Kind, MetricSpec, by_name

DEFAULT_COUNTERS = "default-counters.csv"
EXPORTER_PREFIX = "DCGM_EXP_"
_KIND: dict[str, Kind] = {k: k for k in KINDS}


class CountersError(Exception):
    """A counters file that cannot be used; names the file, the line and the reason for every problem.

    ``str()`` gives one ``file:line: reason`` per problem; ``line`` and ``reason`` are the first one's
    (``line`` is None for a problem with the file as a whole). At most :data:`MAX_PROBLEMS` are kept in
    ``problems`` (each reason cut at :data:`MAX_PROBLEM_CHARS` characters); ``count`` is how many were
    found (default: as many as given), and ``str()`` ends with ``... and N more problems`` for the rest.
    """

    def __init__(
        self, source: str, problems: Sequence[tuple[int | None, str]], count: int | None = None
    ) -> None:
        self.source = source
        kept = [(line, clip(reason, MAX_PROBLEM_CHARS)) for line, reason in problems[:MAX_PROBLEMS]]
        self.problems: tuple[tuple[int | None, str], ...] = tuple(kept) or ((None, "invalid counters"),)
        self.count = max(count or 0, len(problems), len(self.problems))
        self.line, self.reason = self.problems[0]
        super().__init__(source, self.problems)

    def __str__(self) -> str:
        lines = [
            f"{self.source}: {reason}" if line is None else f"{self.source}:{line}: {reason}"
            for line, reason in self.problems
        ]
        if self.count > len(self.problems):
            lines.append(f"{self.source}: ... and {self.count - len(self.problems)} more problems")
        return "\n".join(lines)


@dataclass(frozen=True)
class Counter:
    """One enabled line of a counters file."""

    spec: MetricSpec
    kind: Kind  # the type the file asks for
    help: str  # the help the file gives (dcgm-exporter exposes the file's text)
    line: int

    @property
    def name(self) -> str:
        return self.spec.name


def _unquote(column: str) -> str:
    if len(column) >= 2 and column[0] == column[-1] == '"':
        return column[1:-1].replace('""', '"')
    return column


def _parse_line(text: str) -> tuple[str, str, str] | str:
    """The three columns of a line, or the reason it is malformed."""
    columns = text.split(",", 2)
    if len(columns) < 3:
        return f"expected 3 comma-separated columns (field, type, help), found {len(columns)}"
    name, kind, help_ = (_unquote(c.strip()) for c in columns)
    return name, kind, help_


MAX_LINE_CHARS = 64 * 1024  # a longer line is a problem; its rest is read in pieces and dropped


def _lines(stream: TextIO) -> Iterator[str | None]:
    """Physical lines of a text stream opened with universal newlines (so only LF, CRLF and CR end a
    line, numbered as an editor does), a leading BOM dropped; None for a line over
    :data:`MAX_LINE_CHARS`, whose rest is skipped without being held."""
    first = True
    while line := stream.readline(MAX_LINE_CHARS):
        if first:
            line, first = line.removeprefix("\ufeff"), False
        if len(line) >= MAX_LINE_CHARS and not line.endswith("\n"):
            while (rest := stream.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                pass
            yield None
            continue
        yield line.removesuffix("\n")


def parse_counters(text: str, source: str) -> list[Counter]:
    """The enabled metrics of a counters file's text; `source` names the file in error messages."""
    return _parse(io.StringIO(text, newline=None), source)


def _parse(stream: TextIO, source: str) -> list[Counter]:
    counters: list[Counter] = []
    problems = _Problems()
    seen: dict[int, Counter] = {}  # field id -> first line enabling it (aliases share an id)
    for number, raw in enumerate(_lines(stream), start=1):
        if raw is None:
            problems.append((number, f"longer than {MAX_LINE_CHARS} characters"))
            continue
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parsed = _parse_line(stripped)
        if isinstance(parsed, str):
            problems.append((number, parsed))
            continue
        name, kind, help_ = parsed
        if not name:
            problems.append((number, "the field column is empty"))
            continue
        if name.startswith(EXPORTER_PREFIX):
            problems.append(
                (number, f"{name} is a dcgm-exporter synthesised metric, not supported by gpunode")
            )
            continue
        spec = by_name(name)
        if spec is None:
            problems.append((number, f"unknown field {name}"))
            continue
        kind_ = _KIND.get(kind)
        if kind_ is None:
            problems.append((number, f"{name}: type must be one of {', '.join(KINDS)}, not {kind!r}"))
            continue
        if kind_ == "label" and not spec.is_string:
            problems.append(
                (number, f"{name}: type label is only for string fields, and this one is numeric")
            )
            continue
        if kind_ != "label" and spec.is_string:
            problems.append((number, f"{name}: a string field can only be a label, not a {kind}"))
            continue
        first = seen.get(spec.field_id)
        if first is not None:
            also = "" if first.name == name else f" as {first.name}"
            problems.append((number, f"duplicate field {name} (already on line {first.line}{also})"))
            continue
        counter = Counter(spec=spec, kind=kind_, help=help_ or spec.help, line=number)
        seen[spec.field_id] = counter
        counters.append(counter)
    if problems.count:
        raise CountersError(source, problems.kept, problems.count)
    if not counters:
        raise CountersError(source, [(None, "no metrics enabled (every line is blank or a comment)")])
    return counters


class _Problems:
    """The first :data:`MAX_PROBLEMS` problems, and how many there were."""

    def __init__(self) -> None:
        self.kept: list[tuple[int | None, str]] = []
        self.count = 0

    def append(self, problem: tuple[int | None, str]) -> None:
        self.count += 1
        if len(self.kept) < MAX_PROBLEMS:
            self.kept.append(problem)


def default_counters_text() -> str:
    """The packaged default counters file (dcgm-exporter's default set)."""
    return resources.files("gpunode.exporter").joinpath(DEFAULT_COUNTERS).read_text(encoding="utf-8")


def load_counters(path: Path | None = None) -> list[Counter]:
    """The metrics a counters file enables; None reads the packaged default."""
    if path is None:
        return parse_counters(default_counters_text(), DEFAULT_COUNTERS)
    try:
        with path.open(encoding="utf-8", newline=None) as stream:  # read as parsed: memory stays small
            return _parse(stream, str(path))
    except UnicodeDecodeError:
        raise CountersError(str(path), [(None, "not UTF-8 text")]) from None
    except OSError as exc:
        raise CountersError(str(path), [(None, f"cannot read: {exc.strerror or exc}")]) from None


def unavailable(counters: Iterable[Counter]) -> list[str]:
    """Names of the enabled metrics nothing can supply (listed once at start, never faked)."""
    return [c.spec.name for c in counters if c.spec.source is None]

"""dcgm-exporter counters files (``-f`` / ``DCGM_EXPORTER_COLLECTORS``): which metrics to export, and how.

The format is dcgm-exporter's: one ``field, type, help`` line per metric; lines starting with ``#`` and
blank lines are ignored; spaces around each column are dropped. The help column is everything after the
second comma, so it may itself contain commas (or be double-quoted, as a CSV reader would allow). The
field must be one the catalog knows; the type is ``gauge``, ``counter`` or ``label``, and ``label`` is
only for string fields (it copies the value onto every series as a label). dcgm-exporter's own
synthesised ``DCGM_EXP_*`` metrics are not supported. A field may appear once.

Without a file, the packaged ``default-counters.csv`` is used: exactly dcgm-exporter's default set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpunode.exporter.catalog import KINDS, Kind, MetricSpec, by_name

DEFAULT_COUNTERS = "default-counters.csv"
EXPORTER_PREFIX = "DCGM_EXP_"
_KIND: dict[str, Kind] = {k: k for k in KINDS}


class CountersError(Exception):
    """A counters file that cannot be used; names the file, the line and the reason for every problem.

    ``str()`` gives one ``file:line: reason`` per problem; ``line`` and ``reason`` are the first one's
    (``line`` is None for a problem with the file as a whole).
    """

    def __init__(self, source: str, problems: Sequence[tuple[int | None, str]]) -> None:
        self.source = source
        self.problems: tuple[tuple[int | None, str], ...] = tuple(problems) or ((None, "invalid counters"),)
        self.line, self.reason = self.problems[0]
        super().__init__(source, self.problems)

    def __str__(self) -> str:
        return "\n".join(
            f"{self.source}: {reason}" if line is None else f"{self.source}:{line}: {reason}"
            for line, reason in self.problems
        )


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


def _lines(text: str) -> list[str]:
    """Physical lines, numbered as an editor does: only LF, CRLF and CR end a line."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")


def parse_counters(text: str, source: str) -> list[Counter]:
    """The enabled metrics of a counters file's text; `source` names the file in error messages."""
    counters: list[Counter] = []
    problems: list[tuple[int | None, str]] = []
    seen: dict[int, Counter] = {}  # field id -> first line enabling it (aliases share an id)
    for number, raw in enumerate(_lines(text), start=1):
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
    if problems:
        raise CountersError(source, problems)
    if not counters:
        raise CountersError(source, [(None, "no metrics enabled (every line is blank or a comment)")])
    return counters


def default_counters_text() -> str:
    """The packaged default counters file (dcgm-exporter's default set)."""
    return resources.files("gpunode.exporter").joinpath(DEFAULT_COUNTERS).read_text(encoding="utf-8")


def load_counters(path: Path | None = None) -> list[Counter]:
    """The metrics a counters file enables; None reads the packaged default."""
    if path is None:
        return parse_counters(default_counters_text(), DEFAULT_COUNTERS)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CountersError(str(path), [(None, "not UTF-8 text")]) from None
    except OSError as exc:
        raise CountersError(str(path), [(None, f"cannot read: {exc.strerror or exc}")]) from None
    return parse_counters(text, str(path))


def unavailable(counters: Iterable[Counter]) -> list[str]:
    """Names of the enabled metrics nothing can supply (listed once at start, never faked)."""
    return [c.spec.name for c in counters if c.spec.source is None]

"""The GPU series in Prometheus' text format and OpenMetrics, fast: byte for byte what prometheus_client's
encoders write for the exporter's families, without escaping the same label set again for every series.

With every field enabled a node with 56 MIG devices has ~600 series of ~14 labels each, and nearly all of a
GPU's series share one label set (the GPU's identity and the string fields dcgm-exporter puts on every
series). prometheus_client escapes and validates each label of each series (~8,000 labels a render, tens of
milliseconds on a busy core); here each distinct label set is rendered once per pass.

Only the two formats Prometheus asks for by default are rendered here: the text format 0.0.4 and
OpenMetrics 1.0.0, both with the default name escaping (``underscores``), for families of gauges and
untyped series whose metric and label names are valid legacy names and whose samples carry no timestamp,
exemplar or native histogram. Anything else (another version or escaping scheme in the Accept header, a
family outside that shape) is answered by prometheus_client's encoder itself: :func:`fast_encoder`
returns None for it and :func:`render` raises :class:`Unsupported`. tests/unit/exporter compares both
paths byte for byte.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Iterable

from prometheus_client import exposition, utils
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

__all__ = ["OPENMETRICS", "TEXT", "Unsupported", "fast_encoder", "render"]

TEXT = "text"
OPENMETRICS = "openmetrics"
# names every encoder writes unchanged (no ':', which OpenMetrics' sample lines would rewrite; no reserved
# '__' label names)
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_float_text: Callable[[float], str] = utils.floatToGoString  # the encoders' numbers (untyped there)
_TEXT_TYPES = {"gauge": "gauge", "unknown": "untyped"}


class Unsupported(Exception):
    """A family this renderer does not write exactly as prometheus_client would: use its encoder."""


def fast_encoder(encoder: Callable[[Collector], bytes]) -> str | None:
    """TEXT or OPENMETRICS when ``encoder`` (from ``choose_encoder``) writes a format :func:`render`
    reproduces exactly; None for any other version or escaping scheme."""
    if encoder is exposition.generate_latest:
        return TEXT
    if (
        isinstance(encoder, functools.partial)
        and not encoder.args
        and encoder.func is openmetrics.generate_latest
        and encoder.keywords == {"escaping": openmetrics.UNDERSCORES, "version": "1.0.0"}
    ):
        return OPENMETRICS
    return None


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _label_string(labels: dict[str, str]) -> str:
    parts = []
    for key, value in sorted(labels.items()):
        if not _PLAIN_NAME.match(key) or key.startswith("__"):
            raise Unsupported(f"label name {key!r}")
        parts.append(f'{key}="{_escape_value(value)}"')
    return "{" + ",".join(parts) + "}" if parts else ""


def render(registry: Collector, fmt: str, counters: Collection[str] = ()) -> bytes:
    """The registry's families as prometheus_client's encoder for ``fmt`` writes them (OpenMetrics
    without its ``# EOF`` line); in the text format the untyped families named in ``counters`` are typed
    ``counter`` (what :func:`gpunode.exporter.collector.type_counters` does to the encoder's text).

    Raises :class:`Unsupported` for a family outside the shape described in the module's docstring."""
    out: list[str] = []
    label_strings: dict[tuple[tuple[str, str], ...], str] = {}
    numbers: dict[float, str] = {}
    for metric in registry.collect():
        name, kind = metric.name, metric.type
        if kind not in _TEXT_TYPES or metric.unit or not _PLAIN_NAME.match(name):
            raise Unsupported(f"family {name!r} of type {kind!r}")
        if fmt == TEXT:
            help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            shown = "counter" if kind == "unknown" and name in counters else _TEXT_TYPES[kind]
        else:
            help_text = _escape_value(metric.documentation)
            shown = kind
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {shown}\n")
        out.extend(_sample_lines(name, metric.samples, label_strings, numbers))
    return "".join(out).encode("utf-8")


def _sample_lines(
    name: str,
    samples: Iterable[Sample],
    label_strings: dict[tuple[tuple[str, str], ...], str],
    numbers: dict[float, str],
) -> Iterable[str]:
    for sample in samples:
        if (
            sample.name != name
            or sample.timestamp is not None
            or sample.exemplar is not None
            or sample.native_histogram is not None
            or sample.value is None
        ):
            raise Unsupported(f"sample {sample.name!r} of family {name!r}")
        key = tuple(sample.labels.items())
        labels = label_strings.get(key)
        if labels is None:
            labels = label_strings[key] = _label_string(sample.labels)
        number = sample.value
        if number == 0:  # 0.0 and -0.0 are one key but two strings
            value = _float_text(number)
        elif number in numbers:
            value = numbers[number]
        else:
            value = numbers[number] = _float_text(number)
        yield f"{name}{labels} {value}\n"

"""The one safe YAML loader: every config, ConfigMap, policy, hooks, GPU-clients and kubeconfig file.

A file is read by :func:`read_config_text` (at most :data:`MAX_CONFIG_BYTES`, 1 MiB unless
``GPUNODE_MAX_CONFIG_BYTES`` says otherwise, and UTF-8) and parsed by :func:`parse_yaml` with
:class:`StrictSafeLoader`, a ``yaml.SafeLoader`` that refuses what only an attacker or an accident needs:

- aliases and anchors (``&a`` / ``*a``): an alias bomb of a few hundred bytes expands into billions of
  nodes once serialised; no config of ours needs them;
- nesting deeper than :data:`MAX_DEPTH` levels, checked while the document is composed, before any
  recursion can exhaust the stack;
- more nodes than one per :data:`BYTES_PER_NODE` bytes of the size limit (52,428 for 1 MiB), which bounds
  the time a file can take to parse;
- integers of more than :data:`MAX_INT_DIGITS` digits (Python refuses to print them);
- duplicate keys (PyYAML silently keeps the last one).

Every failure is a :class:`~gpunode.common.errors.ConfigError` naming the file, the line and column and
the reason, which ends a process with exit code 2 and is what a live reload catches to keep the last
good config. With ``redact=True`` (a kubeconfig holds tokens) a message names the position and the kind
of error only, never a piece of the file.

This module imports PyYAML only (not pydantic): the Kubernetes client reads kubeconfig files through it.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.error import Mark, MarkedYAMLError
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent

from gpunode.common.errors import ConfigError

__all__ = [
    "BYTES_PER_NODE",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_BYTES_ENV",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "StrictSafeLoader",
    "max_config_bytes",
    "parse_yaml",
    "read_config_text",
]

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: a ConfigMap cannot hold more
MAX_CONFIG_BYTES_ENV = "GPUNODE_MAX_CONFIG_BYTES"  # raises (or lowers) the limit for every file
MAX_DEPTH = 64  # nested collections; real files stay under 10
BYTES_PER_NODE = 20  # the node budget: one node per 20 bytes of the size limit (52,428 for 1 MiB)
MAX_INT_DIGITS = 4300  # Python's int <-> str limit: a longer integer cannot even be printed
_INT_LIMIT = 10**MAX_INT_DIGITS


def max_config_bytes() -> int:
    """The size limit of a config file: ``GPUNODE_MAX_CONFIG_BYTES`` (bytes) or :data:`MAX_CONFIG_BYTES`.

    The one place that reads the variable; a value that is not a positive whole number is a
    :class:`ConfigError` naming the variable.
    """
    raw = os.environ.get(MAX_CONFIG_BYTES_ENV, "").strip()
    if not raw:
        return MAX_CONFIG_BYTES
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(
            MAX_CONFIG_BYTES_ENV, [f"must be a positive whole number of bytes, not {raw[:40]!r}"]
        )
    return value


def _limit_text(limit: int) -> str:
    if limit % (1 << 20) == 0:
        return f"{limit} bytes ({limit >> 20} MiB)"
    return f"{limit} bytes"


def read_config_text(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> str:
    """A config file's text; :class:`ConfigError` naming the file when it cannot be read, is larger than
    ``max_bytes`` (default :func:`max_config_bytes`) or is not UTF-8. Never reads more than the limit."""
    name = os.fspath(path)
    limit = max_config_bytes() if max_bytes is None else max_bytes
    try:
        with open(name, "rb") as fh:
            raw = fh.read(limit + 1)
            size = os.fstat(fh.fileno()).st_size if len(raw) > limit else 0
    except FileNotFoundError:
        raise ConfigError(name, ["file not found"]) from None
    except IsADirectoryError:
        raise ConfigError(name, ["cannot read: is a directory"]) from None
    except OSError as exc:
        raise ConfigError(name, [f"cannot read: {exc.strerror or exc}"]) from None
    if len(raw) > limit:
        what = f"is {size} bytes, " if size > limit else ""
        limit_text = f"the limit of {_limit_text(limit)} ({MAX_CONFIG_BYTES_ENV} raises it)"
        raise ConfigError(name, [f"file too large: {what}more than {limit_text}"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(name, [f"not valid UTF-8 (byte offset {exc.start})"]) from None


# ---------------------------------------------------------------------------------------------- the loader


class _Refused(MarkedYAMLError):
    """A limit of :class:`StrictSafeLoader`; its text never quotes the document."""


class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without aliases, with depth, node and integer limits and no duplicate keys."""

    def __init__(self, stream: str, *, max_depth: int = MAX_DEPTH, max_nodes: int | None = None) -> None:
        super().__init__(stream)
        self.max_depth = max_depth
        self.max_nodes = max_nodes if max_nodes is not None else MAX_CONFIG_BYTES // BYTES_PER_NODE
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Mark | None = event.start_mark
        if isinstance(event, AliasEvent) or (isinstance(event, NodeEvent) and event.anchor is not None):
            raise _Refused(None, None, "aliases/anchors are not allowed", mark)
        self._nodes += 1
        if self._nodes > self.max_nodes:
            raise _Refused(None, None, f"more than {self.max_nodes} values in one file", mark)
        if not isinstance(event, CollectionStartEvent):
            return super().compose_node(parent, index)
        if self._depth >= self.max_depth:
            raise _Refused(None, None, f"nested deeper than {self.max_depth} levels", mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(node.value)
        if sum(c.isalnum() for c in text) > MAX_INT_DIGITS:
            raise _Refused(None, None, f"integer with more than {MAX_INT_DIGITS} digits", node.start_mark)
        value: int = super().construct_yaml_int(node)
        if abs(value) >= _INT_LIMIT:
            raise _Refused(None, None, f"integer with more than {MAX_INT_DIGITS} digits", node.start_mark)
        return value


def _construct_mapping_no_duplicates(loader: StrictSafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key; construct_mapping reports it
            continue
        if duplicate:
            raise ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


StrictSafeLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_no_duplicates
)
StrictSafeLoader.add_constructor("tag:yaml.org,2002:int", StrictSafeLoader.construct_yaml_int)


def parse_yaml(
    text: str,
    source_name: str,
    *,
    max_bytes: int | None = None,
    max_depth: int = MAX_DEPTH,
    redact: bool = False,
) -> object:
    """One YAML document of ``text`` (named ``source_name`` in errors) as plain Python data.

    :class:`ConfigError` for text over ``max_bytes`` (default :func:`max_config_bytes`), a syntax error,
    an alias or anchor, nesting deeper than ``max_depth``, more nodes than the budget, a huge integer or
    a duplicate key. ``redact``: messages give the position and kind of error only (kubeconfig).
    """
    limit = max_config_bytes() if max_bytes is None else max_bytes
    if len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit:
        raise ConfigError(
            source_name,
            [f"too large: more than the limit of {_limit_text(limit)} ({MAX_CONFIG_BYTES_ENV} raises it)"],
        )
    loader: StrictSafeLoader | None = None
    try:
        loader = StrictSafeLoader(text, max_depth=max_depth, max_nodes=max(limit // BYTES_PER_NODE, 1000))
        return loader.get_single_data()
    except MarkedYAMLError as exc:
        raise ConfigError(source_name, [_marked_message(exc, redact)]) from None
    except yaml.reader.ReaderError as exc:
        code = f" #x{exc.character:04x}" if isinstance(exc.character, int) and not redact else ""
        raise ConfigError(
            source_name, [f"YAML syntax error at character {exc.position + 1}: unacceptable character{code}"]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            source_name, ["YAML syntax error" if redact else f"YAML syntax error: {exc}"]
        ) from None
    except RecursionError:  # the depth limit prevents it; never a traceback all the same
        raise ConfigError(source_name, [f"invalid YAML: nested deeper than {max_depth} levels"]) from None
    except (ValueError, OverflowError) as exc:
        reason = "a value cannot be converted" if redact else f"a value cannot be converted: {str(exc)[:200]}"
        raise ConfigError(source_name, [f"invalid YAML: {reason}"]) from None
    finally:
        if loader is not None:
            loader.dispose()


def _where(mark: Mark | None) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _marked_message(exc: MarkedYAMLError, redact: bool) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = _where(mark)
    at = f" at {where}" if where else ""
    if isinstance(exc, _Refused):
        return f"invalid YAML{at}: {exc.problem}"
    kind = "invalid YAML" if isinstance(exc, ConstructorError) else "YAML syntax error"
    if redact:
        return f"{kind}{at}"
    what = " ".join(part for part in (exc.problem, exc.context) if part) or "invalid YAML"
    if exc.problem and exc.context:
        what = f"{exc.problem} ({exc.context})"
    return f"{kind}{at}: {what}" if at else f"{kind}: {what}"

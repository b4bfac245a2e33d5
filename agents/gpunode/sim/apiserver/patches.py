"""Selectors and patches for the test API server: field selectors, JSON merge patch (RFC 7386), strategic
merge patch as far as maps go, JSON patch (RFC 6902)."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# -- selectors -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    op: Literal["=", "!="]
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = _field_value(obj, self.path)
        return (actual == self.value) == (self.op == "=")


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    current: Any = obj
    for part in path.split("."):
        current = current.get(part) if isinstance(current, Mapping) else None
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def parse_field_selector(text: str) -> tuple[FieldRequirement, ...]:
    """Parse a field selector (`metadata.name=n1,spec.nodeName!=n2`); raise ValueError when malformed."""
    if not text.strip():
        return ()
    requirements: list[FieldRequirement] = []
    for term in text.split(","):
        m = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*([^=!]*?)\s*", term)
        if not m:
            raise ValueError(f"invalid field selector term {term!r}")
        op: Literal["=", "!="] = "!=" if m.group(2) == "!=" else "="
        requirements.append(FieldRequirement(m.group(1), op, m.group(3)))
    return tuple(requirements)


# -- patches ---------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: null deletes a key, objects merge recursively, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_DELETE = object()


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch as far as maps go: a merge patch that also honours `$patch: delete` and
    `$patch: replace` and ignores the other `$` directives. Lists are replaced whole (the real one merges
    some lists by key)."""
    result = _strategic(target, patch)
    return {} if result is _DELETE else result


def _strategic(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    plain = {k: v for k, v in patch.items() if not k.startswith("$")}
    if directive == "replace":
        return copy.deepcopy(plain)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in plain.items():
        merged = None if value is None else _strategic(result.get(key), value)
        if merged is None or merged is _DELETE:
            result.pop(key, None)
        else:
            result[key] = merged
    return result


class PatchError(ValueError):
    pass


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _index(token: str, length: int, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not re.fullmatch(r"0|[1-9][0-9]*", token):
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > length or (index == length and not allow_end):
        raise PatchError(f"array index {index} out of range")
    return index


def _walk(doc: Any, tokens: list[str]) -> Any:
    current = doc
    for token in tokens:
        if isinstance(current, dict):
            if token not in current:
                raise PatchError(f"missing key {token!r}")
            current = current[token]
        elif isinstance(current, list):
            current = current[_index(token, len(current), allow_end=False)]
        else:
            raise PatchError(f"cannot descend into {token!r}")
    return current


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), allow_end=True), value)
    else:
        raise PatchError(f"cannot add at {last!r}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"missing key {last!r}")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(last, len(parent), allow_end=False))
    raise PatchError(f"cannot remove {last!r}")


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); raise PatchError when one fails."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    result = copy.deepcopy(doc)
    for operation in operations:
        if not isinstance(operation, dict):
            raise PatchError(f"invalid operation {operation!r}")
        op = operation.get("op")
        tokens = _pointer(operation.get("path"))
        if op in ("add", "replace", "test") and "value" not in operation:
            raise PatchError(f"{op} needs a value")
        if op == "add":
            result = _add(result, tokens, copy.deepcopy(operation["value"]))
        elif op == "remove":
            _remove(result, tokens)
        elif op == "replace":
            if tokens:
                _remove(result, tokens)
            result = _add(result, tokens, copy.deepcopy(operation["value"]))
        elif op == "test":
            if _walk(result, tokens) != operation["value"]:
                raise PatchError(f"test failed at {operation.get('path')!r}")
        elif op in ("move", "copy"):
            source = _pointer(operation.get("from"))
            value = _remove(result, source) if op == "move" else copy.deepcopy(_walk(result, source))
            result = _add(result, tokens, value)
        else:
            raise PatchError(f"unknown operation {op!r}")
    return result

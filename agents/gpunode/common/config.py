"""Strict, versioned YAML configuration files.

``load_config(path, Model)`` reads a file with ``yaml.safe_load`` and validates it with a pydantic v2
model derived from :class:`ConfigModel`. Every problem is reported at once, each as
``dotted.yaml.path: what is wrong``, inside a :class:`ConfigError` that the runtime maps to exit code 2.

Strictness: the YAML document is validated in pydantic's JSON mode with ``strict=True``. YAML scalars
already carry their types (``3`` is an int, ``"3"`` a string, ``true`` a bool), so JSON-mode strictness
is exactly right: no silent ``"3" -> 3`` or ``"yes" -> True`` coercion, while sequences still become
tuples, strings become ``Path``/enum members, and ints are accepted where a float is expected.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from gpunode.common.errors import ConfigError

__all__ = [
    "ConfigError",
    "ConfigModel",
    "format_validation_error",
    "load_config",
    "parse_config_text",
]

M = TypeVar("M", bound=BaseModel)


class ConfigModel(BaseModel):
    """Base for every config file model: unknown keys rejected, immutable, camelCase keys in YAML.

    Fields are declared in snake_case; the YAML spells them in camelCase (``migStrategy``). The Python
    name is accepted too (``populate_by_name``), which keeps tests and code constructing models simple.
    Validation through :func:`load_config` is strict (see the module docstring).
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


# ---------------------------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike[str], model: type[M]) -> M:
    """Read and validate the YAML file at ``path``; raise :class:`ConfigError` listing every problem."""
    name = os.fspath(path)
    return parse_config_text(read_config_text(name), name, model)


def read_config_text(path: str | os.PathLike[str]) -> str:
    """A config file's text; :class:`ConfigError` naming the file when it cannot be read as UTF-8."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise ConfigError(name, ["file not found"]) from None
    except IsADirectoryError:
        raise ConfigError(name, ["cannot read: is a directory"]) from None
    except OSError as exc:
        raise ConfigError(name, [f"cannot read: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(name, [f"not valid UTF-8 (byte offset {exc.start})"]) from None
    return text


def parse_config_text(text: str, source_name: str, model: type[M]) -> M:
    """Validate YAML ``text`` (named ``source_name`` in errors) as ``model``; used for reloads too."""
    data = parse_yaml(text, source_name)
    if data is None:  # an empty document: let the model report its required keys
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            source_name, [f"top level must be a mapping of keys to values, not {_type_name(data)}"]
        )
    try:
        payload = json.dumps(data, default=json_default, allow_nan=False)
    except ValueError:
        raise ConfigError(source_name, ["values must be finite numbers (no .inf or .nan)"]) from None
    try:
        return model.model_validate_json(payload, strict=True)
    except ValidationError as exc:
        raise ConfigError(source_name, format_validation_error(exc, model)) from None


class _StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate keys instead of silently keeping the last one."""


def _construct_mapping_no_duplicates(loader: _StrictSafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key; construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictSafeLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping_no_duplicates,
)


def parse_yaml(text: str, source_name: str) -> object:
    try:
        return yaml.load(text, Loader=_StrictSafeLoader)  # a SafeLoader subclass: safe
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = " ".join(part for part in (exc.problem, exc.context) if part) or "invalid YAML"
        if exc.problem and exc.context:
            what = f"{exc.problem} ({exc.context})"
        kind = "invalid YAML" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise ConfigError(source_name, [f"{kind} at {where}{what}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source_name, [f"YAML syntax error: {exc}"]) from None


def json_default(value: object) -> object:
    # YAML types that JSON lacks: timestamps and dates become ISO strings, sets become lists,
    # !!binary becomes text where it decodes. Models declare str/datetime fields for these.
    if isinstance(value, _dt.date | _dt.datetime):
        return value.isoformat()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"unsupported YAML value {value!r}")


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


# ------------------------------------------------------------------------------------ error formatting


def format_validation_error(exc: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """Turn a pydantic ``ValidationError`` into ``"dotted.path: readable message"`` strings.

    ``model`` (the validated class) lets unknown keys suggest the closest known key.
    """
    problems: list[str] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err.get("loc", ()))
        path = format_loc(loc)
        message = _readable_message(err, loc, model)
        problem = f"{path}: {message}" if path else message
        if problem not in problems:
            problems.append(problem)
    return problems


def format_loc(loc: Sequence[int | str]) -> str:
    """``("devices", 0, "name")`` -> ``"devices[0].name"``; the empty location is the top level."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = str(part)
    return out


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "a boolean (true or false)",
    "bool_parsing": "a boolean (true or false)",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "frozen_set_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a path string",
}


def _readable_message(
    err: Mapping[str, Any], loc: tuple[int | str, ...], model: type[BaseModel] | None
) -> str:
    kind = str(err.get("type", ""))
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    got = err.get("input")
    if kind == "extra_forbidden":
        message = "unknown key"
        if model is not None and loc and isinstance(loc[-1], str):
            known = _known_keys(model, loc[:-1])
            close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
            if close:
                message += f" (did you mean {close[0]}?)"
        return message
    if kind == "missing":
        return "required key is missing"
    if kind in {"literal_error", "enum"}:
        choices = _split_expected(str(ctx.get("expected", "")))
        if len(choices) == 1:
            return f"must be {choices[0]} (got {_show(got)})"
        return f"must be one of {', '.join(choices)} (got {_show(got)})"
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}, not {_type_name(got)}"
    msg = str(err.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        return msg.removeprefix("Value error, ")
    if msg.startswith("Assertion failed, "):
        return msg.removeprefix("Assertion failed, ")
    if msg.startswith("Input should be "):
        return f"must be {msg.removeprefix('Input should be ')} (got {_show(got)})"
    return msg[:1].lower() + msg[1:]


_EXPECTED_ITEM = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"|([^\s,']+)")


def _split_expected(expected: str) -> list[str]:
    """pydantic's ``"'none', 'single' or 'mixed'"`` -> ``["none", "single", "mixed"]``."""
    items: list[str] = []
    for single, double, bare in _EXPECTED_ITEM.findall(expected):
        if bare == "or":
            continue
        items.append(single or double or bare)
    return items or [expected]


def _show(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _known_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Best effort: the YAML keys accepted by the model found at ``loc`` (for 'did you mean')."""
    current: object = model
    for part in loc:
        current = _step(current, part)
        if current is None:
            return []
    target = _find_model(current)
    if target is None:
        return []
    keys: list[str] = []
    for name, field in target.model_fields.items():
        keys.append(field.alias or name)
    return keys


def _step(annotation: object, part: int | str) -> object:
    model = _find_model(annotation)
    if isinstance(part, str) and model is not None:
        for name, field in model.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    # Containers: list[X], tuple[X, ...], dict[K, X] -> X
    for arg in _args(annotation):
        if _find_model(arg) is not None or _args(arg):
            return arg
    return None


def _args(annotation: object) -> tuple[object, ...]:
    return tuple(a for a in typing.get_args(annotation) if a is not type(None) and a is not Ellipsis)


def _find_model(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType or origin is typing.Annotated:
        for arg in typing.get_args(annotation):
            found = _find_model(arg)
            if found is not None:
                return found
    return None

"""Strict, versioned YAML configuration files.

``load_config(path, Model)`` reads a file with the one safe YAML loader (:mod:`gpunode.common.safeyaml`:
no aliases, bounded size, depth and node count) and validates it with a pydantic v2
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
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from gpunode.common.errors import ConfigError
from gpunode.common.safeyaml import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_BYTES_ENV,
    MAX_DEPTH,
    StrictSafeLoader,
    max_config_bytes,
    parse_yaml,
    read_config_text,
)

__all__ = [
    "BOOL_WORDS",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_BYTES_ENV",
    "MAX_DEPTH",
    "Bool",
    "ConfigError",
    "ConfigModel",
    "StrictSafeLoader",
    "format_validation_error",
    "load_config",
    "max_config_bytes",
    "parse_config_text",
    "parse_yaml",
    "read_config_text",
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


#: The strings a boolean may be written as: Go's ``strconv.ParseBool``, which NVIDIA's agents use for
#: booleans given as text (``"true"``, ``"False"``, ``"1"``, ``"T"``...). Unquoted YAML words
#: (``yes``, ``on``) are booleans already.
BOOL_WORDS: dict[str, bool] = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}


def _bool_from_text(value: object) -> object:
    """``"true"``/``"False"``/``"1"`` -> bool; other values go on to strict validation."""
    if isinstance(value, str) and value.strip() in BOOL_WORDS:
        return BOOL_WORDS[value.strip()]
    return value


#: A boolean that may also be written as a string (``"true"``, ``"false"``, ``"1"``...), as NVIDIA's
#: files and ClusterPolicies do; anything else is still an error ("a boolean (true or false)").
Bool = Annotated[bool, BeforeValidator(_bool_from_text)]


# ---------------------------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike[str], model: type[M], *, max_bytes: int | None = None) -> M:
    """Read and validate the YAML file at ``path``; raise :class:`ConfigError` listing every problem.

    ``max_bytes``: the size limit (default :func:`max_config_bytes`: 1 MiB or ``GPUNODE_MAX_CONFIG_BYTES``).
    """
    name = os.fspath(path)
    return parse_config_text(read_config_text(name, max_bytes=max_bytes), name, model, max_bytes=max_bytes)


def parse_config_text(text: str, source_name: str, model: type[M], *, max_bytes: int | None = None) -> M:
    """Validate YAML ``text`` (named ``source_name`` in errors) as ``model``; used for reloads too.

    The text goes through :func:`parse_yaml` (no aliases, bounded depth, nodes and size), so the tree
    serialised for pydantic below is never larger than the text itself.
    """
    data = parse_yaml(text, source_name, max_bytes=max_bytes)
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
    except RecursionError:  # parse_yaml bounds the depth; never a traceback all the same
        raise ConfigError(source_name, ["nested too deeply"]) from None
    try:
        return model.model_validate_json(payload, strict=True)
    except ValidationError as exc:
        raise ConfigError(source_name, format_validation_error(exc, model)) from None
    except RecursionError:
        raise ConfigError(source_name, ["nested too deeply"]) from None


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
    problems: dict[str, None] = {}  # ordered and deduplicated in linear time (a file may hold 50,000 errors)
    for err in exc.errors(include_url=False):
        loc = tuple(err.get("loc", ()))
        path = format_loc(loc)
        message = _readable_message(err, loc, model)
        problems[f"{path}: {message}" if path else message] = None
    return list(problems)


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

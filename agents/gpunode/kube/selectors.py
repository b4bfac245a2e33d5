"""Kubernetes label selectors: the one parser, for the drain's pod selector and the test API server.

The grammar is the API server's (``labels.Parse``): comma-separated requirements, all of which must hold:
``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a`` (exists), ``!a`` (does not exist) and
``a>1`` / ``a<1`` (an integer compare; a label that is absent or not an integer never matches). Keys are
qualified names (an optional DNS prefix up to 253 characters, a ``/``, a name up to 63), values up to 63
of ``[A-Za-z0-9._-]`` with alphanumeric ends, or empty. The empty selector selects everything.

Standard library only: importing it costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["LabelSelector", "Requirement", "SelectorOp", "is_label_key", "is_label_value"]

_LABEL_KEY = re.compile(
    r"(?:[A-Za-z0-9](?:[-A-Za-z0-9.]{0,251}[A-Za-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_INTEGER = re.compile(r"-?\d+")
_SET_TERM = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")
_COMPARE_TERM = re.compile(r"^([^=!<>\s]+)\s*(==|=|!=|>|<)\s*(\S*)$")
_EQUALITY_TERM = re.compile(r"^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$")

SelectorOp = Literal["=", "!=", "in", "notin", "exists", "!exists", "gt", "lt"]


def is_label_key(text: str) -> bool:
    """Whether ``text`` is a valid label key (``example.com/name`` or ``name``)."""
    return _LABEL_KEY.fullmatch(text) is not None


def is_label_value(text: str) -> bool:
    """Whether ``text`` is a valid label value (empty, or up to 63 of ``[A-Za-z0-9._-]``)."""
    return _LABEL_VALUE.fullmatch(text) is not None


@dataclass(frozen=True)
class Requirement:
    """One requirement of a selector: ``key``, the operator and its values (one for ``=``, ``!=``,
    ``gt``, ``lt``; the set for ``in`` / ``notin``; none for ``exists`` / ``!exists``)."""

    key: str
    op: SelectorOp
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.op:
            case "exists":
                return value is not None
            case "!exists":
                return value is None
            case "=" | "in":
                return value is not None and value in self.values
            case "!=" | "notin":
                return value is None or value not in self.values
            case "gt" | "lt":
                try:
                    number, bound = int(value or ""), int(self.values[0])
                except ValueError:
                    return False
                return number > bound if self.op == "gt" else number < bound
        return False  # pragma: no cover - every op is handled above


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector; ``text`` as given (stripped), ``terms`` its requirements."""

    text: str = ""
    terms: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str, *, numeric: bool = True) -> LabelSelector:
        """The selector, or ``ValueError`` naming the term that cannot be read. ``numeric=False`` refuses
        the integer compares ``>`` / ``<`` (such a term is then read as a key, and refused as one)."""
        terms: list[Requirement] = []
        for term in _split(text):
            if not term:
                raise ValueError(f"empty term in label selector {text!r}")
            compare = (_COMPARE_TERM if numeric else _EQUALITY_TERM).match(term)
            if match := _SET_TERM.match(term):
                key, word, inner = match.groups()
                values = tuple(v.strip() for v in inner.split(","))
                if not all(v and is_label_value(v) for v in values):
                    raise ValueError(f"invalid value list in label selector term {term!r}")
                terms.append(Requirement(_key(key, term), "in" if word == "in" else "notin", values))
            elif compare:
                key, op, value = compare.groups()
                if op in (">", "<"):
                    if not _INTEGER.fullmatch(value):
                        raise ValueError(f"{op} needs an integer value in label selector term {term!r}")
                    terms.append(Requirement(_key(key, term), "gt" if op == ">" else "lt", (value,)))
                    continue
                if not is_label_value(value):
                    raise ValueError(f"invalid value {value!r} in label selector term {term!r}")
                terms.append(Requirement(_key(key, term), "!=" if op == "!=" else "=", (value,)))
            elif term.startswith("!"):
                terms.append(Requirement(_key(term[1:].strip(), term), "!exists"))
            else:
                terms.append(Requirement(_key(term, term), "exists"))
        return cls(text.strip(), tuple(terms))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(term.matches(found) for term in self.terms)


def _split(text: str) -> list[str]:
    if not text.strip():
        return []
    terms: list[str] = []
    current, depth = "", 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            raise ValueError(f"unbalanced ')' in label selector {text!r}")
        if ch == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += ch
    if depth:
        raise ValueError(f"unbalanced '(' in label selector {text!r}")
    return [*terms, current.strip()]


def _key(key: str, term: str) -> str:
    if not is_label_key(key):
        raise ValueError(f"invalid label key {key!r} in label selector term {term!r}")
    return key

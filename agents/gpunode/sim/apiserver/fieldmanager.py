"""Field ownership for the test API server: `metadata.managedFields` and server-side apply, simplified.

The model (documented in the package docstring too):
- An object's fields are its *leaf paths*: a path through JSON objects down to a value that is not an
  object (a string, number, bool, null or a whole list), or to an empty object. Lists are atomic: whoever
  sets a list owns all of it (the real server merges some lists by key; this one never does).
- `apiVersion`, `kind` and the identity and bookkeeping keys of `metadata` (name, namespace, uid,
  resourceVersion, generation, creationTimestamp, deletion*, managedFields) are nobody's.
- Every write records ownership in `metadata.managedFields` as the real server does, one entry per
  (manager, operation, subresource) with `fieldsType: FieldsV1` and `fieldsV1` in the real `f:` notation.
  A create, update or non-apply patch gives its manager (`?fieldManager=`, else the User-Agent up to its
  first `/`) the leaves it set or changed and takes them from every other manager, without conflicts.
- An apply (`application/apply-patch+yaml`) by manager M: each leaf of the applied configuration that
  another manager owns (the same path, or one path a prefix of the other) and whose live value differs
  from the applied one is a conflict; without `force` the apply fails with 409 and the real Status shape
  (reason Conflict, one `FieldManagerConflict` cause per field). With `force` the other managers lose
  those leaves. Leaves another manager owns with the same value become shared. The applied leaves
  replace M's Apply entry; a leaf M applied before, left out now and owned by nobody else is removed
  from the object.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

JsonObj = dict[str, Any]
FieldPath = tuple[str, ...]

_UNOWNED_META = frozenset(
    {
        "name",
        "namespace",
        "generateName",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)


def leaves(obj: Mapping[str, Any], *, scope: str | None = None) -> dict[FieldPath, Any]:
    """The leaf paths of an object and their values. scope "status": only under status; "main": all
    but status; None: everything."""
    found: dict[FieldPath, Any] = {}

    def walk(value: Any, path: FieldPath) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, (*path, str(key)))
        else:
            found[path] = value

    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if scope == "status" and key != "status":
            continue
        if scope == "main" and key == "status":
            continue
        if key == "metadata" and isinstance(value, dict):
            for meta_key, meta_value in value.items():
                if meta_key not in _UNOWNED_META:
                    walk(meta_value, ("metadata", str(meta_key)))
            continue
        walk(value, (str(key),))
    return found


def dotted(path: FieldPath) -> str:
    """How the real server names a field in conflicts: `.spec.template.spec.nodeSelector`."""
    return "." + ".".join(path)


def fields_v1(paths: Iterable[FieldPath]) -> JsonObj:
    """Leaf paths in the FieldsV1 notation: {"f:spec": {"f:replicas": {}}}."""
    tree: JsonObj = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree


def paths_of(tree: Any, prefix: FieldPath = ()) -> set[FieldPath]:
    """The leaf paths of a FieldsV1 tree (what fields_v1 wrote; `.` markers and other keys skipped)."""
    found: set[FieldPath] = set()
    if not isinstance(tree, dict):
        return found
    children = {k: v for k, v in tree.items() if isinstance(k, str) and k.startswith("f:")}
    if not children:
        if prefix:
            found.add(prefix)
        return found
    for key, value in children.items():
        found |= paths_of(value, (*prefix, key[2:]))
    return found


def overlaps(a: FieldPath, b: FieldPath) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


@dataclass
class Entry:
    manager: str
    operation: str  # "Apply" or "Update"
    api_version: str
    time: str
    subresource: str | None
    fields: set[FieldPath] = field(default_factory=set)

    @property
    def ident(self) -> tuple[str, str, str | None]:
        return (self.manager, self.operation, self.subresource)

    def to_json(self) -> JsonObj:
        out: JsonObj = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1(self.fields),
        }
        if self.subresource:
            out["subresource"] = self.subresource
        return out


def entries_of(obj: Mapping[str, Any]) -> list[Entry]:
    raw = (obj.get("metadata") or {}).get("managedFields") or []
    found: list[Entry] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("manager"), str):
            continue
        found.append(
            Entry(
                item["manager"],
                str(item.get("operation") or "Update"),
                str(item.get("apiVersion") or ""),
                str(item.get("time") or ""),
                item.get("subresource") if isinstance(item.get("subresource"), str) else None,
                paths_of(item.get("fieldsV1")),
            )
        )
    return found


def _store_entries(obj: JsonObj, entries: list[Entry]) -> None:
    kept = [e.to_json() for e in entries if e.fields]
    if kept:
        obj["metadata"]["managedFields"] = kept
    else:
        obj["metadata"].pop("managedFields", None)


def _entry(entries: list[Entry], ident: tuple[str, str, str | None], api_version: str, now: str) -> Entry:
    for e in entries:
        if e.ident == ident:
            e.api_version, e.time = api_version, now
            return e
    e = Entry(ident[0], ident[1], api_version, now, ident[2])
    entries.append(e)
    return e


def _same_fields(a: list[Entry], b: list[Entry]) -> bool:
    return {e.ident: e.fields for e in a if e.fields} == {e.ident: e.fields for e in b if e.fields}


def record_update(
    old: Mapping[str, Any] | None,
    new: JsonObj,
    *,
    manager: str,
    api_version: str,
    subresource: str | None,
    scope: str | None,
    now: str,
) -> None:
    """Record a create/update/non-apply patch in new's managedFields (taken from old, if any)."""
    entries = entries_of(old) if old is not None else []
    before = leaves(old, scope=scope) if old is not None else {}
    after = leaves(new, scope=scope)
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    removed = {p for p in before if p not in after}
    touched = changed | removed
    if touched:
        previous = copy.deepcopy(entries)
        for e in entries:
            e.fields = {q for q in e.fields if not any(overlaps(q, p) for p in touched)}
        mine = _entry(entries, (manager, "Update", subresource), api_version, now)
        mine.fields |= changed
        if _same_fields(previous, entries):
            entries = previous
    _store_entries(new, entries)


@dataclass(frozen=True)
class Conflict:
    manager: str
    api_version: str
    path: FieldPath


class ApplyConflict(Exception):
    def __init__(self, conflicts: list[Conflict]) -> None:
        super().__init__(conflict_message(conflicts))
        self.conflicts = conflicts


def conflict_message(conflicts: list[Conflict]) -> str:
    """`Apply failed with 1 conflict: conflict with "m" using apps/v1: .spec.replicas`, and for several
    one group per manager, each field on its own `- ` line."""
    groups: dict[tuple[str, str], list[FieldPath]] = {}
    for c in conflicts:
        groups.setdefault((c.manager, c.api_version), []).append(c.path)
    parts = []
    for (manager, api_version), paths in groups.items():
        if len(paths) == 1:
            parts.append(f'conflict with "{manager}" using {api_version}: {dotted(paths[0])}')
        else:
            listed = "\n".join(f"- {dotted(p)}" for p in paths)
            parts.append(f'conflicts with "{manager}" using {api_version}:\n{listed}')
    count = len(conflicts)
    return f"Apply failed with {count} conflict{'s' if count != 1 else ''}: " + "\n".join(parts)


def conflict_causes(conflicts: list[Conflict]) -> list[JsonObj]:
    return [
        {
            "reason": "FieldManagerConflict",
            "message": f'conflict with "{c.manager}" using {c.api_version}',
            "field": dotted(c.path),
        }
        for c in conflicts
    ]


def _value_at(obj: Any, path: FieldPath) -> tuple[bool, Any]:
    current = obj
    for part in path:
        if not isinstance(current, dict) or part not in current:
            return False, None
        current = current[part]
    return True, current


def _remove_at(obj: JsonObj, path: FieldPath) -> None:
    parents: list[tuple[JsonObj, str]] = []
    current: Any = obj
    for part in path[:-1]:
        if not isinstance(current, dict) or part not in current:
            return
        parents.append((current, part))
        current = current[part]
    if isinstance(current, dict):
        current.pop(path[-1], None)
    # an object left empty by the removal goes too (never the top-level sections)
    for parent, key in reversed(parents[1:]):
        child = parent.get(key)
        if isinstance(child, dict) and not child:
            parent.pop(key)
        else:
            break


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target)
    for key, value in patch.items():
        result[key] = _merge(result.get(key), value)
    return result


def _strip(applied: JsonObj, scope: str | None) -> JsonObj:
    out = copy.deepcopy(applied)
    if scope == "main":
        out.pop("status", None)
    elif scope == "status":
        out = {k: v for k, v in out.items() if k in ("apiVersion", "kind", "metadata", "status")}
        meta = out.get("metadata")
        if isinstance(meta, dict):
            out["metadata"] = {k: v for k, v in meta.items() if k in _UNOWNED_META}
    meta = out.get("metadata")
    if isinstance(meta, dict):
        for key in _UNOWNED_META - {"name", "namespace"}:
            meta.pop(key, None)
    return out


def apply(
    live: JsonObj,
    applied: JsonObj,
    *,
    manager: str,
    force: bool,
    api_version: str,
    subresource: str | None,
    scope: str | None,
    now: str,
) -> JsonObj:
    """The object after manager applies `applied` to `live` (an existing object, or a bare skeleton with
    only apiVersion/kind/metadata when the apply creates it); raise ApplyConflict."""
    applied = _strip(applied, scope)
    entries = entries_of(live)
    wanted = leaves(applied, scope=scope)
    conflicts: list[Conflict] = []
    for e in entries:
        if e.manager == manager:
            continue
        for q in sorted(e.fields):
            for p, value in wanted.items():
                if not overlaps(p, q) or (len(q) > len(p) and value == {}):
                    continue  # an empty object applied claims the object, not what is in it
                longer = p if len(p) >= len(q) else q
                present, live_value = _value_at(live, longer)
                _, applied_value = _value_at(applied, longer)
                if not present or live_value != applied_value:
                    conflicts.append(Conflict(e.manager, e.api_version, q))
                    break
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    result: JsonObj = _merge(live, applied)
    mine = _entry(entries, (manager, "Apply", subresource), api_version, now)
    dropped = mine.fields - set(wanted)
    if force:
        lost = {c.path for c in conflicts}
        for e in entries:
            if e is not mine:
                e.fields -= lost
    for path in sorted(dropped, key=len, reverse=True):
        owned_elsewhere = any(overlaps(path, q) for e in entries if e is not mine for q in e.fields)
        still_wanted = any(
            overlaps(path, p) and not (len(path) > len(p) and v == {}) for p, v in wanted.items()
        )
        if not owned_elsewhere and not still_wanted:
            _remove_at(result, path)
    mine.fields = set(wanted)
    _store_entries(result, entries)
    return result


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON: unlike ``==``, ``true``, ``1`` and ``1.0`` differ (dict key order does not matter)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def same_ignoring_time(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two objects differ at most in their managedFields' timestamps (compared in place: no copy,
    as the controllers' status writes run this for every node write)."""
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        if key != "metadata":
            if not same_json(value, b[key]):
                return False
            continue
        meta_a, meta_b = value, b[key]
        if not (isinstance(meta_a, dict) and isinstance(meta_b, dict)):
            if not same_json(meta_a, meta_b):
                return False
            continue
        if meta_a.keys() != meta_b.keys():
            return False
        for name, item in meta_a.items():
            other = meta_b[name]
            if name == "managedFields" and isinstance(item, list) and isinstance(other, list):
                if len(item) != len(other):
                    return False
                for x, y in zip(item, other, strict=True):
                    if isinstance(x, dict) and isinstance(y, dict):
                        x = {k: v for k, v in x.items() if k != "time"}
                        y = {k: v for k, v in y.items() if k != "time"}
                    if not same_json(x, y):
                        return False
            elif not same_json(item, other):
                return False
    return True

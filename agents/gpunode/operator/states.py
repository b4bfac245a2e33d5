"""The ClusterPolicy's states in NVIDIA's order, and which rendered objects belong to each.

``gpunode render`` groups its objects by part (``common``, ``nfd``, then one part per agent); the
controller applies them state by state in NVIDIA's order: pre-requisites, driver, container toolkit,
operator validation, device plugin, DCGM exporter, GPU feature discovery, MIG manager. A state that is
not ready does not hold back the later ones. Pure: no Kubernetes client, no rendering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STATES",
    "Obj",
    "ObjectKey",
    "StateDef",
    "StateObjects",
    "assign_states",
    "key_of",
    "stale_keys",
    "state_of_part",
]

Obj = dict[str, Any]  # a Kubernetes object as JSON


@dataclass(frozen=True)
class StateDef:
    """One state: its NVIDIA name, the rendered parts it holds, and whether it runs whatever the policy
    enables (NVIDIA's pre-requisites and operator validation)."""

    name: str
    parts: tuple[str, ...]
    always: bool = False


STATES: tuple[StateDef, ...] = (
    StateDef("pre-requisites", ("common", "nfd"), always=True),
    StateDef("state-driver", ("driver",)),
    StateDef("state-container-toolkit", ("toolkit",)),
    StateDef("state-operator-validation", ("validator",), always=True),
    StateDef("state-device-plugin", ("device-plugin",)),
    StateDef("state-mps-control-daemon", ("mps-control-daemon",)),
    StateDef("state-dcgm-exporter", ("exporter",)),
    StateDef("gpu-feature-discovery", ("feature-discovery",)),
    StateDef("state-mig-manager", ("mig-manager",)),
)
_BY_PART = {part: s for s in STATES for part in s.parts}


def state_of_part(part: str) -> StateDef:
    """The state holding a rendered part; ``KeyError`` naming the known parts otherwise."""
    try:
        return _BY_PART[part]
    except KeyError:
        raise KeyError(
            f"rendered part {part!r} belongs to no state; known parts: {', '.join(_BY_PART)}"
        ) from None


@dataclass(frozen=True, order=True)
class ObjectKey:
    """Identifies an object: ``namespace`` is ``""`` for cluster-scoped kinds."""

    api_version: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def key_of(obj: Mapping[str, Any]) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return ObjectKey(
        str(obj.get("apiVersion", "")),
        str(obj.get("kind", "")),
        str(meta.get("namespace") or ""),
        str(meta.get("name", "")),
    )


@dataclass(frozen=True)
class StateObjects:
    """A state's rendered objects (in render order); ``enabled`` false when the policy turns it off."""

    name: str
    enabled: bool
    objects: tuple[Obj, ...]


def assign_states(rendered: Mapping[str, Sequence[Obj]]) -> list[StateObjects]:
    """Every state in NVIDIA's order with the objects of its rendered parts; a state none of whose parts
    were rendered is disabled unless it always runs. ``KeyError`` for a part no state holds."""
    for part in rendered:
        state_of_part(part)
    out: list[StateObjects] = []
    for s in STATES:
        present = [p for p in s.parts if p in rendered]
        objects = tuple(o for p in present for o in rendered[p])
        out.append(StateObjects(s.name, s.always or bool(present), objects))
    return out


def stale_keys(possible: Sequence[StateObjects], desired: Sequence[StateObjects]) -> list[ObjectKey]:
    """Objects the operator could own (``possible``: the policy rendered with every component on) that
    the current policy does not render: the objects of disabled components, to delete. Later states
    first, and within a state in reverse render order (a DaemonSet before its ServiceAccount)."""
    wanted = {key_of(o) for s in desired for o in s.objects}
    out: list[ObjectKey] = []
    seen: set[ObjectKey] = set()
    for s in reversed(possible):
        for o in reversed(s.objects):
            k = key_of(o)
            if k not in wanted and k not in seen:
                seen.add(k)
                out.append(k)
    return out

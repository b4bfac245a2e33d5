"""gpunode.operator.states: NVIDIA's state order, rendered parts to states, what to delete."""

from __future__ import annotations

import pytest

from gpunode.operator.states import STATES, ObjectKey, assign_states, key_of, stale_keys, state_of_part


def obj(kind: str, name: str, namespace: str | None = "gpunode", api: str = "v1") -> dict[str, object]:
    meta: dict[str, object] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": api, "kind": kind, "metadata": meta}


NS = obj("Namespace", "gpunode", None)
DRIVER = [obj("ServiceAccount", "driver"), obj("DaemonSet", "driver", api="apps/v1")]
PLUGIN = [obj("ServiceAccount", "plugin"), obj("DaemonSet", "plugin", api="apps/v1")]
MIG = [obj("DaemonSet", "mig", api="apps/v1")]


def test_nvidia_order() -> None:
    assert [s.name for s in STATES] == [
        "pre-requisites",
        "state-driver",
        "state-container-toolkit",
        "state-operator-validation",
        "state-device-plugin",
        "state-mps-control-daemon",
        "state-dcgm-exporter",
        "gpu-feature-discovery",
        "state-mig-manager",
    ]


@pytest.mark.parametrize(
    ("part", "state"),
    [
        ("common", "pre-requisites"),
        ("nfd", "pre-requisites"),
        ("driver", "state-driver"),
        ("toolkit", "state-container-toolkit"),
        ("device-plugin", "state-device-plugin"),
        ("exporter", "state-dcgm-exporter"),
        ("feature-discovery", "gpu-feature-discovery"),
        ("mig-manager", "state-mig-manager"),
    ],
)
def test_part_to_state(part: str, state: str) -> None:
    assert state_of_part(part).name == state


def test_unknown_part_is_an_error() -> None:
    with pytest.raises(KeyError, match="'bogus' belongs to no state"):
        assign_states({"bogus": []})


def test_assign_keeps_render_order_and_marks_disabled() -> None:
    got = {s.name: s for s in assign_states({"common": [NS], "driver": DRIVER, "device-plugin": PLUGIN})}
    assert got["pre-requisites"].objects == (NS,)
    assert got["state-driver"].objects == tuple(DRIVER)
    assert got["state-driver"].enabled
    assert not got["state-mig-manager"].enabled
    assert got["state-operator-validation"].enabled  # always runs, even with nothing rendered
    assert got["state-operator-validation"].objects == ()


def test_key_of() -> None:
    assert key_of(NS) == ObjectKey("v1", "Namespace", "", "gpunode")
    assert str(key_of(DRIVER[1])) == "DaemonSet gpunode/driver"


@pytest.mark.parametrize(
    ("desired_parts", "expected"),
    [
        (["common", "driver", "device-plugin", "mig-manager"], []),
        (
            ["common", "driver"],
            [key_of(MIG[0]), key_of(PLUGIN[1]), key_of(PLUGIN[0])],  # later states first, DaemonSet first
        ),
        (["common", "device-plugin", "mig-manager"], [key_of(DRIVER[1]), key_of(DRIVER[0])]),
    ],
)
def test_stale_keys(desired_parts: list[str], expected: list[ObjectKey]) -> None:
    everything = {"common": [NS], "driver": DRIVER, "device-plugin": PLUGIN, "mig-manager": MIG}
    desired = {p: everything[p] for p in desired_parts}
    assert stale_keys(assign_states(everything), assign_states(desired)) == expected

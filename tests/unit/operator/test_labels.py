"""gpunode.operator.labels: node states in a table, each with the one patch it needs."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gpunode.operator.labels import (
    DEPLOY_OPERANDS,
    GPU_PRESENT,
    MIG_CONFIG,
    OWNED_ANNOTATION,
    WORKLOAD_LABEL,
    WORKLOAD_OPERANDS,
    LabelPolicy,
    NodePatch,
    has_nfd_labels,
    is_gpu_node,
    mig_capable,
    owned_labels,
    plan_node_labels,
    workload_of,
)

NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
D = "nvidia.com/gpu.deploy."
CONTAINER = [D + o for o in WORKLOAD_OPERANDS["container"]]
PASSTHROUGH = [D + o for o in WORKLOAD_OPERANDS["vm-passthrough"]]
MIG_MANAGER = D + "mig-manager"
SANDBOX = LabelPolicy(sandbox_workloads=True)


def all_true(keys: list[str]) -> dict[str, str]:
    return dict.fromkeys(keys, "true")


def record(keys: list[str]) -> dict[str, str]:
    return {OWNED_ANNOTATION: ",".join(sorted(keys))}


def labelled(extra: Mapping[str, str] | None = None, keys: list[str] = CONTAINER) -> dict[str, str]:
    """A GPU node as the operator leaves it."""
    return {**NFD, GPU_PRESENT: "true", **all_true(keys), **(extra or {})}


def apply(
    labels: Mapping[str, str], annotations: Mapping[str, str], patch: NodePatch | None
) -> tuple[dict[str, str], dict[str, str]]:
    """The node after the merge patch."""
    out_l, out_a = dict(labels), dict(annotations)
    for source, out in ((patch.labels if patch else {}, out_l), (patch.annotations if patch else {}, out_a)):
        for key, value in source.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
    return out_l, out_a


# Each row: node labels, node annotations, policy, expected label changes, expected record (None: the
# annotation is removed; "same": unchanged). A row whose expected changes are {} and record "same" expects
# no patch at all.
CASES = [
    pytest.param(
        {"kubernetes.io/hostname": "cpu-1"},
        {},
        None,
        {},
        "same",
        id="non-GPU node without our labels: no patch",
    ),
    pytest.param(
        NFD,
        {},
        None,
        {GPU_PRESENT: "true", **all_true(CONTAINER)},
        CONTAINER,
        id="new GPU node: gpu.present and every container operand, recorded as ours",
    ),
    pytest.param(
        {"feature.node.kubernetes.io/pci-0302_10de.present": "true"},
        {},
        None,
        {GPU_PRESENT: "true", **all_true(CONTAINER)},
        CONTAINER,
        id="3D-controller class label alone makes a GPU node",
    ),
    pytest.param(
        {"feature.node.kubernetes.io/pci-0300_10de.present": "true"},
        {},
        None,
        {GPU_PRESENT: "true", **all_true(CONTAINER)},
        CONTAINER,
        id="display-controller class label alone makes a GPU node",
    ),
    pytest.param(
        {"feature.node.kubernetes.io/pci-10de.present": "false"},
        {},
        None,
        {},
        "same",
        id="NFD label false: not a GPU node",
    ),
    pytest.param(
        labelled(),
        record(CONTAINER),
        None,
        {},
        "same",
        id="labelled GPU node: no patch",
    ),
    pytest.param(
        labelled({D + "device-plugin": "false"}),
        record(CONTAINER),
        None,
        {},
        [k for k in CONTAINER if k != D + "device-plugin"],
        id="user's device-plugin=false kept, and no longer ours",
    ),
    pytest.param(
        labelled({D + "device-plugin": "false"}),
        record([k for k in CONTAINER if k != D + "device-plugin"]),
        None,
        {},
        "same",
        id="user's false on a label we never recorded: no patch",
    ),
    pytest.param(
        {**NFD, D + "device-plugin": "false"},
        {},
        None,
        {GPU_PRESENT: "true", **all_true([k for k in CONTAINER if k != D + "device-plugin"])},
        [k for k in CONTAINER if k != D + "device-plugin"],
        id="user's false set before the first pass is never overwritten",
    ),
    pytest.param(
        labelled({D + "device-plugin": "paused-for-mig-change"}),
        record(CONTAINER),
        None,
        {},
        "same",
        id="paused-for-mig-change survives and stays ours",
    ),
    pytest.param(
        labelled({D + "driver": "pre-installed"}),
        record([k for k in CONTAINER if k != D + "driver"]),
        None,
        {},
        "same",
        id="driver manager's pre-installed kept",
    ),
    pytest.param(
        labelled({D + "dcgm": ""}),
        record([k for k in CONTAINER if k != D + "dcgm"]),
        None,
        {D + "dcgm": "true"},
        CONTAINER,
        id="empty value counts as absent",
    ),
    pytest.param(
        labelled({GPU_PRESENT: "false"}),
        record(CONTAINER),
        None,
        {GPU_PRESENT: "true"},
        "same",
        id="gpu.present false on a GPU node turned true",
    ),
    pytest.param(
        {GPU_PRESENT: "true", **all_true(CONTAINER)},
        record(CONTAINER),
        None,
        {GPU_PRESENT: "false", **dict.fromkeys(CONTAINER)},
        None,
        id="NFD labels gone: gpu.present false, our labels removed",
    ),
    pytest.param(
        {GPU_PRESENT: "true", **all_true(CONTAINER), D + "device-plugin": "false"},
        record([k for k in CONTAINER if k != D + "device-plugin"]),
        None,
        {GPU_PRESENT: "false", **{k: None for k in CONTAINER if k != D + "device-plugin"}},
        None,
        id="NFD labels gone: user's false stays",
    ),
    pytest.param(
        {GPU_PRESENT: "false"},
        {},
        None,
        {},
        "same",
        id="gpu.present already false: no patch",
    ),
    pytest.param(
        labelled({DEPLOY_OPERANDS: "false"}),
        record(CONTAINER),
        None,
        dict.fromkeys(CONTAINER),
        None,
        id="deploy.operands=false removes our labels",
    ),
    pytest.param(
        labelled({DEPLOY_OPERANDS: "false", D + "nvsm": "true"}),
        record(CONTAINER),
        None,
        dict.fromkeys(CONTAINER),
        None,
        id="deploy.operands=false leaves a label that is not ours",
    ),
    pytest.param(
        labelled({DEPLOY_OPERANDS: "false"}),
        {},
        None,
        {},
        "same",
        id="deploy.operands=false without our record removes nothing (labels of an earlier operator)",
    ),
    pytest.param(
        labelled({DEPLOY_OPERANDS: "false", D + "device-plugin": "paused-for-mig-change"}),
        record(CONTAINER),
        None,
        {k: None for k in CONTAINER if k != D + "device-plugin"},
        [D + "device-plugin"],
        id="deploy.operands=false: a paused label waits for its pause to end",
    ),
    pytest.param(
        {**NFD, GPU_PRESENT: "true", DEPLOY_OPERANDS: "false"},
        {},
        None,
        {},
        "same",
        id="deploy.operands=false on a fresh GPU node adds nothing",
    ),
    pytest.param(
        {**NFD, GPU_PRESENT: "true", DEPLOY_OPERANDS: "true"},
        {},
        None,
        all_true(CONTAINER),
        CONTAINER,
        id="deploy.operands=true: labels added as usual",
    ),
    pytest.param(
        labelled({"nvidia.com/mig.capable": "true"}),
        record(CONTAINER),
        None,
        {MIG_MANAGER: "true", MIG_CONFIG: "all-disabled"},
        [*CONTAINER, MIG_MANAGER],
        id="MIG-capable (GFD label): MIG manager and mig.config=all-disabled",
    ),
    pytest.param(
        labelled({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}),
        record(CONTAINER),
        None,
        {MIG_MANAGER: "true", MIG_CONFIG: "all-disabled"},
        [*CONTAINER, MIG_MANAGER],
        id="MIG-capable by product name without GFD's label",
    ),
    pytest.param(
        labelled({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.capable": "false"}),
        record(CONTAINER),
        None,
        {},
        "same",
        id="GFD's mig.capable=false beats the product name",
    ),
    pytest.param(
        labelled({"nvidia.com/gpu.product": "Tesla-T4"}),
        record(CONTAINER),
        None,
        {},
        "same",
        id="not MIG-capable: no MIG manager, no mig.config",
    ),
    pytest.param(
        labelled({"nvidia.com/mig.capable": "true", "nvidia.com/vgpu.host-driver-version": "550.54"}),
        record(CONTAINER),
        None,
        {},
        "same",
        id="vGPU host: never MIG-capable",
    ),
    pytest.param(
        labelled({"nvidia.com/mig.capable": "true", MIG_MANAGER: "true", MIG_CONFIG: "all-1g.5gb"}),
        record([*CONTAINER, MIG_MANAGER]),
        None,
        {},
        "same",
        id="mig.config already chosen: kept",
    ),
    pytest.param(
        labelled({"nvidia.com/mig.capable": "true", MIG_MANAGER: "true", MIG_CONFIG: ""}),
        record([*CONTAINER, MIG_MANAGER]),
        None,
        {MIG_CONFIG: "all-disabled"},
        "same",
        id="mig.config empty counts as unset",
    ),
    pytest.param(
        labelled({"nvidia.com/mig.capable": "true", MIG_MANAGER: "true"}),
        record([*CONTAINER, MIG_MANAGER]),
        LabelPolicy(mig_config_default=""),
        {},
        "same",
        id="policy without a MIG default writes no mig.config",
    ),
    pytest.param(
        labelled({MIG_MANAGER: "true"}),
        record([*CONTAINER, MIG_MANAGER]),
        None,
        {},
        "same",
        id="our MIG manager label stays when GFD's label is missing for a moment",
    ),
    pytest.param(
        labelled({MIG_MANAGER: "paused-for-mig-change", "nvidia.com/mig.capable": "true", MIG_CONFIG: "x"}),
        record([*CONTAINER, MIG_MANAGER]),
        None,
        {},
        "same",
        id="paused MIG manager label kept",
    ),
    pytest.param(
        labelled(),
        record(CONTAINER),
        SANDBOX,
        {},
        "same",
        id="sandbox workloads on, no workload label: container by default",
    ),
    pytest.param(
        labelled({WORKLOAD_LABEL: "vm-passthrough", D + "device-plugin": "false"}),
        record(CONTAINER),
        SANDBOX,
        {**{k: None for k in CONTAINER if k != D + "device-plugin"}, **all_true(PASSTHROUGH)},
        PASSTHROUGH,
        id="workload type changed: our old labels go, new ones come, user's false stays",
    ),
    pytest.param(
        labelled({WORKLOAD_LABEL: "vm-passthrough"}),
        record(CONTAINER),
        None,
        {},
        "same",
        id="workload label ignored without sandbox workloads",
    ),
    pytest.param(
        {**NFD, WORKLOAD_LABEL: "bogus"},
        {},
        LabelPolicy(sandbox_workloads=True, default_workload="vm-vgpu"),
        {GPU_PRESENT: "true", **all_true([D + o for o in WORKLOAD_OPERANDS["vm-vgpu"]])},
        [D + o for o in WORKLOAD_OPERANDS["vm-vgpu"]],
        id="unknown workload label: the policy's default",
    ),
    pytest.param(
        {**NFD, "nvidia.com/mig.capable": "true"},
        {},
        LabelPolicy(sandbox_workloads=True, default_workload="x"),
        {GPU_PRESENT: "true", **all_true(CONTAINER), MIG_MANAGER: "true", MIG_CONFIG: "all-disabled"},
        [*CONTAINER, MIG_MANAGER],
        id="unknown default workload: container",
    ),
    pytest.param(
        labelled({WORKLOAD_LABEL: "vm-vgpu", MIG_MANAGER: "true"}, keys=[]),
        record([MIG_MANAGER]),
        SANDBOX,
        {MIG_MANAGER: None, **all_true([D + o for o in WORKLOAD_OPERANDS["vm-vgpu"]])},
        [D + o for o in WORKLOAD_OPERANDS["vm-vgpu"]],
        id="MIG manager label removed on a vGPU-workload node",
    ),
    pytest.param(
        labelled(),
        {OWNED_ANNOTATION: "x" * 9000},
        None,
        {},
        None,
        id="huge record unreadable: replaced (removed, nothing recorded as ours)",
    ),
    pytest.param(
        labelled(),
        {OWNED_ANNOTATION: "kubernetes.io/hostname," + D + "driver"},
        None,
        {},
        None,
        id="record naming a non-deploy label unreadable: nothing is ours",
    ),
    pytest.param(
        labelled({DEPLOY_OPERANDS: "false"}),
        {OWNED_ANNOTATION: "kubernetes.io/hostname"},
        None,
        {},
        None,
        id="forged record never makes the operator remove another label",
    ),
    pytest.param(
        labelled(),
        {OWNED_ANNOTATION: ",".join(reversed(sorted(CONTAINER)))},
        None,
        {},
        CONTAINER,
        id="record rewritten in order once",
    ),
]


@pytest.mark.parametrize(("labels", "annotations", "policy", "changes", "owned"), CASES)
def test_plan(
    labels: dict[str, str],
    annotations: dict[str, str],
    policy: LabelPolicy | None,
    changes: dict[str, str | None],
    owned: list[str] | str | None,
) -> None:
    patch = plan_node_labels(labels, annotations, policy)
    if not changes and owned == "same":
        assert patch is None
        return
    assert patch is not None
    assert dict(patch.labels) == changes
    if owned == "same":
        assert OWNED_ANNOTATION not in patch.annotations
    elif owned is None:
        assert dict(patch.annotations) == {OWNED_ANNOTATION: None}
    else:
        assert dict(patch.annotations) == {OWNED_ANNOTATION: ",".join(sorted(owned))}
    # Applying the patch settles the node: planning again changes nothing.
    after_l, after_a = apply(labels, annotations, patch)
    assert plan_node_labels(after_l, after_a, policy) is None


def test_paused_label_removed_once_its_pause_ends() -> None:
    labels = labelled({DEPLOY_OPERANDS: "false", D + "device-plugin": "paused-for-mig-change"})
    labels, annotations = apply(labels, record(CONTAINER), plan_node_labels(labels, record(CONTAINER)))
    assert labels[D + "device-plugin"] == "paused-for-mig-change"
    labels[D + "device-plugin"] = "true"  # the MIG manager restores it
    patch = plan_node_labels(labels, annotations)
    assert patch is not None
    assert dict(patch.labels) == {D + "device-plugin": None}
    assert dict(patch.annotations) == {OWNED_ANNOTATION: None}


def test_operands_back_on_after_false() -> None:
    labels = labelled({DEPLOY_OPERANDS: "false"})
    labels, annotations = apply(labels, record(CONTAINER), plan_node_labels(labels, record(CONTAINER)))
    assert not any(k in labels for k in CONTAINER)
    labels[DEPLOY_OPERANDS] = "true"
    patch = plan_node_labels(labels, annotations)
    assert patch is not None
    assert dict(patch.labels) == all_true(CONTAINER)


def test_describe_lists_sets_and_removals() -> None:
    patch = NodePatch(labels={"b": None, "a": "true"}, annotations={OWNED_ANNOTATION: "x"})
    assert patch.describe() == f"a=true, -b, {OWNED_ANNOTATION}=..."


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param({}, False, id="no labels"),
        pytest.param({"feature.node.kubernetes.io/pci-10de.present": "true"}, True, id="vendor label"),
        pytest.param({"feature.node.kubernetes.io/pci-1002.present": "true"}, False, id="another vendor"),
        pytest.param({GPU_PRESENT: "true"}, False, id="gpu.present alone is not NFD's word"),
    ],
)
def test_is_gpu_node(labels: dict[str, str], expected: bool) -> None:
    assert is_gpu_node(labels) is expected


def test_has_nfd_labels() -> None:
    assert has_nfd_labels({"feature.node.kubernetes.io/kernel-version.major": "6"})
    assert not has_nfd_labels({"kubernetes.io/hostname": "a"})


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param({"nvidia.com/mig.capable": "true"}, True, id="GFD true"),
        pytest.param(
            {"nvidia.com/mig.capable": "false", "nvidia.com/gpu.product": "A100"}, False, id="GFD false"
        ),
        pytest.param({"nvidia.com/gpu.product": "NVIDIA-A30"}, True, id="A30 by name"),
        pytest.param({"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"}, True, id="H100 by name"),
        pytest.param({"nvidia.com/gpu.product": "NVIDIA-L4"}, False, id="L4 by name"),
        pytest.param({}, False, id="nothing known"),
        pytest.param(
            {"nvidia.com/mig.capable": "true", "nvidia.com/vgpu.host-driver-version": "1"},
            False,
            id="vGPU host",
        ),
    ],
)
def test_mig_capable(labels: dict[str, str], expected: bool) -> None:
    assert mig_capable(labels) is expected


def test_workload_of() -> None:
    assert workload_of({WORKLOAD_LABEL: "vm-vgpu"}, LabelPolicy()) == "container"
    assert workload_of({WORKLOAD_LABEL: "vm-vgpu"}, SANDBOX) == "vm-vgpu"
    assert workload_of({}, LabelPolicy(sandbox_workloads=True, default_workload="vm-passthrough")) == (
        "vm-passthrough"
    )


def test_owned_labels_reads_only_deploy_labels() -> None:
    assert owned_labels({}) == frozenset()
    assert owned_labels({OWNED_ANNOTATION: f"{D}driver, {D}dcgm,"}) == {D + "driver", D + "dcgm"}
    assert owned_labels({OWNED_ANNOTATION: DEPLOY_OPERANDS}) == frozenset()
    assert owned_labels({OWNED_ANNOTATION: D + "bad key!"}) == frozenset()

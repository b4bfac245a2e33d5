"""The rendered node policies' CEL, evaluated as the API server evaluates a ValidatingAdmissionPolicy on a
node update (helpers.admission: Google's CEL runtime, dynamic ``object`` / ``oldObject`` maps, match
conditions, variables in order, every validation): what each agent writes on its own node is admitted;
another node, a token without one node, a key it does not own, the spec (but the driver manager's cordon),
finalizers and owners are refused; other users are not the policies' business.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gpunode.api.clusterpolicy import load_policy
from gpunode.deploy.render import NODE_NAME_CLAIM, node_writes, render
from helpers.admission import compile_cel, denials

POLICIES = Path(__file__).resolve().parents[3] / "containers" / "policies"
NODE = "gpu-1"
NS = "gpunode"
DP, MIG, DRIVER = "gpunode-device-plugin", "gpunode-mig-manager", "gpunode-driver-loader"


def _rendered() -> dict[str, dict[str, Any]]:
    """The three node policies (the time-slicing seed turns on the device plugin's label mode)."""
    objs = render(load_policy(POLICIES / "mig-mixed-timeslicing.yaml").policy, namespace=NS)
    return {
        o["metadata"]["name"].removesuffix("-own-node"): o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy"
    }


POLICY = _rendered()
WRITES = node_writes(load_policy(POLICIES / "mig-mixed-timeslicing.yaml").policy)
OWNED = {DP: WRITES["device-plugin"], MIG: WRITES["mig-manager"], DRIVER: WRITES["driver"]}


def admit(
    agent: str,
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    user: str | None = None,
    claim: list[str] | None = None,
) -> list[str]:
    """Why ``agent``'s policy denies this update by ``user`` (default: the agent's service account, its
    token bound to a pod on ``NODE``; ``claim=["<none>"]``: a token without the claim); [] if admitted."""
    return denials(
        POLICY[agent],
        old,
        new,
        user=user or f"system:serviceaccount:{NS}:{agent}",
        node_claim=None if claim == ["<none>"] else (claim if claim is not None else [NODE]),
    )


def node(name: str = NODE, **changes: Any) -> dict[str, Any]:
    """A realistic node (labels from NFD and the operator, annotations from the kubelet, taints, status)."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "b0c1e6f2",
            "resourceVersion": "1234",
            "labels": {
                "kubernetes.io/hostname": name,
                "node-role.kubernetes.io/gpu": "",
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.deploy.device-plugin": "true",
                "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
                "nvidia.com/gpu.deploy.dcgm-exporter": "true",
                "nvidia.com/gpu.deploy.driver": "true",
                "nvidia.com/mig.config": "all-balanced",
                "nvidia.com/device-plugin.config": "sliced",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24"],
            "providerID": "aws:///us-east-1a/i-0abc",
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        },
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "nodeInfo": {"kubeletVersion": "v1.31.2"}},
    }
    for path, value in changes.items():
        _set(obj, path, value)
    return obj


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    """``metadata__labels__<key>=value`` style paths; a key with dots is the last part; None removes."""
    parts = path.split("__")
    parent = obj
    for part in parts[:-1]:
        parent = parent.setdefault(part, {})
    if value is None:
        parent.pop(parts[-1], None)
    else:
        parent[parts[-1]] = value


def changed(
    old: dict[str, Any],
    *,
    labels: dict[str, str | None] | None = None,
    annotations: dict[str, str | None] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """``old`` after a merge patch of labels / annotations (None removes) and spec fields."""
    new = copy.deepcopy(old)
    for field, patch in (("labels", labels), ("annotations", annotations)):
        for key, value in (patch or {}).items():
            target = new["metadata"].setdefault(field, {})
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    for key, value in spec.items():
        if value is None:
            new["spec"].pop(key, None)
        else:
            new["spec"][key] = value
    new["metadata"]["resourceVersion"] = "1235"  # the server's own change on every write
    return new


# -- every expression is valid CEL -----------------------------------------------------------------------
@pytest.mark.parametrize("agent", sorted(POLICY))
def test_every_expression_compiles_and_type_checks(agent: str) -> None:
    spec = POLICY[agent]["spec"]
    exprs = [m["expression"] for m in spec["matchConditions"]]
    exprs += [v["expression"] for v in spec["variables"]]
    exprs += [r["expression"] for r in spec["validations"]]
    exprs += [r["messageExpression"] for r in spec["validations"] if "messageExpression" in r]
    for expression in exprs:
        compile_cel(expression)


def test_the_three_agents_that_patch_their_node_have_policies() -> None:
    assert sorted(POLICY) == sorted([DP, MIG, DRIVER])
    assert NODE_NAME_CLAIM == "authentication.kubernetes.io/node-name"


# -- what each agent does is admitted ---------------------------------------------------------------------
def test_the_device_plugin_reports_its_config() -> None:
    old = node()
    state, applied = "nvidia.com/device-plugin.config.state", "nvidia.com/device-plugin.config.applied"
    assert OWNED[DP].annotations == (applied, state)
    new = changed(old, annotations={state: "applied", applied: "sliced"})
    assert admit(DP, old, new) == []
    assert admit(DP, new, changed(new, annotations={state: "failed: no such config", applied: ""})) == []


def test_the_mig_manager_pauses_sets_its_state_and_restores() -> None:
    old = node()
    pause = {
        "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "paused-for-mig-change",
        "nvidia.com/gpu.deploy.dcgm-exporter": "paused-for-mig-change",
    }
    paused = changed(old, labels=pause, annotations={"nvidia.com/gpunode.operands-paused": '{"owner":"x"}'})
    assert admit(MIG, old, paused) == []
    state = changed(
        paused,
        labels={"nvidia.com/mig.config.state": "pending"},
        annotations={"nvidia.com/mig.config.state-reason": None},
    )
    assert admit(MIG, paused, state) == []
    failed = changed(
        state,
        labels={"nvidia.com/mig.config.state": "failed"},
        annotations={"nvidia.com/mig.config.state-reason": "GPU 3: in use"},
    )
    assert admit(MIG, state, failed) == []
    restored = changed(
        failed, labels={k: "true" for k in pause}, annotations={"nvidia.com/gpunode.operands-paused": None}
    )
    assert admit(MIG, failed, restored) == []


def test_the_driver_manager_cordons_pauses_and_labels() -> None:
    old = node()
    record = {"nvidia.com/gpunode.driver-upgrade": '{"cordoned":true}'}
    cordoned = changed(old, annotations=record, unschedulable=True)
    assert admit(DRIVER, old, cordoned) == []
    paused = changed(
        cordoned,
        labels={
            "nvidia.com/gpu.deploy.container-toolkit": "paused-for-driver-upgrade",
            "nvidia.com/gpu.deploy.operator-validator": "paused-for-driver-upgrade",
        },
        annotations={"nvidia.com/gpunode.operands-paused": "{}"},
    )
    assert admit(DRIVER, cordoned, paused) == []
    uncordoned = changed(paused, unschedulable=None)
    assert admit(DRIVER, paused, uncordoned) == []
    host = changed(old, labels={"nvidia.com/gpu.deploy.driver": "pre-installed"})
    assert admit(DRIVER, old, host) == []


def test_a_node_without_labels_or_annotations_yet() -> None:
    old = node(metadata__labels=None, metadata__annotations=None)
    new = changed(old, annotations={"nvidia.com/device-plugin.config.state": "applied"})
    assert admit(DP, old, new) == []
    assert admit(MIG, old, changed(old, labels={"nvidia.com/mig.config.state": "success"})) == []


def test_someone_else_is_not_this_policys_business() -> None:
    old = node()
    new = changed(old, labels={"kubernetes.io/hostname": "renamed"}, unschedulable=True)
    for user in (
        "system:node:gpu-1",  # the kubelet
        "kubernetes-admin",
        f"system:serviceaccount:other:{MIG}",  # the same name in another namespace
        f"system:serviceaccount:{NS}:gpunode-feature-discovery",
    ):
        for agent in POLICY:
            assert admit(agent, old, new, user=user) == [], (agent, user)


# -- everything else is denied ----------------------------------------------------------------------------
@pytest.mark.parametrize("agent", [DP, MIG, DRIVER])
def test_another_node_is_refused(agent: str) -> None:
    key = (OWNED[agent].annotations + OWNED[agent].labels)[0]
    field = "annotations" if key in OWNED[agent].annotations else "labels"
    old = node("gpu-2")
    new = changed(old, **{field: {key: "x"}})
    denied = admit(agent, old, new)
    assert denied == [f"{agent} may change only the node its pod runs on ({NODE}), not gpu-2"]


@pytest.mark.parametrize("agent", [DP, MIG, DRIVER])
@pytest.mark.parametrize("claim", [["<none>"], [], ["gpu-1", "gpu-2"], [""]])
def test_a_token_not_bound_to_one_node_is_refused(agent: str, claim: list[str]) -> None:
    old = node()
    new = changed(old, annotations={OWNED[agent].annotations[0]: "x"})
    denied = admit(agent, old, new, claim=claim)
    assert any("service account token bound to a pod" in d for d in denied), denied


@pytest.mark.parametrize("agent", [DP, MIG, DRIVER])
@pytest.mark.parametrize(
    ("field", "patch"),
    [
        ("labels", {"kubernetes.io/hostname": "evil"}),  # change someone else's
        ("labels", {"node-role.kubernetes.io/control-plane": ""}),  # add one
        ("labels", {"feature.node.kubernetes.io/pci-10de.present": None}),  # remove one
        ("labels", {"nvidia.com/mig.config": "all-disabled"}),  # the admin's choice, read by the manager
        ("labels", {"nvidia.com/device-plugin.config": "other"}),
        ("labels", {"nvidia.com/gpu.deploy.operands": "false"}),
        ("annotations", {"node.alpha.kubernetes.io/ttl": "30"}),
        ("annotations", {"example.com/new": "x"}),
        ("annotations", {"volumes.kubernetes.io/controller-managed-attach-detach": None}),
    ],
)
def test_keys_it_does_not_own_are_refused(agent: str, field: str, patch: dict[str, str | None]) -> None:
    old = node()
    denied = admit(agent, old, changed(old, **{field: patch}))
    assert denied == [f"{agent} may change {_owned_text(agent, field)}"]


def _owned_text(agent: str, field: str) -> str:
    keys = getattr(OWNED[agent], field)
    return f"only these {field} of its node: {', '.join(keys)}" if keys else f"no {field} of its node"


def test_the_device_plugin_and_mig_manager_may_not_cordon_and_nobody_may_touch_taints() -> None:
    old = node()
    for agent in (DP, MIG):
        assert admit(agent, old, changed(old, unschedulable=True)) == [
            f"{agent} may change nothing in its node's spec"
        ]
    for agent in (DP, MIG, DRIVER):
        untainted = changed(old, taints=None)
        assert admit(agent, old, untainted), agent
        assert admit(agent, old, changed(old, taints=[{"key": "x", "effect": "NoExecute"}])), agent
        assert admit(agent, old, changed(old, providerID="aws:///elsewhere")), agent


def test_the_mig_manager_may_not_flip_the_driver_deploy_label() -> None:
    old = node()
    assert admit(MIG, old, changed(old, labels={"nvidia.com/gpu.deploy.driver": "false"}))
    assert admit(DRIVER, old, changed(old, labels={"nvidia.com/gpu.deploy.driver": "pre-installed"})) == []


def test_finalizers_and_owners_are_refused() -> None:
    old = node()
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = ["example.com/hold"]
    assert admit(DRIVER, old, new) == [f"{DRIVER} may not change its node's finalizers or owner references"]
    new = copy.deepcopy(old)
    new["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "1"}]
    assert admit(MIG, old, new) == [f"{MIG} may not change its node's finalizers or owner references"]


def test_a_mixed_update_is_refused_as_a_whole() -> None:
    """An owned key beside a foreign one: the whole update is refused (nothing is half-applied)."""
    old = node()
    new = changed(old, labels={"nvidia.com/mig.config.state": "pending", "kubernetes.io/hostname": "x"})
    assert len(admit(MIG, old, new)) == 1

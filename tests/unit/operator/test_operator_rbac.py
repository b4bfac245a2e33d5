"""The operator's RBAC (``render --operator``) lets the controller do what it does: list and watch every
kind it caches, and find and delete a RuntimeClass of any name (the policy names it); a RBAC rule lost
would be a 403 on a real cluster only."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.api.clusterpolicy import parse_policy_text
from gpunode.deploy.operator_install import _EVERYTHING, operator_rules
from gpunode.deploy.render import render_by_agent
from gpunode.kube.cluster import resource_kind
from gpunode.operator.controller import NOT_OWNED_KINDS, RUNTIME_CLASS, everything_on

NS = "gpunode"


def grants(rules: list[dict[str, Any]], group: str, resource: str, verb: str, *, any_name: bool) -> bool:
    return any(
        group in r.get("apiGroups", [])
        and resource in r.get("resources", [])
        and verb in r.get("verbs", [])
        and (not any_name or not r.get("resourceNames"))
        for r in rules
    )


def controller_kinds() -> set[Any]:
    policy = everything_on(parse_policy_text(_EVERYTHING, "<test>").policy)
    kinds = {RUNTIME_CLASS}
    for objs in render_by_agent(policy, namespace=NS).values():
        for o in objs:
            if o["kind"] not in NOT_OWNED_KINDS:
                kinds.add(resource_kind(o["apiVersion"], o["kind"]))
    return kinds


@pytest.mark.parametrize("verb", ["list", "watch"])
def test_every_kind_the_controller_caches_may_be_listed_and_watched(verb: str) -> None:
    cluster, namespaced = operator_rules(NS)
    for kind in sorted(controller_kinds(), key=lambda k: k.plural):
        rules = namespaced if kind.namespaced else cluster
        assert grants(rules, kind.group, kind.plural, verb, any_name=True), f"{verb} {kind.plural}"


@pytest.mark.parametrize("verb", ["get", "create", "patch", "delete"])
def test_a_runtime_class_of_any_name_may_be_written_and_deleted(verb: str) -> None:
    cluster, _ = operator_rules(NS)
    assert grants(cluster, "node.k8s.io", "runtimeclasses", verb, any_name=True)


@pytest.mark.parametrize(
    ("resource", "verb"),
    [
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "delete"),
        ("pods/eviction", "create"),
        ("events", "create"),
        ("nodes", "patch"),
    ],
)
def test_the_upgrade_controller_may_drain_any_node(resource: str, verb: str) -> None:
    cluster, _ = operator_rules(NS)
    assert grants(cluster, "", resource, verb, any_name=True)

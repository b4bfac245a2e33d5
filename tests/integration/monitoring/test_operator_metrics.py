"""gpunode-operator's /metrics, read from the running operator of the shared scrape (conftest.py): two
GPU nodes, one in driver upgrade state upgrade-failed and one upgrade-done (the upgrade controller on:
both stay); one reconcile failed on a 403 for a DaemonSet apply."""

from __future__ import annotations

from .conftest import Scrape


def value(scrape: Scrape, name: str, **labels: str) -> float:
    text = scrape.texts["gpunode-operator"]
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} " if labels else f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not in the operator's /metrics")


def test_driver_upgrade_states_count_the_nodes_labels(scrape: Scrape) -> None:
    upgrade = "gpunode_operator_driver_upgrade_nodes"
    assert value(scrape, upgrade, state="upgrade-failed") == 1
    assert value(scrape, upgrade, state="upgrade-done") == 1
    assert value(scrape, upgrade, state="drain-required") == 0
    # nothing to upgrade: the controller wrote no transition and evicted nothing
    assert value(scrape, "gpunode_operator_driver_upgrade_transitions_total", state="upgrade-failed") == 0
    assert value(scrape, "gpunode_operator_driver_upgrade_evictions_total") == 0


def test_nodes_reconciles_and_errors(scrape: Scrape) -> None:
    assert value(scrape, "gpunode_operator_nodes", kind="gpu") == 2
    assert value(scrape, "gpunode_operator_leader") == 1
    assert value(scrape, "gpunode_operator_reconciles_total", result="success") >= 1
    assert value(scrape, "gpunode_operator_reconciles_total", result="error") >= 1
    assert value(scrape, "gpunode_operator_reconcile_duration_seconds_count") >= 2
    assert value(scrape, "gpunode_operator_api_errors_total", code="403", verb="patch") >= 1
    assert value(scrape, "gpunode_errors_total", agent="operator", reason="reconcile") >= 1
    assert value(scrape, "gpunode_operator_node_label_patches_total") >= 2  # both GPU nodes labelled


def test_policy_and_state_gauges(scrape: Scrape) -> None:
    ready = value(scrape, "gpunode_operator_clusterpolicy_ready", clusterpolicy="cluster-policy")
    assert ready in (0, 1)
    states = [
        line.split('state="', 1)[1].split('"', 1)[0]
        for line in scrape.texts["gpunode-operator"].splitlines()
        if line.startswith("gpunode_operator_state_desired_pods{")
    ]
    assert "state-device-plugin" in states
    assert "pre-requisites" in states

"""Every env var `gpunode render` writes into a container is a setting of the command that container
runs (the registry's spec for its console script and verb), except the few listed below, which other
software reads (or, for now, nothing does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpunode import registry
from gpunode.agent.main import AgentSpec
from gpunode.api.clusterpolicy import load_policy
from gpunode.common.settings import flags_of
from gpunode.deploy.render import render

POLICIES = sorted(  # Helm chart values files (*-values.yaml) are not ClusterPolicies
    p
    for p in (Path(__file__).resolve().parents[3] / "containers" / "policies").glob("*.yaml")
    if not p.stem.endswith("-values")
)

#: Read by the NVIDIA container runtime / CDI hook, not by us: which GPUs, driver files and MIG
#: capabilities the container gets.
CONTAINER_RUNTIME = {
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_DISABLE_REQUIRE",
    "NVIDIA_MIG_CONFIG_DEVICES",
}
#: The downward API's pod facts, written into every agent container for people and tools looking at
#: the pod. Feature discovery reads POD_NAME as its --pod-name setting; nothing reads POD_NAMESPACE.
POD_FACTS = {"POD_NAME", "POD_NAMESPACE"}
#: Written into a container whose command reads nothing of the kind (copied from a sibling container);
#: kept while the manifests must stay byte-identical, to be dropped with a golden update.
UNREAD = {
    ("gpunode-toolkit cdi generate", "RUNTIME"),  # only `runtime configure|status` read it
    ("gpunode-driver-loader upgrade", "GPUNODE_HTTP_PORT"),  # only `init` serves HTTP
}


def _spec_for(command: list[str]) -> AgentSpec[Any]:
    """The spec of the command a container runs: its console script's entry, then the longest verb
    of that entry's specs that the next words spell."""
    entry = next(e for e in registry.AGENTS if e.console_script == command[0])
    verbs = sorted(registry.specs(entry.key), key=lambda v: -len(v.split()))
    verb = next(v for v in verbs if command[1 : 1 + len(v.split())] == v.split())
    return registry.spec(entry.key, verb)


def _envs(spec: AgentSpec[Any]) -> set[str]:
    return {env for flag in flags_of(spec.settings_type) for env in flag.envs}


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of gpunode's DaemonSets (NFD's run its own commands: test_nfd.py)."""
    if obj["kind"] != "DaemonSet" or obj["metadata"]["name"].startswith("gpunode-nfd-"):
        return []
    pod = obj["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.stem)
def test_every_rendered_env_var_is_a_setting(policy: Path) -> None:
    problems, checked = [], 0
    for obj in render(load_policy(str(policy)).policy):
        for container in _containers(obj):
            spec = _spec_for(container["command"])
            envs = _envs(spec)
            for var in container.get("env", []):
                name = var["name"]
                checked += 1
                if name in envs or name in CONTAINER_RUNTIME | POD_FACTS or (spec.prog, name) in UNREAD:
                    continue
                where = f"{obj['metadata']['name']}/{container['name']}"
                problems.append(f"{where}: {name} is not a setting of {spec.prog}")
    assert problems == []
    assert checked > 0


def test_the_allowlists_hold_no_setting() -> None:
    """A variable that became a setting leaves the lists (POD_NAME: feature discovery's own)."""
    for entry in registry.AGENTS:
        for verb, spec in registry.specs(entry.key).items():
            allowed = {"POD_NAME"} if entry.key == "feature-discovery" else set()
            assert _envs(spec) & (CONTAINER_RUNTIME | POD_FACTS) <= allowed, (entry.key, verb)
    for prog, name in UNREAD:
        spec = _spec_for(prog.split())
        assert spec.prog == prog
        assert name not in _envs(spec)

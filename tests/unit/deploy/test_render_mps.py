"""The MPS control daemon in a render: NVIDIA's DaemonSet (device plugin operand, mps.capable nodes), the MPS
root from ``devicePlugin.mps.root`` in both DaemonSets, the config the device plugin publishes."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.api.clusterpolicy import parse_policy_text
from gpunode.common.errors import ConfigError
from gpunode.deploy.render import render

POLICY = """
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {{name: cluster-policy}}
spec:
  devicePlugin:
{device_plugin}
"""


def pods(device_plugin: str) -> dict[str, dict[str, Any]]:
    policy = parse_policy_text(POLICY.format(device_plugin=device_plugin), "policy.yaml").policy
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in render(policy)
        if o["kind"] == "DaemonSet"
    }


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}


def test_the_daemonset_is_nvidias() -> None:
    pod = pods("    enabled: true")["gpunode-mps-control-daemon"]
    assert pod["nodeSelector"]["nvidia.com/mps.capable"] == "true"
    assert pod["nodeSelector"]["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert pod["hostPID"] is True
    main = pod["containers"][0]
    assert main["command"] == ["gpunode-mps-control-daemon"]
    # CDI (the default): privileged for the GPUs' device nodes, which gives SETUID/SETGID too; the legacy
    # path adds just these two (test_render_device_access)
    assert main["securityContext"]["privileged"] is True
    assert main["securityContext"]["runAsUser"] == 0
    assert env(pod)["MPS_ROOT"] == "/run/nvidia/mps"
    assert "CONFIG_FILE" not in env(pod)  # the device plugin's config, as it publishes it
    assert env(pod)["FOLLOW_DEVICE_PLUGIN"] == "true"
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert not mounts["/run/nvidia/mps"].get("readOnly")
    assert not mounts["/dev/shm"].get("readOnly")
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert hosts["mps-shm"] == "/run/nvidia/mps/shm"


def test_the_root_reaches_both_daemonsets_and_the_daemon_follows_the_plugins_config() -> None:
    got = pods(
        "    mps: {root: /var/run/mps/}\n"
        "    config:\n      create: true\n      name: dp-config\n"
        "      data: {sharing.yaml: 'version: v1'}\n"
    )
    mps, plugin = got["gpunode-mps-control-daemon"], got["gpunode-device-plugin"]
    assert env(mps)["MPS_ROOT"] == env(plugin)["MPS_ROOT"] == "/var/run/mps"
    # the config the plugin serves (its label and ConfigMap), as it publishes it under the root
    assert env(mps)["FOLLOW_DEVICE_PLUGIN"] == "true"
    assert "CONFIG_FILE" not in env(mps)
    assert not [v for v in mps["volumes"] if "configMap" in v]
    assert mps.get("automountServiceAccountToken") is not True
    plugin_mounts = {m["mountPath"]: m for m in plugin["containers"][0]["volumeMounts"]}
    assert not plugin_mounts["/var/run/mps"].get("readOnly")  # reads .ready, writes its config


def test_the_daemon_takes_no_api_access_whatever_the_config() -> None:
    for config in ("    config: {name: existing, default: mps}", "    enabled: true"):
        policy = parse_policy_text(POLICY.format(device_plugin=config), "policy.yaml").policy
        objs = render(policy)
        roles = [o for o in objs if o["kind"] in ("ClusterRole", "Role")]
        assert "gpunode-mps-control-daemon" not in {r["metadata"]["name"] for r in roles}
        sa = next(
            o
            for o in objs
            if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == "gpunode-mps-control-daemon"
        )
        assert sa["automountServiceAccountToken"] is False


def test_the_shm_tmpfs_is_mounted_by_an_init_container_alone() -> None:
    """NVIDIA's mps-control-daemon-mounts: the agent's --mount-shm, privileged for the Bidirectional
    volume (the tmpfs must reach the host); the daemon's container sees it (HostToContainer) and gets no
    privilege for it."""
    pod = pods("    mps: {root: /var/run/mps}")["gpunode-mps-control-daemon"]
    init = {c["name"]: c for c in pod["initContainers"]}
    assert list(init) == ["wait-for-toolkit", "mps-control-daemon-mounts"]
    mounts = init["mps-control-daemon-mounts"]
    assert mounts["command"] == ["gpunode-mps-control-daemon", "--mount-shm"]
    assert {e["name"]: e.get("value") for e in mounts["env"]}["MPS_ROOT"] == "/var/run/mps"
    assert mounts["securityContext"]["privileged"] is True
    assert mounts["volumeMounts"] == [
        {"name": "mps-root", "mountPath": "/var/run/mps", "mountPropagation": "Bidirectional"}
    ]
    main = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert main["/var/run/mps"]["mountPropagation"] == "HostToContainer"


def test_no_device_plugin_no_mps_daemon() -> None:
    assert "gpunode-mps-control-daemon" not in pods("    enabled: false")


@pytest.mark.parametrize("root", ["relative/mps", "/"])
def test_a_bad_root_is_refused_with_its_path(root: str) -> None:
    with pytest.raises(ConfigError, match=r"devicePlugin\.mps\.root"):
        pods(f"    mps: {{root: {root!r}}}")

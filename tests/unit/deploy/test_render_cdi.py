"""What render emits for CDI (spec.cdi.enabled, default true) and for the legacy path (false): the device
plugin's device-list strategy, the toolkit's runtime configuration, the hook directory, the RuntimeClass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpunode.api.clusterpolicy import load_policy
from gpunode.deploy.render import PLUGIN_CDI_KIND, PLUGIN_IMEX_KIND, render

BASE = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\n"


def _render(tmp_path: Path, body: str = "") -> list[dict[str, Any]]:
    path = tmp_path / "policy.yaml"
    path.write_text(BASE + (body or "spec: {}\n"), encoding="utf-8")
    return render(load_policy(path, strict=True).policy)


def _pod(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    ds = next(o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == name)
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    return pod


def _env(container: dict[str, Any], name: str) -> str | None:
    return next((e.get("value") for e in container.get("env", []) if e["name"] == name), None)


def _init(pod: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in pod.get("initContainers", []) if c["name"] == name), None)


def test_cdi_by_default(tmp_path: Path) -> None:
    objs = _render(tmp_path)
    plugin = _pod(objs, "gpunode-device-plugin")["containers"][0]
    assert _env(plugin, "DEVICE_LIST_STRATEGY") == "cdi-annotations,cdi-cri"
    assert not [o for o in objs if o["kind"] == "RuntimeClass"]
    toolkit = _pod(objs, "gpunode-toolkit")
    generate = _init(toolkit, "cdi-generate")
    assert generate is not None
    # the device plugin's names: GPUs, and IMEX channels (written from the channel nodes, none: no file)
    assert generate["command"][-2:] == ["--also-kind", f"{PLUGIN_CDI_KIND},{PLUGIN_IMEX_KIND}"]
    # host paths in the spec: the driver root where the host has it, under --host-root /host
    command = " ".join(generate["command"])
    assert "--host-root /host --driver-root /run/nvidia/driver" in command
    mounts = {m["name"]: m["mountPath"] for m in generate["volumeMounts"]}
    assert mounts["driver-root"] == "/host/run/nvidia/driver"
    assert mounts["gpunode-bin"] == "/host/usr/local/gpunode/bin"
    assert mounts["proc-driver"] == "/host/proc/driver"
    configure = _init(toolkit, "runtime-configure")
    assert configure is not None
    assert configure["command"][:5] == ["gpunode-toolkit", "runtime", "configure", "--runtime", "containerd"]
    assert "--no-enable-cdi" not in configure["command"]
    assert "--restart-mode" in configure["command"]
    names = [c["name"] for c in toolkit["initContainers"]]
    assert names.index("cdi-generate") < names.index("runtime-configure") < names.index("toolkit-validation")
    host = {v["name"]: v["hostPath"]["path"] for v in toolkit["volumes"] if "hostPath" in v}
    assert host["gpunode-bin"] == "/usr/local/gpunode/bin"
    assert host["runtime-config"] == "/etc/containerd"
    assert "nvidia-toolkit" not in host  # no NVIDIA binary is looked for
    assert toolkit["hostPID"] is True
    main = toolkit["containers"][0]
    ro = {"name": "gpunode-bin", "mountPath": "/host/usr/local/gpunode/bin", "readOnly": True}
    assert ro in main["volumeMounts"]


def test_host_driver_root_is_the_hosts_root(tmp_path: Path) -> None:
    toolkit = _pod(_render(tmp_path, "spec:\n  driver:\n    enabled: false\n"), "gpunode-toolkit")
    generate = _init(toolkit, "cdi-generate")
    assert generate is not None
    assert "--host-root /host --driver-root / " in " ".join(generate["command"])
    mounts = {m["name"]: m["mountPath"] for m in generate["volumeMounts"]}
    assert mounts["driver-root"] == "/host"


def test_legacy_path(tmp_path: Path) -> None:
    objs = _render(tmp_path, "spec:\n  cdi:\n    enabled: false\n")
    plugin = _pod(objs, "gpunode-device-plugin")["containers"][0]
    assert _env(plugin, "DEVICE_LIST_STRATEGY") == "envvar"
    classes = [o for o in objs if o["kind"] == "RuntimeClass"]
    assert [(c["metadata"]["name"], c["handler"]) for c in classes] == [("nvidia", "nvidia")]
    toolkit = _pod(objs, "gpunode-toolkit")
    configure = _init(toolkit, "runtime-configure")
    assert configure is not None
    assert "--no-enable-cdi" in configure["command"]
    mounts = {m["name"]: m for m in configure["volumeMounts"]}
    assert mounts["nvidia-toolkit"] == {
        "name": "nvidia-toolkit",
        "mountPath": "/host/usr/local/nvidia/toolkit",
        "readOnly": True,
    }


@pytest.mark.parametrize(("cdi", "expected"), [("true", False), ("false", True)])
def test_crio_needs_configuring_only_for_the_legacy_path(tmp_path: Path, cdi: str, expected: bool) -> None:
    body = f"spec:\n  operator:\n    defaultRuntime: crio\n  cdi:\n    enabled: {cdi}\n"
    toolkit = _pod(_render(tmp_path, body), "gpunode-toolkit")
    configure = _init(toolkit, "runtime-configure")
    assert (configure is not None) is expected
    assert toolkit.get("hostPID", False) is expected
    if configure is not None:
        assert {m["mountPath"] for m in configure["volumeMounts"]} >= {"/host/etc/crio", "/host/var/run/crio"}


def test_user_env_still_wins(tmp_path: Path) -> None:
    body = "spec:\n  devicePlugin:\n    env:\n    - name: DEVICE_LIST_STRATEGY\n      value: envvar\n"
    plugin = _pod(_render(tmp_path, body), "gpunode-device-plugin")["containers"][0]
    assert _env(plugin, "DEVICE_LIST_STRATEGY") == "envvar"

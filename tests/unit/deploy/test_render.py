"""gpunode render: goldens, Kubernetes schema validation, GPU Operator conventions, policy errors."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpunode.api.clusterpolicy import load_policy
from gpunode.deploy.render import RESOURCES, agents, dump_yaml, node_writes, render, render_by_agent
from gpunode.deploy.render_cli import main

ROOT = Path(__file__).resolve().parents[3]
POLICIES = ROOT / "containers" / "policies"
GOLDEN = ROOT / "tests" / "golden" / "render"
KUBE_DIR = ROOT / "containers" / "kubernetes"
# Helm chart values files (*-values.yaml) are not ClusterPolicies: test_render_values.py renders them.
SEEDS = sorted(p.stem for p in POLICIES.glob("*.yaml") if not p.stem.endswith("-values"))
K8S_VERSION = "1.33"
UPDATE = os.environ.get("GPUNODE_UPDATE_GOLDEN") == "1"

# The README's RBAC table ("Kubernetes"): agent -> kind -> [(group, resource, verbs)].
RBAC = {
    "gpunode-device-plugin": {"ClusterRole": [("", "nodes", ["get", "watch", "patch"])]},
    "gpunode-feature-discovery": {
        "ClusterRole": [("", "nodes", ["get", "watch"])],
        "Role": [("nfd.k8s-sigs.io", "nodefeatures", ["get", "create", "update"]), ("", "pods", ["get"])],
    },
    "gpunode-mig-manager": {
        "ClusterRole": [("", "nodes", ["get", "watch", "patch"]), ("", "pods", ["list"])]
    },
    "gpunode-driver-loader": {
        "ClusterRole": [
            ("", "nodes", ["get", "watch", "patch"]),
            ("", "pods", ["list"]),
            ("", "pods/eviction", ["create"]),
        ]
    },
}


def _rendered(name: str) -> list[dict[str, Any]]:
    return render(load_policy(POLICIES / f"{name}.yaml", strict=True).policy)


def _daemonsets(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agents' DaemonSets (NFD's worker has its own tests: test_nfd.py)."""
    names = {a.name for a in agents()}
    return [o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] in names]


def _agents_only(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Everything but NFD's objects (named gpunode-nfd-*, or NFD's CRDs)."""
    return [
        o
        for o in objs
        if not o["metadata"]["name"].startswith("gpunode-nfd-")
        and not o["metadata"]["name"].endswith(".nfd.k8s-sigs.io")
    ]


def test_seed_policies_present() -> None:
    assert {"default", "preinstalled-driver", "mig-mixed-timeslicing", "exporter-servicemonitor"} <= set(
        SEEDS
    )


@pytest.mark.parametrize("name", SEEDS)
def test_golden(name: str) -> None:
    text = dump_yaml(_rendered(name))
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text, "GPUNODE_UPDATE_GOLDEN=1 rewrites the golden"


def test_containers_kubernetes_is_the_default_render() -> None:
    by_agent = render_by_agent(load_policy(POLICIES / "default.yaml").policy)
    if UPDATE:
        for key, objs in by_agent.items():
            (KUBE_DIR / f"{key}.yaml").write_text(dump_yaml(objs), encoding="utf-8")
    assert sorted(p.stem for p in KUBE_DIR.glob("*.yaml")) == sorted(by_agent)
    for key, objs in by_agent.items():
        assert (KUBE_DIR / f"{key}.yaml").read_text(encoding="utf-8") == dump_yaml(objs), key


def test_output_is_deterministic() -> None:
    assert dump_yaml(_rendered("default")) == dump_yaml(_rendered("default"))


@pytest.mark.parametrize("name", SEEDS)
def test_output_has_no_anchors_or_aliases(name: str) -> None:
    """Shared objects (two containers' mounts) are written out twice: gpunode's own YAML loader, and some
    tools, refuse aliases."""
    text = dump_yaml(_rendered(name))
    events = list(yaml.parse(text))
    assert not [e for e in events if isinstance(e, yaml.AliasEvent)]
    assert not [e for e in events if getattr(e, "anchor", None)]
    assert list(yaml.safe_load_all(text)) == _rendered(name)


def _validate_service_monitor(obj: dict[str, Any]) -> None:
    # A CRD: not in the bundled Kubernetes schemas; check the fields we use by hand.
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(obj["spec"]) == {"selector", "namespaceSelector", "endpoints"}
    for ep in obj["spec"]["endpoints"]:
        assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "honorLabels"}
        assert isinstance(ep["honorLabels"], bool)
        # The Prometheus Operator's Duration pattern for interval and scrapeTimeout.
        duration = r"(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)"
        for key in ("interval", "scrapeTimeout"):
            assert key not in ep or re.fullmatch(duration, ep[key])


@pytest.mark.parametrize("name", SEEDS)
def test_every_object_validates_against_kubernetes_schema(name: str) -> None:
    for obj in _rendered(name):
        if obj["kind"] == "ServiceMonitor":
            _validate_service_monitor(obj)
            continue
        if obj["kind"] in ("PodMonitor", "PrometheusRule"):  # test_render_monitoring checks them
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_schema_validation_catches_a_typo() -> None:
    ds = _daemonsets(_rendered("default"))[0]
    ds["spec"]["template"]["spec"]["priorityClass"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", SEEDS)
def test_daemonset_conventions(name: str) -> None:
    objs = _rendered(name)
    for ds in _daemonsets(objs):
        agent = next(a for a in agents() if a.name == ds["metadata"]["name"])
        pod = ds["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == "system-node-critical"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        mps = {"nvidia.com/mps.capable": "true"} if agent.key == "mps-control-daemon" else {}
        assert pod["nodeSelector"] == {
            "feature.node.kubernetes.io/pci-10de.present": "true",
            f"nvidia.com/gpu.deploy.{agent.operand}": "true",
            **mps,  # NVIDIA's MPS control daemon runs only where GFD says MPS is configured
        }
        assert pod["serviceAccountName"] == agent.name
        strategy = ds["spec"]["updateStrategy"]["type"]
        assert strategy == ("OnDelete" if agent.key == "driver" else "RollingUpdate")
        main_c = pod["containers"][0]
        assert main_c["image"] == objs_image(objs)
        if agent.port is not None:
            assert main_c["livenessProbe"]["httpGet"]["path"] in ("/healthz", "/health")
            assert main_c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            port_names = {p["name"]: p["containerPort"] for p in main_c["ports"]}
            assert port_names[main_c["readinessProbe"]["httpGet"]["port"]] == agent.port
        env = {e["name"]: e for e in main_c["env"]}
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert "hostIPC" not in pod, agent.name  # no agent uses the host's IPC namespace
        # the toolkit: to signal the runtime after enabling CDI in its configuration; the MPS daemon: to see
        # its clients' processes, as NVIDIA's
        host_pid = ("driver", "mig-manager", "toolkit", "mps-control-daemon")
        assert pod.get("hostPID", False) is (agent.key in host_pid)
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            if agent.key in ("driver", "mig-manager") and not c["name"].startswith("wait-for"):
                assert sc["privileged"] is True
                continue
            # with CDI (every seed policy) the containers that open the GPUs are privileged for the device
            # nodes, with a read-only root; the others are restricted (test_render_device_access has both
            # paths and says which containers open the GPUs)
            gpu = not c["name"].startswith("wait-for") and c["name"] != "runtime-configure"
            assert sc.get("privileged", False) is gpu, (agent.name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True
            if not gpu:
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["capabilities"]["drop"] == ["ALL"]
        if agent.key == "feature-discovery":
            assert main_c["securityContext"]["runAsNonRoot"] is True
        if agent.key == "exporter":
            # root only to reach the kubelet's root-only pod-resources socket
            assert main_c["securityContext"]["runAsUser"] == 0


def objs_image(objs: list[dict[str, Any]]) -> str:
    images = {
        c["image"]
        for ds in _daemonsets(objs)
        for c in ds["spec"]["template"]["spec"]["containers"]
        + ds["spec"]["template"]["spec"]["initContainers"]
    }
    assert len(images) == 1, images
    return images.pop()


def test_init_containers_follow_nvidia_order() -> None:
    by_name = {
        ds["metadata"]["name"]: ds["spec"]["template"]["spec"] for ds in _daemonsets(_rendered("default"))
    }
    toolkit_inits = [c["command"] for c in by_name["gpunode-toolkit"]["initContainers"]]
    assert toolkit_inits[0] == ["gpunode-validator", "--wait-for", "driver", "--timeout", "0"]
    assert toolkit_inits[-1] == ["gpunode-validator", "--component", "toolkit"]
    for name in (
        "gpunode-device-plugin",
        "gpunode-feature-discovery",
        "gpunode-exporter",
        "gpunode-mig-manager",
    ):
        assert by_name[name]["initContainers"][0]["command"][:3] == [
            "gpunode-validator",
            "--wait-for",
            "toolkit",
        ]
    assert by_name["gpunode-feature-discovery"]["containers"][0]["command"] == [
        "gpunode-feature-discovery",
        "--use-node-feature-api",
    ]
    assert by_name["gpunode-toolkit"]["containers"][0]["command"][-1] == "--watch"


def test_preinstalled_driver_validates_the_host_driver() -> None:
    objs = _rendered("preinstalled-driver")
    names = {ds["metadata"]["name"] for ds in _daemonsets(objs)}
    assert "gpunode-driver-loader" not in names
    toolkit = next(ds for ds in _daemonsets(objs) if ds["metadata"]["name"] == "gpunode-toolkit")
    first = toolkit["spec"]["template"]["spec"]["initContainers"][0]
    assert first["command"] == ["gpunode-validator", "--component", "driver"]


@pytest.mark.parametrize("name", SEEDS)
def test_rbac_exactly_as_documented(name: str) -> None:
    objs = _agents_only(_rendered(name))
    policy = load_policy(POLICIES / f"{name}.yaml").policy
    found: dict[str, dict[str, list[tuple[str, str, list[str]]]]] = {}
    for o in objs:
        if o["kind"] in ("ClusterRole", "Role"):
            rules = [
                (g, r, rule["verbs"])
                for rule in o["rules"]
                for g in rule["apiGroups"]
                for r in rule["resources"]
            ]
            found.setdefault(o["metadata"]["name"], {})[o["kind"]] = rules
    expected = {k: dict(v) for k, v in RBAC.items()}
    dp_config = policy.spec.device_plugin.config
    if not dp_config.name:
        expected.pop("gpunode-device-plugin")
        expected["gpunode-feature-discovery"].pop("ClusterRole")
    if not policy.spec.driver.enabled:
        expected.pop("gpunode-driver-loader")
    assert found == expected
    for o in objs:
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert o["roleRef"]["name"] == o["metadata"]["name"]
            assert o["subjects"][0]["name"] == o["metadata"]["name"]
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"] not in found:
            assert o["automountServiceAccountToken"] is False


# The hostPath mounts a container may write, (DaemonSet, container, mountPath) -> why; every other hostPath
# mount is read-only. docs/clusterpolicy.md's "Host paths" table says the same.
WRITABLE = {
    ("gpunode-device-plugin", "device-plugin", "/var/lib/kubelet/device-plugins"): "its gRPC sockets",
    (
        "gpunode-driver-loader",
        "driver",
        "/run/nvidia",
    ): "driver installation, readiness files (Bidirectional)",
    ("gpunode-driver-loader", "driver", "/host/etc/modprobe.d"): "module options, nouveau blacklist",
    ("gpunode-driver-loader", "driver", "/sys"): "module tools work on sysfs",
    ("gpunode-driver-loader", "driver", "/var/log"): "nvidia-installer / DKMS build logs",
    ("gpunode-driver-loader", "driver-manager", "/run/nvidia"): "as the loader (it loads the new driver)",
    ("gpunode-driver-loader", "driver-manager", "/host/etc/modprobe.d"): "as the loader",
    ("gpunode-driver-loader", "driver-manager", "/sys"): "as the loader",
    ("gpunode-driver-loader", "driver-manager", "/var/log"): "as the loader",
    ("gpunode-mig-manager", "mig-manager", "/sys"): "GPU reset after a MIG mode change",
    ("gpunode-mig-manager", "mig-manager", "/var/lib/gpunode/mig"): "the apply journal",
    ("gpunode-mps-control-daemon", "mps-control-daemon", "/run/nvidia/mps"): "pipe/log dirs, .ready",
    ("gpunode-device-plugin", "device-plugin", "/run/nvidia/mps"): "publishes its config for the MPS agent",
    ("gpunode-mps-control-daemon", "mps-control-daemon", "/dev/shm"): "MPS shared memory (<root>/shm)",
    (
        "gpunode-mps-control-daemon",
        "mps-control-daemon-mounts",
        "/run/nvidia/mps",
    ): "mounts the <root>/shm tmpfs (Bidirectional)",
    ("gpunode-toolkit", "cdi-generate", "/var/run/cdi"): "the CDI spec",
    ("gpunode-toolkit", "cdi-generate", "/host/usr/local/gpunode/bin"): "installs gpunode-cdi-hook",
    ("gpunode-toolkit", "runtime-configure", "/host/etc/containerd"): "enable_cdi in containerd's config",
    ("gpunode-toolkit", "toolkit", "/var/run/cdi"): "the CDI spec, rewritten on MIG changes",
    ("gpunode-toolkit", "toolkit-validation", "/run/nvidia/validations"): "toolkit-ready",
    (
        "gpunode-toolkit",
        "driver-validation",
        "/host/run/nvidia/validations",
    ): "driver-ready (host root /host)",
}


def _host_mounts(objs: list[dict[str, Any]]) -> Iterator[tuple[str, str, dict[str, Any], str]]:
    """(DaemonSet, container, mount, host path) for every hostPath mount."""
    for ds in _daemonsets(objs):
        pod = ds["spec"]["template"]["spec"]
        host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        for c in pod.get("initContainers", []) + pod["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] in host:
                    yield ds["metadata"]["name"], c["name"], m, host[m["name"]]


@pytest.mark.parametrize("name", SEEDS)
def test_host_paths_are_read_only_unless_the_agent_writes_there(name: str) -> None:
    seen = set()
    for ds, container, mount, host in _host_mounts(_rendered(name)):
        key = (ds, container, mount["mountPath"])
        seen.add(key)
        assert mount.get("readOnly", False) is (key not in WRITABLE), (key, host)
    assert seen, name


def test_the_writable_table_has_no_stale_rows() -> None:
    seen = {(ds, c, m["mountPath"]) for n in SEEDS for ds, c, m, _ in _host_mounts(_rendered(n))}
    assert set(WRITABLE) <= seen


def test_no_cdi_directory_where_nothing_writes_specs() -> None:
    """The device plugin and the MIG manager neither read nor write CDI specs: no /var/run/cdi at all (a
    writable one would let them plant hooks the runtime runs as root for every GPU container)."""
    for n in SEEDS:
        for ds, _, mount, host in _host_mounts(_rendered(n)):
            if ds in ("gpunode-device-plugin", "gpunode-mig-manager"):
                assert host != "/var/run/cdi", (n, ds, mount)


def test_the_driver_loader_writes_the_host_root_only_where_mounted_writable() -> None:
    """GPUNODE_HOST_ROOT=/host is read-only; /etc/modprobe.d (module options) is mounted writable on top,
    and the MIG manager resets GPUs through its writable /sys (GPUNODE_HOST_ROOT=/)."""
    by_name = {
        ds["metadata"]["name"]: ds["spec"]["template"]["spec"] for ds in _daemonsets(_rendered("default"))
    }
    for container in (
        by_name["gpunode-driver-loader"]["containers"] + by_name["gpunode-driver-loader"]["initContainers"]
    ):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["GPUNODE_HOST_ROOT"] == "/host"
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/host"]["readOnly"] is True
        assert "readOnly" not in mounts["/host/etc/modprobe.d"]
    mig = by_name["gpunode-mig-manager"]["containers"][0]
    env = {e["name"]: e.get("value") for e in mig["env"]}
    assert (env["GPUNODE_HOST_ROOT"], env["HOST_ROOT_MOUNT"]) == ("/", "/host")
    assert {m["mountPath"]: m.get("readOnly", False) for m in mig["volumeMounts"]}["/sys"] is False


def _quantity(text: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


# Measured working sets (MB RSS), which the memory limits must leave room for (docs/clusterpolicy.md).
MEASURED_RSS_MB = {
    "device-plugin": 55,
    "feature-discovery": 45,
    "exporter": 35,
    "toolkit": 31,
    "mig-manager": 40,
    "driver": 30,
    "validator": 31,
    "mps-control-daemon": 30,  # benchmarks/mps.py
}


@pytest.mark.parametrize("name", SEEDS)
def test_every_container_has_requests_and_limits(name: str) -> None:
    for ds in _daemonsets(_rendered(name)):
        pod = ds["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            r = c["resources"]
            for kind in ("cpu", "memory"):
                assert _quantity(r["limits"][kind]) >= _quantity(r["requests"][kind]), (ds, c["name"], kind)
            role = "validator" if c["command"][0] == "gpunode-validator" else c["command"][0]
            role = next((a.key for a in agents() if a.name == role), role)
            assert r == RESOURCES[role], (ds["metadata"]["name"], c["name"])
            assert _quantity(r["limits"]["memory"]) >= 4 * MEASURED_RSS_MB[role] * 2**20, role
            assert _quantity(r["requests"]["memory"]) >= MEASURED_RSS_MB[role] * 1e6, role


def test_the_exporter_without_pod_labels_runs_as_nobody(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        BASE
        + "spec:\n  dcgmExporter:\n    env:\n    - name: DCGM_EXPORTER_KUBERNETES\n      value: 'false'\n",
    )
    objs = render(load_policy(path).policy)
    ds = next(d for d in _daemonsets(objs) if d["metadata"]["name"] == "gpunode-exporter")
    main_c = ds["spec"]["template"]["spec"]["containers"][0]
    assert main_c["securityContext"]["runAsNonRoot"] is True
    assert all(m["name"] != "pod-resources" for m in main_c["volumeMounts"])
    assert all(v["name"] != "pod-resources" for v in ds["spec"]["template"]["spec"]["volumes"])


# -- the node policies -------------------------------------------------------------------------------------
def _policies(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")}


@pytest.mark.parametrize("name", SEEDS)
def test_every_agent_that_patches_nodes_gets_a_node_policy(name: str) -> None:
    objs = _agents_only(_rendered(name))
    patchers = {
        o["metadata"]["name"]
        for o in objs
        if o["kind"] == "ClusterRole"
        and any("nodes" in r["resources"] and "patch" in r["verbs"] for r in o["rules"])
    }
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert {p["metadata"]["name"] for p in policies} == {f"{a}-own-node" for a in patchers}
    assert {b["spec"]["policyName"] for b in bindings} == {p["metadata"]["name"] for p in policies}
    for b in bindings:
        assert b["spec"]["validationActions"] == ["Deny"]
        assert b["metadata"]["name"] == b["spec"]["policyName"]
    for p in policies:
        spec = p["spec"]
        assert spec["failurePolicy"] == "Fail"
        assert spec["matchConstraints"]["resourceRules"] == [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
        ]
        agent = p["metadata"]["name"].removesuffix("-own-node")
        assert spec["matchConditions"] == [
            {
                "name": f"is-{agent}",
                "expression": f"request.userInfo.username == 'system:serviceaccount:gpunode:{agent}'",
            }
        ]
    # apply order: a policy and its binding come with the agent's RBAC, before its DaemonSet
    order = [(o["kind"], o["metadata"]["name"]) for o in objs]
    for agent in patchers:
        binding = order.index(("ValidatingAdmissionPolicyBinding", f"{agent}-own-node"))
        assert binding < order.index(("DaemonSet", agent))


def test_node_policies_follow_the_namespace(tmp_path: Path) -> None:
    objs = render(load_policy(POLICIES / "default.yaml").policy, namespace="gpu")
    for p in (o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"):
        assert "'system:serviceaccount:gpu:gpunode-" in p["spec"]["matchConditions"][0]["expression"]


@pytest.mark.parametrize("version", ["1.30", K8S_VERSION])
def test_node_policies_validate_from_kubernetes_1_30(version: str) -> None:
    """admissionregistration.k8s.io/v1 policies are GA in 1.30, as is the node-name claim they read."""
    objs = _rendered("mig-mixed-timeslicing")
    found = [o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert len(found) == 6  # device plugin, driver loader, MIG manager: a policy and a binding each
    for obj in found:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_eviction_label_belongs_to_both_pausing_agents(tmp_path: Path) -> None:
    body = (
        "spec:\n  driver:\n    manager:\n      env:\n      - name: NODE_LABEL_FOR_GPU_POD_EVICTION\n"
        "        value: example.com/gpu-jobs\n"
    )
    writes = node_writes(load_policy(_write(tmp_path, BASE + body)).policy)
    assert "example.com/gpu-jobs" in writes["driver"].labels
    assert "example.com/gpu-jobs" in writes["mig-manager"].labels  # it may restore the loader's pause
    bad = body.replace("example.com/gpu-jobs", "'not a key!'")
    writes = node_writes(load_policy(_write(tmp_path, BASE + bad)).policy)
    assert not any("not a key" in k for k in writes["driver"].labels)  # the loader refuses it (exit 2)


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def test_the_readme_lists_exactly_the_keys_each_policy_lets_through() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = _section(readme, "**Node policies (Kubernetes 1.30 or later).**", "**Operand pausing**")
    writes = node_writes(load_policy(POLICIES / "default.yaml").policy)
    operands = _section(section, "The operand labels are", "plus the driver manager")
    listed = set(re.findall(r"`([a-z0-9-]+)`", operands))
    prefix = "nvidia.com/gpu.deploy."
    pause = {k.removeprefix(prefix) for k in writes["mig-manager"].labels if k.startswith(prefix)}
    assert listed == pause
    assert pause | {"driver"} == {k.removeprefix(prefix) for k in writes["driver"].labels}
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    for agent, key in (
        ("device plugin", "device-plugin"),
        ("MIG manager", "mig-manager"),
        ("driver manager", "driver"),
    ):
        cells = rows[agent].split("|")
        for k in writes[key].annotations:
            assert f"`{k}`" in cells[3], (agent, k)
        for k in writes[key].labels:
            if not k.startswith(prefix) or k == prefix + "driver":
                assert f"`{k}`" in cells[2], (agent, k)
        assert ("`unschedulable`" in cells[4]) is bool(writes[key].spec)


def test_the_docs_resources_table_is_what_render_sets() -> None:
    docs = (ROOT / "docs" / "clusterpolicy.md").read_text(encoding="utf-8")
    table = _section(docs, "| container | measured RSS |", "`gpunode render -o DIR`")
    roles = {
        "device plugin": "device-plugin",
        "feature discovery": "feature-discovery",
        "exporter": "exporter",
        "toolkit": "toolkit",
        "validator": "validator",
        "MIG manager": "mig-manager",
        "driver loader": "driver",
    }
    checked = 0
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) != 4:
            continue
        role = next(r for name, r in roles.items() if cells[0].startswith(name))
        r = RESOURCES[role]
        assert cells[2] == f"{r['requests']['cpu']} / {r['requests']['memory']}", cells
        assert cells[3] == f"{r['limits']['cpu']} / {r['limits']['memory']}", cells
        checked += 1
    assert checked == len(roles)


def test_render_to_a_directory_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    (out / "device-plugin.yaml").symlink_to(outside)
    (out / "common.yaml").symlink_to(tmp_path / "missing-target")
    assert main(["--policy", str(POLICIES / "default.yaml"), "-o", str(out)]) == 0
    assert outside.read_text() == "keep me\n"
    assert not (tmp_path / "missing-target").exists()
    for f in out.iterdir():
        assert not f.is_symlink(), f
        assert f.is_file(), f
        assert f.stat().st_mode & 0o777 == 0o644
    assert sorted(f.name for f in out.iterdir()) == sorted(
        f"{k}.yaml" for k in render_by_agent(load_policy(POLICIES / "default.yaml").policy)
    )
    assert not [f for f in out.iterdir() if f.name.startswith(".")]  # no temporary file left


def test_exporter_service_and_servicemonitor() -> None:
    default = {o["kind"] for o in _rendered("default") if o["metadata"]["name"] == "gpunode-exporter"}
    assert "Service" in default
    assert "ServiceMonitor" not in default
    objs = _rendered("exporter-servicemonitor")
    svc = next(o for o in objs if o["kind"] == "Service")
    assert svc["spec"]["ports"][0]["port"] == 9400
    sm = next(o for o in objs if o["kind"] == "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert sm["spec"]["endpoints"][0]["scrapeTimeout"] == "10s"
    assert sm["metadata"]["labels"]["release"] == "prometheus"


def test_mig_mixed_and_time_slicing_config() -> None:
    objs = _rendered("mig-mixed-timeslicing")
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "time-slicing-config")
    assert "replicas: 4" in cm["data"]["sliced"]
    dp = next(ds for ds in _daemonsets(objs) if ds["metadata"]["name"] == "gpunode-device-plugin")
    env = {e["name"]: e.get("value") for e in dp["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MIG_STRATEGY"] == "mixed"
    assert env["CONFIG_FILE"] == "/available-configs"
    assert env["DEFAULT_CONFIG"] == "default"


def test_mig_layouts_configmap_is_the_shipped_default() -> None:
    cm = next(o for o in _agents_only(_rendered("default")) if o["kind"] == "ConfigMap")
    spec = yaml.safe_load(cm["data"]["config.yaml"])
    assert "all-balanced" in spec["mig-configs"]
    assert "all-disabled" in spec["mig-configs"]


BASE = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_cli_warns_and_strict_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, BASE + "spec:\n  gfd:\n    bogus: 1\n")
    assert main(["--policy", str(path)]) == 0
    out = capsys.readouterr()
    assert "warning" in out.err
    assert "spec.gfd.bogus: unknown field" in out.err
    assert "kind: DaemonSet" in out.out
    assert main(["--policy", str(path), "--strict"]) == 2
    assert "spec.gfd.bogus" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("spec:\n  mig:\n    strategy: weird\n", "spec.mig.strategy: must be one of none, single, mixed"),
        ("spec:\n  driver:\n    enabled: 'yes'\n", "spec.driver.enabled: must be a boolean"),
        (
            "spec:\n  daemonsets:\n    tolerations:\n    - operator: Sometimes\n",
            "spec.daemonsets.tolerations[0].operator",
        ),
        (
            "spec:\n  devicePlugin:\n    env:\n    - value: x\n",
            "spec.devicePlugin.env[0].name: required key is missing",
        ),
        ("spec: [\n", "YAML syntax error"),
    ],
)
def test_malformed_policy_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, where: str
) -> None:
    path = _write(tmp_path, BASE + body)
    assert main(["--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err
    assert where in err


def test_wrong_kind_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "apiVersion: v1\nkind: ConfigMap\n")
    assert main(["--policy", str(path)]) == 2
    assert "apiVersion" in capsys.readouterr().err


def test_images(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policy", str(POLICIES / "default.yaml"), "--images"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("ghcr.io/gpunode/gpunode:")
    assert lines[1] == "registry.k8s.io/nfd/node-feature-discovery:v0.17.4"  # NFD, deployed by default
    assert main(["--policy", str(POLICIES / "default.yaml"), "--images", "--image", "reg.local/g:1"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "reg.local/g:1"
    args = ["--policy", str(POLICIES / "default.yaml"), "--images", "--image", "reg.local/g:1"]
    assert main([*args, "--nfd-image", "reg.local/nfd:2"]) == 0
    assert capsys.readouterr().out == "reg.local/g:1\nreg.local/nfd:2\n"


def test_namespace_and_image_flags(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = main(
        ["--policy", str(POLICIES / "default.yaml"), "--namespace", "gpu", "--image", "r/g:2", "-o", str(out)]
    )
    assert rc == 0
    docs = [d for f in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    assert all(d["metadata"].get("namespace", "gpu") == "gpu" for d in docs)
    assert objs_image(docs) == "r/g:2"
    assert main(["--policy", str(POLICIES / "default.yaml"), "--namespace", "Bad_NS"]) == 2

"""gpunode.api.helm_values: the GPU Operator chart's values -> a ClusterPolicy, as NVIDIA's chart does it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpunode.api.helm_values import CHART_DEFAULTS, chart_keys, load_values, map_values
from gpunode.common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
PRODUCTION = ROOT / "containers" / "policies" / "production-values.yaml"

DEFAULT_SPEC = {
    "nfd": {"enabled": True},
    "daemonsets": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-node-critical",
    },
    "mig": {"strategy": "single"},
    "driver": {"enabled": True},
    "toolkit": {"enabled": True},
    "devicePlugin": {"enabled": True},
    "dcgmExporter": {"enabled": True},
    "gfd": {"enabled": True},
    "migManager": {"enabled": True, "config": {"default": "all-disabled"}},
}


def _spec(values: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = map_values(values).document["spec"]
    return spec


def _at(spec: dict[str, Any], path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        node = node[part]
    return node


def _values(path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def test_empty_values_give_the_charts_defaults() -> None:
    mapped = map_values({})
    assert mapped.document == {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": DEFAULT_SPEC,
    }
    assert mapped.warnings == ()
    assert mapped.outside == ()


# chart value -> (the value given, ClusterPolicy path under spec, what lands there)
TABLE: list[tuple[str, Any, str, Any]] = [
    ("nfd.enabled", False, "nfd.enabled", False),
    ("psa.enabled", True, "psa.enabled", True),
    ("psp.enabled", False, "psp.enabled", False),
    ("cdi.enabled", False, "cdi.enabled", False),
    ("cdi.default", True, "cdi.default", True),
    ("sandboxWorkloads.enabled", False, "sandboxWorkloads.enabled", False),
    ("sandboxWorkloads.defaultWorkload", "container", "sandboxWorkloads.defaultWorkload", "container"),
    ("sandboxWorkloads.mode", "kubevirt", "sandboxWorkloads.mode", "kubevirt"),
    ("hostPaths.rootFS", "/host", "hostPaths.rootFS", "/host"),
    ("hostPaths.driverInstallDir", "/run/nv", "hostPaths.driverInstallDir", "/run/nv"),
    ("daemonsets.labels", {"team": "ml"}, "daemonsets.labels", {"team": "ml"}),
    ("daemonsets.annotations", {"a": "b"}, "daemonsets.annotations", {"a": "b"}),
    ("daemonsets.priorityClassName", "high", "daemonsets.priorityClassName", "high"),
    ("daemonsets.updateStrategy", "OnDelete", "daemonsets.updateStrategy", "OnDelete"),
    ("daemonsets.rollingUpdate.maxUnavailable", 2, "daemonsets.rollingUpdate.maxUnavailable", "2"),
    ("validator.repository", "r", "validator.repository", "r"),
    ("validator.version", "v25.3.0", "validator.version", "v25.3.0"),
    ("validator.env", [{"name": "A", "value": "1"}], "validator.env", [{"name": "A", "value": "1"}]),
    (
        "validator.plugin.env",
        [{"name": "W", "value": "0"}],
        "validator.plugin.env",
        [{"name": "W", "value": "0"}],
    ),
    (
        "validator.cuda.env",
        [{"name": "W", "value": "0"}],
        "validator.cuda.env",
        [{"name": "W", "value": "0"}],
    ),
    (
        "validator.driver.env",
        [{"name": "D", "value": "0"}],
        "validator.driver.env",
        [{"name": "D", "value": "0"}],
    ),
    (
        "validator.toolkit.env",
        [{"name": "T", "value": "0"}],
        "validator.toolkit.env",
        [{"name": "T", "value": "0"}],
    ),
    ("operator.defaultRuntime", "crio", "operator.defaultRuntime", "crio"),
    ("operator.runtimeClass", "nv", "operator.runtimeClass", "nv"),
    ("operator.defaultGPUMode", "vm", "operator.defaultGPUMode", "vm"),
    ("operator.use_ocp_driver_toolkit", True, "operator.use_ocp_driver_toolkit", True),
    ("operator.initContainer.image", "cuda", "operator.initContainer.image", "cuda"),
    ("operator.initContainer.version", 12.4, "operator.initContainer.version", "12.4"),
    ("mig.strategy", "mixed", "mig.strategy", "mixed"),
    ("driver.enabled", False, "driver.enabled", False),
    ("driver.nvidiaDriverCRD.enabled", True, "driver.useNvidiaDriverCRD", True),
    ("driver.kernelModuleType", "open", "driver.kernelModuleType", "open"),
    ("driver.useOpenKernelModules", True, "driver.useOpenKernelModules", True),
    ("driver.usePrecompiled", False, "driver.usePrecompiled", False),
    ("driver.repository", "nvcr.io/nvidia", "driver.repository", "nvcr.io/nvidia"),
    ("driver.image", "driver", "driver.image", "driver"),
    ("driver.version", "550.127.05", "driver.version", "550.127.05"),
    ("driver.version", 550.54, "driver.version", "550.54"),
    ("driver.imagePullPolicy", "Always", "driver.imagePullPolicy", "Always"),
    ("driver.imagePullSecrets", ["s"], "driver.imagePullSecrets", ["s"]),
    ("driver.startupProbe", {"periodSeconds": 10}, "driver.startupProbe", {"periodSeconds": 10}),
    ("driver.rdma.enabled", True, "driver.rdma.enabled", True),
    ("driver.rdma.useHostMofed", True, "driver.rdma.useHostMofed", True),
    (
        "driver.manager.env",
        [{"name": "E", "value": "1"}],
        "driver.manager.env",
        [{"name": "E", "value": "1"}],
    ),
    ("driver.manager.version", "v0.8.0", "driver.manager.version", "v0.8.0"),
    ("driver.repoConfig", {"configMapName": "repo"}, "driver.repoConfig", {"configMapName": "repo"}),
    ("driver.certConfig", {"name": "certs"}, "driver.certConfig", {"name": "certs"}),
    ("driver.licensingConfig", {"secretName": "l"}, "driver.licensingConfig", {"secretName": "l"}),
    ("driver.kernelModuleConfig", {"name": "k"}, "driver.kernelModuleConfig", {"name": "k"}),
    ("driver.secretEnv", "s", "driver.secretEnv", "s"),
    ("driver.env", [{"name": "E", "value": "1"}], "driver.env", [{"name": "E", "value": "1"}]),
    ("toolkit.enabled", False, "toolkit.enabled", False),
    ("toolkit.installDir", "/opt/nv", "toolkit.installDir", "/opt/nv"),
    ("toolkit.env", [{"name": "C", "value": "x"}], "toolkit.env", [{"name": "C", "value": "x"}]),
    ("devicePlugin.enabled", False, "devicePlugin.enabled", False),
    ("devicePlugin.args", ["--x"], "devicePlugin.args", ["--x"]),
    ("devicePlugin.mps.root", "/run/mps", "devicePlugin.mps.root", "/run/mps"),
    ("dcgm.enabled", True, "dcgm.enabled", True),
    ("dcgmExporter.enabled", False, "dcgmExporter.enabled", False),
    ("dcgmExporter.config.name", "metrics", "dcgmExporter.config.name", "metrics"),
    ("dcgmExporter.serviceMonitor", {"enabled": True}, "dcgmExporter.serviceMonitor", {"enabled": True}),
    (
        "dcgmExporter.service",
        {"internalTrafficPolicy": "Local"},
        "dcgmExporter.service",
        {"internalTrafficPolicy": "Local"},
    ),
    ("dcgmExporter.hostPID", True, "dcgmExporter.hostPID", True),
    ("gfd.enabled", False, "gfd.enabled", False),
    ("gfd.env", [{"name": "G", "value": "1"}], "gfd.env", [{"name": "G", "value": "1"}]),
    ("migManager.enabled", False, "migManager.enabled", False),
    ("migManager.gpuClientsConfig", {"name": "clients"}, "migManager.gpuClientsConfig", {"name": "clients"}),
    ("nodeStatusExporter.enabled", True, "nodeStatusExporter.enabled", True),
    ("gds.enabled", True, "gds.enabled", True),
    ("gdrcopy.enabled", True, "gdrcopy.enabled", True),
    ("vgpuManager.enabled", True, "vgpuManager.enabled", True),
    ("vgpuManager.driverManager.image", "m", "vgpuManager.driverManager.image", "m"),
    ("vgpuDeviceManager.config", {"name": "v"}, "vgpuDeviceManager.config", {"name": "v"}),
    ("vfioManager.enabled", True, "vfioManager.enabled", True),
    ("kataManager.config", {"artifactsDir": "/a"}, "kataManager.config", {"artifactsDir": "/a"}),
    ("sandboxDevicePlugin.enabled", True, "sandboxDevicePlugin.enabled", True),
    ("kataSandboxDevicePlugin.enabled", True, "kataSandboxDevicePlugin.enabled", True),
    ("ccManager.enabled", True, "ccManager.enabled", True),
    ("ccManager.defaultMode", "on", "ccManager.defaultMode", "on"),
]


@pytest.mark.parametrize(("key", "given", "path", "want"), TABLE, ids=[f"{r[0]}={r[1]!r}" for r in TABLE])
def test_each_chart_value_lands_where_the_chart_puts_it(key: str, given: Any, path: str, want: Any) -> None:
    mapped = map_values(_values(key, given))
    assert _at(mapped.document["spec"], path) == want
    assert mapped.warnings == ()
    assert mapped.values_path(f"spec.{path}") == key


@pytest.mark.parametrize(
    ("key", "given"),
    [
        ("driver.repository", ""),
        ("driver.imagePullSecrets", []),
        ("driver.env", []),
        ("driver.resources", {}),
        ("driver.version", ""),
        ("devicePlugin.args", []),
        ("operator.runtimeClass", ""),
        ("dcgmExporter.hostPID", False),
        ("daemonsets.updateStrategy", ""),
    ],
)
def test_empty_or_false_values_are_not_written(key: str, given: Any) -> None:
    """The template writes these under `{{- if }}`: the chart's own empty defaults leave no trace."""
    assert _spec(_values(key, given)) == DEFAULT_SPEC


def test_values_the_template_always_writes_are_kept_when_false() -> None:
    spec = _spec({"driver": {"usePrecompiled": False, "rdma": {"enabled": False}}, "psa": {"enabled": False}})
    assert spec["driver"]["usePrecompiled"] is False
    assert spec["driver"]["rdma"] == {"enabled": False}
    assert spec["psa"] == {"enabled": False}


def test_defaults_are_the_charts() -> None:
    assert CHART_DEFAULTS["nfd"] == {"enabled": True}
    assert CHART_DEFAULTS["mig"] == {"strategy": "single"}
    spec = _spec({"driver": {"version": "550.1"}, "migManager": {"config": {"name": "custom"}}})
    assert spec["driver"] == {"enabled": True, "version": "550.1"}
    assert spec["migManager"]["config"] == {"name": "custom", "default": "all-disabled"}
    # A list given replaces the chart's (Helm merges mappings, never lists).
    spec = _spec({"daemonsets": {"tolerations": [{"operator": "Exists"}]}})
    assert spec["daemonsets"]["tolerations"] == [{"operator": "Exists"}]


def test_upgrade_policy_renamed_and_completed_with_the_charts_defaults() -> None:
    spec = _spec({"driver": {"upgradePolicy": {"autoUpgrade": False, "gpuPodDeletion": {"force": True}}}})
    assert spec["driver"]["upgradePolicy"] == {
        "autoUpgrade": False,
        "maxParallelUpgrades": 1,
        "maxUnavailable": "25%",
        "waitForCompletion": {"timeoutSeconds": 0},
        "podDeletion": {"force": True, "timeoutSeconds": 300, "deleteEmptyDir": False},
        "drain": {"enable": False, "force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
    }
    spec = _spec(
        {
            "driver": {
                "upgradePolicy": {
                    "maxParallelUpgrades": 0,
                    "waitForCompletion": {"podSelector": "app=train"},
                    "drain": {"enable": True, "podSelector": "x=y", "timeoutSeconds": 60},
                }
            }
        }
    )
    upgrade = spec["driver"]["upgradePolicy"]
    assert upgrade["maxParallelUpgrades"] == 0
    assert upgrade["waitForCompletion"] == {"timeoutSeconds": 0, "podSelector": "app=train"}
    assert upgrade["drain"] == {
        "enable": True,
        "force": False,
        "timeoutSeconds": 60,
        "deleteEmptyDir": False,
        "podSelector": "x=y",
    }
    assert "upgradePolicy" not in _spec({})["driver"]
    mapped = map_values({"driver": {"upgradePolicy": {"gpuPodDeletion": {"force": True}}}})
    assert mapped.values_path("spec.driver.upgradePolicy.podDeletion.force") == (
        "driver.upgradePolicy.gpuPodDeletion.force"
    )


def test_the_chart_upgrade_policy_is_the_policy_the_upgrade_controller_reads(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "driver:\n  upgradePolicy:\n    maxParallelUpgrades: 3\n    maxUnavailable: 20%\n"
        "    gpuPodDeletion: {force: true, timeoutSeconds: 60}\n"
        "    drain: {enable: true, podSelector: team=ml}\n"
    )
    up = load_values(values).policy.spec.driver.upgrade_policy
    assert (up.auto_upgrade, up.max_parallel_upgrades, up.max_unavailable) == (True, 3, "20%")  # chart: on
    assert (up.pod_deletion.force, up.pod_deletion.timeout_seconds) == (True, 60)
    assert (up.drain.enable, up.drain.pod_selector, up.drain.timeout_seconds) == (True, "team=ml", 300)


def test_device_plugin_config_needs_a_name_and_keeps_create_and_data() -> None:
    assert "config" not in _spec({"devicePlugin": {"config": {"name": "", "default": "x"}}})["devicePlugin"]
    assert _spec({"devicePlugin": {"config": {"name": "ts"}}})["devicePlugin"]["config"] == {
        "name": "ts",
        "default": "",
    }
    data = {"any": "version: v1\n"}
    spec = _spec({"devicePlugin": {"config": {"name": "ts", "default": "any", "create": True, "data": data}}})
    assert spec["devicePlugin"]["config"] == {"name": "ts", "default": "any", "create": True, "data": data}
    # create: false -> an existing ConfigMap; the chart's data is not used.
    spec = _spec({"devicePlugin": {"config": {"name": "ts", "create": False, "data": data}}})
    assert spec["devicePlugin"]["config"] == {"name": "ts", "default": ""}


def test_mig_manager_config_default_is_quoted() -> None:
    assert _spec({"migManager": {"config": {"default": 7}}})["migManager"]["config"] == {"default": "7"}


def test_cdi_nri_plugin_only_with_cdi_enabled() -> None:
    assert _spec({"cdi": {"enabled": True, "nriPluginEnabled": True}})["cdi"] == {
        "enabled": True,
        "nriPluginEnabled": True,
    }
    assert _spec({"cdi": {"enabled": False, "nriPluginEnabled": True}})["cdi"] == {"enabled": False}


def test_validator_sections_get_an_empty_env() -> None:
    """`{{- if .Values.validator.plugin }}`: a section with a key is written, its env `[]` when empty."""
    spec = _spec({"validator": {"plugin": {"env": []}, "driver": {"env": None}, "toolkit": {}}})
    assert spec["validator"] == {"plugin": {"env": []}, "driver": {"env": []}}


def test_gds_and_gdrcopy_written_only_when_given() -> None:
    assert "gds" not in _spec({})
    assert _spec({"gdrcopy": {"version": "v2.5"}})["gdrcopy"] == {"version": "v2.5", "enabled": False}


def test_keys_the_chart_does_not_have_warn_with_their_path() -> None:
    mapped = map_values(
        {
            "driver": {"verison": "1", "manager": {"imagee": "x"}},
            "devicePlugin": {"config": {"nmae": "x"}},
            "bogus": {"deep": 1},
            "dcgmExporter": {
                "serviceMonitor": {"anything": "goes"}
            },  # copied whole: its fields are the CRD's
        }
    )
    assert mapped.warnings == (
        "driver.verison: not a value of the GPU Operator chart (ignored); did you mean version?",
        "driver.manager.imagee: not a value of the GPU Operator chart (ignored); did you mean image?",
        "devicePlugin.config.nmae: not a value of the GPU Operator chart (ignored); did you mean name?",
        "bogus: not a value of the GPU Operator chart (ignored)",
    )
    assert "verison" not in mapped.document["spec"]["driver"]


def test_chart_values_outside_the_cluster_policy_are_listed() -> None:
    mapped = map_values(
        {
            "operator": {"resources": {"limits": {"cpu": "1"}}, "defaultRuntime": "containerd"},
            "node-feature-discovery": {"worker": {"tolerations": []}},
            "platform": {"openshift": False},
            "driver": {"nvidiaDriverCRD": {"deployDefaultCR": True}},
            "dcgmExporter": {"config": {"create": True, "data": "DCGM_FI_DEV_GPU_UTIL, gauge, util"}},
        }
    )
    assert mapped.outside == (
        "operator.resources",
        "node-feature-discovery",
        "platform",
        "driver.nvidiaDriverCRD.deployDefaultCR",
        "dcgmExporter.config.create",
        "dcgmExporter.config.data",
    )
    assert mapped.warnings == ()
    assert mapped.document["spec"]["operator"] == {"defaultRuntime": "containerd"}


def test_a_section_that_is_not_a_mapping_is_an_error() -> None:
    with pytest.raises(ConfigError) as exc:
        map_values({"driver": True, "migManager": {"config": "x"}}, "v.yaml")
    assert exc.value.problems == (
        "driver: must be a mapping (a section of the chart's values)",
        "migManager.config: must be a mapping (a section of the chart's values)",
    )
    assert map_values({"driver": None}).warnings == ()  # null: the chart's section left out


def test_a_cluster_policy_is_not_values() -> None:
    with pytest.raises(ConfigError, match="a ClusterPolicy, not Helm chart values: use --policy"):
        map_values({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "spec": {}}, "p.yaml")


def test_every_mapped_chart_key_has_a_cluster_policy_path() -> None:
    keys = chart_keys()
    assert keys["gfd.enabled"] == "spec.gfd.enabled"
    assert keys["driver.upgradePolicy.gpuPodDeletion.force"] == "spec.driver.upgradePolicy.podDeletion.force"
    assert keys["operator.resources"] == ""
    assert all(dest == "" or dest.startswith("spec.") for dest in keys.values())


# ----------------------------------------------------------------------------------- through the model


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_values_validates_and_names_the_values_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_values(_write(tmp_path, "driver:\n  enabled: 'yes'\nmig:\n  strategy: half\n"))
    assert exc.value.path.endswith("values.yaml")
    assert exc.value.problems == (
        "driver.enabled: must be a boolean (true or false), not a string",
        'mig.strategy: must be one of none, single, mixed (got "half")',
    )


def test_load_values_uses_the_safe_loader(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="alias"):
        load_values(_write(tmp_path, "a: &x {enabled: true}\ndriver: *x\n"))
    with pytest.raises(ConfigError, match="duplicate"):
        load_values(_write(tmp_path, "driver: {}\ndriver: {}\n"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_values(_write(tmp_path, "- driver\n"))
    assert load_values(_write(tmp_path, "")).warnings == ()


def test_load_values_strict_refuses_unknown_chart_keys(tmp_path: Path) -> None:
    path = _write(tmp_path, "driver:\n  verison: '1'\n")
    assert load_values(path).warnings == (
        "driver.verison: not a value of the GPU Operator chart (ignored); did you mean version?",
    )
    with pytest.raises(ConfigError) as exc:
        load_values(path, strict=True)
    assert exc.value.problems == (
        "driver.verison: not a value of the GPU Operator chart (ignored); did you mean version? (--strict)",
    )


def test_production_values_load() -> None:
    loaded = load_values(PRODUCTION)
    spec = loaded.policy.spec
    assert spec.mig.strategy == "mixed"
    assert spec.driver.version == "550.127.05"
    assert spec.device_plugin.config.name == "time-slicing-config"
    assert spec.device_plugin.config.default == "any"
    assert spec.mig_manager.config.name == "custom-mig-config"
    assert spec.dcgm_exporter.service_monitor.enabled is True
    assert spec.operator.default_runtime == "containerd"
    assert len(spec.daemonsets.tolerations) == 2
    assert loaded.mapped.warnings == ()  # every key is the chart's
    assert loaded.outside == (
        "operator.priorityClassName",
        "operator.resources",
        "operator.tolerations",
        "node-feature-discovery",
    )


def test_every_cluster_policy_path_written_is_a_crd_field() -> None:
    from gpunode.api.clusterpolicy_fields import schema_at, spec_schema

    schema = spec_schema()
    dests = [d for d in chart_keys().values() if d]
    dests += [f"spec.dcgmExporter.serviceMonitor.{k}" for k in ("enabled", "interval", "honorLabels")]
    dests += [f"spec.dcgmExporter.serviceMonitor.{k}" for k in ("additionalLabels", "relabelings")]
    dests.append("spec.dcgmExporter.serviceMonitor.scrapeTimeout")  # the chart's default since v25
    missing = {d for d in dests if schema_at(schema, tuple(d.split(".")[1:])) is None}
    assert missing == set(), "NVIDIA's chart writes these ClusterPolicy paths; add them to the CRD table"

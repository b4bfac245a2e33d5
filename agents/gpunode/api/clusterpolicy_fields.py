"""Every field of NVIDIA's ``ClusterPolicy`` CRD (``nvidia.com/v1``), gpunode's extensions, and why a
field is ignored.

The one source of truth for three things:

* the CRD gpunode installs (:mod:`gpunode.api.clusterpolicy_crd` builds its OpenAPI schema from
  :func:`spec_schema` and :data:`STATUS`);
* what ``gpunode render`` and the operator accept: a field of NVIDIA's CRD that the strict model
  (:mod:`gpunode.api.clusterpolicy`) does not declare is accepted and ignored, with the reason from
  :func:`ignored_reason`; only a field outside this table is unknown;
* the field table of ``docs/clusterpolicy.md`` (:func:`gpunode.api.clusterpolicy.field_table`).

The field names and types follow NVIDIA's CRD as of GPU Operator v25/v26 (fields added by later releases
of the exporter spec, ``enablePodLabels``, ``enablePodUID`` and ``podLabelAllowlistRegex``, included).
This module is plain data: no pydantic, no YAML.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "EXTENSIONS",
    "STATUS",
    "ignored_reason",
    "leaf_paths",
    "nvidia_spec_schema",
    "schema_at",
    "spec_schema",
]

Schema = dict[str, Any]


# -- schema building blocks ----------------------------------------------------------------------------
def _str(**extra: Any) -> Schema:
    return {"type": "string", **extra}


def _bool() -> Schema:
    return {"type": "boolean"}


def _int(fmt: str | None = None, **extra: Any) -> Schema:
    out: Schema = {"type": "integer", **extra}
    if fmt:
        out["format"] = fmt
    return out


def _int_or_str() -> Schema:
    return {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}


def _str_map() -> Schema:
    return {"type": "object", "additionalProperties": {"type": "string"}}


def _list(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def _obj(*required: str, **props: Schema) -> Schema:
    out: Schema = {"type": "object", "properties": dict(sorted(props.items()))}
    if required:
        out["required"] = list(required)
    return out


_QUANTITY = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
    "x-kubernetes-int-or-string": True,
}


def _env() -> Schema:
    return _list(_obj("name", name=_str(), value=_str()))


def _resources() -> Schema:
    quantities: Schema = {"type": "object", "additionalProperties": dict(_QUANTITY)}
    return _obj(limits=quantities, requests=copy.deepcopy(quantities))


def _image(**more: Schema) -> dict[str, Schema]:
    """The image fields every NVIDIA component has."""
    return {
        "repository": _str(),
        "image": _str(pattern=r"[a-zA-Z0-9\-]+"),
        "version": _str(),
        "imagePullPolicy": _str(),
        "imagePullSecrets": _list(_str()),
        **more,
    }


def _component(*, resources: bool = True, **more: Schema) -> Schema:
    """An NVIDIA operand: enabled, image, args, env, (resources), plus its own fields."""
    props = _image(enabled=_bool(), args=_list(_str()), env=_env(), **more)
    if resources:
        props["resources"] = _resources()
    return _obj(**props)


def _env_only() -> Schema:
    return _obj(env=_env())


def _probe() -> Schema:
    return _obj(
        initialDelaySeconds=_int("int32"),
        timeoutSeconds=_int("int32", minimum=1),
        periodSeconds=_int("int32", minimum=1),
        successThreshold=_int("int32", minimum=1),
        failureThreshold=_int("int32", minimum=1),
    )


def _driver_manager() -> Schema:
    return _obj(**_image(env=_env()))


def _toleration() -> Schema:
    return _obj(
        key=_str(),
        operator=_str(),
        value=_str(),
        effect=_str(),
        tolerationSeconds=_int("int64"),
    )


def _relabel_config() -> Schema:
    return _obj(
        action=_str(),
        modulus=_int("int64"),
        regex=_str(),
        replacement=_str(),
        separator=_str(),
        sourceLabels=_list(_str()),
        targetLabel=_str(),
    )


def _upgrade_policy() -> Schema:
    return _obj(
        autoUpgrade=_bool(),
        maxParallelUpgrades=_int(minimum=0),
        maxUnavailable=_int_or_str(),
        drain=_obj(
            enable=_bool(),
            force=_bool(),
            podSelector=_str(),
            timeoutSeconds=_int(minimum=0),
            deleteEmptyDir=_bool(),
        ),
        podDeletion=_obj(force=_bool(), timeoutSeconds=_int(minimum=0), deleteEmptyDir=_bool()),
        waitForCompletion=_obj(podSelector=_str(), timeoutSeconds=_int(minimum=0)),
    )


def nvidia_spec_schema() -> Schema:
    """``spec`` of NVIDIA's ClusterPolicy CRD: every field, NVIDIA's types (no defaults, nothing required:
    gpunode's model supplies the defaults, and a policy written for either operator applies unchanged)."""
    return _obj(
        operator=_obj(
            defaultRuntime=_str(enum=["docker", "crio", "containerd"]),
            runtimeClass=_str(),
            defaultGPUMode=_str(),
            initContainer=_obj(**_image()),
            labels=_str_map(),
            annotations=_str_map(),
            use_ocp_driver_toolkit=_bool(),
        ),
        daemonsets=_obj(
            labels=_str_map(),
            annotations=_str_map(),
            tolerations=_list(_toleration()),
            priorityClassName=_str(),
            updateStrategy=_str(enum=["RollingUpdate", "OnDelete"]),
            rollingUpdate=_obj(maxUnavailable=_str()),
        ),
        driver=_component(
            useNvidiaDriverCRD=_bool(),
            usePrecompiled=_bool(),
            useOpenKernelModules=_bool(),
            kernelModuleType=_str(enum=["auto", "open", "proprietary"]),
            startupProbe=_probe(),
            livenessProbe=_probe(),
            readinessProbe=_probe(),
            rdma=_obj(enabled=_bool(), useHostMofed=_bool()),
            upgradePolicy=_upgrade_policy(),
            manager=_driver_manager(),
            repoConfig=_obj(configMapName=_str()),
            certConfig=_obj(name=_str()),
            licensingConfig=_obj(configMapName=_str(), secretName=_str(), nlsEnabled=_bool()),
            virtualTopology=_obj(config=_str()),
            kernelModuleConfig=_obj(name=_str()),
            secretEnv=_str(),
        ),
        toolkit=_component(installDir=_str()),
        devicePlugin=_component(
            config=_obj(name=_str(), default=_str()),
            mps=_obj(root=_str()),
        ),
        dcgmExporter=_component(
            podAnnotations=_str_map(),
            podLabels=_str_map(),
            config=_obj(name=_str()),
            serviceMonitor=_obj(
                enabled=_bool(),
                interval=_str(),
                scrapeTimeout=_str(),
                honorLabels=_bool(),
                additionalLabels=_str_map(),
                relabelings=_list(_relabel_config()),
            ),
            service=_obj(type=_str(), internalTrafficPolicy=_str()),
            hostPID=_bool(),
            hostNetwork=_bool(),
            hpcJobMapping=_obj(enabled=_bool(), directory=_str()),
            enablePodLabels=_bool(),
            enablePodUID=_bool(),
            podLabelAllowlistRegex=_list(_str()),
            podMetrics=_obj(enabled=_bool()),
        ),
        dcgm=_component(hostPort=_int("int32")),
        nodeStatusExporter=_component(),
        gfd=_component(),
        mig=_obj(strategy=_str(enum=["none", "single", "mixed"])),
        migManager=_component(
            config=_obj(name=_str(), default=_str(enum=["all-disabled", ""])),
            gpuClientsConfig=_obj(name=_str()),
        ),
        psp=_obj(enabled=_bool()),
        psa=_obj(enabled=_bool()),
        validator=_obj(
            **_image(args=_list(_str()), env=_env(), resources=_resources()),
            plugin=_env_only(),
            toolkit=_env_only(),
            driver=_env_only(),
            cuda=_env_only(),
            vfioPCI=_env_only(),
            vgpuManager=_env_only(),
            vgpuDevices=_env_only(),
        ),
        gds=_component(resources=False),
        gdrcopy=_component(resources=False),
        sandboxWorkloads=_obj(
            enabled=_bool(),
            defaultWorkload=_str(enum=["container", "vm-passthrough", "vm-vgpu"]),
            mode=_str(enum=["kubevirt", "kata"]),
        ),
        vfioManager=_component(driverManager=_driver_manager()),
        sandboxDevicePlugin=_component(),
        kataSandboxDevicePlugin=_component(),
        vgpuManager=_component(driverManager=_driver_manager()),
        vgpuDeviceManager=_component(config=_obj(name=_str(), default=_str())),
        cdi=_obj(enabled=_bool(), default=_bool(), nriPluginEnabled=_bool()),
        kataManager=_component(
            config=_obj(
                artifactsDir=_str(),
                runtimeClasses=_list(
                    _obj(
                        "name",
                        "artifacts",
                        name=_str(),
                        nodeSelector=_str_map(),
                        artifacts=_obj("url", url=_str(), pullSecret=_str()),
                    )
                ),
            )
        ),
        ccManager=_component(defaultMode=_str(enum=["on", "off", "devtools"])),
        hostPaths=_obj(rootFS=_str(), driverInstallDir=_str()),
    )


# gpunode's own fields (not in NVIDIA's CRD): path -> schema. All honoured.
EXTENSIONS: Mapping[str, Schema] = {
    "spec.gpunode": _obj(**_image(alerts=_obj(enabled=_bool()), dashboard=_obj(enabled=_bool()))),
    "spec.nfd": _obj(enabled=_bool()),
    "spec.devicePlugin.config.create": _bool(),
    "spec.devicePlugin.config.data": _str_map(),
    "spec.migManager.config.create": _bool(),
    "spec.migManager.config.data": _str_map(),
}

# Values gpunode accepts beyond NVIDIA's enums: path -> the extra values.
EXTRA_ENUM_VALUES: Mapping[str, tuple[str, ...]] = {
    "spec.driver.kernelModuleType": ("precompiled", "runcompiled"),
}


# NVIDIA enums gpunode widens to any string: the MIG manager's default layout may name any layout.
ANY_STRING: tuple[str, ...] = ("spec.migManager.config.default",)


def spec_schema() -> Schema:
    """``spec`` of gpunode's CRD: NVIDIA's fields plus gpunode's extensions."""
    spec = nvidia_spec_schema()
    for path, schema in EXTENSIONS.items():
        *parents, name = path.split(".")[1:]
        node = spec
        for part in parents:
            node = node["properties"][part]
        node["properties"][name] = copy.deepcopy(schema)
        node["properties"] = dict(sorted(node["properties"].items()))
    for path, values in EXTRA_ENUM_VALUES.items():
        node = spec
        for part in path.split(".")[1:]:
            node = node["properties"][part]
        node["enum"] = [*node["enum"], *values]
    for path in ANY_STRING:
        node = spec
        for part in path.split(".")[1:]:
            node = node["properties"][part]
        del node["enum"]
    return spec


def _condition() -> Schema:
    return _obj(
        "lastTransitionTime",
        "message",
        "reason",
        "status",
        "type",
        lastTransitionTime=_str(format="date-time"),
        message=_str(maxLength=32768),
        observedGeneration=_int("int64", minimum=0),
        reason=_str(maxLength=1024, minLength=1, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
        status=_str(enum=["True", "False", "Unknown"]),
        type=_str(
            maxLength=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        ),
    )


# status.driverUpgrade.nodes: nodes per state of nvidia.com/gpu-driver-upgrade-state (camelCase keys)
_UPGRADE_STATE_COUNTS = ("pending", "upgrading", "done", "failed", "held")

# ``status``: NVIDIA's (state, namespace, conditions) plus, per state, where and why it is not ready.
STATUS: Schema = _obj(
    state=_str(enum=["ignored", "ready", "notReady"]),
    namespace=_str(),
    conditions=_list(_condition()),
    states=_list(
        _obj(
            "name",
            name=_str(),
            state=_str(),
            desired=_int("int32", minimum=0),
            ready=_int("int32", minimum=0),
            unavailable=_int("int32", minimum=0),
            nodes=_list(_str()),
            message=_str(),
        )
    ),
    # the upgrade controller's (gpunode-operator, docs/upgrades.md): which nodes wait, hold a slot, failed
    driverUpgrade=_obj(
        autoUpgrade=_bool(),
        message=_str(),
        nodes=_obj(**{s: _int("int32", minimum=0) for s in _UPGRADE_STATE_COUNTS}),
        upgrading=_list(_str()),
        waiting=_list(_str()),
        waitingReason=_str(),
        failed=_list(_obj("node", node=_str(), reason=_str())),
    ),
)


# -- why a field is ignored ------------------------------------------------------------------------------
_IMAGE = "every agent runs from the one gpunode image (spec.gpunode, or --image)"
_BUILD = "configures NVIDIA's driver image build; the driver loader takes spec.driver.env"
_SPLIT = "per-check env is not split; spec.validator.env reaches every validation container"
_SANDBOX = "VM and sandbox workloads (vGPU, VFIO passthrough, Kata, confidential computing) are not supported"

# The reason for an NVIDIA field gpunode does not implement, by path; ``*`` stands for any component.
REASONS: Mapping[str, str] = {
    "spec.*.repository": _IMAGE,
    "spec.*.image": _IMAGE,
    "spec.*.version": _IMAGE,
    "spec.*.imagePullPolicy": _IMAGE,
    "spec.*.imagePullSecrets": _IMAGE,
    "spec.*.resources": "each agent's requests and limits are sized from its measured working set",
    "spec.*.args": "NVIDIA's command-line arguments do not apply; agents take env (spec.<component>.env)",
    "spec.*.startupProbe": "gpunode's probes are its agents' /healthz and /readyz",
    "spec.*.livenessProbe": "gpunode's probes are its agents' /healthz and /readyz",
    "spec.*.readinessProbe": "gpunode's probes are its agents' /healthz and /readyz",
    "spec.*.driverManager": _SANDBOX,
    "spec.operator.initContainer": "no CUDA init image: the wait-for init containers run from the "
    "gpunode image",
    "spec.operator.labels": "labels of NVIDIA's operand pods; use spec.daemonsets.labels",
    "spec.operator.annotations": "annotations of NVIDIA's operand pods; use spec.daemonsets.annotations",
    "spec.operator.use_ocp_driver_toolkit": "OpenShift Driver Toolkit builds are not supported",
    "spec.daemonsets.updateStrategy": "set per agent: the driver loader OnDelete, the others RollingUpdate",
    "spec.daemonsets.rollingUpdate": "set per agent: RollingUpdate with maxUnavailable 1",
    "spec.driver.useNvidiaDriverCRD": "the NVIDIADriver CRD is not supported; one driver DaemonSet per "
    "policy",
    "spec.driver.usePrecompiled": "use spec.driver.kernelModuleType: precompiled",
    "spec.driver.useOpenKernelModules": "deprecated by NVIDIA; use spec.driver.kernelModuleType: open",
    "spec.driver.rdma.useHostMofed": "gpunode loads nvidia-peermem against the host's RDMA stack as found",
    "spec.driver.repoConfig": _BUILD,
    "spec.driver.certConfig": _BUILD,
    "spec.driver.kernelModuleConfig": "module parameters go through spec.driver.env",
    "spec.driver.secretEnv": "the driver loader takes spec.driver.env",
    "spec.driver.licensingConfig": _SANDBOX,
    "spec.driver.virtualTopology": _SANDBOX,
    "spec.toolkit.installDir": "gpunode's toolkit installs only its CDI hook program, at "
    "/usr/local/gpunode/bin (gpunode-toolkit cdi generate --hook-path)",
    "spec.dcgmExporter.podAnnotations": "use spec.daemonsets.annotations",
    "spec.dcgmExporter.podLabels": "use spec.daemonsets.labels",
    "spec.dcgmExporter.config": "custom counters: DCGM_EXPORTER_COLLECTORS through spec.dcgmExporter.env",
    "spec.dcgmExporter.serviceMonitor.relabelings": "not rendered; relabel in Prometheus",
    "spec.dcgmExporter.service": "the exporter's Service is ClusterIP on port 9400",
    "spec.dcgmExporter.hostPID": "the exporter names processes from NVML, not the host's PID namespace",
    "spec.dcgmExporter.hostNetwork": "the exporter serves on the pod network (Service port 9400)",
    "spec.dcgmExporter.hpcJobMapping": "HPC job mapping files are not read",
    "spec.dcgmExporter.enablePodLabels": "pod attribution comes from the kubelet's PodResources socket "
    "(DCGM_EXPORTER_KUBERNETES through spec.dcgmExporter.env)",
    "spec.dcgmExporter.enablePodUID": "pod attribution comes from the kubelet's PodResources socket",
    "spec.dcgmExporter.podLabelAllowlistRegex": "pod labels are not copied onto metrics",
    "spec.dcgm": "no separate DCGM host engine: the exporter reads NVML directly",
    "spec.nodeStatusExporter": "not implemented; gpunode's agents serve their own /metrics",
    "spec.migManager.gpuClientsConfig": "the MIG manager finds GPU clients itself (its GPU-clients file "
    "through spec.migManager.env)",
    "spec.psp": "PodSecurityPolicy was removed from Kubernetes",
    "spec.psa": "the namespace's Pod Security labels are set by gpunode's manifests",
    "spec.validator.plugin": _SPLIT,
    "spec.validator.toolkit": _SPLIT,
    "spec.validator.driver": _SPLIT,
    "spec.validator.cuda": "no CUDA workload validation: NVML and the CDI spec are validated",
    "spec.validator.vfioPCI": _SANDBOX,
    "spec.validator.vgpuManager": _SANDBOX,
    "spec.validator.vgpuDevices": _SANDBOX,
    "spec.gds": "GPUDirect Storage is not supported",
    "spec.gdrcopy": "GDRCopy is not supported",
    "spec.sandboxWorkloads": _SANDBOX,
    "spec.vfioManager": _SANDBOX,
    "spec.sandboxDevicePlugin": _SANDBOX,
    "spec.kataSandboxDevicePlugin": _SANDBOX,
    "spec.operator.defaultGPUMode": _SANDBOX,
    "spec.dcgmExporter.podMetrics": "pod attribution comes from the kubelet's PodResources socket "
    "(DCGM_EXPORTER_KUBERNETES through spec.dcgmExporter.env)",
    "spec.vgpuManager": _SANDBOX,
    "spec.vgpuDeviceManager": _SANDBOX,
    "spec.kataManager": _SANDBOX,
    "spec.ccManager": _SANDBOX,
    "spec.cdi.default": "with spec.cdi.enabled every workload gets its devices through CDI; there is no "
    "per-runtime-class default to choose",
    "spec.cdi.nriPluginEnabled": "gpunode's toolkit enables CDI in the runtime's configuration instead of "
    "serving an NRI plugin",
    "spec.hostPaths": "the agents find the host root and the driver root themselves",
}


def ignored_reason(path: str) -> str | None:
    """The reason for ignoring the NVIDIA field at ``path`` (``spec.driver.licensingConfig``), or ``None``
    when the table gives none. Looks up the path, then the wildcard for its last key (``spec.*.image``)."""
    if path in REASONS:
        return REASONS[path]
    parts = path.split(".")
    if len(parts) >= 3:
        return REASONS.get(f"spec.*.{parts[-1]}")
    return None


# -- walking schemas ----------------------------------------------------------------------------------------
def schema_at(schema: Schema, path: tuple[str, ...]) -> Schema | None:
    """The sub-schema at ``path`` (``"[]"`` steps into list items), or ``None`` when absent."""
    node: Schema | None = schema
    for part in path:
        if node is None:
            return None
        node = node.get("items") if part == "[]" else node.get("properties", {}).get(part)
    return node


def leaf_paths(schema: Schema, prefix: str) -> Iterator[tuple[str, str]]:
    """``(path, type)`` of every leaf of ``schema``: scalars, maps and lists of scalars."""
    if "properties" in schema:
        for name, sub in schema["properties"].items():
            yield from leaf_paths(sub, f"{prefix}.{name}")
        return
    items = schema.get("items")
    if isinstance(items, dict) and "properties" in items:
        yield from leaf_paths(items, f"{prefix}[]")
        return
    yield prefix, _type_name(schema)


def _type_name(schema: Schema) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return f"[]{_type_name(schema['items'])}"
    if kind == "object" and "additionalProperties" in schema:
        return f"map[string]{_type_name(schema['additionalProperties'])}"
    if kind == "integer" and "format" in schema:
        return str(schema["format"])
    return kind

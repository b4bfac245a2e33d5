"""Pure functions: a :class:`ClusterPolicy` -> the Kubernetes manifests that deploy gpunode's agents.

Conventions (GPU Operator): one image for every agent, ``priorityClassName: system-node-critical``, the
``nvidia.com/gpu`` NoSchedule toleration, node selection by NFD's ``pci-10de.present`` label plus
``nvidia.com/gpu.deploy.<operand>: "true"``, readiness barriers as files in ``/run/nvidia/validations``
awaited by ``gpunode-validator --wait-for`` init containers, and RBAC limited to what each agent does
(README, "Kubernetes").

The agents, their console scripts, operand labels and HTTP ports come from :mod:`gpunode.registry`
(``AgentSpec.default_http_port`` of the spec each main container runs); a test checks that every env
var written into a container is one of that command's settings.

Least privilege (issue 14): every hostPath is mounted read-only unless the agent writes there (each mount
says why where it is declared); every container has CPU and memory requests and limits (:data:`RESOURCES`);
and each agent that patches its node gets a ValidatingAdmissionPolicy (:func:`node_writes`,
``_Renderer._node_policy``) that lets its service account change only its own node, and only the keys
it owns there.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from gpunode import __version__, registry
from gpunode.api.clusterpolicy import ClusterPolicy, EnvVar, NamedConfig
from gpunode.common.settings import flags_of
from gpunode.deploy.alerts import DASHBOARD_FILE, prometheus_rule
from gpunode.deploy.nfd import nfd_images, render_nfd
from gpunode.driver_loader.upgrade_state import DRIVER_DEPLOY_LABEL, driver_operands
from gpunode.driver_loader.upgrade_state import RECORD_ANNOTATION as UPGRADE_RECORD_ANNOTATION
from gpunode.kube.labelconfig import APPLIED_ANNOTATION, STATE_ANNOTATION
from gpunode.kube.operands import DEFAULT_OPERANDS, DEPLOY_PREFIX
from gpunode.kube.operands import RECORD_ANNOTATION as PAUSE_RECORD_ANNOTATION
from gpunode.kube.selectors import is_label_key
from gpunode.mig import DEFAULT_JOURNAL
from gpunode.mig.decisions import REASON_ANNOTATION as MIG_REASON_ANNOTATION
from gpunode.mig.decisions import STATE_LABEL as MIG_STATE_LABEL
from gpunode.mps.settings import MpsSettings
from gpunode.toolkit.hook import DEFAULT_HOOK_DIR as HOOK_DIR
from gpunode.toolkit.settings import TOOLKIT_DIR as NVIDIA_TOOLKIT_DIR

__all__ = [
    "MAIN_VERBS",
    "NODE_NAME_CLAIM",
    "PSA_ENFORCE",
    "RESOURCES",
    "Agent",
    "NodeWrites",
    "agent_by_key",
    "agents",
    "dump_yaml",
    "image_for",
    "images",
    "namespace_object",
    "node_writes",
    "render",
    "render_by_agent",
    "requested_runtime_class",
    "runtime_class_obj",
]

Obj = dict[str, Any]  # a Kubernetes object (JSON-like)

VALIDATIONS = "/run/nvidia/validations"
MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"  # GFD's; the MPS control daemon runs where it is true
DRIVER_INSTALL_DIR = "/run/nvidia/driver"
NONROOT_UID = 65532
#: Pod Security admission's enforced level on a namespace.
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"

#: The user-info extra of a pod-bound service account token that names the pod's node (set by the API
#: server since Kubernetes 1.30, ServiceAccountTokenPodNodeInfo); the node policies compare it with the node.
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"

# Requests and limits per container, sized from the measured working sets (benchmarks/startup.py, the
# systemd units' notes): device plugin ~55 MB RSS, feature discovery 34-45 MB, exporter ~35 MB, MIG manager
# 30-40 MB, driver loader daemon ~30 MB, toolkit and validator 27-31 MB; all idle at about 1 ms of CPU a
# second. Requests are about the working set (what the scheduler reserves); memory limits are 4-10x it,
# the systemd units' MemoryMax=, so a runaway (a leak, an input that expands) is killed and restarted in
# its own cgroup instead of the node's OOM killer choosing a victim. CPU limits only cap a runaway.
_SMALL: Obj = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}
#: container -> resources; keys are registry keys (main containers) or the init containers' roles.
RESOURCES: dict[str, Obj] = {
    # gRPC thread pool and every device's health state; MemoryMax=512M under systemd
    "device-plugin": {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    },
    "feature-discovery": _SMALL,
    "exporter": _SMALL,
    "toolkit": _SMALL,
    # an apply runs nvidia-smi, systemctl and the hooks in this cgroup too; MemoryMax=1G under systemd
    "mig-manager": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
    # the loader (and the driver manager, which may load too) builds kernel modules here when no
    # precompiled ones fit the kernel (nvidia-installer / DKMS: compilers, several cores, about 1-2 GB):
    # generous limits, the daemon itself stays near 30 MB
    "driver": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "4", "memory": "4Gi"}},
    "validator": _SMALL,  # the validation and wait-for-<component> init containers
    # the MPS control daemons and the MPS servers they start run in this container's cgroup too
    "mps-control-daemon": {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    },
}


@dataclass(frozen=True)
class NodeWrites:
    """What one agent changes on its own node: the label and annotation keys it owns and the node spec
    fields it sets; its ValidatingAdmissionPolicy refuses every other change by its service account."""

    labels: tuple[str, ...] = ()
    annotations: tuple[str, ...] = ()
    spec: tuple[str, ...] = ()


def _eviction_label(policy: ClusterPolicy) -> str | None:
    """``NODE_LABEL_FOR_GPU_POD_EVICTION`` of the driver manager (its container's env, ``driver.manager.env``)
    when it is a label key (the driver manager refuses anything else, exit 2)."""
    value = next(
        (
            e.value
            for e in reversed(policy.spec.driver.manager.env)
            if e.name == "NODE_LABEL_FOR_GPU_POD_EVICTION"
        ),
        "",
    )
    key = value.strip()
    return key if key and is_label_key(key) else None


def node_writes(policy: ClusterPolicy) -> dict[str, NodeWrites]:
    """Per agent key, what it writes on its node (the agents that patch their node; from their own constants).

    * device plugin (a config chosen by node label): the ``device-plugin.config.state`` / ``.applied``
      annotations saying which config it serves; no labels.
    * MIG manager: the ``mig.config.state`` label and its reason annotation, and operand pausing.
    * driver manager: ``gpu.deploy.driver=pre-installed``, its upgrade record annotation, the cordon
      (``spec.unschedulable``), and operand pausing.

    Operand pausing (:mod:`gpunode.kube.operands`, shared by both) sets the operands' ``gpu.deploy.*``
    labels and the pause record annotation; either agent restores a pause the other left behind when it
    died, so both own the union of the two operand sets (and the driver manager's extra eviction label).
    Feature discovery reads its node only; it writes NodeFeature objects, not the node.
    """
    evict = _eviction_label(policy)
    pause_labels = {o.label for o in DEFAULT_OPERANDS} | {DEPLOY_PREFIX + "client"}
    pause_labels |= {o.label for o in driver_operands(evict or "")}
    pausing = NodeWrites(labels=tuple(sorted(pause_labels)), annotations=(PAUSE_RECORD_ANNOTATION,))
    return {
        "device-plugin": NodeWrites(annotations=tuple(sorted((STATE_ANNOTATION, APPLIED_ANNOTATION)))),
        "mig-manager": NodeWrites(
            labels=tuple(sorted({MIG_STATE_LABEL, *pausing.labels})),
            annotations=tuple(sorted({MIG_REASON_ANNOTATION, *pausing.annotations})),
        ),
        "driver": NodeWrites(
            labels=tuple(sorted({DRIVER_DEPLOY_LABEL, *pausing.labels})),
            annotations=tuple(sorted({UPGRADE_RECORD_ANNOTATION, *pausing.annotations})),
            spec=("unschedulable",),
        ),
    }


@dataclass(frozen=True)
class Agent:
    """One DaemonSet: a registry entry with an operand label, and what its main container runs."""

    key: str  # registry key: file name and short name
    name: str  # console script = DaemonSet / ServiceAccount name (= app.kubernetes.io/name)
    operand: str  # nvidia.com/gpu.deploy.<operand>
    port: int | None  # HTTP port with /healthz, /readyz, /metrics (the spec's default_http_port)
    verb: str = ""  # the verb the main container runs (a registry SPECS key), for verb commands

    @property
    def command(self) -> list[str]:
        """The main container's command without its flags: console script, then the verb's words."""
        return [self.name, *self.verb.split()]


#: The verb each verb command's main container runs.
MAIN_VERBS = {"driver": "init", "toolkit": "cdi generate"}


@functools.cache
def agent_by_key(key: str) -> Agent:
    """The registry's agent ``key`` as a DaemonSet (``KeyError`` when it has no operand label)."""
    entry = registry.entry(key)
    if entry.operand is None:
        raise KeyError(f"{key} is not deployed as a DaemonSet")
    verb = MAIN_VERBS.get(key, "")
    return Agent(entry.key, entry.console_script, entry.operand, entry.http_port, verb)


def agents() -> tuple[Agent, ...]:
    """Every agent deployed as a DaemonSet, in the registry's order (imports each one's settings)."""
    return tuple(agent_by_key(e.key) for e in registry.AGENTS if e.operand is not None)


def _validator() -> str:
    return registry.entry("validator").console_script


def image_for(policy: ClusterPolicy, override: str | None = None) -> str:
    if override:
        return override
    g = policy.spec.gpunode
    return f"{g.repository.rstrip('/')}/{g.image}:{g.version or __version__}"


def enabled_agents(policy: ClusterPolicy) -> list[Agent]:
    s = policy.spec
    on = {
        "driver": s.driver.enabled,
        "toolkit": s.toolkit.enabled,
        "device-plugin": s.device_plugin.enabled,
        "feature-discovery": s.gfd.enabled,
        "exporter": s.dcgm_exporter.enabled,
        "mig-manager": s.mig_manager.enabled,
        "mps-control-daemon": s.device_plugin.enabled,  # NVIDIA: the device plugin's MPS state
    }
    return [agent_by_key(e.key) for e in registry.AGENTS if e.operand is not None and on[e.key]]


def render(
    policy: ClusterPolicy,
    *,
    namespace: str = "gpunode",
    image: str | None = None,
    nfd_image: str | None = None,
) -> list[Obj]:
    """Every manifest, in apply order (namespace first)."""
    out: list[Obj] = []
    for objs in render_by_agent(policy, namespace=namespace, image=image, nfd_image=nfd_image).values():
        out.extend(objs)
    return out


def render_by_agent(
    policy: ClusterPolicy,
    *,
    namespace: str = "gpunode",
    image: str | None = None,
    nfd_image: str | None = None,
) -> dict[str, list[Obj]]:
    """``{"common": [...], "nfd": [...], "<agent key>": [...]}`` in a fixed order (a file each in
    containers/kubernetes); ``nfd`` only with ``spec.nfd.enabled``."""
    r = _Renderer(policy, namespace, image_for(policy, image))
    common = [r.namespace_obj()]
    runtime_class = requested_runtime_class(policy)
    if runtime_class is not None:
        common.append(runtime_class_obj(runtime_class))
    result: dict[str, list[Obj]] = {"common": common}
    nfd = render_nfd(policy, namespace=namespace, image=nfd_image)
    if nfd:
        result["nfd"] = nfd
    for agent in enabled_agents(policy):
        result[agent.key] = r.agent(agent)
    return result


def namespace_object(namespace: str) -> Obj:
    """The agents' namespace; Pod Security admission enforces ``privileged`` there (the driver loader and
    the MIG manager are privileged pods)."""
    labels = {"app.kubernetes.io/part-of": "gpunode", "app.kubernetes.io/managed-by": "gpunode-render"}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {**labels, "name": namespace, PSA_ENFORCE: "privileged"}},
    }


def requested_runtime_class(policy: ClusterPolicy) -> str | None:
    """The RuntimeClass GPU workloads use, or None.

    With CDI (``spec.cdi.enabled``, the default) workloads need none: the device plugin names CDI
    devices and the runtime injects them. Only the legacy path (``spec.cdi.enabled: false``) renders
    one, ``spec.operator.runtimeClass`` (default ``nvidia``), whose handler the toolkit registers,
    running NVIDIA's runtime, which must then be on the host (the toolkit fails clearly otherwise).
    On that path the agents that open the GPUs (device plugin, feature discovery, exporter, MPS control
    daemon) use it too: NVIDIA's runtime gives them the device nodes (``NVIDIA_VISIBLE_DEVICES=all``).
    """
    if policy.spec.cdi.enabled:
        return None
    return policy.spec.operator.runtime_class


#: The kind of the CDI names the device plugin hands out (its own, as NVIDIA's plugin).
PLUGIN_CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
#: The kind of the IMEX channel names it hands out (``imex.channelIDs``): the toolkit writes that spec
#: from the channel nodes beside the GPU ones (none on the node: no file).
PLUGIN_IMEX_KIND = "k8s.device-plugin.nvidia.com/imex-channel"
#: Runtime configuration the toolkit edits, per runtime: (config dir, socket dir).
RUNTIME_DIRS = {"containerd": ("/etc/containerd", "/run/containerd"), "crio": ("/etc/crio", "/var/run/crio")}


def runtime_class_obj(name: str) -> Obj:
    """RuntimeClass ``name`` whose handler has the same name (the toolkit's ``runtime configure``
    registers the ``nvidia`` handler in containerd or CRI-O under ``--nvidia-runtime-name``)."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/part-of": "gpunode",
                "app.kubernetes.io/managed-by": "gpunode-render",
            },
        },
        "handler": name,
    }


class _PlainDumper(yaml.SafeDumper):
    """Safe YAML without anchors and aliases: an object shared between containers (their mounts, say) is
    written out each time, as people and tools reading manifests expect (gpunode's own loader refuses
    aliases)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(objs: Iterable[Obj]) -> str:
    """Deterministic multi-document YAML (keys sorted, block style, no anchors or aliases)."""
    docs = [
        yaml.dump(o, Dumper=_PlainDumper, sort_keys=True, default_flow_style=False, width=1000) for o in objs
    ]
    return "---\n" + "---\n".join(docs) if docs else ""


def mig_default_config_text() -> str:
    return resources.files("gpunode.mig").joinpath("default-config.yaml").read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------- helpers


def _env(name: str, value: str) -> Obj:
    return {"name": name, "value": value}


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env_value(env: list[Obj], name: str) -> str:
    """The literal value of ``name`` in a container's env ("" when absent or not literal)."""
    return next((str(e.get("value", "")) for e in env if e["name"] == name), "")


def _user_env(items: Iterable[EnvVar]) -> list[Obj]:
    return [_env(e.name, e.value) for e in items]


def _merge_env(base: list[Obj], extra: list[Obj]) -> list[Obj]:
    """Policy env overrides ours by name, order kept (ours first, then new ones)."""
    by_name = {e["name"]: e for e in extra}
    out = [by_name.pop(e["name"], e) for e in base]
    return out + [e for e in extra if e["name"] in by_name]


def _host_volume(name: str, path: str, kind: str | None = None) -> Obj:
    hp: Obj = {"path": path}
    if kind:
        hp["type"] = kind
    return {"name": name, "hostPath": hp}


def _mount(name: str, path: str, read_only: bool = False, propagation: str | None = None) -> Obj:
    m: Obj = {"name": name, "mountPath": path}
    if read_only:
        m["readOnly"] = True
    if propagation:
        m["mountPropagation"] = propagation
    return m


def _restricted(run_as_root: bool = False, add: tuple[str, ...] = ()) -> Obj:
    caps: Obj = {"drop": ["ALL"]}
    if add:
        caps["add"] = list(add)
    sc: Obj = {
        "allowPrivilegeEscalation": False,
        "capabilities": caps,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if run_as_root:
        sc["runAsUser"] = 0
        sc["runAsNonRoot"] = False
    else:
        sc["runAsUser"] = NONROOT_UID
        sc["runAsGroup"] = NONROOT_UID
        sc["runAsNonRoot"] = True
    return sc


_PRIVILEGED: Obj = {"privileged": True, "readOnlyRootFilesystem": False, "runAsUser": 0}


def _privileged_gpu(run_as_root: bool = False) -> Obj:
    """A container that opens the GPUs without NVIDIA's runtime: ``privileged``, the only generic way to
    pass the device cgroup (docs/cdi.md, "How the agents reach the GPU"). What privilege leaves to keep is
    kept: the user (65532 where root is not needed) and a read-only root file system. Not written, because
    the API or the runtime ignores or refuses them with ``privileged``: ``allowPrivilegeEscalation: false``
    (refused), dropped capabilities and a seccomp profile (privileged containers get every capability and
    run unconfined)."""
    sc: Obj = {"privileged": True, "readOnlyRootFilesystem": True}
    if run_as_root:
        sc["runAsUser"] = 0
        sc["runAsNonRoot"] = False
    else:
        sc["runAsUser"] = NONROOT_UID
        sc["runAsGroup"] = NONROOT_UID
        sc["runAsNonRoot"] = True
    return sc


def _probe(path: str, port: str, *, period: int = 10, failures: int = 3, delay: int = 0) -> Obj:
    p: Obj = {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }
    if delay:
        p["initialDelaySeconds"] = delay
    return p


def _resources(role: str) -> Obj:
    """A deep copy of :data:`RESOURCES` for ``role`` (callers may not share one dict between containers)."""
    r = RESOURCES[role]
    return {"requests": dict(r["requests"]), "limits": dict(r["limits"])}


def _cel(text: str) -> str:
    """A CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(_cel(i) for i in items) + "]"


def _unchanged_except(name: str) -> str:
    """CEL: the map ``variables.new<Name>`` differs from ``variables.old<Name>`` only at the keys of
    ``variables.owned<Name>`` (nothing else added, removed or changed)."""
    new, old, owned = (f"variables.{w}{name}" for w in ("new", "old", "owned"))
    return (
        f"{new}.all(k, k in {owned} || (k in {old} && {old}[k] == {new}[k])) && "
        f"{old}.all(k, k in {owned} || k in {new})"
    )


def _or_empty(path: str, empty: str = "{}") -> str:
    """CEL: ``path`` (``object.metadata.labels``), or ``empty`` where the object has no such field."""
    return f"(has({path}) ? {path} : {empty})"


def _keys_text(keys: tuple[str, ...], what: str) -> str:
    return f"only these {what} of its node: {', '.join(keys)}" if keys else f"no {what} of its node"


def _patches_nodes(rules: list[Obj]) -> bool:
    return any("nodes" in r["resources"] and "patch" in r["verbs"] for r in rules)


class _Renderer:
    def __init__(self, policy: ClusterPolicy, namespace: str, image: str) -> None:
        self.p = policy
        self.s = policy.spec
        self.ns = namespace
        self.image = image

    # ------------------------------------------------------------------ common

    def namespace_obj(self) -> Obj:
        return namespace_object(self.ns)

    def _common_labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/part-of": "gpunode", "app.kubernetes.io/managed-by": "gpunode-render"}

    def _labels(self, agent: Agent) -> dict[str, str]:
        return {**self._common_labels(), "app.kubernetes.io/name": agent.name}

    def _meta(self, name: str, agent: Agent, namespaced: bool = True) -> Obj:
        m: Obj = {"name": name, "labels": self._labels(agent)}
        if namespaced:
            m["namespace"] = self.ns
        return m

    @property
    def driver_root(self) -> str:
        return DRIVER_INSTALL_DIR if self.s.driver.enabled else "/"

    def _node_selector(self, agent: Agent) -> dict[str, str]:
        present = (
            "feature.node.kubernetes.io/pci-10de.present" if self.s.nfd.enabled else "nvidia.com/gpu.present"
        )
        selector = {present: "true", f"nvidia.com/gpu.deploy.{agent.operand}": "true"}
        if agent.key == "mps-control-daemon":  # as NVIDIA's: only where GFD found MPS configured
            selector[MPS_CAPABLE_LABEL] = "true"
        return selector

    def _tolerations(self) -> list[Obj]:
        out = []
        for t in self.s.daemonsets.tolerations:
            d = t.model_dump(by_alias=True, exclude_none=True)
            out.append(d)
        return out

    def _wait_init(self, what: str) -> Obj:
        return {
            "name": f"wait-for-{what}",
            "image": self.image,
            "imagePullPolicy": self.s.gpunode.image_pull_policy,
            "command": [_validator(), "--wait-for", what, "--timeout", "0"],
            "env": _merge_env([_env("LOG_FORMAT", "json")], _user_env(self.s.validator.env)),
            "securityContext": _restricted(),
            "resources": _resources("validator"),
            # reads the readiness files only
            "volumeMounts": [_mount("run-nvidia-validations", VALIDATIONS, read_only=True)],
        }

    def _base_env(self, agent: Agent) -> list[Obj]:
        env = [
            _field_env("NODE_NAME", "spec.nodeName"),
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            _env("LOG_FORMAT", "json"),
        ]
        if agent.port is not None and agent.key != "exporter":
            env.append(_env("GPUNODE_HTTP_PORT", str(agent.port)))
        return env

    def _nvml_env(self, capabilities: str = "utility") -> list[Obj]:
        return [
            _env("NVIDIA_VISIBLE_DEVICES", "all"),
            _env("NVIDIA_DRIVER_CAPABILITIES", capabilities),
            _env("NVIDIA_DISABLE_REQUIRE", "true"),
            _env("NVIDIA_DRIVER_ROOT", "/driver-root"),
        ]

    def _gpu_security(self, run_as_root: bool = False, add: tuple[str, ...] = ()) -> Obj:
        """The securityContext of an agent container that opens the GPUs (NVML, MPS).

        CDI (``spec.cdi.enabled``): privileged, because nothing else gives a pod the device nodes without
        NVIDIA's runtime (a hostPath ``/dev`` does not pass the device cgroup; the runtimes apply CDI
        devices only from the device plugin or DRA, not from pod annotations). Legacy: unprivileged, and
        :meth:`_gpu_pod` sets the RuntimeClass whose NVIDIA runtime injects the devices."""
        if self.s.cdi.enabled:
            return _privileged_gpu(run_as_root)
        return _restricted(run_as_root=run_as_root, add=add)

    def _gpu_pod(self, pod: Obj) -> Obj:
        """``pod`` with the legacy path's RuntimeClass (NVIDIA's runtime reads ``NVIDIA_VISIBLE_DEVICES``
        and injects the GPUs); unchanged with CDI, where :meth:`_gpu_security` makes the containers
        privileged instead."""
        runtime_class = requested_runtime_class(self.p)
        if runtime_class is not None:
            pod["runtimeClassName"] = runtime_class
        return pod

    def _container(self, agent: Agent, command: list[str], env: list[Obj], user_env: Iterable[EnvVar]) -> Obj:
        c: Obj = {
            "name": agent.key,
            "image": self.image,
            "imagePullPolicy": self.s.gpunode.image_pull_policy,
            "command": command,
            "env": _merge_env(env, _user_env(user_env)),
            "resources": _resources(agent.key),
        }
        if agent.port is not None:
            c["ports"] = [{"name": "http", "containerPort": agent.port, "protocol": "TCP"}]
            health = "/health" if agent.key == "exporter" else "/healthz"
            c["livenessProbe"] = _probe(health, "http", period=10, failures=6, delay=10)
            c["readinessProbe"] = _probe("/readyz", "http", period=5, failures=3)
        return c

    def _daemonset(self, agent: Agent, pod: Obj, *, on_delete: bool = False) -> Obj:
        ds = self.s.daemonsets
        pod_meta: Obj = {"labels": {**ds.labels, **self._labels(agent)}}
        if ds.annotations:
            pod_meta["annotations"] = dict(ds.annotations)
        strategy: Obj = (
            {"type": "OnDelete"}
            if on_delete
            else {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
        )
        spec: Obj = {
            "serviceAccountName": agent.name,
            "priorityClassName": ds.priority_class_name,
            "tolerations": self._tolerations(),
            "nodeSelector": self._node_selector(agent),
            **pod,
        }
        if self.s.gpunode.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": n} for n in self.s.gpunode.image_pull_secrets]
        meta = self._meta(agent.name, agent)
        if ds.labels:
            meta["labels"] = {**ds.labels, **meta["labels"]}
        if ds.annotations:
            meta["annotations"] = dict(ds.annotations)
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": agent.name}},
                "updateStrategy": strategy,
                "template": {"metadata": pod_meta, "spec": spec},
            },
        }

    def _service_account(self, agent: Agent) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": self._meta(agent.name, agent),
            "automountServiceAccountToken": False,
        }

    def _rbac(self, agent: Agent, cluster_rules: list[Obj], ns_rules: list[Obj]) -> list[Obj]:
        out: list[Obj] = []
        subject = [{"kind": "ServiceAccount", "name": agent.name, "namespace": self.ns}]
        if cluster_rules:
            out.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": self._meta(agent.name, agent, namespaced=False),
                    "rules": cluster_rules,
                }
            )
            out.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": self._meta(agent.name, agent, namespaced=False),
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": agent.name,
                    },
                    "subjects": subject,
                }
            )
        if ns_rules:
            out.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": self._meta(agent.name, agent),
                    "rules": ns_rules,
                }
            )
            out.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": self._meta(agent.name, agent),
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": agent.name},
                    "subjects": subject,
                }
            )
        return out

    def agent(self, agent: Agent) -> list[Obj]:
        build = {
            "driver": self._driver,
            "toolkit": self._toolkit,
            "device-plugin": self._device_plugin,
            "feature-discovery": self._gfd,
            "exporter": self._exporter,
            "mig-manager": self._mig_manager,
            "mps-control-daemon": self._mps_control_daemon,
        }[agent.key]
        objs, cluster_rules, ns_rules = build(agent)
        sa = self._service_account(agent)
        if cluster_rules or ns_rules:
            sa.pop("automountServiceAccountToken")
        policy = self._node_policy(agent) if _patches_nodes(cluster_rules) else []
        return [sa, *self._rbac(agent, cluster_rules, ns_rules), *policy, *objs]

    def _node_policy(self, agent: Agent) -> list[Obj]:
        """The ValidatingAdmissionPolicy (and its binding) that holds ``agent``'s service account to its own
        node and the keys it owns there (:func:`node_writes`), whatever its ClusterRole allows.

        RBAC cannot name "the node this pod runs on"; the API server can, from the pod-bound token's
        ``authentication.kubernetes.io/node-name`` (Kubernetes 1.30 or later). Admission sees only writes:
        the node watch and the pod list (reads) and evictions (an Eviction names only the pod) stay scoped by
        the agent itself (field selectors on its node), not by this policy. ``object`` and ``oldObject``
        are the node after and before the update; the API server itself discards status changes made
        through the node resource, so the policy compares labels, annotations, spec, finalizers and owner
        references, each with the agent's own keys left out.
        """
        writes = node_writes(self.p)[agent.key]
        who = agent.name
        name = f"{who}-own-node"
        extra, claim = "request.userInfo.extra", _cel(NODE_NAME_CLAIM)
        variables = [
            {
                "name": "nodeName",
                "expression": f"has({extra}) && {claim} in {extra} && size({extra}[{claim}]) == 1 "
                f"? {extra}[{claim}][0] : ''",
            },
            {"name": "ownedLabels", "expression": _cel_list(writes.labels)},
            {"name": "ownedAnnotations", "expression": _cel_list(writes.annotations)},
            {"name": "ownedSpec", "expression": _cel_list(writes.spec)},
        ]
        for var, path in (
            ("Labels", "metadata.labels"),
            ("Annotations", "metadata.annotations"),
            ("Spec", "spec"),
        ):
            variables.append({"name": f"old{var}", "expression": _or_empty(f"oldObject.{path}")})
            variables.append({"name": f"new{var}", "expression": _or_empty(f"object.{path}")})
        same_meta = " && ".join(
            f"{_or_empty(f'object.metadata.{f}', '[]')} == {_or_empty(f'oldObject.metadata.{f}', '[]')}"
            for f in ("finalizers", "ownerReferences")
        )
        spec_text = (
            f"only {', '.join('spec.' + f for f in writes.spec)} of its node"
            if writes.spec
            else "nothing in its node's spec"
        )
        validations = [
            {
                "expression": "variables.nodeName != ''",
                "message": f"{who} may change a node only with a service account token bound to a pod on it "
                f"(the {NODE_NAME_CLAIM} claim, Kubernetes 1.30 or later); this request carries none",
            },
            {
                "expression": "object.metadata.name == variables.nodeName",
                "message": f"{who} may change only the node its pod runs on",
                "messageExpression": f"{_cel(who + ' may change only the node its pod runs on (')} + "
                "variables.nodeName + '), not ' + object.metadata.name",
            },
            {
                "expression": _unchanged_except("Labels"),
                "message": f"{who} may change {_keys_text(writes.labels, 'labels')}",
            },
            {
                "expression": _unchanged_except("Annotations"),
                "message": f"{who} may change {_keys_text(writes.annotations, 'annotations')}",
            },
            {"expression": _unchanged_except("Spec"), "message": f"{who} may change {spec_text}"},
            {
                "expression": same_meta,
                "message": f"{who} may not change its node's finalizers or owner references",
            },
        ]
        meta = self._meta(name, agent, namespaced=False)
        return [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": meta,
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["UPDATE"],
                                "resources": ["nodes"],
                            }
                        ]
                    },
                    "matchConditions": [
                        {
                            "name": "is-" + who,
                            "expression": f"request.userInfo.username == {_cel(self._username(agent))}",
                        }
                    ],
                    "variables": variables,
                    "validations": validations,
                },
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": self._meta(name, agent, namespaced=False),
                "spec": {"policyName": name, "validationActions": ["Deny"]},
            },
        ]

    def _username(self, agent: Agent) -> str:
        return f"system:serviceaccount:{self.ns}:{agent.name}"

    # ------------------------------------------------------------------ agents

    def _driver(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        d = self.s.driver
        env = [
            *self._base_env(agent),
            _env("GPUNODE_HOST_ROOT", "/host"),
            _env("NVIDIA_DRIVER_ROOT", DRIVER_INSTALL_DIR),
            _env("KERNEL_MODULE_TYPE", d.kernel_module_type),
            _env("GPU_DIRECT_RDMA_ENABLED", "true" if d.rdma.enabled else "false"),
        ]
        if d.version:
            env.append(_env("DRIVER_VERSION", d.version))
        # Every host path the loader uses is under GPUNODE_HOST_ROOT=/host. Kubernetes' readOnly is not
        # recursive: the host's separately mounted trees under /host (/host/run, /host/sys, /host/dev)
        # stay writable there, which the loader needs for its state, pid, status and readiness files
        # (/run/nvidia), the firmware search path (/sys/module/firmware_class) and the device nodes it
        # creates (/dev/nvidia*); the root filesystem itself (/etc, /usr, /var, ...) is read-only, but for
        # the one directory it writes, mounted writable on top.
        mounts = [
            # the driver installation (/run/nvidia/driver) and the readiness files live here, and what
            # the loader mounts there must reach the host and the other agents' driver-root mounts
            _mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            # reads the host (kernel, /proc/devices, modules, tools); writes only through the mounts below
            _mount("host-root", "/host", read_only=True),
            # module options (nvidia-gpunode.conf) and, if asked, the nouveau blacklist, which modprobe
            # reads from the host's configuration (-C /host/etc/modprobe.d)
            _mount("host-modprobe-d", "/host/etc/modprobe.d"),
            # modprobe, rmmod and the driver's tools work on module state through sysfs
            _mount("host-sys", "/sys"),
            # nvidia-installer and DKMS write their build logs here
            _mount("var-log", "/var/log"),
            # syslog of nvidia-persistenced and the tools: connecting to a socket needs no writable mount
            _mount("dev-log", "/dev/log", read_only=True),
        ]
        main = self._container(agent, agent.command, env, d.env)
        main["securityContext"] = dict(_PRIVILEGED)
        main["volumeMounts"] = mounts
        main["startupProbe"] = {**_probe("/readyz", "http", period=10, failures=120), "timeoutSeconds": 60}
        manager = {
            "name": "driver-manager",
            "image": self.image,
            "imagePullPolicy": self.s.gpunode.image_pull_policy,
            "command": [agent.name, "upgrade"],
            "env": _merge_env(env, _user_env(d.manager.env)),
            "securityContext": dict(_PRIVILEGED),
            "resources": _resources("driver"),  # it loads the new driver, which may build the modules
            "volumeMounts": mounts,
        }
        pod: Obj = {
            "hostPID": True,  # unloading names (and waits for) the host processes holding /dev/nvidia*
            "terminationGracePeriodSeconds": 120,
            "initContainers": [manager],
            "containers": [main],
            "volumes": [
                _host_volume("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
                _host_volume("host-root", "/"),
                _host_volume("host-modprobe-d", "/etc/modprobe.d", "DirectoryOrCreate"),
                _host_volume("host-sys", "/sys", "Directory"),
                _host_volume("var-log", "/var/log"),
                _host_volume("dev-log", "/dev/log"),
            ],
        }
        # nodes: its own only (the node policy); pods: listed with spec.nodeName=<its node> only (the agent's
        # field selector: admission does not see reads); evictions: only pods from that list (an Eviction
        # names only the pod, so admission cannot check the pod's node either)
        nodes = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "patch"]}
        pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
        evict = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
        return [self._daemonset(agent, pod, on_delete=True)], [nodes, pods, evict], []

    def _toolkit(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        runtime = self.s.operator.default_runtime
        env = self._base_env(agent) + self._nvml_env() + [_env("RUNTIME", runtime)]
        # The spec names host paths: the driver root, /proc/driver and the hook directory are mounted where
        # the host has them under --host-root /host (the spec says /run/nvidia/driver/..., never /host/...).
        # The device plugin's CDI names (k8s.device-plugin.nvidia.com/gpu=...) resolve in a second spec,
        # its IMEX channel names (k8s.device-plugin.nvidia.com/imex-channel=N) in a third, written from the
        # channel nodes whatever the plugin's config says (no channel node: no file).
        cmd = [*agent.command, "--host-root", "/host", "--driver-root", self.driver_root]
        also = f"{PLUGIN_CDI_KIND},{PLUGIN_IMEX_KIND}"
        cmd += ["--output", "/var/run/cdi/nvidia.yaml", "--also-kind", also]
        in_host = "/host" + self.driver_root.rstrip("/")
        mounts = [
            _mount("driver-root", in_host, read_only=True, propagation="HostToContainer"),
            _mount("proc-driver", "/host/proc/driver", read_only=True),  # MIG capability minors
            _mount("cdi", "/var/run/cdi"),  # writes the CDI specs
            _mount("gpunode-bin", "/host" + HOOK_DIR),  # installs gpunode-cdi-hook, which the specs run
        ]
        inits: list[Obj] = []
        if self.s.driver.enabled:
            inits.append(self._wait_init("driver"))
        else:  # a host driver: validate it, which writes driver-ready for everything after
            inits.append(self._validate_init("driver", [_mount("host-root", "/host", read_only=True)]))
        first = self._container(agent, cmd, env, self.s.toolkit.env)
        # privileged on both paths: NVML needs the device nodes, and the toolkit runs before any
        # RuntimeClass handler exists (it registers the legacy one itself)
        first.update(
            name="cdi-generate", securityContext=_privileged_gpu(run_as_root=True), volumeMounts=mounts
        )
        inits.append(first)
        volumes = [
            _host_volume("driver-root", self.driver_root),
            _host_volume("cdi", "/var/run/cdi", "DirectoryOrCreate"),
            _host_volume("gpunode-bin", HOOK_DIR, "DirectoryOrCreate"),
            _host_volume("proc-driver", "/proc/driver", "Directory"),
            _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
            *([_host_volume("host-root", "/")] if not self.s.driver.enabled else []),
        ]
        configure = self._runtime_configure(agent, runtime, env)
        if configure is not None:
            container, extra = configure
            inits.append(container)
            volumes += extra
        inits.append(self._validate_init("toolkit", [_mount("cdi", "/var/run/cdi", read_only=True)]))
        main = self._container(agent, [*cmd, "--watch"], env, self.s.toolkit.env)
        main["securityContext"] = _privileged_gpu(run_as_root=True)  # NVML's MIG events
        # cdi-generate installed the hook; the watch only checks it is current (no write)
        main["volumeMounts"] = [*mounts[:3], _mount("gpunode-bin", "/host" + HOOK_DIR, read_only=True)]
        pod: Obj = {"initContainers": inits, "containers": [main], "volumes": volumes}
        if configure is not None:
            pod["hostPID"] = True  # the runtime's pid (its socket's peer) to signal it after a change
        return [self._daemonset(agent, pod)], [], []

    def _runtime_configure(self, agent: Agent, runtime: str, env: list[Obj]) -> tuple[Obj, list[Obj]] | None:
        """The init container that enables CDI in the runtime (``spec.cdi.enabled``), or registers
        NVIDIA's handlers (legacy, ``false``; NVIDIA's runtime must be on the host, read under
        ``/host``); None where there is nothing to configure (CRI-O reads CDI specs by itself; Docker
        is not configured by gpunode)."""
        legacy = not self.s.cdi.enabled
        if runtime not in RUNTIME_DIRS or (runtime == "crio" and not legacy):
            return None
        config_dir, socket_dir = RUNTIME_DIRS[runtime]
        cmd = ["gpunode-toolkit", "runtime", "configure", "--runtime", runtime, "--host-root", "/host"]
        cmd += ["--restart-mode", "signal"]  # containerd: exits and its supervisor restarts it; CRI-O reloads
        cmd += ["--no-enable-cdi"] if legacy else []
        mounts = [
            _mount("runtime-config", "/host" + config_dir),
            _mount("runtime-socket", "/host" + socket_dir, read_only=True),
        ]
        volumes = [
            _host_volume("runtime-config", config_dir, "DirectoryOrCreate"),
            _host_volume("runtime-socket", socket_dir, "DirectoryOrCreate"),
        ]
        if legacy:  # only to check that NVIDIA's runtime binaries are there
            mounts.append(_mount("nvidia-toolkit", "/host" + NVIDIA_TOOLKIT_DIR, read_only=True))
            volumes.append(_host_volume("nvidia-toolkit", NVIDIA_TOOLKIT_DIR, "DirectoryOrCreate"))
        container = self._container(agent, cmd, env, self.s.toolkit.env)
        container.update(
            name="runtime-configure", securityContext=_restricted(run_as_root=True), volumeMounts=mounts
        )
        return container, volumes

    def _validate_init(self, component: str, mounts: list[Obj]) -> Obj:
        env = [
            _env("LOG_FORMAT", "json"),
            _env("TOOLKIT_CHECKS", "cdi"),
            _env("NVIDIA_DRIVER_ROOT", "/driver-root"),
            _env("NVIDIA_VISIBLE_DEVICES", "all"),
            _env("NVIDIA_DRIVER_CAPABILITIES", "utility"),
            _env("NVIDIA_DISABLE_REQUIRE", "true"),
        ]
        if component == "driver":
            env.append(_env("HOST_ROOT", "/host"))
        return {
            "name": f"{component}-validation",
            "image": self.image,
            "imagePullPolicy": self.s.gpunode.image_pull_policy,
            "command": [_validator(), "--component", component],
            "env": _merge_env(env, _user_env(self.s.validator.env)),
            # NVML (the driver's GPUs; the toolkit's check lists them against the specs): as cdi-generate
            "securityContext": _privileged_gpu(run_as_root=True),
            "resources": _resources("validator"),
            "volumeMounts": [
                # writes <component>-ready; the validator puts it under its host root (HOST_ROOT=/host for
                # the driver), so the writable mount is where it writes, on top of the read-only host
                _mount("run-nvidia-validations", ("/host" if component == "driver" else "") + VALIDATIONS),
                _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
                *mounts,
            ],
        }

    def _device_plugin(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        dp = self.s.device_plugin
        env = self._base_env(agent) + self._nvml_env("compute,utility")
        env += [_env("MIG_STRATEGY", self.s.mig.strategy), _env("FAIL_ON_INIT_ERROR", "true")]
        # CDI (default): the runtime injects what the CDI names say, no RuntimeClass (as NVIDIA's chart,
        # both: annotations for runtimes that read them, the CRI field for those that read that)
        strategy = "cdi-annotations,cdi-cri" if self.s.cdi.enabled else "envvar"
        env += [_env("DEVICE_LIST_STRATEGY", strategy), _env("NAMESPACE", self.ns)]
        mps_root = dp.mps.root
        env.append(_env("MPS_ROOT", mps_root))  # reads <root>/.ready; hands out <root>/... in Allocate
        # No /var/run/cdi: the plugin neither reads nor writes CDI specs (it hands the kubelet CDI device
        # names; the runtime reads the toolkit's spec), and a writable spec directory would let it plant
        # hooks that the runtime runs as root for every GPU container.
        mounts = [
            # creates its gRPC sockets beside the kubelet's and connects to kubelet.sock
            _mount("device-plugin", "/var/lib/kubelet/device-plugins"),
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
            # the MPS control daemon's readiness (sharing.mps); HostToContainer: it may come later.
            # Writable: the plugin publishes the config it serves there for the MPS control daemon.
            _mount("mps-root", mps_root, propagation="HostToContainer"),
        ]
        volumes = [
            _host_volume("device-plugin", "/var/lib/kubelet/device-plugins", "Directory"),
            _host_volume("driver-root", self.driver_root),
            _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
            _host_volume("mps-root", mps_root, "DirectoryOrCreate"),
        ]
        objs: list[Obj] = []
        cluster_rules: list[Obj] = []
        cm = self._config_map(agent, dp.config, "gpunode-device-plugin-config")
        if cm is not None:
            name, created = cm
            objs.extend(created)
            env += [_env("CONFIG_FILE", "/available-configs")]
            if dp.config.default:
                env.append(_env("DEFAULT_CONFIG", dp.config.default))
            mounts.append(_mount("available-configs", "/available-configs", read_only=True))
            volumes.append({"name": "available-configs", "configMap": {"name": name}})
            cluster_rules.append(  # watch its node's config label, report in annotations (node policy)
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "patch"]}
            )
        main = self._container(agent, agent.command, env, dp.env)
        # Root to create its sockets in the kubelet's root-owned directory. Legacy: no privilege, no
        # escalation, SYS_ADMIN only for MIG (reading the MIG capability files), as NVIDIA's chart does;
        # CDI: privileged for the device nodes (_gpu_security).
        add = ("SYS_ADMIN",) if self.s.mig.strategy != "none" else ()
        main["securityContext"] = self._gpu_security(run_as_root=True, add=add)
        main["volumeMounts"] = mounts
        pod: Obj = {
            "initContainers": [self._wait_init("toolkit")],
            "containers": [main],
            "volumes": volumes,
        }
        return [*objs, self._daemonset(agent, self._gpu_pod(pod))], cluster_rules, []

    def _mps_control_daemon(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        """NVIDIA's MPS control daemon DaemonSet: on nodes GFD labels ``nvidia.com/mps.capable=true``
        (``sharing.mps`` configured), with the device plugin's config, root with CAP_SETUID/CAP_SETGID (MPS
        servers run as their clients' users) and the host's PID namespace, as NVIDIA's (clients and servers
        must see each other's processes). The config is the one the node's device plugin serves, as the
        plugin publishes it under the MPS root (``FOLLOW_DEVICE_PLUGIN``, :mod:`gpunode.mps.follow`): one
        choice of config per node, made by the plugin from its label and ConfigMap, where NVIDIA runs a
        second config-manager; this DaemonSet needs no ConfigMap, no API access and no RBAC. An init
        container (``mps-control-daemon-mounts``, NVIDIA's) mounts the ``<root>/shm`` tmpfs through a
        ``Bidirectional`` volume, which only a privileged container may have; it exits at once, the
        daemon's container gets no more privilege for it (docs/mps.md)."""
        dp = self.s.device_plugin
        root = dp.mps.root
        env = self._base_env(agent) + self._nvml_env("compute,utility")
        env += [_env("MIG_STRATEGY", self.s.mig.strategy), _env("MPS_ROOT", root)]
        mounts = [
            # HostToContainer: the init container's tmpfs at <root>/shm is seen here (mps_shm_present)
            _mount("mps-root", root, propagation="HostToContainer"),
            _mount("mps-shm", "/dev/shm"),  # the clients' /dev/shm (the plugin mounts <root>/shm there)
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
        ]
        volumes = [
            _host_volume("mps-root", root, "DirectoryOrCreate"),
            _host_volume("mps-shm", f"{root.rstrip('/')}/shm", "DirectoryOrCreate"),
            _host_volume("driver-root", self.driver_root),
            _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
        ]
        env.append(_env("FOLLOW_DEVICE_PLUGIN", "true"))  # <root>/.device-plugin-config.yaml
        cluster_rules: list[Obj] = []
        # the device plugin's env where it names a setting of this agent (LOG_LEVEL, MIG_STRATEGY, ...)
        known = {e for flag in flags_of(MpsSettings) for e in flag.envs}
        main = self._container(agent, agent.command, env, [e for e in dp.env if e.name in known])
        # SETUID/SETGID: MPS servers run as their clients' users; SYS_ADMIN: the GPUs' compute mode (a
        # privileged NVML call) on the legacy path (with CDI the container is privileged anyway)
        main["securityContext"] = self._gpu_security(run_as_root=True, add=("SETUID", "SETGID", "SYS_ADMIN"))
        main["volumeMounts"] = mounts
        shm_init: Obj = {  # NVIDIA's mps-control-daemon-mounts: the <root>/shm tmpfs, on the host
            "name": "mps-control-daemon-mounts",
            "image": self.image,
            "imagePullPolicy": self.s.gpunode.image_pull_policy,
            "command": [*agent.command, "--mount-shm"],
            "env": [_env("LOG_FORMAT", "json"), _env("MPS_ROOT", root)],
            # Bidirectional propagation (the mount must reach the host) is allowed to privileged only
            "securityContext": {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True},
            "resources": _resources(agent.key),
            "volumeMounts": [_mount("mps-root", root, propagation="Bidirectional")],
        }
        pod: Obj = {
            "hostPID": True,
            "initContainers": [self._wait_init("toolkit"), shm_init],
            "containers": [main],
            "volumes": volumes,
        }
        return [self._daemonset(agent, self._gpu_pod(pod))], cluster_rules, []

    def _config_map(
        self, agent: Agent, config: NamedConfig, default_name: str
    ) -> tuple[str, list[Obj]] | None:
        if config.create:
            name = config.name or default_name
            data = dict(sorted(config.data.items()))
            cm: Obj = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": self._meta(name, agent),
                "data": data,
            }
            return name, [cm]
        if config.name:
            return config.name, []
        return None

    def _gfd(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        env = self._base_env(agent) + self._nvml_env()
        env += [
            _env("GFD_MIG_STRATEGY", self.s.mig.strategy),
            _env("GFD_USE_NODE_FEATURE_API", "true"),
            _field_env("NAMESPACE", "metadata.namespace"),
            _env("GPUNODE_HOST_ROOT", "/host"),
        ]
        mounts = [
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
            _mount("host-sys", "/host/sys", read_only=True),
        ]
        volumes = [
            _host_volume("driver-root", self.driver_root),
            _host_volume("host-sys", "/sys", "Directory"),
            _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
        ]
        cluster_rules: list[Obj] = []
        cm = self._config_map(agent, self.s.device_plugin.config, "gpunode-device-plugin-config")
        if cm is not None and self.s.device_plugin.enabled:
            env.append(_env("GFD_CONFIG_FILE", "/available-configs"))
            if self.s.device_plugin.config.default:
                env.append(_env("DEFAULT_CONFIG", self.s.device_plugin.config.default))
            mounts.append(_mount("available-configs", "/available-configs", read_only=True))
            volumes.append({"name": "available-configs", "configMap": {"name": cm[0]}})
            cluster_rules.append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch"]})
        main = self._container(agent, [*agent.command, "--use-node-feature-api"], env, self.s.gfd.env)
        main["securityContext"] = self._gpu_security()
        main["volumeMounts"] = mounts
        pod: Obj = {
            "initContainers": [self._wait_init("toolkit")],
            "containers": [main],
            "volumes": volumes,
        }
        ns_rules = [
            {
                "apiGroups": ["nfd.k8s-sigs.io"],
                "resources": ["nodefeatures"],
                "verbs": ["get", "create", "update"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        ]
        return [self._daemonset(agent, self._gpu_pod(pod))], cluster_rules, ns_rules

    def _exporter(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        ex = self.s.dcgm_exporter
        env = self._base_env(agent) + self._nvml_env()
        env += [_env("DCGM_EXPORTER_LISTEN", f":{agent.port}"), _env("DCGM_EXPORTER_KUBERNETES", "true")]
        main = self._container(agent, agent.command, env, ex.env)
        main["ports"] = [{"name": "metrics", "containerPort": agent.port, "protocol": "TCP"}]
        main["livenessProbe"]["httpGet"]["port"] = "metrics"
        main["readinessProbe"]["httpGet"]["port"] = "metrics"
        pods = _env_value(main["env"], "DCGM_EXPORTER_KUBERNETES").strip().lower() in ("1", "true", "yes")
        # The kubelet creates pod-resources/ 0750 and its socket owned by root, and connecting to a socket
        # takes write permission on it: only root gets in (a group does not: the socket is not group
        # writable). So with pod labels on, the exporter runs as root, with every capability dropped (no
        # DAC override: root is simply the owner), no privilege escalation, a read-only root file system
        # (legacy); with CDI it is privileged for the device nodes (_gpu_security), as root or as 65532.
        main["securityContext"] = self._gpu_security(run_as_root=pods)
        main["volumeMounts"] = [
            # the kubelet's PodResources socket (pod labels): connecting needs no writable mount
            *([_mount("pod-resources", "/var/lib/kubelet/pod-resources", read_only=True)] if pods else []),
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
        ]
        volumes = [
            _host_volume("driver-root", self.driver_root),
            _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
        ]
        if pods:
            volumes.insert(0, _host_volume("pod-resources", "/var/lib/kubelet/pod-resources", "Directory"))
        pod: Obj = {
            "automountServiceAccountToken": False,
            "initContainers": [self._wait_init("toolkit")],
            "containers": [main],
            "volumes": volumes,
        }
        service: Obj = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self._meta(agent.name, agent),
            "spec": {
                "type": "ClusterIP",
                "internalTrafficPolicy": "Local",
                "selector": {"app.kubernetes.io/name": agent.name},
                "ports": [{"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"}],
            },
        }
        objs = [self._daemonset(agent, self._gpu_pod(pod)), service]
        sm = ex.service_monitor
        if sm.enabled:
            meta = self._meta(agent.name, agent)
            meta["labels"] = {**sm.additional_labels, **meta["labels"]}
            objs.append(
                {
                    "apiVersion": "monitoring.coreos.com/v1",
                    "kind": "ServiceMonitor",
                    "metadata": meta,
                    "spec": {
                        "selector": {"matchLabels": {"app.kubernetes.io/name": agent.name}},
                        "namespaceSelector": {"matchNames": [self.ns]},
                        "endpoints": [
                            {
                                "port": "metrics",
                                "path": "/metrics",
                                "interval": sm.interval,
                                **({"scrapeTimeout": sm.scrape_timeout} if sm.scrape_timeout else {}),
                                "honorLabels": sm.honor_labels,
                            }
                        ],
                    },
                }
            )
            objs.extend(self._monitoring(agent, sm.additional_labels, sm.interval))
        if self.s.gpunode.dashboard.enabled:
            objs.append(self._dashboard(agent))
        return objs, [], []

    def _monitoring(self, agent: Agent, labels: dict[str, str], interval: str) -> list[Obj]:
        """Beside the exporter's ServiceMonitor: a PodMonitor for the other agents' ``http`` port
        (``/metrics``), and the alert rules (``spec.gpunode.alerts.enabled``), both with the
        ServiceMonitor's additional labels so the same Prometheus selects them (docs/alerts.md)."""
        meta = self._meta("gpunode-agents", agent)
        meta["labels"] = {**labels, **self._common_labels()}
        objs: list[Obj] = [
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "PodMonitor",
                "metadata": meta,
                "spec": {
                    "selector": {"matchLabels": {"app.kubernetes.io/part-of": "gpunode"}},
                    "namespaceSelector": {"matchNames": [self.ns]},
                    "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": interval}],
                },
            }
        ]
        if self.s.gpunode.alerts.enabled:
            objs.append(prometheus_rule(self.ns, {**labels, **self._common_labels()}))
        return objs

    def _dashboard(self, agent: Agent) -> Obj:
        """The Grafana dashboard as a ConfigMap for Grafana's dashboard sidecar (``grafana_dashboard:
        "1"``, kube-prometheus-stack's default), with ``spec.gpunode.dashboard.enabled``."""
        meta = self._meta("gpunode-dashboard", agent)
        meta["labels"] = {**self._common_labels(), "grafana_dashboard": "1"}
        text = resources.files("gpunode.deploy").joinpath(DASHBOARD_FILE).read_text(encoding="utf-8")
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {DASHBOARD_FILE: text}}

    def _mig_manager(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        mm = self.s.mig_manager
        env = self._base_env(agent) + self._nvml_env()
        env += [
            _env("NVIDIA_MIG_CONFIG_DEVICES", "all"),
            _env("HOST_ROOT_MOUNT", "/host"),  # systemctl through chroot /host
            _env("GPUNODE_HOST_ROOT", "/"),  # GPU resets through /sys, the host's, mounted writable
            _env("CONFIG_FILE", "/mig-parted-config/config.yaml"),
            _env("MIG_PARTED_JOURNAL_FILE", DEFAULT_JOURNAL),
        ]
        objs: list[Obj] = []
        if mm.config.create or not mm.config.name:
            name = mm.config.name or "gpunode-mig-parted-config"
            data = (
                dict(sorted(mm.config.data.items()))
                if mm.config.data
                else {"config.yaml": mig_default_config_text()}
            )
            objs.append(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self._meta(name, agent), "data": data}
            )
        else:
            name = mm.config.name
        main = self._container(agent, agent.command, env, mm.env)
        main["securityContext"] = dict(_PRIVILEGED)
        # No /var/run/cdi (the toolkit's watch regenerates the CDI spec after a MIG change) and no
        # /run/nvidia/validations in the main container (the manager neither reads nor writes them).
        main["volumeMounts"] = [
            # `chroot /host systemctl` stops and starts the host's GPU clients: the binary and its libraries
            # are read, systemd is reached through its socket (connecting needs no writable mount)
            _mount("host-root", "/host", read_only=True, propagation="HostToContainer"),
            # a MIG mode change resets the GPU through /sys/bus/pci/devices/<bdf>/reset
            _mount("host-sys", "/sys"),
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
            # the apply journal, so that an interrupted change is finished after a crash or reboot
            _mount("mig-state", "/var/lib/gpunode/mig"),
            _mount("mig-parted-config", "/mig-parted-config", read_only=True),
        ]
        pod: Obj = {
            # NVML names the processes in a change's way by host PID; no hostIPC: nothing uses the host's
            # IPC namespace (NVIDIA's manifest sets it without a stated need)
            "hostPID": True,
            "terminationGracePeriodSeconds": 600,
            "initContainers": [self._wait_init("toolkit")],
            "containers": [main],
            "volumes": [
                _host_volume("host-root", "/"),
                _host_volume("host-sys", "/sys", "Directory"),
                _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
                _host_volume("driver-root", self.driver_root),
                _host_volume("mig-state", "/var/lib/gpunode/mig", "DirectoryOrCreate"),
                {"name": "mig-parted-config", "configMap": {"name": name}},
            ],
        }
        rules = [  # nodes: its own only (the node policy); pods: listed with spec.nodeName=<its node> only
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ]
        return [*objs, self._daemonset(agent, pod)], rules, []


def images(policy: ClusterPolicy, image: str | None = None, nfd_image: str | None = None) -> list[str]:
    """The images the rendered manifests use: gpunode's (every agent runs from the same image), then NFD's
    when the policy deploys NFD."""
    return [image_for(policy, image), *nfd_images(policy, nfd_image)]

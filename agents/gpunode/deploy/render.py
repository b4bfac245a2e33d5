"""Pure functions: a :class:`ClusterPolicy` -> the Kubernetes manifests that deploy gpunode's agents.

Conventions (GPU Operator): one image for every agent, ``priorityClassName: system-node-critical``, the
``nvidia.com/gpu`` NoSchedule toleration, node selection by NFD's ``pci-10de.present`` label plus
``nvidia.com/gpu.deploy.<operand>: "true"``, readiness barriers as files in ``/run/nvidia/validations``
awaited by ``gpunode-validator --wait-for`` init containers, and RBAC limited to what each agent does
(README, "Kubernetes").

The agents, their console scripts, operand labels and HTTP ports come from :mod:`gpunode.registry`
(``AgentSpec.default_http_port`` of the spec each main container runs); a test checks that every env
var written into a container is one of that command's settings.
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
from gpunode.mig import DEFAULT_JOURNAL

__all__ = [
    "MAIN_VERBS",
    "Agent",
    "agent_by_key",
    "agents",
    "dump_yaml",
    "image_for",
    "render",
    "render_by_agent",
]

Obj = dict[str, Any]  # a Kubernetes object (JSON-like)

VALIDATIONS = "/run/nvidia/validations"
DRIVER_INSTALL_DIR = "/run/nvidia/driver"
NONROOT_UID = 65532


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
    port = registry.spec(key, verb).default_http_port
    return Agent(entry.key, entry.console_script, entry.operand, port, verb)


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
    }
    return [agent_by_key(e.key) for e in registry.AGENTS if e.operand is not None and on[e.key]]


def render(policy: ClusterPolicy, *, namespace: str = "gpunode", image: str | None = None) -> list[Obj]:
    """Every manifest, in apply order (namespace first)."""
    out: list[Obj] = []
    for objs in render_by_agent(policy, namespace=namespace, image=image).values():
        out.extend(objs)
    return out


def render_by_agent(
    policy: ClusterPolicy, *, namespace: str = "gpunode", image: str | None = None
) -> dict[str, list[Obj]]:
    """``{"common": [...], "<agent key>": [...]}`` in a fixed order (a file each in containers/kubernetes)."""
    r = _Renderer(policy, namespace, image_for(policy, image))
    result: dict[str, list[Obj]] = {"common": [r.namespace_obj()]}
    for agent in enabled_agents(policy):
        result[agent.key] = r.agent(agent)
    return result


def dump_yaml(objs: Iterable[Obj]) -> str:
    """Deterministic multi-document YAML (keys sorted, block style)."""
    docs = [yaml.safe_dump(o, sort_keys=True, default_flow_style=False, width=1000) for o in objs]
    return "---\n" + "---\n".join(docs) if docs else ""


def mig_default_config_text() -> str:
    return resources.files("gpunode.mig").joinpath("default-config.yaml").read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------- helpers


def _env(name: str, value: str) -> Obj:
    return {"name": name, "value": value}


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


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


class _Renderer:
    def __init__(self, policy: ClusterPolicy, namespace: str, image: str) -> None:
        self.p = policy
        self.s = policy.spec
        self.ns = namespace
        self.image = image

    # ------------------------------------------------------------------ common

    def namespace_obj(self) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.ns, "labels": {**self._common_labels(), "name": self.ns}},
        }

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
        return {present: "true", f"nvidia.com/gpu.deploy.{agent.operand}": "true"}

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

    def _container(self, agent: Agent, command: list[str], env: list[Obj], user_env: Iterable[EnvVar]) -> Obj:
        c: Obj = {
            "name": agent.key,
            "image": self.image,
            "imagePullPolicy": self.s.gpunode.image_pull_policy,
            "command": command,
            "env": _merge_env(env, _user_env(user_env)),
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
        }[agent.key]
        objs, cluster_rules, ns_rules = build(agent)
        sa = self._service_account(agent)
        if cluster_rules or ns_rules:
            sa.pop("automountServiceAccountToken")
        return [sa, *self._rbac(agent, cluster_rules, ns_rules), *objs]

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
        mounts = [
            _mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            _mount("host-root", "/host", read_only=True),
            _mount("host-sys", "/sys"),
            _mount("var-log", "/var/log"),
            _mount("dev-log", "/dev/log"),
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
            "volumeMounts": mounts,
        }
        pod: Obj = {
            "hostPID": True,
            "terminationGracePeriodSeconds": 120,
            "initContainers": [manager],
            "containers": [main],
            "volumes": [
                _host_volume("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
                _host_volume("host-root", "/"),
                _host_volume("host-sys", "/sys", "Directory"),
                _host_volume("var-log", "/var/log"),
                _host_volume("dev-log", "/dev/log"),
            ],
        }
        nodes = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "patch"]}
        pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
        evict = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
        return [self._daemonset(agent, pod, on_delete=True)], [nodes, pods, evict], []

    def _toolkit(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        env = self._base_env(agent) + self._nvml_env() + [_env("RUNTIME", self.s.operator.default_runtime)]
        cmd = [*agent.command, "--output", "/var/run/cdi/nvidia.yaml"]
        mounts = [
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
            _mount("cdi", "/var/run/cdi"),
        ]
        inits: list[Obj] = []
        if self.s.driver.enabled:
            inits.append(self._wait_init("driver"))
        else:  # a host driver: validate it, which writes driver-ready for everything after
            inits.append(self._validate_init("driver", [_mount("host-root", "/host", read_only=True)]))
        first = self._container(agent, cmd, env, self.s.toolkit.env)
        first.update(name="cdi-generate", securityContext=_restricted(run_as_root=True), volumeMounts=mounts)
        inits.append(first)
        inits.append(self._validate_init("toolkit", [_mount("cdi", "/var/run/cdi", read_only=True)]))
        main = self._container(agent, [*cmd, "--watch"], env, self.s.toolkit.env)
        main["securityContext"] = _restricted(run_as_root=True)
        main["volumeMounts"] = mounts
        pod: Obj = {
            "runtimeClassName": self.s.operator.runtime_class,
            "initContainers": inits,
            "containers": [main],
            "volumes": [
                _host_volume("driver-root", self.driver_root),
                _host_volume("cdi", "/var/run/cdi", "DirectoryOrCreate"),
                _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
                *([_host_volume("host-root", "/")] if not self.s.driver.enabled else []),
            ],
        }
        return [self._daemonset(agent, pod)], [], []

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
            "securityContext": _restricted(run_as_root=True),
            "volumeMounts": [
                _mount("run-nvidia-validations", VALIDATIONS),
                _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
                *mounts,
            ],
        }

    def _device_plugin(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        dp = self.s.device_plugin
        env = self._base_env(agent) + self._nvml_env("compute,utility")
        env += [_env("MIG_STRATEGY", self.s.mig.strategy), _env("FAIL_ON_INIT_ERROR", "true")]
        env += [_env("DEVICE_LIST_STRATEGY", "envvar"), _env("NAMESPACE", self.ns)]
        mounts = [
            _mount("device-plugin", "/var/lib/kubelet/device-plugins"),
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
            _mount("cdi", "/var/run/cdi"),
        ]
        volumes = [
            _host_volume("device-plugin", "/var/lib/kubelet/device-plugins", "Directory"),
            _host_volume("driver-root", self.driver_root),
            _host_volume("cdi", "/var/run/cdi", "DirectoryOrCreate"),
            _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
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
            cluster_rules.append(
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "patch"]}
            )
        main = self._container(agent, agent.command, env, dp.env)
        # Root to create its sockets in the kubelet's root-owned directory; no privilege, no escalation.
        # SYS_ADMIN only for MIG (reading the MIG capability files), as NVIDIA's chart does.
        add = ("SYS_ADMIN",) if self.s.mig.strategy != "none" else ()
        main["securityContext"] = _restricted(run_as_root=True, add=add)
        main["volumeMounts"] = mounts
        pod: Obj = {
            "runtimeClassName": self.s.operator.runtime_class,
            "initContainers": [self._wait_init("toolkit")],
            "containers": [main],
            "volumes": volumes,
        }
        return [*objs, self._daemonset(agent, pod)], cluster_rules, []

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
        main["securityContext"] = _restricted()
        main["volumeMounts"] = mounts
        pod: Obj = {
            "runtimeClassName": self.s.operator.runtime_class,
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
        return [self._daemonset(agent, pod)], cluster_rules, ns_rules

    def _exporter(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        ex = self.s.dcgm_exporter
        env = self._base_env(agent) + self._nvml_env()
        env += [_env("DCGM_EXPORTER_LISTEN", f":{agent.port}"), _env("DCGM_EXPORTER_KUBERNETES", "true")]
        main = self._container(agent, agent.command, env, ex.env)
        main["ports"] = [{"name": "metrics", "containerPort": agent.port, "protocol": "TCP"}]
        main["livenessProbe"]["httpGet"]["port"] = "metrics"
        main["readinessProbe"]["httpGet"]["port"] = "metrics"
        main["securityContext"] = _restricted()
        main["volumeMounts"] = [
            _mount("pod-resources", "/var/lib/kubelet/pod-resources", read_only=True),
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
        ]
        pod: Obj = {
            "runtimeClassName": self.s.operator.runtime_class,
            "automountServiceAccountToken": False,
            "initContainers": [self._wait_init("toolkit")],
            "containers": [main],
            "volumes": [
                _host_volume("pod-resources", "/var/lib/kubelet/pod-resources", "Directory"),
                _host_volume("driver-root", self.driver_root),
                _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
            ],
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
        objs = [self._daemonset(agent, pod), service]
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
                                "honorLabels": sm.honor_labels,
                            }
                        ],
                    },
                }
            )
        return objs, [], []

    def _mig_manager(self, agent: Agent) -> tuple[list[Obj], list[Obj], list[Obj]]:
        mm = self.s.mig_manager
        env = self._base_env(agent) + self._nvml_env()
        env += [
            _env("NVIDIA_MIG_CONFIG_DEVICES", "all"),
            _env("HOST_ROOT_MOUNT", "/host"),
            _env("GPUNODE_HOST_ROOT", "/host"),
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
        main["volumeMounts"] = [
            _mount("host-root", "/host", propagation="HostToContainer"),
            _mount("host-sys", "/sys"),
            _mount("run-nvidia-validations", VALIDATIONS),
            _mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
            _mount("cdi", "/var/run/cdi"),
            _mount("mig-state", "/var/lib/gpunode/mig"),
            _mount("mig-parted-config", "/mig-parted-config", read_only=True),
        ]
        pod: Obj = {
            "runtimeClassName": self.s.operator.runtime_class,
            "hostPID": True,
            "hostIPC": True,
            "terminationGracePeriodSeconds": 600,
            "initContainers": [self._wait_init("toolkit")],
            "containers": [main],
            "volumes": [
                _host_volume("host-root", "/"),
                _host_volume("host-sys", "/sys", "Directory"),
                _host_volume("run-nvidia-validations", VALIDATIONS, "DirectoryOrCreate"),
                _host_volume("driver-root", self.driver_root),
                _host_volume("cdi", "/var/run/cdi", "DirectoryOrCreate"),
                _host_volume("mig-state", "/var/lib/gpunode/mig", "DirectoryOrCreate"),
                {"name": "mig-parted-config", "configMap": {"name": name}},
            ],
        }
        rules = [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ]
        return [*objs, self._daemonset(agent, pod)], rules, []


def images(policy: ClusterPolicy, image: str | None = None) -> list[str]:
    """The images the rendered manifests use (one: every agent runs from the same image)."""
    return [image_for(policy, image)]

"""Upstream Node Feature Discovery (NFD), as the GPU Operator ships it, rendered for ``spec.nfd.enabled``.

NFD's worker reads each node's PCI devices and publishes them as ``NodeFeature`` objects; its master turns
them into node labels. With NVIDIA's worker settings (PCI classes 02, 0200, 0207, 0300 and 0302, labelled by
vendor) a node with an NVIDIA GPU gets ``feature.node.kubernetes.io/pci-10de.present=true``, the label the
agents' DaemonSets select on, and the master lets ``nvidia.com`` labels through (feature discovery publishes
its GPU labels as a NodeFeature too). The garbage collector deletes the NodeFeature objects of nodes that are
gone.

Objects: the two NFD CRDs the master reads (NodeFeature, NodeFeatureRule), one ServiceAccount per
component, RBAC as NFD's own manifests grant it (master: nodes and the two NFD kinds; worker: its
NodeFeature objects and its own pod, in the namespace; garbage collector: nodes and NodeFeature deletion),
the worker's ConfigMap, the master Deployment, the worker DaemonSet (every node, the control plane's too)
and the garbage collector Deployment. Every container is non-root, drops every capability, has a read-only
root file system and mounts host paths read-only.

Pure functions of the policy, the namespace and the image (:data:`DEFAULT_IMAGE`, ``--nfd-image``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpunode.api.clusterpolicy import ClusterPolicy

__all__ = [
    "DEFAULT_IMAGE",
    "EXTRA_LABEL_NAMESPACES",
    "PCI_DEVICE_CLASSES",
    "WORKER_CONFIG",
    "nfd_images",
    "render_nfd",
]

Obj = dict[str, Any]

#: NFD's image, pinned to a released tag (NFD v0.17.4); ``gpunode render --nfd-image`` overrides it.
DEFAULT_IMAGE = "registry.k8s.io/nfd/node-feature-discovery:v0.17.4"
#: PCI device classes the worker reports: network (02, 0200 Ethernet, 0207 InfiniBand) and display
#: (0300 VGA, 0302 3D controller), NVIDIA's worker settings.
PCI_DEVICE_CLASSES = ("02", "0200", "0207", "0300", "0302")
#: Label namespaces the master accepts beyond NFD's own (feature discovery's ``nvidia.com/gpu.*`` labels).
EXTRA_LABEL_NAMESPACES = ("nvidia.com",)

GROUP = "nfd.k8s-sigs.io"
CONFIG_DIR = "/etc/kubernetes/node-feature-discovery"

#: The worker's configuration file (``nfd-worker.conf``): PCI devices labelled by vendor only, so an NVIDIA
#: device of one of the classes gives ``pci-10de.present``.
WORKER_CONFIG = (
    "sources:\n"
    "  pci:\n"
    f"    deviceClassWhitelist: [{', '.join(repr(c) for c in PCI_DEVICE_CLASSES)}]\n"
    "    deviceLabelFields: [vendor]\n"
)

# Requests and limits of NFD's own manifests.
_RESOURCES: dict[str, Obj] = {
    "master": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "300m", "memory": "4Gi"}},
    "worker": {"requests": {"cpu": "5m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "512Mi"}},
    "gc": {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"cpu": "200m", "memory": "1Gi"}},
}


def nfd_images(policy: ClusterPolicy, image: str | None = None) -> list[str]:
    """NFD's image when the policy deploys NFD, else nothing."""
    return [image or DEFAULT_IMAGE] if policy.spec.nfd.enabled else []


def render_nfd(policy: ClusterPolicy, *, namespace: str, image: str | None = None) -> list[Obj]:
    """NFD's objects in apply order (CRDs, accounts and RBAC, configuration, workloads); nothing when
    ``spec.nfd.enabled`` is false (an NFD already in the cluster is used)."""
    if not policy.spec.nfd.enabled:
        return []
    return _Nfd(policy, namespace, image or DEFAULT_IMAGE).objects()


def _crd(kind: str, plural: str, scope: str, short: str, spec_props: Obj) -> Obj:
    """A v1alpha1 CRD of NFD's group with a structural schema: the fields NFD reads, typed where NFD
    fixes their shape, open where NFD's feature sets vary by source."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": _common_labels()},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
            },
            "scope": scope,
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {"type": "object", "properties": spec_props},
                            },
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }


def _open_object() -> Obj:
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _common_labels() -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "gpunode", "app.kubernetes.io/managed-by": "gpunode-render"}


class _Nfd:
    def __init__(self, policy: ClusterPolicy, namespace: str, image: str) -> None:
        self.s = policy.spec
        self.ns = namespace
        self.image = image

    def objects(self) -> list[Obj]:
        worker_conf = f"{self._name('worker')}-conf"
        return [
            _crd(
                "NodeFeature",
                "nodefeatures",
                "Namespaced",
                "nf",
                {
                    "features": _open_object(),
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            ),
            _crd(
                "NodeFeatureRule",
                "nodefeaturerules",
                "Cluster",
                "nfr",
                {"rules": {"type": "array", "items": _open_object()}},
            ),
            *self._account(
                "master",
                cluster_rules=[
                    # labels (and, from rules, annotations, taints, extended resources) on every node
                    {
                        "apiGroups": [""],
                        "resources": ["nodes", "nodes/status"],
                        "verbs": ["get", "list", "patch", "update"],
                    },
                    {
                        "apiGroups": [GROUP],
                        "resources": ["nodefeatures", "nodefeaturerules"],
                        "verbs": ["get", "list", "watch"],
                    },
                ],
            ),
            *self._account(
                "worker",
                ns_rules=[
                    # its node's NodeFeature object, owned by its pod
                    {
                        "apiGroups": [GROUP],
                        "resources": ["nodefeatures"],
                        "verbs": ["create", "get", "update"],
                    },
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                ],
            ),
            *self._account(
                "gc",
                cluster_rules=[
                    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
                    {"apiGroups": [GROUP], "resources": ["nodefeatures"], "verbs": ["delete", "list"]},
                ],
            ),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": self._meta(worker_conf, "worker"),
                "data": {"nfd-worker.conf": WORKER_CONFIG},
            },
            self._deployment(
                "master",
                self._container(
                    "master",
                    ["nfd-master", f"-extra-label-ns={','.join(EXTRA_LABEL_NAMESPACES)}"],
                    [],
                ),
                {"enableServiceLinks": False},
            ),
            self._worker(worker_conf),
            self._deployment("gc", self._container("gc", ["nfd-gc"], []), {}),
        ]

    # ------------------------------------------------------------------ helpers

    def _name(self, role: str) -> str:
        return f"gpunode-nfd-{role}"

    def _labels(self, role: str) -> dict[str, str]:
        return {**_common_labels(), "app.kubernetes.io/name": self._name(role)}

    def _meta(self, name: str, role: str, namespaced: bool = True) -> Obj:
        m: Obj = {"name": name, "labels": self._labels(role)}
        if namespaced:
            m["namespace"] = self.ns
        return m

    def _account(
        self, role: str, cluster_rules: Sequence[Obj] = (), ns_rules: Sequence[Obj] = ()
    ) -> list[Obj]:
        name = self._name(role)
        subject = [{"kind": "ServiceAccount", "name": name, "namespace": self.ns}]
        out: list[Obj] = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": self._meta(name, role)}]
        rbac = "rbac.authorization.k8s.io"
        for kind, rules, namespaced in (("ClusterRole", cluster_rules, False), ("Role", ns_rules, True)):
            if not rules:
                continue
            out.append(
                {
                    "apiVersion": f"{rbac}/v1",
                    "kind": kind,
                    "metadata": self._meta(name, role, namespaced),
                    "rules": list(rules),
                }
            )
            out.append(
                {
                    "apiVersion": f"{rbac}/v1",
                    "kind": f"{kind}Binding",
                    "metadata": self._meta(name, role, namespaced),
                    "roleRef": {"apiGroup": rbac, "kind": kind, "name": name},
                    "subjects": subject,
                }
            )
        return out

    def _container(self, role: str, command: list[str], mounts: list[Obj]) -> Obj:
        r = _RESOURCES[role]
        c: Obj = {
            "name": role,
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "command": command,
            "env": [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                # Go's soft memory limit at the container's limit: it collects before the OOM killer acts
                {"name": "GOMEMLIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
            ],
            "resources": {"requests": dict(r["requests"]), "limits": dict(r["limits"])},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True,
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "runAsGroup": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
        if mounts:
            c["volumeMounts"] = mounts
        return c

    def _pod(self, role: str, container: Obj, extra: Obj) -> Obj:
        spec: Obj = {"serviceAccountName": self._name(role), "containers": [container], **extra}
        if self.s.gpunode.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": n} for n in self.s.gpunode.image_pull_secrets]
        return {"metadata": {"labels": self._labels(role)}, "spec": spec}

    def _deployment(self, role: str, container: Obj, extra: Obj) -> Obj:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self._meta(self._name(role), role),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": self._name(role)}},
                "template": self._pod(role, container, extra),
            },
        }

    def _worker(self, conf: str) -> Obj:
        host = [  # (volume, host path, container path): what the PCI, kernel and OS sources read
            ("host-boot", "/boot", "/host-boot"),
            ("host-os-release", "/etc/os-release", "/host-etc/os-release"),
            ("host-sys", "/sys", "/host-sys"),
            ("host-usr-lib", "/usr/lib", "/host-usr/lib"),
            ("host-lib", "/lib", "/host-lib"),
            ("features-d", f"{CONFIG_DIR}/features.d/", f"{CONFIG_DIR}/features.d/"),
        ]
        mounts = [{"name": v, "mountPath": c, "readOnly": True} for v, _, c in host]
        mounts.append({"name": "nfd-worker-conf", "mountPath": CONFIG_DIR, "readOnly": True})
        volumes: list[Obj] = [{"name": v, "hostPath": {"path": h}} for v, h, _ in host]
        volumes.append(
            {
                "name": "nfd-worker-conf",
                "configMap": {"name": conf, "items": [{"key": "nfd-worker.conf", "path": "nfd-worker.conf"}]},
            }
        )
        tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in self.s.daemonsets.tolerations]
        control_plane = {
            "key": "node-role.kubernetes.io/control-plane",
            "operator": "Exists",
            "effect": "NoSchedule",
        }
        if control_plane not in tolerations:
            tolerations.append(control_plane)
        pod = self._pod(
            "worker",
            self._container("worker", ["nfd-worker"], mounts),
            {
                "priorityClassName": self.s.daemonsets.priority_class_name,
                "dnsPolicy": "ClusterFirstWithHostNet",
                "tolerations": tolerations,
                "volumes": volumes,
            },
        )
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": self._meta(self._name("worker"), "worker"),
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": self._name("worker")}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": pod,
            },
        }

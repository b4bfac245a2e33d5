"""``gpunode render --operator``: everything ``kubectl apply -f -`` needs to install gpunode-operator.

In apply order: the ClusterPolicy CRD (:mod:`gpunode.api.clusterpolicy_crd`), the namespace
(Pod Security ``enforce=privileged``), the operator's ServiceAccount, RBAC and Deployment, NFD (with
``spec.nfd.enabled``), and the ClusterPolicy in the ConfigMap ``gpunode-operator-clusterpolicy``: kubectl
cannot create a ClusterPolicy in the apply that creates its CRD, so the operator applies it once the CRD
serves (:mod:`gpunode.operator.seed`). The operator then renders and applies the agents.

The operator's RBAC is least privilege, derived from what the render code can produce for any policy
(:func:`operator_rules`): full control of the object kinds it renders, the rules it grants the agents and
NFD (Kubernetes lets a role be granted only by someone who holds it), nodes (list, watch, label), the
ClusterPolicies and their status, and, in its namespace only, leader-election Leases and the pods and
ControllerRevisions its readiness rules read. Cluster-scoped objects other than its own (named) ones
can be listed but not read, changed or deleted; no Secrets; no other namespace.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gpunode.api.clusterpolicy import ClusterPolicy, parse_policy_text
from gpunode.api.clusterpolicy_crd import crd
from gpunode.deploy.nfd import render_nfd
from gpunode.deploy.render import image_for, namespace_object, render
from gpunode.operator.seed import seed_configmap

__all__ = [
    "CONSOLE_SCRIPT",
    "KINDS",
    "clusterpolicy_crds",
    "clusterpolicy_object",
    "operator_rules",
    "render_operator",
    "render_operator_by_part",
]

Obj = dict[str, Any]

#: The operator's command, in the one gpunode image (console script gpunode-operator).
CONSOLE_SCRIPT = "gpunode-operator"
NAME = "gpunode-operator"

#: kind -> (API group, resource, namespaced) for every kind the render code produces.
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("", "namespaces", False),
    "ServiceAccount": ("", "serviceaccounts", True),
    "ConfigMap": ("", "configmaps", True),
    "Service": ("", "services", True),
    "DaemonSet": ("apps", "daemonsets", True),
    "Deployment": ("apps", "deployments", True),
    "ClusterRole": ("rbac.authorization.k8s.io", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings", True),
    "ValidatingAdmissionPolicy": ("admissionregistration.k8s.io", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
        False,
    ),
    "RuntimeClass": ("node.k8s.io", "runtimeclasses", False),
    "CustomResourceDefinition": ("apiextensions.k8s.io", "customresourcedefinitions", False),
    "ServiceMonitor": ("monitoring.coreos.com", "servicemonitors", True),
    "PodMonitor": ("monitoring.coreos.com", "podmonitors", True),
    "PrometheusRule": ("monitoring.coreos.com", "prometheusrules", True),
}

_WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]

# A policy that turns on every object the render code can produce (the operator's RBAC must cover any
# policy it may be given, not only the one installed with it).
_EVERYTHING = """\
apiVersion: nvidia.com/v1
kind: ClusterPolicy
spec:
  operator:
    runtimeClass: nvidia
  cdi:
    enabled: false  # the legacy runtime path renders the RuntimeClass
  gpunode:
    dashboard:
      enabled: true
  devicePlugin:
    config:
      name: any
  dcgmExporter:
    serviceMonitor:
      enabled: true
  nfd:
    enabled: true
"""


def clusterpolicy_crds() -> list[Obj]:
    """The ClusterPolicy CRD (:func:`gpunode.api.clusterpolicy_crd.crd`)."""
    return [crd()]


def clusterpolicy_object(policy: ClusterPolicy) -> Obj:
    """The policy as written (fields left out stay out, so the CRD's and the operator's defaults apply)."""
    obj = policy.model_dump(mode="json", by_alias=True, exclude_unset=True)
    obj["apiVersion"], obj["kind"] = policy.api_version, policy.kind
    obj.setdefault("metadata", {}).setdefault("name", policy.metadata.name)
    return obj


def _dedupe(rules: Iterable[Obj]) -> list[Obj]:
    seen: dict[str, Obj] = {}
    for r in rules:
        seen.setdefault(json.dumps(r, sort_keys=True), r)
    return list(seen.values())


def operator_rules(namespace: str) -> tuple[list[Obj], list[Obj]]:
    """(cluster rules, rules in ``namespace``) the operator needs for any policy."""
    policy = parse_policy_text(_EVERYTHING, "<operator RBAC>").policy
    objs = render(policy, namespace=namespace)
    by_kind: dict[tuple[str, bool], set[str]] = {}
    names: dict[tuple[str, str], set[str]] = {}  # cluster-scoped (group, resource) -> object names
    granted_cluster: list[Obj] = []
    granted_ns: list[Obj] = []
    for o in objs:
        kind = o["kind"]
        if kind == "Namespace":
            continue  # installed with the operator; it only keeps the Pod Security label (below)
        group, resource, namespaced = KINDS[kind]
        if namespaced or kind == "RuntimeClass":  # its own namespace; a RuntimeClass the policy names
            by_kind.setdefault((group, namespaced), set()).add(resource)
        else:
            names.setdefault((group, resource), set()).add(o["metadata"]["name"])
        if kind == "ClusterRole":
            granted_cluster.extend(o["rules"])
        elif kind == "Role":
            granted_ns.extend(o["rules"])
    cluster: list[Obj] = [
        # create/patch: the install's policy, applied from its ConfigMap (gpunode.operator.seed)
        {
            "apiGroups": ["nvidia.com"],
            "resources": ["clusterpolicies"],
            "verbs": ["get", "list", "watch", "create", "patch"],
        },
        {
            "apiGroups": ["nvidia.com"],
            "resources": ["clusterpolicies/status"],
            "verbs": ["get", "update", "patch"],
        },
        # controller ownerReferences with blockOwnerDeletion
        {"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        # the driver upgrade controller: the pods on a node it upgrades (GPU pods evicted, the node
        # drained through the Eviction API, the stale driver and validator pods deleted), an Event per step
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {
            "apiGroups": [""],
            "resources": ["namespaces"],
            "resourceNames": [namespace],
            "verbs": ["get", "patch"],
        },
    ]
    ns_rules: list[Obj] = [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
        # readiness: the driver's pods against the newest ControllerRevision of its DaemonSet
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["controllerrevisions"], "verbs": ["get", "list", "watch"]},
    ]
    for (group, namespaced), resources in sorted(by_kind.items()):
        rule = {"apiGroups": [group], "resources": sorted(resources), "verbs": list(_WRITE)}
        (ns_rules if namespaced else cluster).append(rule)
    # cluster-scoped objects: created (a create cannot name its object) and listed freely, but only the
    # operator's own may be read, changed or deleted (never another ClusterRole or admission policy)
    for (group, resource), object_names in sorted(names.items()):
        cluster.append({"apiGroups": [group], "resources": [resource], "verbs": ["create", "list", "watch"]})
        cluster.append(
            {
                "apiGroups": [group],
                "resources": [resource],
                "resourceNames": sorted(object_names),
                "verbs": ["get", "update", "patch", "delete"],
            }
        )
    return _dedupe(cluster + granted_cluster), _dedupe(ns_rules + granted_ns)


def _labels() -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": "gpunode",
        "app.kubernetes.io/managed-by": "gpunode-render",
        "app.kubernetes.io/name": NAME,
    }


def _operator(policy: ClusterPolicy, namespace: str, image: str) -> list[Obj]:
    rbac = "rbac.authorization.k8s.io"
    cluster_rules, ns_rules = operator_rules(namespace)
    meta: Obj = {"name": NAME, "namespace": namespace, "labels": _labels()}
    cluster_meta: Obj = {"name": NAME, "labels": _labels()}
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]
    g = policy.spec.gpunode
    pod: Obj = {
        "serviceAccountName": NAME,
        "priorityClassName": "system-cluster-critical",
        "tolerations": [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
        ],
        "containers": [
            {
                "name": "operator",
                "image": image,
                "imagePullPolicy": g.image_pull_policy,
                "command": [CONSOLE_SCRIPT, "--leader-elect"],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "LOG_FORMAT", "value": "json"},
                ],
                # a slim cache of 5,000 nodes stays under 120 MB (issue 15); the limit leaves room
                "resources": {
                    "requests": {"cpu": "10m", "memory": "128Mi"},
                    "limits": {"cpu": "1", "memory": "512Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }
        ],
    }
    if g.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in g.image_pull_secrets]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": dict(cluster_meta),
            "rules": cluster_rules,
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": dict(cluster_meta),
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": NAME},
            "subjects": subject,
        },
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": dict(meta), "rules": ns_rules},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": NAME},
            "subjects": subject,
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": dict(meta),
            "spec": {
                # one replica, as NVIDIA runs it; leader election keeps a second one (a rollout's new pod,
                # or a scaled-up copy) from writing at the same time
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                "template": {"metadata": {"labels": _labels()}, "spec": pod},
            },
        },
    ]


def render_operator_by_part(
    policy: ClusterPolicy,
    *,
    namespace: str = "gpunode",
    image: str | None = None,
    nfd_image: str | None = None,
) -> dict[str, list[Obj]]:
    """``{"crds", "operator", "nfd", "clusterpolicy"}`` in apply order (``nfd`` empty without NFD); the
    last is the ConfigMap the operator applies the policy from (one ``kubectl apply`` works)."""
    return {
        "crds": clusterpolicy_crds(),
        "operator": [namespace_object(namespace), *_operator(policy, namespace, image_for(policy, image))],
        "nfd": render_nfd(policy, namespace=namespace, image=nfd_image),
        "clusterpolicy": [seed_configmap(clusterpolicy_object(policy), namespace, _labels())],
    }


def render_operator(
    policy: ClusterPolicy,
    *,
    namespace: str = "gpunode",
    image: str | None = None,
    nfd_image: str | None = None,
) -> list[Obj]:
    """Every object of the install, in apply order."""
    parts = render_operator_by_part(policy, namespace=namespace, image=image, nfd_image=nfd_image)
    return [o for objs in parts.values() for o in objs]

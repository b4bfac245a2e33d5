"""The ``ClusterPolicy`` CustomResourceDefinition gpunode installs (``nvidia.com/v1``, cluster-scoped).

Its schema is built from :mod:`gpunode.api.clusterpolicy_fields`: every field of NVIDIA's CRD, so a
ClusterPolicy written for NVIDIA's operator applies unchanged, plus gpunode's extensions. The schema is
structural (every node typed, no ``x-kubernetes-preserve-unknown-fields``), so the API server prunes a
field outside it, as NVIDIA's does. ``status`` is a subresource; ``kubectl get clusterpolicy`` shows the
state and the age. ``containers/crd/clusterpolicy.yaml`` is :func:`crd` rendered (a test keeps them equal).
"""

from __future__ import annotations

from typing import Any

from gpunode.api.clusterpolicy_fields import STATUS, spec_schema

__all__ = ["GROUP", "KIND", "PLURAL", "VERSION", "crd"]

GROUP = "nvidia.com"
VERSION = "v1"
KIND = "ClusterPolicy"
PLURAL = "clusterpolicies"


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object (``apiextensions.k8s.io/v1``)."""
    schema = {
        "type": "object",
        "description": "ClusterPolicy: the GPU node software of the cluster (gpunode)",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": STATUS,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "gpunode"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "State", "type": "string", "jsonPath": ".status.state"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }

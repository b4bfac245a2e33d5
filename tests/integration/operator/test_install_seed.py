"""One ``kubectl apply`` of ``gpunode render --operator``: kubectl cannot create the ClusterPolicy in the
apply that creates its CRD, so the install carries it in a ConfigMap and the operator applies it once the
CRD serves (:mod:`gpunode.operator.seed`). Against the test API server: every object of the install
applied in order (no ClusterPolicy among them), the operator's controller brings the cluster to ``ready``;
a user's edit of the policy lasts until a changed render is applied; a ConfigMap that is no policy is
logged and ignored; before the CRD serves, the pass fails and the next one succeeds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpunode.api.clusterpolicy import parse_policy_text
from gpunode.deploy.operator_install import render_operator
from gpunode.deploy.render import render_by_agent
from gpunode.kube.api import KubeError
from gpunode.kube.client import Kube
from gpunode.operator.cache import ObjectCache
from gpunode.operator.controller import ClusterPolicyController, run_controller
from gpunode.operator.seed import SEED_ANNOTATION, SEED_NAME, parse_seed
from gpunode.sim.apiserver import FakeApiServer
from helpers.waiting import until

NS = "gpunode"
NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
POLICY = """\
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: cluster-policy}
spec:
  nfd: {enabled: false}
  dcgmExporter: {enabled: true}
  migManager: {enabled: false}
"""


def render(policy: Any, namespace: str) -> Mapping[str, Sequence[dict[str, Any]]]:
    return render_by_agent(policy, namespace=namespace)


def install(text: str = POLICY) -> list[dict[str, Any]]:
    return render_operator(parse_policy_text(text, "policy.yaml").policy, namespace=NS)


def apply_all(api: FakeApiServer, objs: list[dict[str, Any]]) -> None:
    """As ``kubectl apply -f -`` does, in order (field manager kubectl's)."""
    for o in objs:
        api.apply(o["kind"], o, manager="kubectl")


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[FakeApiServer, Kube]]:
    with FakeApiServer() as api:
        for n in ("gpu-0", "gpu-1"):
            api.add_node(n, labels={"kubernetes.io/hostname": n, "nvidia.com/gpu.present": "true", **NFD})
        api.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Kube.connect_cluster(str(tmp_path / "kubeconfig"), namespace=NS, backoff=(0.01, 0.05))
        try:
            yield api, kube
        finally:
            await kube.aclose()


def controller(kube: Kube, cache: ObjectCache | None = None) -> ClusterPolicyController:
    return ClusterPolicyController(kube, render, namespace=NS, cache=cache)


async def test_one_apply_of_the_install_brings_the_policy_and_the_cluster_up(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (api, kube):
        objs = install()
        assert "ClusterPolicy" not in {o["kind"] for o in objs}  # kubectl could not map it yet
        apply_all(api, objs)
        c = controller(kube)
        first = await c.reconcile()
        assert "ClusterPolicy cluster-policy" in first.applied
        cp = api.get("ClusterPolicy", "cluster-policy")
        assert cp is not None
        assert cp["spec"] == {
            "nfd": {"enabled": False},
            "dcgmExporter": {"enabled": True},
            "migManager": {"enabled": False},
        }
        digest = cp["metadata"]["annotations"][SEED_ANNOTATION]
        assert (parse_seed(api.get("ConfigMap", SEED_NAME, NS) or {}) or ({}, ""))[1] == digest
        for _ in range(200):
            if (await c.reconcile()).state == "ready":
                break
            await asyncio.sleep(0.02)
        assert (api.get("ClusterPolicy", "cluster-policy") or {})["status"]["state"] == "ready"
        # applied once: the passes after it, and a restarted operator, leave the policy alone
        version = (api.get("ClusterPolicy", "cluster-policy") or {})["metadata"]["resourceVersion"]
        again = await controller(kube).reconcile()
        assert "ClusterPolicy cluster-policy" not in again.applied
        assert (api.get("ClusterPolicy", "cluster-policy") or {})["metadata"]["resourceVersion"] == version


async def test_before_the_crd_serves_the_pass_fails_and_the_next_applies_the_policy(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (api, kube):
        objs = install()
        crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
        apply_all(api, [o for o in objs if o["kind"] != "CustomResourceDefinition"])
        c = controller(kube)
        with pytest.raises(KubeError):
            await c.reconcile()  # the operator's loop retries it with backoff
        apply_all(api, crds)
        await c.reconcile()
        assert api.get("ClusterPolicy", "cluster-policy") is not None


async def test_an_edit_lasts_until_a_changed_render_is_applied_and_a_bad_configmap_is_ignored(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (api, kube):
        apply_all(api, install())
        cache = ObjectCache(kube, namespace=NS)
        c = controller(kube, cache)
        task = asyncio.create_task(run_controller(c))
        try:
            await until(lambda: api.get("ClusterPolicy", "cluster-policy") is not None, timeout=20)
            # kubectl edit clusterpolicy: the operator leaves it (the install did not change)
            api.patch("ClusterPolicy", "cluster-policy", {"spec": {"dcgmExporter": {"enabled": False}}})
            await asyncio.sleep(1.0)
            assert (api.get("ClusterPolicy", "cluster-policy") or {})["spec"]["dcgmExporter"] == {
                "enabled": False
            }
            # a render with another policy applied: the new ConfigMap queues a pass that applies it
            apply_all(
                api, install(POLICY.replace("migManager: {enabled: false}", "migManager: {enabled: true}"))
            )

            def mig_on() -> bool:
                spec = (api.get("ClusterPolicy", "cluster-policy") or {}).get("spec") or {}
                return spec.get("migManager") == {"enabled": True}

            await until(mig_on, timeout=20)
            spec = (api.get("ClusterPolicy", "cluster-policy") or {})["spec"]
            assert spec["dcgmExporter"] == {"enabled": True}  # the install's fields are the install's again
            # a ConfigMap that carries no policy: logged, ignored; the policy stays
            bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": SEED_NAME, "namespace": NS}}
            api.apply(
                "ConfigMap",
                {**bad, "data": {"clusterpolicy.json": json.dumps({"kind": "Pod"})}},
                manager="x",
                force=True,
            )
            await asyncio.sleep(0.5)
            assert mig_on()
            assert not task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_policy_the_api_server_refuses_is_said_once_and_the_clusters_policy_serves(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (api, kube):
        apply_all(api, install())
        c = controller(kube)
        await c.reconcile()  # the install's policy, created
        api.patch("ClusterPolicy", "cluster-policy", {"spec": {"dcgmExporter": {"enabled": False}}})
        # a new render whose policy the API server refuses (422: as the CRD's schema would)
        apply_all(api, install(POLICY.replace("migManager: {enabled: false}", "migManager: {enabled: true}")))
        api.fail_next(1, status=422, method="PATCH", path_contains="/clusterpolicies/cluster-policy?")
        result = await c.reconcile()  # no exception: the pass goes on with the cluster's policy
        assert result.active == "cluster-policy"
        spec = (api.get("ClusterPolicy", "cluster-policy") or {})["spec"]
        assert spec["migManager"] == {"enabled": False}
        assert spec["dcgmExporter"] == {"enabled": False}

        def applies(since: int) -> list[int]:  # the policy's own resource (its /status aside)
            rs = api.requests[since:]
            return [
                r.status
                for r in rs
                if r.method == "PATCH" and r.path.endswith("/clusterpolicies/cluster-policy")
            ]

        assert 422 in applies(0)
        requests = len(api.requests)
        await c.reconcile()  # not tried again for the same ConfigMap
        assert applies(requests) == []

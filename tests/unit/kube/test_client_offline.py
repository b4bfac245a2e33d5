"""The Kubernetes layer without a server: credentials, node name, error translation."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from gpunode.common.errors import UsageError
from gpunode.kube import api, client


def test_no_node_name_explains_node_name() -> None:
    for missing in (None, ""):
        with pytest.raises(UsageError, match="NODE_NAME") as info:
            api.require_node_name(missing)
        assert "spec.nodeName" in str(info.value)
    assert api.require_node_name("gpu-1") == "gpu-1"


def test_kubeconfig_missing_or_broken_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        client.load_kubeconfig(str(tmp_path / "nope"))
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\n")  # no clusters
    with pytest.raises(UsageError, match=str(broken)):
        client.load_kubeconfig(str(broken))


def test_kubeconfig_list_takes_the_first_existing_file(tmp_path: Path) -> None:
    good = tmp_path / "config"
    good.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    config = client.load_kubeconfig(f"{tmp_path / 'missing'}:{good}")
    assert config.get() is not None


def test_no_credentials_at_all_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(UsageError, match="KUBECONFIG"):
        client.load_kubeconfig(None, service_account=str(tmp_path / "sa"))


def test_in_cluster_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("secret-token")
    (sa / "namespace").write_text("gpu-operator")
    (sa / "ca.crt").write_text("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    single = client.load_kubeconfig(None, service_account=str(sa)).get()
    assert single is not None
    assert single.cluster.server == "https://10.0.0.1:443"


def status_error(code: int, body: dict[str, object] | None = None) -> httpx2.HTTPStatusError:
    request = httpx2.Request("GET", "http://x/api/v1/nodes/n")
    response = httpx2.Response(code, json=body or {"reason": "R", "message": "m"}, request=request)
    return httpx2.HTTPStatusError("x", request=request, response=response)


@pytest.mark.parametrize(
    ("exc", "kind", "status"),
    [
        pytest.param(status_error(404), api.KubeNotFound, 404, id="404"),
        pytest.param(status_error(409), api.KubeConflict, 409, id="409"),
        pytest.param(status_error(403), api.KubeForbidden, 403, id="403"),
        pytest.param(status_error(500), api.KubeUnavailable, 500, id="500-retryable"),
        pytest.param(status_error(503), api.KubeUnavailable, 503, id="503-retryable"),
        pytest.param(status_error(429), api.KubeUnavailable, 429, id="429-retryable"),
        pytest.param(status_error(422), api.KubeError, 422, id="422-plain"),
        pytest.param(httpx2.ConnectError("refused"), api.KubeUnavailable, None, id="refused"),
        pytest.param(httpx2.ReadTimeout("slow"), api.KubeUnavailable, None, id="timeout"),
        pytest.param(TimeoutError(), api.KubeUnavailable, None, id="deadline"),
    ],
)
def test_errors_become_ours_with_the_status(exc: BaseException, kind: type, status: int | None) -> None:
    err = client._translate(exc, "patch", "nodes")
    assert type(err) is kind
    assert err.status == status


def test_eviction_refused_by_a_budget_is_not_an_outage() -> None:
    err = client._translate(status_error(429), "create", "pods/eviction")
    assert type(err) is api.KubeError
    assert err.status == 429


def test_forbidden_names_the_verb_and_resource_to_grant() -> None:
    body = {"reason": "Forbidden", "message": 'nodefeatures.nfd.k8s-sigs.io "x" is forbidden: ...'}
    err = client._translate(
        status_error(403, body), "create", "nodefeatures", group="nfd.k8s-sigs.io", namespace="ns"
    )
    text = str(err)
    assert '"create"' in text
    assert '"nodefeatures"' in text
    assert '["nfd.k8s-sigs.io"]' in text
    assert 'namespace "ns"' in text
    assert "is forbidden" in text  # the server's own words too

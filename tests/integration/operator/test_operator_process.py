"""gpunode-operator as a real process against the test API server: --leader-elect takes the Lease, the
ClusterPolicy goes ready, /healthz and /readyz answer, SIGTERM stops it; usage errors exit 2."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from gpunode.api.clusterpolicy_crd import crd
from gpunode.kube.client import Kube
from gpunode.sim.apiserver import FakeApiServer
from helpers.waiting import wait_until

OPERATOR = [
    sys.executable,
    "-c",
    "import sys; from gpunode.deploy.operator_cli import main; sys.exit(main())",
]
NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_operator_process_reaches_ready_under_leader_election(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        for n in ("gpu-0", "gpu-1"):
            api.add_node(n, labels={"kubernetes.io/hostname": n, **NFD})
        api.add_node("cpu-0", labels={"kubernetes.io/hostname": "cpu-0"})
        kubeconfig = tmp_path / "kubeconfig"
        api.write_kubeconfig(kubeconfig)
        port = free_port()
        log = tmp_path / "operator.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    *OPERATOR,
                    "--kubeconfig",
                    str(kubeconfig),
                    "--leader-elect",
                    "--identity",
                    "replica-a",
                    "--namespace",
                    "gpunode",
                    "--http-address",
                    "127.0.0.1",
                    "--http-port",
                    str(port),
                    "--log-format",
                    "json",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(
                lambda: (
                    api.get("Lease", "gpunode-operator", "gpunode") is not None or proc.poll() is not None
                ),
                20,
            )
            assert proc.poll() is None, log.read_text()
            lease = api.get("Lease", "gpunode-operator", "gpunode")
            assert lease is not None
            assert lease["spec"]["holderIdentity"] == "replica-a"
            wait_until(lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 10)
            status, body = http_get(f"http://127.0.0.1:{port}/readyz")
            assert status == 200, body

            # the policy arrives after the operator started: the watch brings it
            async def create() -> None:
                kube = Kube.connect_cluster(str(kubeconfig), namespace="gpunode")
                try:
                    await kube.apply(crd(), field_manager="user")
                    await kube.apply(
                        {
                            "apiVersion": "nvidia.com/v1",
                            "kind": "ClusterPolicy",
                            "metadata": {"name": "cluster-policy"},
                            "spec": {},
                        },
                        field_manager="user",
                    )
                finally:
                    await kube.aclose()

            asyncio.run(create())

            def ready() -> bool:
                obj = api.get("ClusterPolicy", "cluster-policy")
                return (
                    bool(obj and (obj.get("status") or {}).get("state") == "ready") or proc.poll() is not None
                )

            wait_until(ready, 30)
            assert proc.poll() is None, log.read_text()
            pods = {
                p["spec"]["nodeName"]
                for p in api.objects("Pod", "gpunode")
                if "nfd" not in p["metadata"]["name"]
            }
            assert pods == {"gpu-0", "gpu-1"}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
        assert code == 0, log.read_text()[-3000:]
        events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        assert any(e.get("event") == "reconciled" for e in events)


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    missing = subprocess.run(
        [*OPERATOR, "--kubeconfig", str(tmp_path / "nope")], capture_output=True, text=True, timeout=30
    )
    assert missing.returncode == 2
    assert "kubeconfig" in missing.stderr
    bad = subprocess.run(
        [*OPERATOR, "--kubeconfig", str(tmp_path / "nope"), "--lease-duration", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2
    assert "--lease-duration" in bad.stderr
    helped = subprocess.run([*OPERATOR, "--help"], capture_output=True, text=True, timeout=30)
    assert helped.returncode == 0
    assert "--leader-elect" in helped.stdout


def _start(kubeconfig: Path, identity: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                *OPERATOR,
                "--kubeconfig",
                str(kubeconfig),
                "--leader-elect",
                "--lease-duration",
                "3",
                "--identity",
                identity,
                "--namespace",
                "gpunode",
                "--http-port",
                "-1",
                "--log-format",
                "json",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _events(log: Path, name: str) -> list[dict[str, object]]:
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found


def test_leader_failover_the_standby_takes_over_and_never_wrote_before(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        api.add_node("gpu-0", labels={"kubernetes.io/hostname": "gpu-0", **NFD})
        kubeconfig = tmp_path / "kubeconfig"
        api.write_kubeconfig(kubeconfig)

        async def create() -> None:
            kube = Kube.connect_cluster(str(kubeconfig), namespace="gpunode")
            try:
                await kube.apply(crd(), field_manager="user")
                await kube.apply(
                    {
                        "apiVersion": "nvidia.com/v1",
                        "kind": "ClusterPolicy",
                        "metadata": {"name": "cluster-policy"},
                        "spec": {},
                    },
                    field_manager="user",
                )
            finally:
                await kube.aclose()

        asyncio.run(create())
        logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
        a = _start(kubeconfig, "a", logs["a"])
        procs = [a]
        try:

            def holder() -> str:
                lease = api.get("Lease", "gpunode-operator", "gpunode")
                return str(lease["spec"].get("holderIdentity") or "") if lease else ""

            wait_until(lambda: holder() == "a" or a.poll() is not None, 20)
            b = _start(kubeconfig, "b", logs["b"])
            procs.append(b)

            def ready() -> bool:
                obj = api.get("ClusterPolicy", "cluster-policy")
                return bool(obj and (obj.get("status") or {}).get("state") == "ready")

            wait_until(ready, 30)
            wait_until(lambda: b.poll() is None and len(logs["b"].read_bytes()) > 0, 30)
            assert holder() == "a"
            # the standby wrote nothing: no pass, no node label, no status
            assert _events(logs["b"], "reconciled") == []
            assert _events(logs["b"], "node_labelled") == []
            assert _events(logs["a"], "node_labelled")  # the leader labelled gpu-0
            a.kill()  # no release: b must wait for the lease to expire
            a.wait(10)
            wait_until(lambda: holder() == "b", 30)
            wait_until(lambda: bool(_events(logs["b"], "reconciled")), 30)
            assert ready()
            assert b.poll() is None, logs["b"].read_text()[-3000:]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(15)
                    except subprocess.TimeoutExpired:
                        p.kill()


def test_nfd_labels_appearing_trigger_a_reconcile_without_waiting_45_s(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        api.add_node("gpu-0", labels={"kubernetes.io/hostname": "gpu-0"})  # NFD not there yet
        kubeconfig = tmp_path / "kubeconfig"
        api.write_kubeconfig(kubeconfig)

        async def create() -> None:
            kube = Kube.connect_cluster(str(kubeconfig), namespace="gpunode")
            try:
                await kube.apply(crd(), field_manager="user")
                await kube.apply(
                    {
                        "apiVersion": "nvidia.com/v1",
                        "kind": "ClusterPolicy",
                        "metadata": {"name": "cluster-policy"},
                        "spec": {},
                    },
                    field_manager="user",
                )
            finally:
                await kube.aclose()

        asyncio.run(create())
        log = tmp_path / "operator.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*OPERATOR, "--kubeconfig", str(kubeconfig), "--http-port", "-1", "--log-format", "json"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:

            def reason() -> str:
                obj = api.get("ClusterPolicy", "cluster-policy") or {}
                conds = (obj.get("status") or {}).get("conditions") or []
                return next((str(c["reason"]) for c in conds if c["type"] == "Ready"), "")

            wait_until(lambda: reason() == "NFDLabelsMissing" or proc.poll() is not None, 20)
            assert proc.poll() is None, log.read_text()[-3000:]
            api.patch_node("gpu-0", {"metadata": {"labels": NFD}})
            wait_until(lambda: reason() == "Reconciled", 15)  # well before the 45 s requeue
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()

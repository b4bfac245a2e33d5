"""gpunode doctor on a healthy fake node, then on nodes broken one way at a time."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpunode import doctor
from gpunode.doctor import Check, diagnose
from gpunode.nvml import errors
from gpunode.sim import nvml as sim

Node = Any  # the conftest's Node builder (fixture `node`)


def by_name(results: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in results}


async def test_healthy_node_is_all_ok(node: Node) -> None:
    results = await diagnose(node.options(), node.open_nvml)
    assert [c.name for c in results] == list(doctor.CHECK_NAMES)
    bad = [c for c in results if c.status != "ok" and c.name != "fabric"]
    assert not bad, bad
    assert by_name(results)["fabric"].status == "skip"  # no NVLink fabric on this node
    assert "driver 550.54.15" in by_name(results)["nvml"].detail
    assert "all-disabled" in by_name(results)["mig"].detail


async def test_not_a_kubernetes_node_skips_the_kubelet_checks(node: Node) -> None:
    shutil.rmtree(node.paths.kubelet_root)
    node.stop_exporter()
    results = by_name(await diagnose(node.options(), node.open_nvml))
    assert results["device-plugin"].status == "skip"
    assert results["exporter"].status == "skip"


def _nouveau(node: Node) -> dict[str, Any]:
    node.host.load_nouveau()
    return {}


def _no_uvm(node: Node) -> dict[str, Any]:
    shutil.rmtree(node.host.root / "sys/module/nvidia_uvm")
    return {}


def _node_missing(node: Node) -> dict[str, Any]:
    (node.host.root / "dev/nvidia2").unlink()
    return {}


def _wrong_mode(node: Node) -> dict[str, Any]:
    os.chmod(node.host.root / "dev/nvidiactl", 0o600)
    return {}


def _not_a_char_device(node: Node) -> dict[str, Any]:
    path = node.host.root / "dev/nvidia1"
    path.unlink()
    path.write_text("")
    os.chmod(path, 0o666)
    return {"marker_nodes": False}


def _cdi_missing_gpu(node: Node) -> dict[str, Any]:
    node.write("/var/run/cdi/nvidia.yaml", node.spec(["0", "1", "3"]))
    return {}


def _cdi_stale(node: Node) -> dict[str, Any]:
    node.write("/var/run/cdi/nvidia.yaml", node.spec([str(i) for i in range(node.gpus)], "535.104.05"))
    return {}


def _cdi_absent(node: Node) -> dict[str, Any]:
    (node.host.root / "var/run/cdi/nvidia.yaml").unlink()
    return {}


def _no_runtime(node: Node) -> dict[str, Any]:
    (node.host.root / "etc/containerd/conf.d/99-nvidia.toml").unlink()
    return {}


def _stale_labels(node: Node) -> dict[str, Any]:
    old = time.time() - 600
    os.utime(node.host.root / "etc/kubernetes/node-feature-discovery/features.d/gfd", (old, old))
    return {}


def _labels_without_count(node: Node) -> dict[str, Any]:
    node.write("/etc/kubernetes/node-feature-discovery/features.d/gfd", "nvidia.com/gpu.product=X\n")
    return {}


def _mig_differs(node: Node) -> dict[str, Any]:
    return {"mig_config": "all-1g.6gb"}


def _plugin_stale(node: Node) -> dict[str, Any]:
    node.stop_listening("nvidia-gpu.sock")
    return {}


def _plugin_missing(node: Node) -> dict[str, Any]:
    node.stop_listening("nvidia-gpu.sock")
    (node.paths.device_plugin_dir / "nvidia-gpu.sock").unlink()
    return {}


def _exporter_down(node: Node) -> dict[str, Any]:
    node.stop_exporter()
    return {}


def _exporter_xid(node: Node) -> dict[str, Any]:
    node.stop_exporter()
    node.start_exporter(node.metrics.replace('"GPU-0"} 0', '"GPU-0"} 79'))
    return {}


BROKEN: list[tuple[str, Callable[[Node], dict[str, Any]], str, str]] = [
    # id, breakage, the failing check, text its fix must hold
    ("nouveau-loaded", _nouveau, "nouveau", "blacklist nouveau"),
    ("uvm-module-missing", _no_uvm, "modules", "modprobe nvidia-uvm"),
    ("node-missing", _node_missing, "device-nodes", "gpunode-driver-loader init"),
    ("node-wrong-mode", _wrong_mode, "device-nodes", "chmod 0666"),
    ("node-not-char", _not_a_char_device, "device-nodes", "gpunode-driver-loader init"),
    ("cdi-missing-gpu", _cdi_missing_gpu, "cdi", "cdi generate"),
    ("cdi-stale-driver", _cdi_stale, "cdi", "cdi generate"),
    ("cdi-absent", _cdi_absent, "cdi", "cdi generate"),
    ("no-nvidia-runtime", _no_runtime, "runtime", "runtime configure"),
    ("stale-labels", _stale_labels, "labels", "gpunode-feature-discovery"),
    ("labels-without-count", _labels_without_count, "labels", "gpunode-feature-discovery"),
    ("mig-layout-differs", _mig_differs, "mig", "gpunode-mig apply"),
    ("plugin-socket-stale", _plugin_stale, "device-plugin", "restart the plugin"),
    ("plugin-socket-missing", _plugin_missing, "device-plugin", "gpunode-device-plugin"),
    ("exporter-down", _exporter_down, "exporter", "gpunode-exporter"),
    ("exporter-reports-xid", _exporter_xid, "xid", "XID catalog"),
]


@pytest.mark.parametrize(("breakage", "check", "fix"), [pytest.param(b, c, f, id=i) for i, b, c, f in BROKEN])
async def test_each_breakage_fails_its_check_with_a_fix(
    node: Node, breakage: Callable[[Node], dict[str, Any]], check: str, fix: str
) -> None:
    changes = breakage(node)
    results = by_name(await diagnose(node.options(**changes), node.open_nvml))
    assert results[check].status == "fail", results[check]
    assert fix in results[check].fix
    others = [c for c in results.values() if c.status == "fail" and c.name != check]
    assert not others, others


async def test_nvml_failure_fails_and_skips_what_needs_it(node: Node) -> None:
    async def broken() -> Any:
        raise errors.LibraryNotFound("libnvidia-ml.so.1 not found")

    results = by_name(await diagnose(node.options(), broken))
    assert results["nvml"].status == "fail"
    assert "gpunode-driver-loader init" in results["nvml"].fix
    assert results["mig"].status == "skip"
    assert results["cdi"].status == "warn"


async def test_xid_during_the_watch_fails(node: Node) -> None:
    async def inject() -> None:
        await asyncio.sleep(0.2)
        simnode = sim.open_node(state=node.state)
        with simnode.mutate() as state:
            state.inject_xid(1, 79, now=time.time())

    task = asyncio.create_task(inject())
    results = by_name(await diagnose(node.options(xid_window=0.8), node.open_nvml))
    await task
    assert results["xid"].status == "fail", results["xid"]
    assert "XID 79 on GPU 1" in results["xid"].detail


async def test_persistenced_gone_warns(node: Node) -> None:
    pid_file = node.host.root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    pid_file.write_text("999999\n")
    results = by_name(await diagnose(node.options(), node.open_nvml))
    assert results["persistence"].status == "warn"
    assert "nvidia-persistenced" in results["persistence"].fix


def test_cli_table_and_json(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    if node.markers:
        pytest.skip("needs real device nodes (mknod) for the command line run")
    assert doctor.main(node.cli_args(), {}) == 0
    table = capsys.readouterr().out
    assert "nvml" in table
    assert "0 fail" in table
    node.host.load_nouveau()
    assert doctor.main([*node.cli_args(), "--json"], {}) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    failed = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["nouveau"]
    assert failed[0]["fix"]


def test_cli_on_a_bare_simulated_node(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "sim.json"
    sim.init_state_file(state, "t4x4")
    code = doctor.main(
        [
            "--sim-state",
            str(state),
            "--kubelet-dir",
            str(tmp_path / "none"),
            "--exporter-port",
            "-1",
            "--xid-window",
            "0.1",
        ],
        {},
    )
    out = capsys.readouterr().out
    assert "simulated node" in out
    assert code in (0, 1)  # the machine's own CDI/runtime files decide the rest


def test_cli_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main(["--gfd-sleep-interval", "soon"], {}) == 2
    assert "--gfd-sleep-interval" in capsys.readouterr().err


async def test_a_mig_config_matching_no_gpu_warns(node: Node) -> None:
    """mig-parted's rule (issue 18): nothing to apply, a success; the doctor says why, as a warning."""
    results = by_name(await diagnose(node.options(mig_config="all-1g.10gb"), node.open_nvml))
    assert results["mig"].status == "warn", results["mig"]
    assert 'config "all-1g.10gb" matches no GPU on this node' in results["mig"].detail
    assert results["mig"].fix

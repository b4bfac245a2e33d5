"""The validator's readers: CDI specs, container runtime configs, names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpunode.common.errors import UsageError
from gpunode.common.hostpaths import HostPaths
from gpunode.validator import checks, cli
from gpunode.validator.checks import DeviceRef

GPU0 = DeviceRef(0, "GPU-aaaa", 0)
GPU1_MIG = DeviceRef(1, "GPU-bbbb", 1, mig_enabled=True)
MIG10 = DeviceRef(1, "MIG-cccc", 1, mig_index=0)

YAML_SPEC = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
  - name: MIG-cccc
    containerEdits: {deviceNodes: [{path: /dev/nvidia1}]}
containerEdits:
  mounts:
    - {hostPath: /run/nvidia/driver/usr/lib64/libcuda.so.580.65.06, containerPath: /usr/lib64/libcuda.so.1}
"""


@pytest.mark.parametrize(
    ("names", "devices", "missing"),
    [
        pytest.param({"0", "1:0"}, [GPU0, GPU1_MIG, MIG10], [], id="index-names"),
        pytest.param({"GPU-aaaa", "MIG-cccc"}, [GPU0, GPU1_MIG, MIG10], [], id="uuid-names"),
        pytest.param({"0"}, [GPU0, GPU1_MIG, MIG10], [MIG10], id="mig-device-missing"),
        pytest.param({"1:0"}, [GPU0], [GPU0], id="gpu-missing"),
        pytest.param({"all"}, [GPU0], [GPU0], id="only-all"),
    ],
)
def test_cdi_missing(names: set[str], devices: list[DeviceRef], missing: list[DeviceRef]) -> None:
    spec = checks.CdiSpec(Path("x.yaml"), "nvidia.com/gpu", frozenset(names))
    assert checks.cdi_missing([spec], devices, "nvidia.com/gpu") == missing
    assert checks.cdi_missing([spec], devices, "management.nvidia.com/gpu") == [
        d for d in devices if d is not GPU1_MIG
    ]


def test_load_cdi_specs_yaml_json_and_garbage(tmp_path: Path) -> None:
    paths = HostPaths(tmp_path)
    run_cdi, etc_cdi = paths.cdi_dirs[1], paths.cdi_dirs[0]
    run_cdi.mkdir(parents=True)
    etc_cdi.mkdir(parents=True)
    (run_cdi / "nvidia.yaml").write_text(YAML_SPEC)
    (etc_cdi / "mgmt.json").write_text(
        json.dumps({"cdiVersion": "0.5.0", "kind": "management.nvidia.com/gpu", "devices": [{"name": "all"}]})
    )
    (etc_cdi / "broken.yaml").write_text("cdiVersion: [\n")
    (etc_cdi / "notes.txt").write_text("ignored")
    specs = {s.path.name: s for s in checks.load_cdi_specs(paths)}
    assert set(specs) == {"nvidia.yaml", "mgmt.json", "broken.yaml"}
    assert specs["nvidia.yaml"].devices == {"0", "MIG-cccc"}
    assert specs["nvidia.yaml"].libcuda_versions == {"580.65.06"}
    assert specs["mgmt.json"].kind == "management.nvidia.com/gpu"
    assert specs["broken.yaml"].error.startswith("cannot parse")


def _write(root: Path, host_path: str, text: str) -> None:
    path = root / host_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("files", "engines"),
    [
        pytest.param(
            {
                "/etc/containerd/config.toml": 'version = 2\nimports = ["/etc/containerd/extra/*.toml"]\n',
                "/etc/containerd/extra/nv.toml": (
                    '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\nruntime_type = "x"\n'
                ),
            },
            ["containerd"],
            id="containerd-v2-imports",
        ),
        pytest.param(
            {
                "/etc/containerd/config.toml": "version = 3\n",
                "/etc/containerd/conf.d/99-nvidia.toml": (
                    '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
                    'runtime_type = "x"\n'
                ),
            },
            ["containerd"],
            id="containerd-v3-conf.d",
        ),
        pytest.param(
            {"/etc/containerd/config.toml": '[plugins.cri.containerd.runtimes.nvidia]\nruntime_type = "x"\n'},
            ["containerd"],
            id="containerd-v1",
        ),
        pytest.param(
            {
                "/etc/crio/crio.conf": "[crio.runtime]\n",
                "/etc/crio/crio.conf.d/99-nvidia.conf": (
                    '[crio.runtime.runtimes.nvidia]\nruntime_path = "/x"\n'
                ),
            },
            ["crio"],
            id="crio-drop-in",
        ),
        pytest.param(
            {"/etc/docker/daemon.json": '{"runtimes": {"nvidia": {"path": "/x"}}}'}, ["docker"], id="docker"
        ),
        pytest.param(
            {
                "/etc/containerd/config.toml": (
                    '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\nruntime_type = "x"\n'
                )
            },
            [],
            id="containerd-without-nvidia",
        ),
    ],
)
def test_runtime_configs(tmp_path: Path, files: dict[str, str], engines: list[str]) -> None:
    for host_path, text in files.items():
        _write(tmp_path, host_path, text)
    found = checks.read_runtime_configs(HostPaths(tmp_path))
    assert found.has("nvidia") == engines
    assert not found.errors
    assert len(found.files) == len(files)


def test_runtime_config_syntax_error(tmp_path: Path) -> None:
    _write(tmp_path, "/etc/containerd/config.toml", "version = \n")
    found = checks.read_runtime_configs(HostPaths(tmp_path))
    assert found.errors
    assert "config.toml" in found.errors[0]


@pytest.mark.parametrize(
    ("given", "names"),
    [
        (["driver"], ["driver-ready"]),
        (["toolkit", "cuda"], ["toolkit-ready", "cuda-ready"]),
        ([".driver-ctr-ready"], [".driver-ctr-ready"]),
        (["nvidia-fs-ready"], ["nvidia-fs-ready"]),
    ],
)
def test_wait_names(given: list[str], names: list[str]) -> None:
    assert cli.wait_names(given) == names


def test_wait_names_from_env_and_bad_names() -> None:
    from_env = cli.SPEC.parser().parse([], {"WAIT_FOR": "driver, toolkit"}).settings.wait_for
    assert cli.wait_names(from_env) == ["driver-ready", "toolkit-ready"]
    with pytest.raises(UsageError):
        cli.wait_names(["../etc/passwd"])


def test_device_node_problem(tmp_path: Path) -> None:
    marker = tmp_path / "nvidia0"
    marker.write_text("c 195:0\n")
    assert checks.device_node_problem(tmp_path / "nvidia9") == ("missing", 0)
    assert checks.device_node_problem(marker)[0] == "not a character device"
    assert checks.device_node_problem(marker, marker_ok=True)[0] == ""

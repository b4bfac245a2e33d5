"""gpunode.common.hostpaths: every host path built under an injectable root."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.common.hostpaths import HostPaths, normalize_bdf

BDF = "0000:3b:00.0"


@pytest.mark.parametrize(
    ("build", "relative"),
    [
        pytest.param(lambda h: h.sys, "sys", id="sys"),
        pytest.param(lambda h: h.proc, "proc", id="proc"),
        pytest.param(lambda h: h.dev, "dev", id="dev"),
        pytest.param(lambda h: h.run, "run", id="run"),
        pytest.param(lambda h: h.etc, "etc", id="etc"),
        pytest.param(lambda h: h.host("/etc/os-release"), "etc/os-release", id="host-any"),
        pytest.param(lambda h: h.pci_devices_dir, "sys/bus/pci/devices", id="pci-devices"),
        pytest.param(lambda h: h.pci_device(BDF), f"sys/bus/pci/devices/{BDF}", id="pci-device"),
        pytest.param(
            lambda h: h.pci_device("00000000:3B:00.0"), f"sys/bus/pci/devices/{BDF}", id="pci-nvml-bdf"
        ),
        pytest.param(lambda h: h.pci_numa_node(BDF), f"sys/bus/pci/devices/{BDF}/numa_node", id="numa-node"),
        pytest.param(lambda h: h.sys_module(), "sys/module/nvidia", id="sys-module"),
        pytest.param(lambda h: h.dev_nvidia(3), "dev/nvidia3", id="dev-nvidia"),
        pytest.param(lambda h: h.nvidiactl, "dev/nvidiactl", id="nvidiactl"),
        pytest.param(lambda h: h.nvidia_uvm, "dev/nvidia-uvm", id="nvidia-uvm"),
        pytest.param(lambda h: h.nvidia_uvm_tools, "dev/nvidia-uvm-tools", id="nvidia-uvm-tools"),
        pytest.param(lambda h: h.nvidia_modeset, "dev/nvidia-modeset", id="nvidia-modeset"),
        pytest.param(lambda h: h.nvidia_caps, "dev/nvidia-caps", id="nvidia-caps"),
        pytest.param(lambda h: h.proc_modules, "proc/modules", id="proc-modules"),
        pytest.param(lambda h: h.proc_devices, "proc/devices", id="proc-devices"),
        pytest.param(lambda h: h.proc_driver_nvidia, "proc/driver/nvidia", id="proc-driver-nvidia"),
        pytest.param(lambda h: h.device_plugin_dir, "var/lib/kubelet/device-plugins", id="device-plugin-dir"),
        pytest.param(
            lambda h: h.kubelet_socket, "var/lib/kubelet/device-plugins/kubelet.sock", id="kubelet-sock"
        ),
        pytest.param(
            lambda h: h.pod_resources_socket, "var/lib/kubelet/pod-resources/kubelet.sock", id="podres"
        ),
        pytest.param(lambda h: h.run_nvidia, "run/nvidia", id="run-nvidia"),
        pytest.param(lambda h: h.validations_dir, "run/nvidia/validations", id="validations"),
        pytest.param(lambda h: h.cdi_dirs[0], "etc/cdi", id="etc-cdi"),
        pytest.param(lambda h: h.cdi_dirs[1], "var/run/cdi", id="run-cdi"),
        pytest.param(
            lambda h: h.nfd_features_dir, "etc/kubernetes/node-feature-discovery/features.d", id="nfd"
        ),
        pytest.param(lambda h: h.driver_dir, "", id="driver-dir-default"),
    ],
)
def test_paths_are_under_root(tmp_path: Path, build: object, relative: str) -> None:
    paths = HostPaths(root=tmp_path)
    assert build(paths) == tmp_path / relative  # type: ignore[operator]


def test_defaults_are_the_real_host_paths() -> None:
    paths = HostPaths()
    assert paths.sys == Path("/sys")
    assert paths.kubelet_socket == Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert paths.driver_lib_dirs()[0] == Path("/usr/lib64")


def test_driver_root_and_kubelet_dir_are_host_paths_under_root(tmp_path: Path) -> None:
    paths = HostPaths(root=tmp_path, driver_root="/run/nvidia/driver", kubelet_dir="/data/kubelet")
    assert paths.driver_dir == tmp_path / "run/nvidia/driver"
    assert paths.driver("/usr/bin/nvidia-smi") == tmp_path / "run/nvidia/driver/usr/bin/nvidia-smi"
    assert paths.kubelet_socket == tmp_path / "data/kubelet/device-plugins/kubelet.sock"
    assert paths.driver_lib_dirs() == tuple(
        tmp_path / "run/nvidia/driver" / sub
        for sub in ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib64", "usr/lib")
    )


def test_str_and_path_arguments_are_equal(tmp_path: Path) -> None:
    assert HostPaths(str(tmp_path), "/d") == HostPaths(tmp_path, Path("/d"))
    assert isinstance(HostPaths(str(tmp_path)).root, Path)


def test_frozen(tmp_path: Path) -> None:
    paths = HostPaths(tmp_path)
    with pytest.raises(AttributeError):
        paths.root = Path("/")  # type: ignore[misc]


def test_construction_touches_nothing(tmp_path: Path) -> None:
    HostPaths(root=tmp_path / "does-not-exist").driver_lib_dirs()
    assert not (tmp_path / "does-not-exist").exists()


def test_find_driver_lib(tmp_path: Path) -> None:
    paths = HostPaths(root=tmp_path, driver_root="/drv")
    assert paths.find_driver_lib("libnvidia-ml.so.1") is None
    lib = tmp_path / "drv/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    assert paths.find_driver_lib("libnvidia-ml.so.1") == lib
    with pytest.raises(ValueError, match="must not contain"):
        paths.find_driver_lib("../libx.so")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("1\n", 1, id="node-1"),
        pytest.param("0", 0, id="node-0"),
        pytest.param("-1\n", None, id="minus-one-unknown"),
        pytest.param("garbage", None, id="unparsable"),
        pytest.param(None, None, id="missing-file"),
    ],
)
def test_read_numa_node(tmp_path: Path, content: str | None, expected: int | None) -> None:
    paths = HostPaths(root=tmp_path)
    if content is not None:
        node_file = paths.pci_numa_node(BDF)
        node_file.parent.mkdir(parents=True)
        node_file.write_text(content)
    assert paths.read_numa_node("00000000:3B:00.0") == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00.0"),
        ("0001:AF:1f.7", "0001:af:1f.7"),
        (" 0000:3b:00.0\n", "0000:3b:00.0"),
    ],
    ids=repr,
)
def test_normalize_bdf(given: str, expected: str) -> None:
    assert normalize_bdf(given) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "../../etc", "0000:3b:00", "0000:3b:00.8", "zz:00.0", "100000000:3b:00.0", "0000:3b:00.0/x"],
    ids=repr,
)
def test_normalize_bdf_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="PCI"):
        normalize_bdf(bad)


@pytest.mark.parametrize("bad", ["/../etc/shadow", "a/../../b"])
def test_host_rejects_parent_references(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match=r"\.\."):
        HostPaths(tmp_path).host(bad)


def test_negative_minor_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="negative"):
        HostPaths(tmp_path).dev_nvidia(-1)

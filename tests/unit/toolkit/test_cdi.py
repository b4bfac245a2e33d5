"""The pure CDI spec builder, the cdiVersion table, rendering, and discovery on fake host trees."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode.common.hostpaths import HostPaths
from gpunode.nvml.api import GpuInfo, MigDevice, MigMode, PciInfo
from gpunode.nvml.caps import parse_mig_minors
from gpunode.toolkit import cdi
from gpunode.toolkit.cdi import DriverFiles, SpecOptions

VERSION = "550.54.15"
LIBDIR = "usr/lib/x86_64-linux-gnu"


def gpu(index: int, minor: int | None = None, mig: bool = False) -> GpuInfo:
    return GpuInfo(
        index=index,
        minor=index if minor is None else minor,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-40GB",
        serial=None,
        pci=PciInfo(f"00000000:{index + 7:02X}:00.0", 0, index + 7, 0, 0x20B010DE, 0),
        numa_node=None,
        memory_total_mib=40960,
        compute_capability=(8, 0),
        architecture="ampere",
        brand="nvidia",
        sm_count=108,
        mig=MigMode(mig, mig),
    )


def mig_dev(parent: GpuInfo, index: int, gi: int, ci: int = 0) -> MigDevice:
    return MigDevice(
        parent_index=parent.index,
        parent_uuid=parent.uuid,
        index=index,
        uuid=f"MIG-{parent.index:04d}{index:04d}-0000-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        profile="1g.5gb",
        gi_id=gi,
        ci_id=ci,
        memory_mib=4864,
        sm_count=14,
        gi_slices=1,
        ci_slices=1,
        copy_engines=1,
        decoders=0,
        encoders=0,
        jpeg=0,
        ofa=0,
    )


G0, G1 = gpu(0), gpu(1, mig=True)
M10, M11 = mig_dev(G1, 0, gi=1), mig_dev(G1, 1, gi=2)
CAPS = {"gpu1/gi1/access": 12, "gpu1/gi1/ci0/access": 13, "gpu1/gi2/access": 21, "gpu1/gi2/ci0/access": 22}


def build(
    gpus: list[GpuInfo] | None = None,
    migs: dict[int, tuple[MigDevice, ...]] | None = None,
    caps: dict[str, int] | None = None,
    files: DriverFiles | None = None,
    **opts: Any,
) -> tuple[dict[str, Any], list[str]]:
    spec, warnings = cdi.build_spec(
        [G0, G1] if gpus is None else gpus,
        {1: (M10, M11)} if migs is None else migs,
        files or DriverFiles(version=VERSION),
        SpecOptions(**opts),
        CAPS if caps is None else caps,
    )
    return spec.to_dict(), warnings


def names(doc: dict[str, Any]) -> list[str]:
    return [d["name"] for d in doc["devices"]]


def nodes(doc: dict[str, Any], name: str) -> list[str]:
    device = next(d for d in doc["devices"] if d["name"] == name)
    return [n["path"] for n in device["containerEdits"].get("deviceNodes", [])]


# ----------------------------------------------------------------------------------------- naming


@pytest.mark.parametrize(
    ("strategies", "expected"),
    [
        pytest.param(
            ("index", "uuid"),
            ["0", G0.uuid, "1", G1.uuid, "1:0", M10.uuid, "1:1", M11.uuid, "all"],
            id="index-uuid-default",
        ),
        pytest.param(("uuid",), [G0.uuid, G1.uuid, M10.uuid, M11.uuid, "all"], id="uuid"),
        pytest.param(("index",), ["0", "1", "1:0", "1:1", "all"], id="index"),
        pytest.param(("type-index",), ["gpu0", "gpu1", "mig1:0", "mig1:1", "all"], id="type-index"),
    ],
)
def test_device_names_per_strategy(strategies: tuple[str, ...], expected: list[str]) -> None:
    doc, _ = build(name_strategies=strategies)
    assert names(doc) == expected


def test_no_all_device() -> None:
    doc, _ = build(all_device=False)
    assert "all" not in names(doc)


def test_no_gpus_gives_no_devices_and_no_all() -> None:
    doc, _ = build(gpus=[], migs={})
    assert doc["devices"] == []


def test_gpu_and_mig_device_nodes_with_host_paths_under_dev_root() -> None:
    doc, warnings = build(dev_root="/run/nvidia/driver")
    assert warnings == []
    assert nodes(doc, "0") == ["/dev/nvidia0"]
    assert nodes(doc, "1:0") == [
        "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    ]
    assert nodes(doc, M11.uuid) == [
        "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]
    node = doc["devices"][0]["containerEdits"]["deviceNodes"][0]
    assert node == {"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"}


def test_host_path_left_out_when_dev_root_is_slash() -> None:
    doc, _ = build()
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]


def test_missing_mig_capability_minors_are_left_out_with_a_warning() -> None:
    doc, warnings = build(caps={"gpu1/gi1/access": 12})
    assert nodes(doc, "1:0") == ["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap12"]
    assert nodes(doc, "1:1") == ["/dev/nvidia1"]
    assert len(warnings) == 3
    assert any("gpu1/gi1/ci0/access" in w and M10.uuid in w for w in warnings)


def test_mig_capabilities_use_the_parent_minor_not_its_index() -> None:
    parent = gpu(0, minor=3, mig=True)
    m = mig_dev(parent, 0, gi=5, ci=1)
    doc, warnings = build(
        gpus=[parent], migs={0: (m,)}, caps={"gpu3/gi5/access": 50, "gpu3/gi5/ci1/access": 52}
    )
    assert warnings == []
    assert nodes(doc, "0:0") == [
        "/dev/nvidia3",
        "/dev/nvidia-caps/nvidia-cap50",
        "/dev/nvidia-caps/nvidia-cap52",
    ]


def test_all_is_the_union_in_natural_order() -> None:
    gpus = [gpu(i) for i in (10, 2, 1)]
    doc, _ = build(gpus=gpus, migs={})
    assert names(doc)[:2] == ["1", gpus[2].uuid]
    assert nodes(doc, "all") == ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia10"]
    doc, _ = build()
    assert nodes(doc, "all") == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]


def test_duplicate_names_are_refused() -> None:
    twin = gpu(1)
    with pytest.raises(ValueError, match="duplicate CDI device names"):
        build(gpus=[G0, GpuInfo(**{**twin.__dict__, "uuid": G0.uuid})], migs={}, name_strategies=("uuid",))


@pytest.mark.parametrize(
    ("kind", "ok"),
    [
        ("nvidia.com/gpu", True),
        ("k8s.device-plugin.nvidia.com/gpu", True),
        ("management.nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com", False),
        ("nvidia.com/", False),
        ("/gpu", False),
        ("nvidia.com/-gpu", False),
        ("nvidia.com/gpu-", False),
        ("1nvidia.com/gpu", False),
        ("nvidia com/gpu", False),
    ],
)
def test_validate_kind(kind: str, ok: bool) -> None:
    if ok:
        assert cdi.validate_kind(kind) == kind
    else:
        with pytest.raises(ValueError, match="CDI kind"):
            cdi.validate_kind(kind)


def test_make_kind_prefers_kind() -> None:
    assert cdi.make_kind("nvidia.com", "gpu") == "nvidia.com/gpu"
    assert cdi.make_kind("nvidia.com", "gpu", "example.com/accel") == "example.com/accel"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("index,uuid", ("index", "uuid")),
        (" uuid , index ,uuid", ("uuid", "index")),
        ("type-index", ("type-index",)),
        ("", None),
        ("index,name", None),
    ],
)
def test_parse_name_strategies(text: str, expected: tuple[str, ...] | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="strateg"):
            cdi.parse_name_strategies(text)
    else:
        assert cdi.parse_name_strategies(text) == expected


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("0", True),
        ("0:1", True),
        ("GPU-abc", True),
        ("mig0:1", True),
        ("all", True),
        ("-x", False),
        ("x:", False),
        ("a b", False),
    ],
)
def test_validate_device_name(name: str, ok: bool) -> None:
    if ok:
        assert cdi.validate_device_name(name) == name
    else:
        with pytest.raises(ValueError, match="invalid CDI device name"):
            cdi.validate_device_name(name)


# ---------------------------------------------------------------------------------- cdiVersion


def _spec(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"kind": "nvidia.com/gpu", "devices": [{"name": "gpu0", "containerEdits": {}}]}
    doc.update(extra)
    return doc


def _edits(**edits: Any) -> dict[str, Any]:
    return _spec(containerEdits=edits)


@pytest.mark.parametrize(
    ("doc", "version"),
    [
        pytest.param(_spec(), "0.3.0", id="baseline"),
        pytest.param(_edits(env=["A=1"], deviceNodes=[{"path": "/dev/x"}]), "0.3.0", id="plain-edits"),
        pytest.param(
            _edits(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]),
            "0.4.0",
            id="mount-type",
        ),
        pytest.param(
            _edits(deviceNodes=[{"path": "/dev/x", "hostPath": "/h/dev/x"}]), "0.5.0", id="hostPath"
        ),
        pytest.param(
            _spec(
                devices=[{"name": "g", "containerEdits": {"deviceNodes": [{"path": "/x", "hostPath": "/y"}]}}]
            ),
            "0.5.0",
            id="device-hostPath",
        ),
        pytest.param(_spec(devices=[{"name": "0", "containerEdits": {}}]), "0.5.0", id="digit-name"),
        pytest.param(_spec(annotations={"a": "b"}), "0.6.0", id="spec-annotations"),
        pytest.param(
            _spec(devices=[{"name": "g", "annotations": {"a": "b"}, "containerEdits": {}}]),
            "0.6.0",
            id="device-annotations",
        ),
        pytest.param(_spec(kind="nvidia.com/gpu.shared"), "0.6.0", id="dotted-class"),
        pytest.param(_edits(additionalGids=[44]), "0.7.0", id="additionalGids"),
        pytest.param(_edits(intelRdt={"closID": "x"}), "0.7.0", id="intelRdt"),
        pytest.param(
            _edits(netDevices=[{"hostInterfaceName": "eth1", "name": "net1"}]), "1.1.0", id="netDevices"
        ),
        pytest.param(
            _spec(devices=[{"name": "0", "containerEdits": {}}], annotations={"a": "b"}),
            "0.6.0",
            id="highest-wins",
        ),
    ],
)
def test_minimum_version(doc: dict[str, Any], version: str) -> None:
    assert cdi.minimum_version(doc) == version


def test_version_rules_are_in_ascending_order() -> None:
    keys = [tuple(int(p) for p in v.split(".")) for v, _, _ in cdi.VERSION_RULES]
    assert keys == sorted(keys)


def test_spec_is_stamped_with_its_minimum_version() -> None:
    assert build(name_strategies=("type-index",))[0]["cdiVersion"] == "0.3.0"
    assert build()[0]["cdiVersion"] == "0.5.0"  # "0" starts with a digit
    assert build(name_strategies=("type-index",), dev_root="/run/nvidia/driver")[0]["cdiVersion"] == "0.5.0"
    assert build(name_strategies=("type-index",), kind="nvidia.com/gpu.x")[0]["cdiVersion"] == "0.6.0"


# -------------------------------------------------------------------------------- common edits

FILES = DriverFiles(
    version=VERSION,
    libraries=(
        f"/{LIBDIR}/libnvidia-ml.so.{VERSION}",
        f"/{LIBDIR}/libcuda.so.{VERSION}",
        f"/usr/lib64/libcuda.so.{VERSION}",
    ),
    symlinks=(
        (f"libnvidia-ml.so.{VERSION}", f"/{LIBDIR}/libnvidia-ml.so.1"),
        ("libcuda.so.1", f"/{LIBDIR}/libcuda.so"),
    ),
    binaries=("/usr/bin/nvidia-smi",),
    firmware=(f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",),
    control_nodes=("/dev/nvidia-uvm", "/dev/nvidiactl"),
    libcuda_dir=f"/{LIBDIR}",
)


def test_common_edits() -> None:
    doc, _ = build(files=FILES, driver_root="/run/nvidia/driver", dev_root="/run/nvidia/driver")
    edits = doc["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR=/{LIBDIR}"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]  # fixed order
    assert edits["deviceNodes"][0]["hostPath"] == "/run/nvidia/driver/dev/nvidiactl"
    paths = [m["containerPath"] for m in edits["mounts"]]
    assert paths == sorted(paths)
    assert f"/{LIBDIR}/libcuda.so.{VERSION}" in paths
    assert "/usr/bin/nvidia-smi" in paths
    mount = next(m for m in edits["mounts"] if m["containerPath"] == "/usr/bin/nvidia-smi")
    assert mount == {
        "hostPath": "/run/nvidia/driver/usr/bin/nvidia-smi",
        "containerPath": "/usr/bin/nvidia-smi",
        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
    }
    # gpunode's hook: one entry running every step in NVIDIA's order, joined by --then
    (hook,) = edits["hooks"]
    assert hook == {
        "hookName": "createContainer",
        "path": "/usr/local/gpunode/bin/gpunode-cdi-hook",
        "args": [
            "gpunode-cdi-hook",
            "create-symlinks",
            "--link",
            f"libcuda.so.1::/{LIBDIR}/libcuda.so",
            "--link",
            f"libnvidia-ml.so.{VERSION}::/{LIBDIR}/libnvidia-ml.so.1",
            "--then",
            "enable-cuda-compat",
            f"--host-driver-version={VERSION}",
            "--then",
            "update-ldcache",
            "--folder",
            f"/{LIBDIR}",
            "--folder",
            "/usr/lib64",
            "--then",
            "disable-device-node-modification",
        ],
    }
    # NVIDIA's hook program: one entry per step, NVIDIA's command lines
    doc, _ = build(files=FILES, hook_path="/usr/bin/nvidia-cdi-hook")
    symlinks, compat, ldcache, nodemod = doc["containerEdits"]["hooks"]
    assert symlinks == {
        "hookName": "createContainer",
        "path": "/usr/bin/nvidia-cdi-hook",
        "args": [
            "nvidia-cdi-hook",
            "create-symlinks",
            "--link",
            f"libcuda.so.1::/{LIBDIR}/libcuda.so",
            "--link",
            f"libnvidia-ml.so.{VERSION}::/{LIBDIR}/libnvidia-ml.so.1",
        ],
    }
    assert compat["args"] == ["nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={VERSION}"]
    assert ldcache["args"] == [
        "nvidia-cdi-hook",
        "update-ldcache",
        "--folder",
        f"/{LIBDIR}",
        "--folder",
        "/usr/lib64",
    ]
    assert nodemod["args"] == ["nvidia-cdi-hook", "disable-device-node-modification"]


def hook_steps(doc: dict[str, Any]) -> list[str]:
    """The hook commands a spec runs, in order: one per entry, or each step of gpunode's --then chain."""
    out: list[str] = []
    for hook in doc["containerEdits"].get("hooks", []):
        args = hook["args"][1:]
        out += [args[0]] + [args[i + 1] for i, a in enumerate(args) if a == "--then"]
    return out


@pytest.mark.parametrize(
    ("disabled", "left"),
    [
        ("", ["create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification"]),
        ("enable-cuda-compat", ["create-symlinks", "update-ldcache", "disable-device-node-modification"]),
        (
            "update-ldcache,chmod",
            ["create-symlinks", "enable-cuda-compat", "disable-device-node-modification"],
        ),
        ("create-symlinks,enable-cuda-compat,update-ldcache", ["disable-device-node-modification"]),
        ("all", []),
    ],
)
def test_disable_hook(disabled: str, left: list[str]) -> None:
    doc, _ = build(files=FILES, disabled_hooks=cdi.parse_disabled_hooks(disabled))
    assert hook_steps(doc) == left
    nvidia, _ = build(
        files=FILES, disabled_hooks=cdi.parse_disabled_hooks(disabled), hook_path="/usr/bin/nvidia-cdi-hook"
    )
    assert [h["args"][1] for h in nvidia["containerEdits"].get("hooks", [])] == left


def test_disable_hook_rejects_an_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown hook 'frob'"):
        cdi.parse_disabled_hooks("create-symlinks,frob")


def test_management_spec_has_only_all() -> None:
    opts = SpecOptions(kind=cdi.MANAGEMENT_KIND, dev_root="/run/nvidia/driver")
    spec, warnings = cdi.build_management_spec(
        FILES, opts, ["/dev/nvidia10", "/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap1"]
    )
    doc = spec.to_dict()
    assert warnings == []
    assert doc["kind"] == "management.nvidia.com/gpu"
    assert names(doc) == ["all"]
    assert nodes(doc, "all") == ["/dev/nvidia2", "/dev/nvidia10", "/dev/nvidia-caps/nvidia-cap1"]
    assert doc["cdiVersion"] == "0.5.0"
    assert doc["containerEdits"]["mounts"]


def test_hooks_through_nvidia_ctk_take_the_hook_subcommand() -> None:
    doc, _ = build(files=FILES, hook_path="/usr/local/nvidia/toolkit/nvidia-ctk")
    for hook in doc["containerEdits"]["hooks"]:
        assert hook["path"] == "/usr/local/nvidia/toolkit/nvidia-ctk"
        assert hook["args"][:2] == ["nvidia-ctk", "hook"]


def test_no_driver_files_gives_only_env() -> None:
    doc, _ = build()
    assert doc["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}


# ----------------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_render_round_trips(fmt: cdi.Format) -> None:
    spec, _ = cdi.build_spec([G0, G1], {1: (M10, M11)}, FILES, SpecOptions(dev_root="/d"), CAPS)
    text = cdi.render(spec, fmt)
    loaded = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert loaded == spec.to_dict()
    assert list(loaded)[:3] == ["cdiVersion", "kind", "devices"]
    assert text == cdi.render(spec, fmt)  # deterministic
    if fmt == "yaml":
        assert "- name: '1:0'" in text
        assert "- name: '0'" in text


@pytest.mark.parametrize(
    ("path", "fmt", "expected"),
    [
        ("/var/run/cdi/nvidia.yaml", None, "yaml"),
        ("/var/run/cdi/nvidia.JSON", None, "json"),
        ("/var/run/cdi/nvidia.json", "yaml", "yaml"),
        ("/etc/cdi/nvidia", None, "yaml"),
        (None, "json", "json"),
    ],
)
def test_format_for(path: str | None, fmt: str | None, expected: str) -> None:
    assert cdi.format_for(path, fmt) == expected


def test_load_spec(tmp_path: Path) -> None:
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "a.com/b", "devices": []}))
    assert cdi.load_spec(good)["kind"] == "a.com/b"
    bad = tmp_path / "s.yaml"
    bad.write_text("- just a list\n")
    with pytest.raises(ValueError, match="not a CDI spec"):
        cdi.load_spec(bad)


# ----------------------------------------------------------------------------------- discovery


def _touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_driver(root: Path, driver_root: str = "run/nvidia/driver") -> Path:
    base = root / driver_root
    lib = base / LIBDIR
    for name in ("libnvidia-ml", "libcuda", "libnvidia-ptxjitcompiler"):
        _touch(lib / f"{name}.so.{VERSION}")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{VERSION}")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")  # a chain
    _touch(lib / "libcuda.so.535.104.05")  # an older driver's leftover: not mounted
    (lib / "libnvidia-nvvm.so.4").symlink_to("libnvidia-nvvm.so.535.104.05")  # dangling
    (lib / "libnvidia-ml.so").symlink_to(f"/{LIBDIR}/libnvidia-ml.so.1")  # absolute, inside the root
    _touch(lib / "libfoo.so.1")
    _touch(base / "usr/lib64" / f"libnvidia-ml.so.{VERSION}")  # more specific dir wins for this one
    _touch(base / "usr/bin/nvidia-smi")
    _touch(base / "usr/sbin/nvidia-persistenced")
    _touch(base / f"lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin")
    _touch(base / f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin")
    for node in ("nvidiactl", "nvidia-uvm"):
        _touch(base / "dev" / node)
    return base


def test_discover_driver(tmp_path: Path) -> None:
    fake_driver(tmp_path)
    host = HostPaths(root=tmp_path, driver_root="/run/nvidia/driver")
    files, warnings = cdi.discover_driver(host, VERSION, dev_root="/run/nvidia/driver")
    assert warnings == []
    assert files.libraries == (
        f"/usr/lib64/libnvidia-ml.so.{VERSION}",
        f"/{LIBDIR}/libcuda.so.{VERSION}",
        f"/{LIBDIR}/libnvidia-ptxjitcompiler.so.{VERSION}",
    )
    assert sorted(files.symlinks, key=lambda t: t[1]) == [
        ("libcuda.so.1", f"/{LIBDIR}/libcuda.so"),
        (f"libcuda.so.{VERSION}", f"/{LIBDIR}/libcuda.so.1"),
        (f"libnvidia-ptxjitcompiler.so.{VERSION}", f"/{LIBDIR}/libnvidia-ptxjitcompiler.so.1"),
    ]
    assert files.binaries == ("/usr/bin/nvidia-smi", "/usr/sbin/nvidia-persistenced")
    assert files.firmware == (
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    )
    assert files.control_nodes == ("/dev/nvidiactl", "/dev/nvidia-uvm")


def test_discover_driver_follows_links_in_the_root(tmp_path: Path) -> None:
    base = tmp_path / "drv"
    lib = base / LIBDIR
    _touch(lib / f"libnvidia-ml.so.{VERSION}")
    (lib / "libnvidia-ml.so").symlink_to(f"/{LIBDIR}/libnvidia-ml.so.{VERSION}")
    files, _ = cdi.discover_driver(HostPaths(root=tmp_path, driver_root="/drv"), VERSION)
    assert files.symlinks == ((f"/{LIBDIR}/libnvidia-ml.so.{VERSION}", f"/{LIBDIR}/libnvidia-ml.so"),)


def test_discover_driver_on_an_empty_root_finds_nothing(tmp_path: Path) -> None:
    host = HostPaths(root=tmp_path, driver_root="/")
    files, warnings = cdi.discover_driver(host, VERSION)
    assert files == DriverFiles(version=VERSION)
    assert warnings == []  # the caller decides: cdi generate exits 1 with this message
    message = cdi.no_libraries_message(host, VERSION)
    assert str(tmp_path) in message
    assert all(sub in message for sub in cdi.LIBRARY_SUBDIRS)


def _elf_library(path: Path, soname: str) -> None:
    """A real shared library with ``soname`` (built with the C compiler), or a skip without one."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a shared library")
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / "x.c"
    src.write_text("int gpunode_test_symbol(void) { return 1; }\n")
    subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(src)], check=True)
    src.unlink()


@pytest.mark.parametrize(
    "layout",
    [
        "usr/lib/x86_64-linux-gnu",
        "lib/x86_64-linux-gnu",
        "usr/lib64",
        "lib64",
        "usr/lib/aarch64-linux-gnu",
        "lib/aarch64-linux-gnu",
        "usr/lib",
    ],
)
def test_discover_driver_in_every_layout(tmp_path: Path, layout: str) -> None:
    """Libraries only (no links, as in a driver tree unpacked without ldconfig): found in every layout,
    the soname link read from the library, NVIDIA's libcuda.so link, NVIDIA_CTK_LIBCUDA_DIR."""
    base = tmp_path / "drv"
    _elf_library(base / layout / f"libcuda.so.{VERSION}", "libcuda.so.1")
    _elf_library(base / layout / f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1")
    _elf_library(base / layout / f"vdpau/libvdpau_nvidia.so.{VERSION}", "libvdpau_nvidia.so.1")
    files, warnings = cdi.discover_driver(HostPaths(root=tmp_path, driver_root="/drv"), VERSION)
    assert warnings == []
    assert sorted(files.libraries) == [
        f"/{layout}/libcuda.so.{VERSION}",
        f"/{layout}/libnvidia-ml.so.{VERSION}",
        f"/{layout}/vdpau/libvdpau_nvidia.so.{VERSION}",
    ]
    assert files.libcuda_dir == f"/{layout}"
    assert sorted(files.symlinks, key=lambda t: t[1]) == [
        ("libcuda.so.1", f"/{layout}/libcuda.so"),
        (f"libcuda.so.{VERSION}", f"/{layout}/libcuda.so.1"),
        (f"libnvidia-ml.so.{VERSION}", f"/{layout}/libnvidia-ml.so.1"),
        (f"libvdpau_nvidia.so.{VERSION}", f"/{layout}/vdpau/libvdpau_nvidia.so.1"),
    ]


def test_discover_driver_merged_usr_takes_each_library_once(tmp_path: Path) -> None:
    base = tmp_path / "drv"
    _touch(base / LIBDIR / f"libcuda.so.{VERSION}")
    (base / "lib").symlink_to("usr/lib")  # merged /usr: lib/x86_64-linux-gnu is the same folder
    files, _ = cdi.discover_driver(HostPaths(root=tmp_path, driver_root="/drv"), VERSION)
    assert files.libraries == (f"/{LIBDIR}/libcuda.so.{VERSION}",)


def test_elf_soname_of_non_libraries(tmp_path: Path) -> None:
    _touch(tmp_path / "empty")
    _touch(tmp_path / "text", "not an ELF file\n")
    (tmp_path / "trunc").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 20)
    for name in ("empty", "text", "trunc", "absent"):
        assert cdi.elf_soname(tmp_path / name) is None


def test_discover_driver_wrong_version_finds_no_libraries(tmp_path: Path) -> None:
    fake_driver(tmp_path)
    files, _ = cdi.discover_driver(HostPaths(root=tmp_path, driver_root="/run/nvidia/driver"), "999.1")
    assert files.libraries == ()
    assert files.symlinks == ()
    assert files.libcuda_dir == ""


def test_read_mig_cap_minors_prefers_the_capability_files(tmp_path: Path) -> None:
    host = HostPaths(root=tmp_path)
    caps = tmp_path / "proc/driver/nvidia/capabilities/gpu1/mig"
    _touch(caps / "gi1/access", "DeviceFileMinor: 112\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    _touch(caps / "gi1/ci0/access", "DeviceFileMinor: 113\n")
    _touch(caps / "gi2/access", "garbage\n")
    _touch(
        tmp_path / "proc/driver/nvidia-caps/mig-minors",
        "config 1\nmonitor 2\ngpu1/gi1/access 12\ngpu1/gi2/access 21\ngpu1/gi2/ci0/access 22\n",
    )
    assert cdi.read_mig_cap_minors(host, [G0, G1], {1: (M10, M11)}) == {
        "gpu1/gi1/access": 112,
        "gpu1/gi1/ci0/access": 113,
        "gpu1/gi2/access": 21,
        "gpu1/gi2/ci0/access": 22,
    }


def test_read_mig_cap_minors_without_proc(tmp_path: Path) -> None:
    assert cdi.read_mig_cap_minors(HostPaths(root=tmp_path), [G1], {1: (M10,)}) == {}


def test_parse_helpers() -> None:
    assert cdi.parse_device_file_minor("DeviceFileMode: 292\nDeviceFileMinor: 7\n") == 7
    assert cdi.parse_device_file_minor("nothing") is None
    assert parse_mig_minors("config 1\nbad line here\ngpu0/gi1/access 12\n") == {
        "config": 1,
        "gpu0/gi1/access": 12,
    }


def test_discovery_reads_nothing_outside_the_host_root(tmp_path: Path) -> None:
    fake_driver(tmp_path)
    host = HostPaths(root=tmp_path, driver_root="/run/nvidia/driver")
    files, _ = cdi.discover_driver(host, VERSION, dev_root="/run/nvidia/driver")
    spec, _ = cdi.build_spec([G0], {}, files, SpecOptions(driver_root="/run/nvidia/driver"), {})
    for mount in spec.to_dict()["containerEdits"]["mounts"]:
        assert mount["hostPath"].startswith("/run/nvidia/driver/")
        assert os.path.exists(tmp_path / mount["hostPath"].lstrip("/"))


# -------------------------------------------------------------------------------- flags and env


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        pytest.param(
            [],
            {},
            {"kind": "nvidia.com/gpu", "hook_path": cdi.DEFAULT_HOOK_PATH, "dev_root": "/"},
            id="defaults",
        ),
        pytest.param(
            ["--vendor", "k8s.device-plugin.nvidia.com"],
            {},
            {"kind": "k8s.device-plugin.nvidia.com/gpu"},
            id="vendor",
        ),
        pytest.param([], {"NVIDIA_CTK_CDI_KIND": "e.com/f"}, {"kind": "e.com/f"}, id="nvidia-env"),
        pytest.param(
            [],
            {"NVIDIA_CTK_CDI_KIND": "e.com/f", "GPUNODE_CDI_KIND": "c.com/d"},
            {"kind": "c.com/d"},
            id="own-env-first",
        ),
        pytest.param(
            ["--kind", "a.com/b"], {"GPUNODE_CDI_KIND": "c.com/d"}, {"kind": "a.com/b"}, id="flag-wins"
        ),
        pytest.param([], {"NVIDIA_CDI_HOOK_PATH": "/opt/hook"}, {"hook_path": "/opt/hook"}, id="hook-env"),
        pytest.param(
            ["--nvidia-cdi-hook-path", "/x/nvidia-ctk"], {}, {"hook_path": "/x/nvidia-ctk"}, id="hook-alias"
        ),
        pytest.param(
            ["--driver-root", "/run/nvidia/driver"],
            {},
            {"driver_root": "/run/nvidia/driver", "dev_root": "/run/nvidia/driver"},
            id="dev-root-follows-driver-root",
        ),
        pytest.param(
            ["--driver-root", "/run/nvidia/driver"],
            {"NVIDIA_DEV_ROOT": "/"},
            {"dev_root": "/"},
            id="dev-root-env",
        ),
        pytest.param(["--no-all-device"], {}, {"all_device": False}, id="no-all-device"),
        pytest.param(
            [], {"GPUNODE_CDI_DEVICE_NAME_STRATEGY": "uuid"}, {"name_strategies": ("uuid",)}, id="names-env"
        ),
    ],
)
def test_spec_options_from_flags(argv: list[str], environ: dict[str, str], expected: dict[str, Any]) -> None:
    from gpunode.toolkit import cdi_cli

    settings = cdi_cli.GENERATE.parser().parse(argv, environ).settings
    opts = cdi_cli.spec_options(settings.cdi, settings.common.driver_root)
    for key, value in expected.items():
        assert getattr(opts, key) == value


def test_watch_from_env() -> None:
    from gpunode.toolkit import cdi_cli

    assert cdi_cli.GENERATE.parser().parse([], {"GPUNODE_CDI_WATCH": "true"}).settings.watch is True
    assert cdi_cli.GENERATE.parser().parse([], {}).settings.watch is False

"""CDI specs for NVIDIA GPUs: pure spec building, the minimum-version table, and host discovery.

A CDI spec (https://github.com/cncf-tags/container-device-interface, ``SPEC.md``) names devices of one
``kind`` (``nvidia.com/gpu``) and says, per device and for the whole spec, which device nodes, mounts,
hooks and environment variables a container gets. A runtime resolves ``nvidia.com/gpu=0`` by applying
the spec-level edits plus device ``0``'s edits.

What :func:`build_spec` writes (the shape ``nvidia-ctk cdi generate`` gives in its default mode):

* devices, in GPU-index order: per GPU ``<index>`` and ``GPU-<uuid>`` (``--device-name-strategy``
  ``index``/``uuid``; ``type-index`` gives ``gpu<index>``), then per MIG device ``<gpu>:<mig>`` and
  ``MIG-<uuid>`` (``type-index``: ``mig<gpu>:<mig>``), and finally ``all`` (the union of every device's
  edits). A GPU device gets ``/dev/nvidia<minor>``; a MIG device gets its parent's node plus the two
  capability nodes ``/dev/nvidia-caps/nvidia-cap<N>`` of its GPU instance and compute instance (a
  missing capability minor is left out with a warning: the simulator has none).
* spec-level edits: ``NVIDIA_VISIBLE_DEVICES=void`` (so the legacy runtime hook adds nothing twice), the
  control nodes that exist (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``,
  ``/dev/nvidia-modeset``), read-only bind mounts (``ro, nosuid, nodev, bind``) of the driver's compute
  and utility libraries of exactly the running driver version, its binaries and GSP firmware, and two
  ``createContainer`` hooks: ``create-symlinks`` for the libraries' ``.so`` links and ``update-ldcache``
  for their directories.

Host discovery (:func:`discover_driver`, :func:`read_mig_cap_minors`) is deliberately simple: instead of
parsing ``/etc/ld.so.cache`` (or running ``ldconfig -p``, which reads the host's cache, not the driver
root's), it scans the usual library directories under the driver root
(:data:`gpunode.common.hostpaths.DRIVER_LIB_SUBDIRS`, most specific first; a library is taken from the
first directory that holds it) for ``<name>.so.<driver version>`` and the symlinks in the same directory
that lead to it. Paths are read through :class:`~gpunode.common.hostpaths.HostPaths` (``root`` is where
the host's ``/`` is visible) and written to the spec as host paths.

``cdiVersion`` is the lowest version whose schema holds everything the spec uses
(:data:`VERSION_RULES`, :func:`minimum_version`), because loaders reject a spec that declares a version
below what its fields need.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import stat
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpunode.common.hostpaths import HostPaths
from gpunode.nvml.api import GpuInfo, MigDevice
from gpunode.nvml.caps import mig_cap_keys, read_mig_minors
from gpunode.toolkit.hook import DEFAULT_HOOK_PATH, is_gpunode_hook

__all__ = [
    "BINARIES",
    "COMPUTE_LIBRARIES",
    "CONTROL_NODES",
    "DEFAULT_HOOK_PATH",
    "DEFAULT_KIND",
    "DEFAULT_OUTPUT",
    "HOOK_COMMANDS",
    "LIBRARY_SUBDIRS",
    "MANAGEMENT_KIND",
    "MODES",
    "MOUNT_OPTIONS",
    "NAME_STRATEGIES",
    "UTILITY_LIBRARIES",
    "VERSION_RULES",
    "CdiDevice",
    "ContainerEdits",
    "DeviceNode",
    "DriverFiles",
    "Hook",
    "Mount",
    "Spec",
    "SpecOptions",
    "build_management_spec",
    "build_spec",
    "common_edits",
    "device_names",
    "discover_driver",
    "discover_nodes",
    "driver_version_from_host",
    "elf_soname",
    "format_for",
    "hooks_enabled",
    "load_spec",
    "make_kind",
    "minimum_version",
    "no_libraries_message",
    "parse_device_file_minor",
    "parse_disabled_hooks",
    "parse_name_strategies",
    "read_mig_cap_minors",
    "render",
    "validate_device_name",
    "validate_kind",
]

DEFAULT_KIND = "nvidia.com/gpu"
MANAGEMENT_KIND = "management.nvidia.com/gpu"
DEFAULT_OUTPUT = "/var/run/cdi/nvidia.yaml"
BASE_VERSION = "0.3.0"

#: ``--mode``: ``nvml`` (``auto`` is the same) names every GPU and MIG device NVML reports;
#: ``management`` names only ``all``: every /dev/nvidia* node found (monitoring containers).
MODES = ("nvml", "auto", "management")
NAME_STRATEGIES = ("index", "uuid", "type-index")
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
#: The hooks a spec may run, in the order they run (``--disable-hook`` takes these names or ``all``).
HOOK_COMMANDS = (
    "create-symlinks",
    "enable-cuda-compat",
    "update-ldcache",
    "disable-device-node-modification",
)
#: NVIDIA's other hook names: accepted by ``--disable-hook`` (gpunode's specs never run them).
_OTHER_NVIDIA_HOOKS = ("chmod", "update-application-profile")

#: Library directories searched under the driver root, most specific first: every layout a driver
#: ships in (Debian/Ubuntu multiarch, RHEL/SUSE lib64, NVIDIA's runfile and its test driver root under
#: lib/, x86_64 and aarch64, merged /usr or not). A library is taken from the first directory that
#: holds it (with merged /usr, lib/... and usr/lib/... are one directory).
LIBRARY_SUBDIRS: tuple[str, ...] = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
)
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")

#: NVIDIA_DRIVER_CAPABILITIES=utility: management (nvidia-smi, DCGM) libraries.
UTILITY_LIBRARIES = ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq")
#: NVIDIA_DRIVER_CAPABILITIES=compute: CUDA and OpenCL driver libraries.
COMPUTE_LIBRARIES = (
    "libcuda",
    "libcudadebugger",
    "libnvidia-allocator",
    "libnvidia-compiler",
    "libnvidia-gpucomp",
    "libnvidia-nvvm",
    "libnvidia-opencl",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-ptxjitcompiler",
)
#: VDPAU: the driver's backend, in the vdpau/ folder of the library directory.
VDPAU_LIBRARY = "vdpau/libvdpau_nvidia"
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
BINARY_SUBDIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
FIRMWARE_SUBDIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")

Format = Literal["yaml", "json"]
Obj = dict[str, Any]  # a CDI spec document, or a part of one, being built (JSON)
Doc = Mapping[str, Any]  # a CDI spec document, or a part of one, being read (JSON/YAML)


# ------------------------------------------------------------------------------------- spec model


@dataclass(frozen=True)
class DeviceNode:
    path: str  # inside the container
    host_path: str | None = None  # None: the same as path

    def to_dict(self) -> Obj:
        out: Obj = {"path": self.path}
        if self.host_path is not None and self.host_path != self.path:
            out["hostPath"] = self.host_path
        return out


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = MOUNT_OPTIONS

    def to_dict(self) -> Obj:
        return {
            "hostPath": self.host_path,
            "containerPath": self.container_path,
            "options": list(self.options),
        }


@dataclass(frozen=True)
class Hook:
    hook_name: str  # createRuntime, createContainer, startContainer, poststart, poststop
    path: str
    args: tuple[str, ...] = ()

    def to_dict(self) -> Obj:
        out: Obj = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        return out


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def to_dict(self) -> Obj:
        """Only the non-empty fields, in the spec's field order."""
        out: Obj = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_dict() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_dict() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_dict() for h in self.hooks]
        return out


@dataclass(frozen=True)
class CdiDevice:
    name: str
    edits: ContainerEdits


@dataclass(frozen=True)
class Spec:
    kind: str
    devices: tuple[CdiDevice, ...]
    edits: ContainerEdits = ContainerEdits()

    @property
    def names(self) -> list[str]:
        """Fully qualified device names: ``nvidia.com/gpu=0``, ..."""
        return [f"{self.kind}={d.name}" for d in self.devices]

    def to_dict(self) -> Obj:
        """The document, ``cdiVersion`` first, stamped with the minimum version its content needs."""
        body: Obj = {
            "kind": self.kind,
            "devices": [{"name": d.name, "containerEdits": d.edits.to_dict()} for d in self.devices],
        }
        edits = self.edits.to_dict()
        if edits:
            body["containerEdits"] = edits
        return {"cdiVersion": minimum_version(body), **body}


# ---------------------------------------------------------------------------------- cdiVersion table


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _all_edits(spec: Doc) -> list[Doc]:
    edits = [d.get("containerEdits") or {} for d in spec.get("devices") or ()]
    edits.append(spec.get("containerEdits") or {})
    return edits


def _any_edit(spec: Doc, test: Callable[[Doc], bool]) -> bool:
    return any(test(e) for e in _all_edits(spec))


def _uses_annotations(spec: Doc) -> bool:
    return bool(spec.get("annotations")) or any(d.get("annotations") for d in spec.get("devices") or ())


def _dotted_class(spec: Doc) -> bool:
    kind = str(spec.get("kind", ""))
    return "/" in kind and "." in kind.split("/", 1)[1]


def _digit_first_name(spec: Doc) -> bool:
    return any(str(d.get("name", "a"))[:1].isdigit() for d in spec.get("devices") or ())


def _node_host_path(edits: Doc) -> bool:
    return any(n.get("hostPath") for n in edits.get("deviceNodes") or ())


def _mount_type(edits: Doc) -> bool:
    return any(m.get("type") for m in edits.get("mounts") or ())


#: (version, what needs it, test on the spec document). The CDI spec's version history: 0.3.0 is the
#: first tagged spec (env, deviceNodes, mounts, hooks); 0.4.0 added ``mounts[].type``; 0.5.0 added
#: ``deviceNodes[].hostPath`` and allowed device names that start with a digit; 0.6.0 added
#: ``annotations`` (spec and device) and dots in the class part of ``kind``; 0.7.0 added ``intelRdt``
#: and ``additionalGids``; 1.1.0 added ``netDevices``. (0.8.0 and 1.0.0 changed only the Go API.)
VERSION_RULES: tuple[tuple[str, str, Callable[[Doc], bool]], ...] = (
    ("0.4.0", "mounts[].type", lambda s: _any_edit(s, _mount_type)),
    ("0.5.0", "deviceNodes[].hostPath", lambda s: _any_edit(s, _node_host_path)),
    ("0.5.0", "a device name starting with a digit", _digit_first_name),
    ("0.6.0", "annotations", _uses_annotations),
    ("0.6.0", "a dot in the class of kind", _dotted_class),
    ("0.7.0", "containerEdits.intelRdt", lambda s: _any_edit(s, lambda e: "intelRdt" in e)),
    (
        "0.7.0",
        "containerEdits.additionalGids",
        lambda s: _any_edit(s, lambda e: bool(e.get("additionalGids"))),
    ),
    ("1.1.0", "containerEdits.netDevices", lambda s: _any_edit(s, lambda e: bool(e.get("netDevices")))),
)


def minimum_version(spec: Doc) -> str:
    """The lowest ``cdiVersion`` that can hold ``spec`` (a spec document, with or without cdiVersion)."""
    needed = BASE_VERSION
    for version, _, test in VERSION_RULES:
        if _version_key(version) > _version_key(needed) and test(spec):
            needed = version
    return needed


# ------------------------------------------------------------------------------------------ names

_VENDOR = re.compile(r"^[A-Za-z](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def validate_kind(kind: str) -> str:
    """``vendor/class`` as CDI allows it (letters, digits, ``-_.``; starting with a letter, ending with
    a letter or digit); ``ValueError`` naming what is wrong otherwise."""
    vendor, sep, klass = kind.partition("/")
    if not sep:
        raise ValueError(f"CDI kind {kind!r} is not of the form vendor/class (e.g. nvidia.com/gpu)")
    if not _VENDOR.match(vendor):
        raise ValueError(f"CDI kind {kind!r}: invalid vendor {vendor!r}")
    if not _CLASS.match(klass):
        raise ValueError(f"CDI kind {kind!r}: invalid class {klass!r}")
    return kind


def make_kind(vendor: str, klass: str, kind: str | None = None) -> str:
    """``kind`` when given, else ``vendor/class``; validated."""
    return validate_kind(kind if kind else f"{vendor}/{klass}")


def validate_device_name(name: str) -> str:
    if not _DEVICE.match(name):
        raise ValueError(f"invalid CDI device name {name!r}")
    return name


def parse_name_strategies(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"index,uuid"`` -> ``("index", "uuid")``; ``ValueError`` for an unknown or empty strategy list."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = tuple(dict.fromkeys(s.strip() for s in items if s.strip()))
    if not out:
        raise ValueError("at least one device name strategy is needed (index, uuid, type-index)")
    for s in out:
        if s not in NAME_STRATEGIES:
            raise ValueError(f"unknown device name strategy {s!r}; choose from {', '.join(NAME_STRATEGIES)}")
    return out


def device_names(strategies: Sequence[str], index: str, uuid: str, mig: bool) -> list[str]:
    """A device's names under ``strategies``, in that order (duplicates dropped)."""
    names: list[str] = []
    for s in strategies:
        if s == "index":
            names.append(index)
        elif s == "uuid":
            names.append(uuid)
        elif s == "type-index":
            names.append(("mig" if mig else "gpu") + index)
    return list(dict.fromkeys(names))


# ------------------------------------------------------------------------------------ driver files


@dataclass(frozen=True)
class DriverFiles:
    """What :func:`discover_driver` found, as paths relative to the driver root (``/usr/bin/nvidia-smi``)."""

    version: str = ""
    libraries: tuple[str, ...] = ()
    symlinks: tuple[tuple[str, str], ...] = ()  # (target as the link holds it, link path)
    binaries: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()
    control_nodes: tuple[str, ...] = ()  # container paths under /dev that exist under the dev root
    libcuda_dir: str = ""  # the folder of libcuda.so.<version> ("" when absent)


@dataclass(frozen=True)
class SpecOptions:
    kind: str = DEFAULT_KIND
    name_strategies: tuple[str, ...] = ("index", "uuid")
    all_device: bool = True
    driver_root: str = "/"  # host path
    dev_root: str = "/"  # host path under which /dev lives
    hook_path: str = DEFAULT_HOOK_PATH
    env: tuple[str, ...] = ("NVIDIA_VISIBLE_DEVICES=void",)
    disabled_hooks: frozenset[str] = frozenset()  # HOOK_COMMANDS names left out
    mode: str = "nvml"


def _host(root: str, path: str) -> str:
    """A container path as a host path under ``root`` (a host path)."""
    return posixpath.normpath(posixpath.join(root, path.lstrip("/")))


def _node(path: str, dev_root: str) -> DeviceNode:
    return DeviceNode(path, _host(dev_root, path))


def _node_key(node: DeviceNode) -> tuple[str, int, str]:
    """Natural order: /dev/nvidia2 before /dev/nvidia10."""
    match = re.match(r"^(.*?)(\d+)$", node.path)
    if match is None:
        return (node.path, -1, node.path)
    return (match[1], int(match[2]), node.path)


def _hook_args(hook_path: str, command: str, args: Iterable[str]) -> tuple[str, ...]:
    """argv for a hook: ``nvidia-cdi-hook <command> ...``, or ``nvidia-ctk hook <command> ...`` when the
    hook path is nvidia-ctk itself (older toolkits)."""
    argv0 = posixpath.basename(hook_path) or hook_path
    head = (argv0, "hook") if argv0 == "nvidia-ctk" else (argv0,)
    return (*head, command, *args)


def parse_disabled_hooks(text: str | Sequence[str]) -> frozenset[str]:
    """``--disable-hook``: hook names (comma-separated or a list) or ``all``; ``ValueError`` for an
    unknown name."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = {s.strip() for s in items if s.strip()}
    if "all" in names:
        return frozenset(HOOK_COMMANDS)
    for name in sorted(names):
        if name not in HOOK_COMMANDS and name not in _OTHER_NVIDIA_HOOKS:
            raise ValueError(f"unknown hook {name!r}; choose from all, {', '.join(HOOK_COMMANDS)}")
    return frozenset(names & set(HOOK_COMMANDS))


def hooks_enabled(opts: SpecOptions) -> bool:
    """Whether the spec runs any hook (so ``hook_path`` must exist)."""
    return not set(HOOK_COMMANDS) <= opts.disabled_hooks


def common_edits(files: DriverFiles, opts: SpecOptions) -> ContainerEdits:
    """The spec-level edits: env, control nodes, driver mounts and the hooks, in NVIDIA's order:
    ``create-symlinks``, ``enable-cuda-compat``, ``update-ldcache``,
    ``disable-device-node-modification`` (each unless disabled). With gpunode's hook program they are
    one hook entry, the steps joined by ``--then`` (one process per container start instead of four);
    any other ``--hook-path`` (NVIDIA's) gets one entry per step."""
    nodes = tuple(_node(p, opts.dev_root) for p in CONTROL_NODES if p in files.control_nodes)
    mount_paths = sorted({*files.libraries, *files.binaries, *files.firmware})
    mounts = tuple(Mount(_host(opts.driver_root, p), p) for p in mount_paths)
    env = opts.env
    if files.libcuda_dir:
        env = (*env, f"NVIDIA_CTK_LIBCUDA_DIR={files.libcuda_dir}")
    wanted: list[tuple[str, list[str]]] = []
    if files.symlinks:
        links: list[str] = []
        for target, link in sorted(files.symlinks, key=lambda t: t[1]):
            links += ["--link", f"{target}::{link}"]
        wanted.append(("create-symlinks", links))
    if files.libcuda_dir and files.version:
        wanted.append(("enable-cuda-compat", [f"--host-driver-version={files.version}"]))
    folders = sorted({posixpath.dirname(p) for p in files.libraries})
    if folders:
        wanted.append(("update-ldcache", [a for folder in folders for a in ("--folder", folder)]))
    if files.libraries:
        wanted.append(("disable-device-node-modification", []))
    steps = [(command, args) for command, args in wanted if command not in opts.disabled_hooks]
    if is_gpunode_hook(opts.hook_path) and len(steps) > 1:
        # gpunode's hook runs every step, in the same order, in one process (docs/cdi.md, "Speed")
        chained: list[str] = []
        for command, args in steps:
            chained += [*(["--then"] if chained else []), command, *args]
        hooks: tuple[Hook, ...] = (
            Hook("createContainer", opts.hook_path, _hook_args(opts.hook_path, chained[0], chained[1:])),
        )
    else:
        hooks = tuple(
            Hook("createContainer", opts.hook_path, _hook_args(opts.hook_path, command, args))
            for command, args in steps
        )
    return ContainerEdits(env=env, device_nodes=nodes, mounts=mounts, hooks=hooks)


def build_management_spec(
    files: DriverFiles, opts: SpecOptions, device_nodes: Sequence[str]
) -> tuple[Spec, list[str]]:
    """``--mode management``: one device, ``all``, holding every GPU and MIG capability node found
    (``device_nodes``: container paths from :func:`discover_nodes`), plus the usual spec-level edits;
    no NVML enumeration, so it stays valid across MIG changes (what monitoring containers use)."""
    validate_kind(opts.kind)
    nodes = tuple(sorted((_node(p, opts.dev_root) for p in device_nodes), key=_node_key))
    warnings = [] if nodes else [f"no GPU device nodes under {opts.dev_root}/dev"]
    devices = (CdiDevice("all", ContainerEdits(device_nodes=nodes)),) if nodes else ()
    return Spec(opts.kind, devices, common_edits(files, opts)), warnings


def build_spec(
    gpus: Sequence[GpuInfo],
    migs: Mapping[int, Sequence[MigDevice]],
    files: DriverFiles,
    opts: SpecOptions,
    cap_minors: Mapping[str, int],
) -> tuple[Spec, list[str]]:
    """The spec for ``gpus`` and their MIG devices (``migs`` by GPU index), and warnings.

    ``cap_minors`` maps capability names (:func:`gpunode.nvml.caps.mig_cap_keys`) to ``/dev/nvidia-caps``
    minors; a missing one is left out of the MIG device's nodes with a warning. Pure; raises
    ``ValueError`` for an invalid kind or a device name CDI does not allow.
    """
    validate_kind(opts.kind)
    warnings: list[str] = []
    devices: list[CdiDevice] = []
    every: dict[str, DeviceNode] = {}

    def add(names: Sequence[str], nodes: Sequence[DeviceNode]) -> None:
        edits = ContainerEdits(device_nodes=tuple(nodes))
        for name in names:
            devices.append(CdiDevice(validate_device_name(name), edits))
        for n in nodes:
            every.setdefault(n.path, n)

    for gpu in sorted(gpus, key=lambda g: g.index):
        gpu_node = _node(f"/dev/nvidia{gpu.minor}", opts.dev_root)
        add(device_names(opts.name_strategies, str(gpu.index), gpu.uuid, mig=False), [gpu_node])
        for mig in sorted(migs.get(gpu.index, ()), key=lambda m: m.index):
            nodes = [gpu_node]
            for key in mig_cap_keys(gpu.minor, mig.gi_id, mig.ci_id):
                minor = cap_minors.get(key)
                if minor is None:
                    warnings.append(f"MIG device {mig.uuid}: no device minor for capability {key}; left out")
                else:
                    nodes.append(_node(f"/dev/nvidia-caps/nvidia-cap{minor}", opts.dev_root))
            index = f"{gpu.index}:{mig.index}"
            add(device_names(opts.name_strategies, index, mig.uuid, mig=True), nodes)

    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate CDI device names: {', '.join(dup)}")
    if opts.all_device and devices:
        if "all" in names:
            raise ValueError("a device is named 'all'; use --no-all-device")
        devices.append(
            CdiDevice("all", ContainerEdits(device_nodes=tuple(sorted(every.values(), key=_node_key))))
        )
    return Spec(opts.kind, tuple(devices), common_edits(files, opts)), warnings


# ------------------------------------------------------------------------------------ rendering


_NUMBERISH = re.compile(r"^[0-9][0-9:._-]*$")


def format_for(path: str | None, fmt: str | None) -> Format:
    """``fmt`` when given, else from the file name: ``.json`` -> json, anything else yaml."""
    if fmt:
        if fmt not in ("yaml", "json"):
            raise ValueError(f"unknown format {fmt!r}; choose yaml or json")
        return "json" if fmt == "json" else "yaml"
    return "json" if path and path.lower().endswith(".json") else "yaml"


def render(spec: Spec | Doc, fmt: Format = "yaml") -> str:
    """The spec as text (deterministic: built in a fixed order, no timestamps)."""
    doc = spec.to_dict() if isinstance(spec, Spec) else dict(spec)
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    import yaml  # only when writing YAML

    class Dumper(yaml.SafeDumper):
        pass

    def quoted_numbers(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        # "0" and "1:0" stay strings for every reader (YAML 1.1 reads 1:0 as a base-60 integer)
        style = "'" if _NUMBERISH.match(value) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, quoted_numbers)
    text: str = yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=1000)
    return "---\n" + text


def load_spec(path: Path) -> Obj:
    """A spec file (YAML or JSON); ``ValueError`` when it is not a mapping with ``kind`` and ``devices``."""
    from gpunode.common.errors import ConfigError
    from gpunode.common.safeyaml import parse_yaml, read_config_text

    try:  # the one safe loader for YAML: size, depth and alias limits
        text = read_config_text(path)
        if path.suffix.lower() == ".json":
            try:
                doc = json.loads(text)
            except RecursionError:
                raise ConfigError(str(path), ["nested too deeply"]) from None
        else:
            doc = parse_yaml(text, str(path))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(doc, dict) or "kind" not in doc or not isinstance(doc.get("devices"), list):
        raise ValueError(f"{path}: not a CDI spec (needs kind and devices)")
    return doc


# ------------------------------------------------------------------------------------ discovery


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _resolve_link(host: HostPaths, link: str, max_hops: int = 8) -> str | None:
    """Follow a symlink inside the driver root (absolute targets stay inside it); the final path
    relative to the driver root, or None when it loops or dangles."""
    current = link
    for _ in range(max_hops):
        local = host.driver(current)
        if not local.is_symlink():
            return current if local.exists() else None
        target = os.readlink(local)
        current = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
    return None


def _library_dirs(host: HostPaths) -> list[str]:
    return ["/" + sub for sub in LIBRARY_SUBDIRS if host.driver(sub).is_dir()]


def elf_soname(path: Path) -> str | None:
    """The ``DT_SONAME`` of a shared library (``libcuda.so.1``), or None when ``path`` is not an ELF
    file with one (read through the program headers: PT_DYNAMIC, then DT_STRTAB mapped by PT_LOAD)."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
                return None
            is64 = head[4] == 2
            end = "<" if head[5] == 1 else ">"
            if is64:
                (phoff,) = struct.unpack_from(end + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
            else:
                (phoff,) = struct.unpack_from(end + "I", head, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
            if not 0 < phnum <= 512 or phentsize < (56 if is64 else 32):
                return None
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            loads: list[tuple[int, int, int]] = []
            dynamic: tuple[int, int] | None = None
            for i in range(phnum):
                if is64:
                    p_type, _, offset, vaddr, _, filesz = struct.unpack_from(
                        end + "IIQQQQ", table, i * phentsize
                    )
                else:
                    p_type, offset, vaddr, _, filesz = struct.unpack_from(end + "IIIII", table, i * phentsize)
                if p_type == 1:  # PT_LOAD
                    loads.append((vaddr, offset, filesz))
                elif p_type == 2:  # PT_DYNAMIC
                    dynamic = (offset, filesz)
            if dynamic is None:
                return None
            f.seek(dynamic[0])
            data = f.read(min(dynamic[1], 1 << 20))
            entry = end + ("qQ" if is64 else "iI")
            size = struct.calcsize(entry)
            strtab: int | None = None
            soname: int | None = None
            for at in range(0, len(data) - size + 1, size):
                tag, value = struct.unpack_from(entry, data, at)
                if tag == 0:  # DT_NULL
                    break
                if tag == 5:  # DT_STRTAB
                    strtab = value
                elif tag == 14:  # DT_SONAME
                    soname = value
            if strtab is None or soname is None:
                return None
            for vaddr, offset, filesz in loads:
                if vaddr <= strtab < vaddr + filesz:
                    f.seek(offset + (strtab - vaddr) + soname)
                    name = f.read(256).split(b"\0", 1)[0].decode("ascii")
                    return name if name and "/" not in name else None
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def discover_driver(
    host: HostPaths,
    driver_version: str,
    dev_root: str = "/",
    libraries: Sequence[str] = UTILITY_LIBRARIES + COMPUTE_LIBRARIES,
) -> tuple[DriverFiles, list[str]]:
    """Scan the driver root (``host.driver_dir``) for the driver's files, and ``dev_root`` (a host path,
    under ``host.root``) for the control device nodes. Returns the files and warnings.

    Links for the container: the symlinks beside each library that lead to it (its soname link and
    development links, as the driver installed them), the soname link read from the library's
    ``DT_SONAME`` when the driver root lacks it, and NVIDIA's ``libcuda.so -> libcuda.so.1``."""
    warnings: list[str] = []
    libs: list[str] = []
    links: dict[str, str] = {}  # link path -> target
    wanted = {f"{name}.so.{driver_version}": name for name in libraries}
    wanted[f"{posixpath.basename(VDPAU_LIBRARY)}.so.{driver_version}"] = posixpath.basename(VDPAU_LIBRARY)
    found: set[str] = set()
    libcuda_dir = ""
    for directory in _library_dirs(host):
        for sub in ("", posixpath.dirname(VDPAU_LIBRARY)):
            folder = posixpath.join(directory, sub) if sub else directory
            try:
                entries = sorted(os.scandir(host.driver(folder)), key=lambda e: e.name)
            except OSError:
                continue
            is_vdpau = bool(sub)
            here = [
                e.name
                for e in entries
                if e.name in wanted
                and e.name not in found
                and e.name.startswith("libvdpau_nvidia") == is_vdpau
                and _is_file(Path(e.path))
            ]
            for name in here:
                found.add(name)
                libs.append(posixpath.join(folder, name))
                if name.startswith("libcuda.so."):
                    libcuda_dir = folder
            if not here:
                continue
            targets = {posixpath.join(folder, name) for name in here}
            stems = tuple(wanted[name] + ".so" for name in here)
            for entry in entries:
                if not entry.name.startswith(stems) or not entry.is_symlink():
                    continue
                path = posixpath.join(folder, entry.name)
                if _resolve_link(host, path) in targets:
                    links[path] = os.readlink(entry.path)
            for name in here:
                soname = elf_soname(host.driver(posixpath.join(folder, name)))
                if soname and soname != name and soname.startswith(wanted[name] + ".so"):
                    links.setdefault(posixpath.join(folder, soname), name)
    if libcuda_dir:
        links.setdefault(posixpath.join(libcuda_dir, "libcuda.so"), "libcuda.so.1")
    missing = sorted(set(wanted) - found)
    if libs:
        essential = [m for m in missing if m.startswith(("libnvidia-ml.", "libcuda."))]
        if essential:
            warnings.append(f"driver libraries not found: {', '.join(essential)}")

    binaries: list[str] = []
    for name in BINARIES:
        for sub in BINARY_SUBDIRS:
            if _is_file(host.driver(f"{sub}/{name}")):
                binaries.append(f"/{sub}/{name}")
                break

    firmware: list[str] = []
    for sub in FIRMWARE_SUBDIRS:
        fw_dir = host.driver(f"{sub}/{driver_version}")
        if fw_dir.is_dir():
            firmware = sorted(f"/{sub}/{driver_version}/{p.name}" for p in fw_dir.iterdir() if _is_file(p))
            break

    dev_base = host.host(dev_root)
    control = tuple(p for p in CONTROL_NODES if (dev_base / p.lstrip("/")).exists())
    files = DriverFiles(
        version=driver_version,
        libraries=tuple(libs),
        symlinks=tuple((target, link) for link, target in sorted(links.items())),
        binaries=tuple(binaries),
        firmware=tuple(firmware),
        control_nodes=control,
        libcuda_dir=libcuda_dir,
    )
    return files, warnings


def no_libraries_message(host: HostPaths, driver_version: str) -> str:
    """What ``cdi generate`` says when the driver root holds no driver library."""
    return (
        f"no driver libraries of version {driver_version} under the driver root {host.driver_dir} "
        f"(searched {', '.join(LIBRARY_SUBDIRS)}); a spec without them gives containers no "
        "libcuda/libnvidia-ml. Point --driver-root (NVIDIA_DRIVER_ROOT) at the driver's files, or pass "
        "--allow-missing-libraries to write the spec anyway"
    )


_GPU_NODE = re.compile(r"^nvidia(\d+)$")
_KERNEL_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_LIB_VERSION = re.compile(r"^libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


def driver_version_from_host(host: HostPaths) -> str | None:
    """The driver version without NVML (``--mode management``): the loaded kernel module's
    (``/proc/driver/nvidia/version``), else the highest ``libnvidia-ml.so.<version>`` in the driver
    root's library folders; None when neither is there."""
    try:
        match = _KERNEL_VERSION.search((host.proc_driver_nvidia / "version").read_text(errors="replace"))
    except OSError:
        match = None
    if match:
        return match[1]
    found: list[str] = []
    for directory in _library_dirs(host):
        with contextlib.suppress(OSError):
            found += [m[1] for e in os.scandir(host.driver(directory)) if (m := _LIB_VERSION.match(e.name))]
    return max(found, key=_version_key) if found else None


def discover_nodes(host: HostPaths, dev_root: str = "/") -> list[str]:
    """Every GPU node ``/dev/nvidia<N>`` and MIG capability node ``/dev/nvidia-caps/nvidia-cap<N>``
    under ``dev_root`` (container paths), for ``--mode management``."""
    base = host.host(dev_root) / "dev"
    out: list[str] = []
    with contextlib.suppress(OSError):
        out += [f"/dev/{e.name}" for e in os.scandir(base) if _GPU_NODE.match(e.name)]
    with contextlib.suppress(OSError):
        out += [
            f"/dev/nvidia-caps/{e.name}"
            for e in os.scandir(base / "nvidia-caps")
            if e.name.startswith("nvidia-cap")
        ]
    return out


_MINOR_LINE = re.compile(r"^\s*DeviceFileMinor\s*:\s*(\d+)\s*$", re.MULTILINE)


def parse_device_file_minor(text: str) -> int | None:
    """``DeviceFileMinor: 12`` from a ``/proc/driver/nvidia/capabilities/.../access`` file."""
    match = _MINOR_LINE.search(text)
    return int(match[1]) if match else None


def read_mig_cap_minors(
    host: HostPaths, gpus: Sequence[GpuInfo], migs: Mapping[int, Sequence[MigDevice]]
) -> dict[str, int]:
    """Device minors of the MIG capabilities the devices need: each from its ``DeviceFileMinor`` in
    ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>[/ci<id>]/access``, else from
    ``/proc/driver/nvidia-caps/mig-minors``; absent ones are simply not in the result."""
    table: dict[str, int] | None = None
    caps = host.proc_driver_nvidia / "capabilities"
    out: dict[str, int] = {}
    for gpu in gpus:
        for mig in migs.get(gpu.index, ()):
            for key in mig_cap_keys(gpu.minor, mig.gi_id, mig.ci_id):
                gpu_part, rest = key.split("/", 1)
                try:
                    minor = parse_device_file_minor((caps / gpu_part / "mig" / rest).read_text())
                except OSError:
                    minor = None
                if minor is None:
                    if table is None:
                        table = read_mig_minors(host) or {}
                    minor = table.get(key)
                if minor is not None:
                    out[key] = minor
    return out

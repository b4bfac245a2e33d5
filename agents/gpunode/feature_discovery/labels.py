"""GFD's node labels, computed purely from :class:`NodeFacts` (no NVML, no files, no clock).

Every key is NVIDIA GPU Feature Discovery's (k8s-device-plugin v0.20 semantics), in the ``nvidia.com/``
namespace: ``gfd.timestamp``, ``cuda.driver.*``, ``cuda.driver-version.*``, ``cuda.runtime.*``,
``cuda.runtime-version.*``, ``gpu.machine``, ``gpu.count``, ``gpu.product``, ``gpu.memory``,
``gpu.replicas``, ``gpu.sharing-strategy``, ``gpu.family``, ``gpu.compute.major``/``.minor``,
``gpu.mode``, ``mig.capable``, ``mig.strategy``, ``mps.capable``, ``vgpu.present``, ``gpu.clique``, the
MIG ``single`` attributes (``gpu.multiprocessors``, ``gpu.slices.*``, ``gpu.engines.*``) and the MIG
``mixed`` groups (``mig-<profile>.*``, with ``+`` in the profile written as ``.``).

Rules, as NVIDIA's GFD applies them:

* With no GPU at all only ``vgpu.present`` (and ``gfd.timestamp``) are written.
* ``gpu.product`` / ``gpu.machine`` are sanitised (:func:`sanitize`); a product is
  ``<model>[-MIG-<profile>][-SHARED]``: ``-SHARED`` when the resource has more than one replica and is
  not renamed (``rename`` on its entry or ``renameByDefault``).
* Replicas: ``0`` for a model whose GPUs all have MIG enabled (the full-GPU view of MIG GPUs carries no
  sharing), else the configured replicas of the resource, else ``1``; ``sharing-strategy`` is
  ``time-slicing`` (or ``mps`` under ``sharing.mps``) when replicas > 1, else ``none``.
* ``mps.capable``: ``true`` when the sharing strategy is MPS, else ``false``. MPS sharing with a GPU
  that has MIG enabled is refused (:class:`MpsMigRefused`, the agent exits 2), as NVIDIA's GFD fails.
* ``gpu.memory`` is omitted when NVML reports 0 MiB (unified-memory parts); family and compute labels are
  omitted when the compute capability major is 0.
* ``gpu.mode``: every GPU's PCI class ``0x0302xx`` -> ``compute``, every one ``0x0300xx`` ->
  ``graphics``; anything else, a mix, or an unreadable class -> ``unknown``.
* MIG ``single``: when every GPU has MIG enabled, each has MIG devices and they all share one profile,
  the ``gpu.*`` labels describe the MIG devices (count = all MIG devices of the node, memory and
  attributes of the profile, family/compute of the parent). Otherwise -- MIG-enabled GPU without MIG
  devices, MIG-enabled beside MIG-disabled GPUs, or several profiles -- ``gpu.product`` is
  ``<model of the first MIG-enabled GPU>-MIG-INVALID`` with count, replicas and memory ``0`` and an
  empty ``sharing-strategy``, and a warning says why. With no MIG-enabled GPU, single labels as none.
* MIG ``mixed``: full-GPU labels for all physical GPUs plus one ``mig-<profile>.*`` group per profile
  (attributes from the profile's first MIG device, by GPU index then MIG index); MIG-enabled GPUs
  without MIG devices contribute nothing to the groups.
* ``gpu.clique`` is written when every fabric-attached GPU reports the same clique; disagreement is a
  warning and no label.

Deliberate deviations from NVIDIA's GFD (each one replaces a random or fatal behaviour):

* **Heterogeneous nodes.** NVIDIA writes the ``gpu.*`` labels once per model, in Go map order, so a random
  model wins. Here the ``gpu.*`` labels describe the model with the most GPUs (ties: the model whose first
  GPU has the lowest index); ``gpu.count`` counts that model only, and a ``multiple GPU models`` warning
  names every model. ``gpu.mode`` and ``mig.capable`` still look at every GPU.
* **Label values are always valid.** A value longer than 63 characters, with characters outside
  ``[A-Za-z0-9._-]`` or not starting and ending alphanumeric would be dropped by NFD; it is rewritten by
  :func:`make_valid` and the change recorded in :attr:`LabelResult.adjusted` (never silently dropped).
* **A driver version that is not ``major.minor[.rev]``** is fatal in NVIDIA's GFD; here the driver
  labels are left out with a warning and the rest are still written.
* **Several time-slicing entries for one resource** (this project's per-device ``devices`` selections):
  the labels show the first entry's replicas, with a warning when the entries disagree.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpunode.api.plugin_types import MigStrategy, TimeSlicing
from gpunode.nvml.api import GpuInfo, MigDevice, SystemInfo

__all__ = [
    "MAX_VALUE_LENGTH",
    "MIG_STRATEGIES",
    "PREFIX",
    "LabelResult",
    "MpsMigRefused",
    "NodeFacts",
    "compute_labels",
    "family",
    "make_valid",
    "sanitize",
    "split_driver_version",
    "valid_label_value",
]

PREFIX = "nvidia.com/"
MIG_STRATEGIES = ("none", "single", "mixed")
MAX_VALUE_LENGTH = 63
FULL_GPU_RESOURCE = "nvidia.com/gpu"
_HASH_CHARS = 8

_UNSANITARY = re.compile(r"[^A-Za-z0-9 _.-]")
_VALID_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_EDGE_JUNK = "-_."

PCI_CLASS_3D = 0x0302  # class/subclass of a 3D controller (datacenter GPUs)
PCI_CLASS_VGA = 0x0300  # class/subclass of a VGA controller (display GPUs)


# --------------------------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class NodeFacts:
    """Everything the labels are computed from.

    ``gpus`` are the GPUs NVML can reach (lost GPUs are simply absent); ``mig_devices`` maps a
    MIG-enabled GPU's index to its MIG devices; ``pci_classes`` maps a GPU index to its PCI class
    (``0x030200``), ``None`` or absent when unreadable; ``machine`` is the raw DMI product name (``None``:
    unreadable); ``cliques`` maps a GPU index to ``"<clusterUUID>.<cliqueId>"`` for fabric-attached GPUs.
    """

    system: SystemInfo | None
    gpus: tuple[GpuInfo, ...]
    mig_devices: Mapping[int, tuple[MigDevice, ...]]
    pci_classes: Mapping[int, int | None]
    machine: str | None
    vgpu_present: bool = False
    cliques: Mapping[int, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class LabelResult:
    """The labels, what the caller should log, and every value changed to be a valid label value.

    ``adjusted`` holds ``(key, original value, written value)``; callers log each entry.
    """

    labels: dict[str, str]
    warnings: tuple[str, ...]
    adjusted: tuple[tuple[str, str, str], ...]


# ------------------------------------------------------------------------------------------ helpers


def sanitize(text: str) -> str:
    """GFD's sanitiser: drop characters outside ``[A-Za-z0-9 _.-]``, then join the words with ``-``."""
    return "-".join(_UNSANITARY.sub("", text).split())


def family(major: int, minor: int) -> str:
    """The architecture family of a compute capability, as GFD names it (``undefined`` if unknown)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
        13: "rubin",
    }.get(major, "undefined")


def split_driver_version(v: str) -> tuple[str, str, str]:
    """``"550.54.15"`` -> ``("550", "54", "15")``; ``"400.300"`` -> ``("400", "300", "")``.

    Parts are kept as text (leading zeros stay); ``ValueError`` unless there are 2 or 3 parts.
    """
    parts = v.split(".")
    if len(parts) not in (2, 3):
        raise ValueError(f"driver version {v!r} is not major.minor[.revision]")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def valid_label_value(v: str) -> bool:
    """A Kubernetes label value: empty, or up to 63 of ``[A-Za-z0-9._-]`` with alphanumeric ends."""
    return len(v) <= MAX_VALUE_LENGTH and _VALID_VALUE.match(v) is not None


def make_valid(key: str, value: str) -> str:
    """``value`` unchanged if it is a valid label value, else the closest valid one.

    Invalid characters go the way :func:`sanitize` sends them, non-alphanumeric ends are trimmed; a value
    still longer than 63 characters keeps its head and gets ``-<8 hex digits of sha256(value)>``, so two
    long values sharing a prefix stay distinct. For ``*.product`` keys the informative tail
    (``-MIG-<profile>[-SHARED]`` or ``-SHARED``) is kept and the model part shortened instead. A value with
    nothing valid in it becomes empty.
    """
    if valid_label_value(value):
        return value
    cleaned = sanitize(value).strip(_EDGE_JUNK)
    if len(cleaned) <= MAX_VALUE_LENGTH:
        return cleaned
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    tail = _product_tail(cleaned) if key.endswith(".product") else ""
    budget = MAX_VALUE_LENGTH - len(tail) - 1 - _HASH_CHARS
    if budget < _HASH_CHARS:  # the tail itself is too long to keep
        tail, budget = "", MAX_VALUE_LENGTH - 1 - _HASH_CHARS
    head = cleaned[:budget].rstrip(_EDGE_JUNK)
    return f"{head}-{digest}{tail}"


def _product_tail(product: str) -> str:
    index = product.find("-MIG-")
    if index > 0:
        return product[index:]
    return "-SHARED" if product.endswith("-SHARED") else ""


def _product(parts: Iterable[str], *, shared: bool) -> str:
    names = [sanitize(p) for p in parts if p]
    if shared:
        names.append("SHARED")
    return "-".join(names)


def _key(resource: str, suffix: str) -> str:
    return f"{resource}.{suffix}"


def _profile_name(device: MigDevice) -> str:
    """The profile as GFD spells it in keys and products: ``1g.5gb+me`` -> ``1g.5gb.me``."""
    return device.profile.replace("+", ".")


@dataclass(frozen=True)
class _Sharing:
    replicas: int
    strategy: str
    shared_suffix: bool


def _sharing(resource: str, sharing: TimeSlicing | None, *, enabled: bool, warnings: list[str]) -> _Sharing:
    """Replicas, sharing strategy and ``-SHARED`` for one resource (``enabled=False``: MIG full-GPU view)."""
    if not enabled:
        return _Sharing(0, "none", False)
    entries = [r for r in sharing.resources if r.name == resource] if sharing is not None else []
    if not entries or sharing is None:
        return _Sharing(1, "none", False)
    entry = entries[0]
    if len({e.replicas for e in entries}) > 1:
        warnings.append(
            f"{resource} has several time-slicing entries with different replicas "
            f"({', '.join(str(e.replicas) for e in entries)}); the labels show the first ({entry.replicas})"
        )
    replicas = entry.replicas if entry.replicas > 0 else 1
    if replicas <= 1:
        return _Sharing(replicas, "none", False)
    renamed = entry.rename is not None or sharing.rename_by_default
    return _Sharing(replicas, sharing.strategy, not renamed)


def _base(resource: str, count: int, share: _Sharing, product_parts: Sequence[str]) -> dict[str, str]:
    return {
        _key(resource, "product"): _product(product_parts, shared=share.shared_suffix),
        _key(resource, "count"): str(count),
        _key(resource, "replicas"): str(share.replicas),
        _key(resource, "sharing-strategy"): share.strategy,
    }


def _mig_attributes(resource: str, device: MigDevice) -> dict[str, str]:
    values = {
        "memory": device.memory_mib,
        "multiprocessors": device.sm_count,
        "slices.gi": device.gi_slices,
        "slices.ci": device.ci_slices,
        "engines.copy": device.copy_engines,
        "engines.decoder": device.decoders,
        "engines.encoder": device.encoders,
        "engines.jpeg": device.jpeg,
        "engines.ofa": device.ofa,
    }
    return {_key(resource, suffix): str(value) for suffix, value in values.items()}


# ---------------------------------------------------------------------------------------- label groups


def _system_labels(system: SystemInfo | None, warnings: list[str]) -> dict[str, str]:
    if system is None:
        warnings.append("NVML system information unavailable: no cuda.driver / cuda.runtime labels")
        return {}
    labels: dict[str, str] = {}
    try:
        major, minor, rev = split_driver_version(system.driver_version)
    except ValueError as exc:
        warnings.append(f"{exc}: no cuda.driver labels")
    else:
        labels.update(
            {
                PREFIX + "cuda.driver.major": major,
                PREFIX + "cuda.driver.minor": minor,
                PREFIX + "cuda.driver.rev": rev,
                PREFIX + "cuda.driver-version.major": major,
                PREFIX + "cuda.driver-version.minor": minor,
                PREFIX + "cuda.driver-version.revision": rev,
                PREFIX + "cuda.driver-version.full": system.driver_version,
            }
        )
    cuda_major = system.cuda_driver_version // 1000
    cuda_minor = (system.cuda_driver_version % 1000) // 10
    labels.update(
        {
            PREFIX + "cuda.runtime.major": str(cuda_major),
            PREFIX + "cuda.runtime.minor": str(cuda_minor),
            PREFIX + "cuda.runtime-version.major": str(cuda_major),
            PREFIX + "cuda.runtime-version.minor": str(cuda_minor),
            PREFIX + "cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
        }
    )
    return labels


def _machine(machine: str | None) -> str:
    text = sanitize(machine.strip()) if machine is not None else ""
    return text or "unknown"


def _choose_model(gpus: Sequence[GpuInfo], warnings: list[str]) -> list[GpuInfo]:
    """The GPUs of the model the ``gpu.*`` labels describe: most GPUs, ties to the lowest first index."""
    by_model: dict[str, list[GpuInfo]] = {}
    for gpu in gpus:  # ordered by index, so each list's first GPU is the model's lowest index
        by_model.setdefault(gpu.name, []).append(gpu)
    chosen = max(by_model.values(), key=lambda group: (len(group), -group[0].index))
    if len(by_model) > 1:
        listing = ", ".join(f"{name} x{len(group)}" for name, group in by_model.items())
        warnings.append(
            f"multiple GPU models ({listing}): gpu.* labels describe {chosen[0].name} "
            f"(the model with the most GPUs, ties to the lowest GPU index)"
        )
    return chosen


def _full_gpu_labels(
    group: Sequence[GpuInfo], sharing: TimeSlicing | None, warnings: list[str]
) -> dict[str, str]:
    full = [g for g in group if not g.mig_enabled]
    rep = full[0] if full else group[0]
    share = _sharing(FULL_GPU_RESOURCE, sharing, enabled=bool(full), warnings=warnings)
    labels = _base(FULL_GPU_RESOURCE, len(group), share, [rep.name])
    if rep.memory_total_mib:
        labels[_key(FULL_GPU_RESOURCE, "memory")] = str(rep.memory_total_mib)
    major, minor = rep.compute_capability
    if major != 0:
        labels[_key(FULL_GPU_RESOURCE, "family")] = family(major, minor)
        labels[_key(FULL_GPU_RESOURCE, "compute.major")] = str(major)
        labels[_key(FULL_GPU_RESOURCE, "compute.minor")] = str(minor)
    return labels


def _gpu_mode(gpus: Sequence[GpuInfo], classes: Mapping[int, int | None], warnings: list[str]) -> str:
    kinds: set[str] = set()
    for gpu in gpus:
        value = classes.get(gpu.index)
        if value is None:
            warnings.append(f"PCI class of GPU {gpu.index} ({gpu.pci.bus_id}) unreadable: gpu.mode=unknown")
            return "unknown"
        kinds.add({PCI_CLASS_3D: "compute", PCI_CLASS_VGA: "graphics"}.get(value >> 8, "unknown"))
    if len(kinds) != 1:
        warnings.append(f"GPUs have different PCI classes: gpu.mode=unknown ({', '.join(sorted(kinds))})")
        return "unknown"
    mode = kinds.pop()
    if mode == "unknown":
        warnings.append("GPU PCI class is neither a 3D nor a VGA controller: gpu.mode=unknown")
    return mode


def _devices_by_gpu(gpus: Sequence[GpuInfo], facts: NodeFacts) -> list[tuple[GpuInfo, tuple[MigDevice, ...]]]:
    return [(g, tuple(facts.mig_devices.get(g.index, ()))) for g in gpus if g.mig_enabled]


def _single_labels(
    gpus: Sequence[GpuInfo], facts: NodeFacts, sharing: TimeSlicing | None, warnings: list[str]
) -> dict[str, str]:
    enabled = _devices_by_gpu(gpus, facts)
    if not enabled:
        return {}
    devices = [d for _, devs in enabled for d in devs]
    profiles = sorted({_profile_name(d) for d in devices})
    reason = None
    if any(not devs for _, devs in enabled):
        empty = ", ".join(str(g.index) for g, devs in enabled if not devs)
        reason = f"MIG is enabled on GPU {empty} but it has no MIG devices"
    elif len(enabled) != len(gpus):
        reason = "some GPUs have MIG enabled and others disabled"
    elif len(profiles) != 1:
        reason = f"more than one MIG profile on the node ({', '.join(profiles)})"
    if reason is not None:
        warnings.append(f"invalid MIG configuration for mig-strategy=single: {reason}")
        return {
            _key(FULL_GPU_RESOURCE, "product"): _product(
                [enabled[0][0].name, "MIG", "INVALID"], shared=False
            ),
            _key(FULL_GPU_RESOURCE, "count"): "0",
            _key(FULL_GPU_RESOURCE, "replicas"): "0",
            _key(FULL_GPU_RESOURCE, "sharing-strategy"): "",
            _key(FULL_GPU_RESOURCE, "memory"): "0",
        }
    first = devices[0]
    parent = next(g for g, _ in enabled if g.index == first.parent_index)
    share = _sharing(FULL_GPU_RESOURCE, sharing, enabled=True, warnings=warnings)
    labels = _base(FULL_GPU_RESOURCE, len(devices), share, [parent.name, "MIG", profiles[0]])
    labels.update(_mig_attributes(FULL_GPU_RESOURCE, first))
    return labels


def _mixed_labels(
    gpus: Sequence[GpuInfo], facts: NodeFacts, sharing: TimeSlicing | None, warnings: list[str]
) -> dict[str, str]:
    groups: dict[str, list[tuple[GpuInfo, MigDevice]]] = {}
    for gpu, devices in _devices_by_gpu(gpus, facts):
        for device in devices:
            groups.setdefault(_profile_name(device), []).append((gpu, device))
    labels: dict[str, str] = {}
    for profile, members in groups.items():
        resource = f"{PREFIX}mig-{profile}"
        parent, first = members[0]
        share = _sharing(resource, sharing, enabled=True, warnings=warnings)
        labels.update(_base(resource, len(members), share, [parent.name, "MIG", profile]))
        labels.update(_mig_attributes(resource, first))
    return labels


def _clique(gpus: Sequence[GpuInfo], cliques: Mapping[int, str | None], warnings: list[str]) -> str | None:
    seen = {cliques[g.index] for g in gpus if cliques.get(g.index) is not None}
    if len(seen) > 1:
        warnings.append(
            f"fabric-attached GPUs disagree on their clique ({', '.join(sorted(map(str, seen)))})"
        )
        return None
    return seen.pop() if seen else None


# --------------------------------------------------------------------------------------------- labels


class MpsMigRefused(ValueError):
    """MPS sharing on a node with MIG enabled: NVIDIA's GFD fails; the agent exits 2 with this text."""


def compute_labels(
    facts: NodeFacts, *, mig_strategy: MigStrategy, sharing: TimeSlicing | None, timestamp: int | None
) -> LabelResult:
    """The GFD label set for ``facts`` (see the module docstring for every rule).

    ``timestamp`` is written as ``gfd.timestamp`` unless None. ``ValueError`` for an unknown strategy.
    """
    if mig_strategy not in MIG_STRATEGIES:
        raise ValueError(f"invalid MIG strategy {mig_strategy!r}: must be one of {', '.join(MIG_STRATEGIES)}")
    warnings: list[str] = []
    raw: dict[str, str] = {}
    if timestamp is not None:
        raw[PREFIX + "gfd.timestamp"] = str(timestamp)
    raw[PREFIX + "vgpu.present"] = "true" if facts.vgpu_present else "false"

    gpus = sorted(facts.gpus, key=lambda g: g.index)
    if not gpus:
        warnings.append("no GPUs found: only vgpu.present (and gfd.timestamp) are written")
    else:
        raw.update(_system_labels(facts.system, warnings))
        raw[PREFIX + "gpu.machine"] = _machine(facts.machine)
        raw.update(_full_gpu_labels(_choose_model(gpus, warnings), sharing, warnings))
        raw[PREFIX + "gpu.mode"] = _gpu_mode(gpus, facts.pci_classes, warnings)
        raw[PREFIX + "mig.capable"] = "true" if any(g.mig_capable for g in gpus) else "false"
        mps = sharing is not None and sharing.mps
        if mps:
            mig = [str(g.index) for g in gpus if g.mig_enabled]
            if mig:
                raise MpsMigRefused(
                    "sharing.mps: MPS sharing is not supported for MIG devices (MIG is enabled on GPU "
                    f"{', '.join(mig)}); disable MIG on the node or share with sharing.timeSlicing"
                )
        raw[PREFIX + "mps.capable"] = "true" if mps else "false"
        if mig_strategy != "none":
            raw[PREFIX + "mig.strategy"] = mig_strategy
        if mig_strategy == "single":
            raw.update(_single_labels(gpus, facts, sharing, warnings))
        elif mig_strategy == "mixed":
            raw.update(_mixed_labels(gpus, facts, sharing, warnings))
        clique = _clique(gpus, facts.cliques, warnings)
        if clique is not None:
            raw[PREFIX + "gpu.clique"] = clique

    labels: dict[str, str] = {}
    adjusted: list[tuple[str, str, str]] = []
    for key in sorted(raw):
        value = raw[key]
        written = make_valid(key, value)
        if written != value:
            adjusted.append((key, value, written))
        labels[key] = written
    return LabelResult(labels, tuple(warnings), tuple(adjusted))

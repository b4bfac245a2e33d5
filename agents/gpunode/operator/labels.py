"""Which labels the operator puts on a node: :func:`plan_node_labels`, pure.

The rules, as NVIDIA's GPU Operator labels nodes (``shared/reference/operator.md``), and where we differ:

- **GPU node**: NFD labels it ``feature.node.kubernetes.io/pci-10de.present``, ``pci-0302_10de.present`` or
  ``pci-0300_10de.present`` = ``true``. It gets ``nvidia.com/gpu.present=true``; a node carrying
  ``gpu.present=true`` without them gets ``false``.
- **Deploy labels**: ``nvidia.com/gpu.deploy.<operand>=true`` for each operand of the node's workload type
  (:data:`WORKLOAD_OPERANDS`), only where the label is absent or empty. Any other value belongs to someone
  else (a user's ``false``, an agent's ``paused-for-<reason>``, the driver manager's ``pre-installed``) and
  is never changed.
- **Workload type**: ``container``, unless the policy enables sandbox workloads; then the node's
  ``nvidia.com/gpu.workload.config`` (``container``, ``vm-passthrough``, ``vm-vgpu``), or the policy's
  default where that label is missing or unknown.
- **MIG manager** (``gpu.deploy.mig-manager``) on container nodes with a MIG-capable GPU: GFD's
  ``nvidia.com/mig.capable=true``; without that label, a ``nvidia.com/gpu.product`` naming an A100, A30 or
  H100; never on a vGPU host (``nvidia.com/vgpu.host-driver-version`` set). Once added it stays while the
  node is a container GPU node: a GFD label missing for a moment does not take the MIG manager away in the
  middle of a change.
- **MIG config**: ``nvidia.com/mig.config=<policy default>`` (``all-disabled``) on GPU nodes with a
  MIG-capable GPU where it is unset or empty, never changed once set.
- **Own labels**: the annotation ``nvidia.com/gpunode.operator-labels`` lists the deploy labels the
  operator added (comma-separated, sorted), written in the same patch as the labels. A label stays the
  operator's while it is ``true`` or paused (``paused-for-*``: the pausing agent puts ``true`` back);
  someone who sets anything else takes it over and it leaves the list. The operator removes only its own
  labels, and only at ``true`` (a paused one goes once its pause ends): all of them when the node sets
  ``nvidia.com/gpu.deploy.operands=false`` or stops being a GPU node, those of the old workload type when
  the type changes. NVIDIA removes every deploy label in these cases, a user's ``false`` included, and
  adds ``true`` back after a short no-GPU reading: the user's choice is lost (NVIDIA/gpu-operator#2288).

NVIDIA's labels written before this operator took over are not in the list: they are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpunode.kube.operands import DEPLOY_PREFIX
from gpunode.kube.selectors import is_label_key

__all__ = [
    "CONTAINER",
    "DEPLOY_OPERANDS",
    "GPU_PRESENT",
    "MIG_CONFIG",
    "NFD_GPU_LABELS",
    "OWNED_ANNOTATION",
    "VM_PASSTHROUGH",
    "VM_VGPU",
    "WORKLOAD_LABEL",
    "WORKLOAD_OPERANDS",
    "LabelPolicy",
    "NodePatch",
    "has_nfd_labels",
    "is_gpu_node",
    "mig_capable",
    "owned_labels",
    "plan_node_labels",
    "workload_of",
]

NFD_PREFIX = "feature.node.kubernetes.io/"
NFD_GPU_LABELS = (
    NFD_PREFIX + "pci-10de.present",
    NFD_PREFIX + "pci-0302_10de.present",
    NFD_PREFIX + "pci-0300_10de.present",
)
GPU_PRESENT = "nvidia.com/gpu.present"
DEPLOY_OPERANDS = DEPLOY_PREFIX + "operands"
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
MIG_CAPABLE = "nvidia.com/mig.capable"
GPU_PRODUCT = "nvidia.com/gpu.product"
VGPU_HOST_DRIVER = "nvidia.com/vgpu.host-driver-version"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_ALL_DISABLED = "all-disabled"
MIG_MANAGER = "mig-manager"
OWNED_ANNOTATION = "nvidia.com/gpunode.operator-labels"
PAUSED_PREFIX = "paused-for-"
MIG_PRODUCTS = ("a100", "a30", "h100")  # product names NVIDIA takes as MIG-capable without GFD's label

# Our list is a few hundred characters; anything far larger was not written by the operator.
MAX_OWNED_CHARS = 8192

CONTAINER = "container"
VM_PASSTHROUGH = "vm-passthrough"
VM_VGPU = "vm-vgpu"

#: The operands each workload type deploys (the suffixes of their ``nvidia.com/gpu.deploy.*`` labels),
#: as NVIDIA's controller labels them; ``mig-manager`` is added on MIG-capable container nodes.
WORKLOAD_OPERANDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        CONTAINER: (
            "driver",
            "gpu-feature-discovery",
            "container-toolkit",
            "device-plugin",
            "dcgm",
            "dcgm-exporter",
            "node-status-exporter",
            "operator-validator",
        ),
        VM_PASSTHROUGH: (
            "sandbox-device-plugin",
            "sandbox-validator",
            "vfio-manager",
            "kata-manager",
            "cc-manager",
        ),
        VM_VGPU: (
            "sandbox-device-plugin",
            "vgpu-manager",
            "vgpu-device-manager",
            "sandbox-validator",
            "cc-manager",
        ),
    }
)


@dataclass(frozen=True)
class LabelPolicy:
    """What of the ClusterPolicy node labelling needs.

    ``sandbox_workloads`` is ``spec.sandboxWorkloads.enabled``, ``default_workload`` its
    ``defaultWorkload``; ``mig_config_default`` is the ``nvidia.com/mig.config`` value written where
    unset: ``all-disabled`` when the MIG manager is enabled and ``spec.migManager.config.default`` is
    ``all-disabled`` (NVIDIA writes nothing otherwise), ``""`` for nothing."""

    sandbox_workloads: bool = False
    default_workload: str = CONTAINER
    mig_config_default: str = MIG_ALL_DISABLED


@dataclass(frozen=True)
class NodePatch:
    """One merge patch of a node's metadata: a None value removes the key."""

    labels: Mapping[str, str | None]
    annotations: Mapping[str, str | None]

    def describe(self) -> str:
        """``key=value`` set, ``-key`` removed, labels first: for the log."""
        parts = [f"-{k}" if v is None else f"{k}={v}" for k, v in sorted(self.labels.items())]
        parts += [f"-{k}" if v is None else f"{k}=..." for k, v in sorted(self.annotations.items())]
        return ", ".join(parts)


# -- what a node is --------------------------------------------------------------------------------------
def is_gpu_node(labels: Mapping[str, str]) -> bool:
    """NFD found an NVIDIA PCI device (any class, display or 3D controller)."""
    return any(labels.get(key) == "true" for key in NFD_GPU_LABELS)


def has_nfd_labels(labels: Mapping[str, str]) -> bool:
    """NFD labelled the node at all (the operator's hint that NFD runs in the cluster)."""
    return any(key.startswith(NFD_PREFIX) for key in labels)


def mig_capable(labels: Mapping[str, str]) -> bool:
    """A GPU that can be partitioned: GFD says so, or (no GFD label yet) its product name; never on a
    vGPU host."""
    if labels.get(VGPU_HOST_DRIVER):
        return False
    if MIG_CAPABLE in labels:
        return labels[MIG_CAPABLE] == "true"
    product = labels.get(GPU_PRODUCT, "").lower()
    return any(name in product for name in MIG_PRODUCTS)


def workload_of(labels: Mapping[str, str], policy: LabelPolicy) -> str:
    """The node's workload type: ``container`` without sandbox workloads; else its label, or the
    policy's default (``container`` when that is not a known type either)."""
    if not policy.sandbox_workloads:
        return CONTAINER
    chosen = labels.get(WORKLOAD_LABEL, "")
    if chosen in WORKLOAD_OPERANDS:
        return chosen
    return policy.default_workload if policy.default_workload in WORKLOAD_OPERANDS else CONTAINER


def owned_labels(annotations: Mapping[str, str]) -> frozenset[str]:
    """The deploy labels the operator's annotation lists; empty when absent or unreadable (a huge value,
    or one that is not a list of deploy label keys: it is then replaced)."""
    text = annotations.get(OWNED_ANNOTATION)
    if not text or len(text) > MAX_OWNED_CHARS:
        return frozenset()
    keys = {key.strip() for key in text.split(",") if key.strip()}
    if not all(_is_deploy_label(key) for key in keys):
        return frozenset()
    return frozenset(keys)


def _is_deploy_label(key: str) -> bool:
    return key.startswith(DEPLOY_PREFIX) and key != DEPLOY_OPERANDS and is_label_key(key)


def _still_ours(value: str | None) -> bool:
    return value == "true" or (value is not None and value.startswith(PAUSED_PREFIX))


# -- the plan --------------------------------------------------------------------------------------------
def plan_node_labels(
    labels: Mapping[str, str], annotations: Mapping[str, str], policy: LabelPolicy | None = None
) -> NodePatch | None:
    """The one merge patch that brings a node's labels in line with the rules (module docstring), or None
    when nothing changes."""
    policy = policy or LabelPolicy()
    changes: dict[str, str | None] = {}
    owned = {key for key in owned_labels(annotations) if _still_ours(labels.get(key))}
    gpu = is_gpu_node(labels)

    if gpu and labels.get(GPU_PRESENT) != "true":
        changes[GPU_PRESENT] = "true"
    elif not gpu and labels.get(GPU_PRESENT) == "true":
        changes[GPU_PRESENT] = "false"

    wanted: set[str] = set()
    if gpu and labels.get(DEPLOY_OPERANDS) != "false":
        workload = workload_of(labels, policy)
        wanted = {DEPLOY_PREFIX + operand for operand in WORKLOAD_OPERANDS[workload]}
        mig_manager = DEPLOY_PREFIX + MIG_MANAGER
        if workload == CONTAINER and (mig_capable(labels) or mig_manager in owned):
            wanted.add(mig_manager)

    for key in sorted(wanted):
        if not labels.get(key):  # absent or empty: anything else is someone's choice
            changes[key] = "true"
            owned.add(key)
    for key in sorted(owned - wanted):
        if labels.get(key) == "true":  # a paused one waits for its pause to end
            changes[key] = None
            owned.discard(key)

    if gpu and policy.mig_config_default and mig_capable(labels) and not labels.get(MIG_CONFIG):
        changes[MIG_CONFIG] = policy.mig_config_default

    annotation_changes: dict[str, str | None] = {}
    record = ",".join(sorted(owned)) or None
    if record != annotations.get(OWNED_ANNOTATION):
        annotation_changes[OWNED_ANNOTATION] = record
    if not changes and not annotation_changes:
        return None
    return NodePatch(labels=changes, annotations=annotation_changes)

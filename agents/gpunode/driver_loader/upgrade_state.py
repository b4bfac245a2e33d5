"""The driver manager's pure parts: the operands it pauses, the node record of a run in progress, its
options (from the typed settings), how a run ends, and the in-use advice.

No I/O here; the flow that talks to the API server and the loader is :mod:`gpunode.driver_loader.upgrade`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpunode.common.errors import UsageError
from gpunode.driver_loader.settings import DEFAULT_DRAIN_TIMEOUT, DEFAULT_OPERAND_TIMEOUT, UpgradeSettings
from gpunode.kube.api import PodInfo
from gpunode.kube.drain import decide_pod, is_gpu_pod
from gpunode.kube.operands import DEPLOY_PREFIX, LabelOperand, Operand

__all__ = [
    "DRIVER_DEPLOY_LABEL",
    "DRIVER_OPERANDS",
    "DRIVER_OPERAND_PODS",
    "OWNER",
    "PAUSE_REASON",
    "PRE_INSTALLED",
    "RECORD_ANNOTATION",
    "UPGRADE_CONTROLLER_ANNOTATION",
    "UPGRADE_STATE_LABEL",
    "Result",
    "UpgradeFailed",
    "UpgradeOptions",
    "UpgradeOutcome",
    "UpgradeRecord",
    "driver_operands",
    "in_use_advice",
]

OWNER = "gpunode-driver-manager"  # owner of the operand pause record; field manager of our writes
PAUSE_REASON = "driver-upgrade"  # labels read paused-for-driver-upgrade, as NVIDIA's
RECORD_ANNOTATION = "nvidia.com/gpunode.driver-upgrade"
DRIVER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.driver"
PRE_INSTALLED = "pre-installed"
UPGRADE_CONTROLLER_ANNOTATION = "nvidia.com/gpu-driver-upgrade-enabled"
UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"

_OURS = "app.kubernetes.io/name"
# The operands NVIDIA's driver manager pauses (reference 1.9), with the pod labels of NVIDIA's DaemonSets
# and of ours. Operands without known pod labels are still waited for: any pod whose nodeSelector names
# the paused label counts.
DRIVER_OPERAND_PODS: tuple[tuple[str, tuple[Mapping[str, str], ...]], ...] = (
    ("operator-validator", ({"app": "nvidia-operator-validator"}, {_OURS: "gpunode-validator"})),
    ("container-toolkit", ({"app": "nvidia-container-toolkit-daemonset"}, {_OURS: "gpunode-toolkit"})),
    ("device-plugin", ({"app": "nvidia-device-plugin-daemonset"}, {_OURS: "gpunode-device-plugin"})),
    ("gpu-feature-discovery", ({"app": "gpu-feature-discovery"}, {_OURS: "gpunode-feature-discovery"})),
    ("dcgm-exporter", ({"app": "nvidia-dcgm-exporter"}, {_OURS: "gpunode-exporter"})),
    ("dcgm", ({"app": "nvidia-dcgm"},)),
    ("mig-manager", ({"app": "nvidia-mig-manager"}, {_OURS: "gpunode-mig-manager"})),
    ("nvsm", ()),
    ("sandbox-validator", ({"app": "nvidia-sandbox-validator"},)),
    ("sandbox-device-plugin", ({"app": "nvidia-sandbox-device-plugin-daemonset"},)),
    ("vgpu-device-manager", ({"app": "nvidia-vgpu-device-manager"},)),
    ("client", ()),
    ("dra-driver", ()),
    ("dra-validator", ()),
    ("dcgm-dra", ()),
    ("dcgm-exporter-dra", ()),
)


def driver_operands(extra_label: str = "") -> tuple[Operand, ...]:
    """The operands paused for a driver upgrade, plus ``extra_label`` (``NODE_LABEL_FOR_GPU_POD_EVICTION``:
    any node label key, paused and restored like a deploy label)."""
    operands: list[Operand] = [Operand(name, tuple(pods)) for name, pods in DRIVER_OPERAND_PODS]
    if extra_label and extra_label not in {o.label for o in operands}:
        if extra_label.startswith(DEPLOY_PREFIX):
            operands.append(Operand(extra_label[len(DEPLOY_PREFIX) :]))
        else:
            operands.append(LabelOperand(name=extra_label, key=extra_label))
    return tuple(operands)


DRIVER_OPERANDS = driver_operands()


@dataclass(frozen=True)
class UpgradeRecord:
    """The node annotation ``nvidia.com/gpunode.driver-upgrade``: an upgrade in progress."""

    cordoned: bool  # we cordoned the node (or are about to): uncordon it when finishing
    started: str
    step: str

    def to_json(self) -> str:
        return json.dumps(
            {"cordoned": self.cordoned, "started": self.started, "step": self.step}, separators=(",", ":")
        )

    @classmethod
    def from_json(cls, text: str) -> UpgradeRecord | None:
        """The record, or None when the annotation is unreadable: anyone allowed to patch the node can
        write it, so a huge or deeply nested value (RecursionError in the parser) is unreadable too."""
        if len(text) > 16384:
            return None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("cordoned"), bool):
                return None
            return cls(data["cordoned"], str(data.get("started", "")), str(data.get("step", "")))
        except (ValueError, RecursionError):
            return None


@dataclass(frozen=True)
class UpgradeOptions:
    gpu_pod_eviction: bool = True  # ENABLE_GPU_POD_EVICTION
    auto_drain: bool = False  # ENABLE_AUTO_DRAIN
    drain_use_force: bool = False  # DRAIN_USE_FORCE
    drain_pod_selector: str = ""  # DRAIN_POD_SELECTOR_LABEL
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # DRAIN_TIMEOUT_SECONDS; 0: no limit
    drain_delete_emptydir_data: bool = False  # DRAIN_DELETE_EMPTYDIR_DATA
    operator_namespace: str = "gpu-operator"  # OPERATOR_NAMESPACE
    eviction_label: str = ""  # NODE_LABEL_FOR_GPU_POD_EVICTION
    force_reinstall: bool = False  # FORCE_REINSTALL
    operand_timeout: float = DEFAULT_OPERAND_TIMEOUT  # GPUNODE_OPERAND_TIMEOUT
    poll: float = 1.0  # seconds between looks at the pods being waited for
    evict_retry: float = 5.0  # seconds between evictions a disruption budget refused (as kubectl)
    api_wait: float = 300.0  # how long the first contact waits for an unreachable API server
    progress_interval: float = 10.0  # seconds between progress events while nothing changes

    @classmethod
    def from_settings(cls, settings: UpgradeSettings) -> UpgradeOptions:
        """From ``upgrade``'s settings (already parsed and checked by their flags); :class:`UsageError`
        for a timeout out of range."""
        try:
            options = cls(
                gpu_pod_eviction=settings.enable_gpu_pod_eviction,
                auto_drain=settings.enable_auto_drain,
                drain_use_force=settings.drain_use_force,
                drain_pod_selector=settings.drain_pod_selector_label or "",
                drain_timeout=_seconds(settings.drain_timeout_seconds),
                drain_delete_emptydir_data=settings.drain_delete_emptydir_data,
                operator_namespace=settings.operator_namespace or "gpu-operator",
                eviction_label=settings.node_label_for_gpu_pod_eviction or "",
                force_reinstall=settings.force_reinstall,
                operand_timeout=_seconds(settings.operand_timeout),
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if options.operand_timeout <= 0:
            raise UsageError("--operand-timeout (GPUNODE_OPERAND_TIMEOUT) must be more than 0 seconds")
        return options

    def summary(self) -> dict[str, object]:
        return {
            "gpu_pod_eviction": self.gpu_pod_eviction,
            "auto_drain": self.auto_drain,
            "drain_use_force": self.drain_use_force,
            "drain_pod_selector": self.drain_pod_selector,
            "drain_timeout_s": self.drain_timeout or None,
            "drain_delete_emptydir_data": self.drain_delete_emptydir_data,
            "eviction_label": self.eviction_label or None,
            "force_reinstall": self.force_reinstall,
            "operand_timeout_s": self.operand_timeout,
        }


def _seconds(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"invalid duration {value!r}: must be 0 or more seconds")
    return value


class UpgradeFailed(Exception):
    """The upgrade cannot go on; the message says why and what would let it."""

    def __init__(self, message: str, step: str = "") -> None:
        super().__init__(message)
        self.step = step


Result = Literal["pre-installed", "loaded", "kept", "upgraded", "failed"]


@dataclass(frozen=True)
class UpgradeOutcome:
    """How a run ended: ``pre-installed`` (host driver, labelled), ``loaded`` (none was loaded),
    ``kept`` (the loaded driver matches), ``upgraded`` (unloaded and loaded again) or ``failed``."""

    result: Result
    reason: str = ""
    step: str = ""
    seconds: float = 0.0
    evicted: tuple[str, ...] = ()
    recovered: bool = False  # a previous run's leftovers were cleaned up first

    @property
    def ok(self) -> bool:
        return self.result != "failed"


def in_use_advice(
    in_use: str, pods: Sequence[PodInfo], options: UpgradeOptions, *, controller_owned: bool
) -> str:
    """The driver-in-use error, with the GPU pods still on the node and what would let the upgrade
    through (``pods``: the node's pods, or none when they could not be listed)."""
    parts = [in_use]
    gpu_pods = [p for p in pods if is_gpu_pod(p)]
    if gpu_pods:
        force, emptydir = options.drain_use_force, options.drain_delete_emptydir_data
        parts.append(
            "GPU pods on this node: "
            + ", ".join(str(decide_pod(p, force=force, delete_emptydir_data=emptydir)) for p in gpu_pods)
        )
    if controller_owned:
        parts.append(
            "the GPU Operator's upgrade controller owns eviction here: let it drain the node (label "
            f"it {UPGRADE_STATE_LABEL}=upgrade-required), stop the GPU workloads, or disable the "
            "upgrade policy"
        )
    elif not options.auto_drain:
        first = "" if options.gpu_pod_eviction else "ENABLE_GPU_POD_EVICTION=true evicts the GPU pods, "
        parts.append(f"stop the GPU workloads; {first}ENABLE_AUTO_DRAIN=true drains the node")
    return "; ".join(parts)

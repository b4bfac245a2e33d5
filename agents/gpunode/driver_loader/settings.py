"""gpunode-driver-loader's settings: one frozen dataclass per verb (init, unload, status, upgrade).

Every flag keeps its option, NVIDIA's environment variable (``KERNEL_MODULE_TYPE``, ``DRIVER_VERSION``,
``FORCE_REINSTALL``, ``GPU_DIRECT_RDMA_ENABLED``, ``DRIVER_CONFIG_DIGEST``, ``ENABLE_AUTO_DRAIN``,
``DRAIN_*`` ...), default and help text. Flags several verbs share live in groups:

- :class:`HostSettings`: where the host and its tools are (init, unload, upgrade);
- :class:`DriverSettings`: which driver is loaded, everything the configuration digest covers;
- :class:`LoadSettings`: the recorded digest and how ``init`` treats the host (init, upgrade).

``--force-reinstall`` sits between the last two for ``init`` and among the driver manager's flags for
``upgrade`` (with its own help text), as the ``--help`` of each verb has always listed it.
Importing this module loads no Kubernetes client; the label checks (:mod:`gpunode.kube.selectors`) load
when a selector or label key is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpunode.common.cli import parse_duration
from gpunode.common.settings import CommonSettings, HttpSettings, KubeSettings, group, setting
from gpunode.driver_loader.modules import MODULE_TYPES

if TYPE_CHECKING:
    from gpunode.kube.selectors import LabelSelector

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_HEALTH_INTERVAL",
    "DEFAULT_OPERAND_TIMEOUT",
    "DEFAULT_PARAMS_DIR",
    "DEFAULT_UDEV_TIMEOUT",
    "DEFAULT_VALIDATIONS_DIR",
    "DriverSettings",
    "HostSettings",
    "InitSettings",
    "LoadSettings",
    "StatusSettings",
    "UnloadSettings",
    "UpgradeSettings",
    "pod_selector",
]

DEFAULT_VALIDATIONS_DIR = "/run/nvidia/validations"
DEFAULT_PARAMS_DIR = "/drivers"
DEFAULT_UDEV_TIMEOUT = 3.0
DEFAULT_HEALTH_INTERVAL = 30.0
DEFAULT_DRAIN_TIMEOUT = 300.0
DEFAULT_OPERAND_TIMEOUT = 300.0


def pod_selector(text: str) -> LabelSelector:
    """``DRAIN_POD_SELECTOR_LABEL``: a label selector without the integer compares ``>`` / ``<``."""
    from gpunode.kube.selectors import LabelSelector

    return LabelSelector.parse(text, numeric=False)


def _selector_text(text: str) -> str:
    pod_selector(text)
    return text.strip()


def _label_key(text: str) -> str:
    """``NODE_LABEL_FOR_GPU_POD_EVICTION``: a node label key; ``ValueError`` otherwise."""
    from gpunode.kube.selectors import is_label_key

    key = text.strip()
    if not is_label_key(key):
        raise ValueError(f"{text!r} is not a valid node label key (like example.com/gpu-workload)")
    return key


def _host_root() -> Any:
    return setting(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's / is mounted",
    )


def _force_reinstall(help: str) -> Any:
    return setting("--force-reinstall", env="FORCE_REINSTALL", type=bool, default=False, help=help)


@dataclass(frozen=True)
class HostSettings:
    """Where the host's / is, where the readiness files go, and where each tool is."""

    host_root: str = _host_root()
    validations_dir: str = setting(
        "--validations-dir",
        default=DEFAULT_VALIDATIONS_DIR,
        metavar="DIR",
        help="readiness files (host path)",
    )
    bin_dir: str | None = setting(
        "--bin-dir", env="GPUNODE_DRIVER_BIN_DIR", metavar="DIR", help="take every tool from DIR only"
    )
    modprobe: str | None = setting("--modprobe", metavar="PATH", help="the modprobe executable")
    rmmod: str | None = setting("--rmmod", metavar="PATH", help="the rmmod executable")
    depmod: str | None = setting("--depmod", metavar="PATH", help="the depmod executable")
    dkms: str | None = setting("--dkms", metavar="PATH", help="the dkms executable")
    nvidia_installer: str | None = setting(
        "--nvidia-installer", metavar="PATH", help="the nvidia-installer executable"
    )
    nvidia_persistenced: str | None = setting(
        "--nvidia-persistenced", metavar="PATH", help="the nvidia-persistenced executable"
    )
    nvidia_smi: str | None = setting("--nvidia-smi", metavar="PATH", help="the nvidia-smi executable")

    def tools(self) -> dict[str, str]:
        """The tools given explicitly, by name (``--modprobe`` ... ``--nvidia-smi``)."""
        given = {
            "modprobe": self.modprobe,
            "rmmod": self.rmmod,
            "depmod": self.depmod,
            "dkms": self.dkms,
            "nvidia-installer": self.nvidia_installer,
            "nvidia-persistenced": self.nvidia_persistenced,
            "nvidia-smi": self.nvidia_smi,
        }
        return {tool: path for tool, path in given.items() if path}


@dataclass(frozen=True)
class DriverSettings:
    """Which driver is loaded, and how: everything the configuration digest covers."""

    kernel_module_type: str = setting(
        "--kernel-module-type",
        env="KERNEL_MODULE_TYPE",
        type=str.lower,
        choices=MODULE_TYPES,
        default="auto",
        help="module source (auto, precompiled, runcompiled) or NVIDIA's flavour (open, proprietary)",
    )
    kernel_version: str | None = setting(
        "--kernel-version",
        env="KERNEL_VERSION",
        metavar="KVER",
        help="kernel to load for (default: the host's uname -r)",
    )
    module_params_dir: str = setting(
        "--module-params-dir",
        default=DEFAULT_PARAMS_DIR,
        metavar="DIR",
        help="<module>.conf module parameter files",
    )
    driver_version: str | None = setting(
        "--driver-version",
        env="DRIVER_VERSION",
        metavar="VER",
        help="driver version (default: from the driver root)",
    )
    gpu_direct_rdma: bool = setting(
        "--gpu-direct-rdma",
        env="GPU_DIRECT_RDMA_ENABLED",
        type=bool,
        default=False,
        help="GPUDirect RDMA: also load nvidia-peermem",
    )


@dataclass(frozen=True)
class LoadSettings:
    """The digest to record, and how ``init`` treats nouveau and the device nodes."""

    driver_config_digest: str | None = setting(
        "--driver-config-digest",
        env="DRIVER_CONFIG_DIGEST",
        metavar="SHA",
        help="digest to record and compare (default: computed)",
    )
    write_nouveau_blacklist: bool = setting(
        "--write-nouveau-blacklist",
        type=bool,
        default=False,
        help="write blacklist-nouveau.conf when nouveau is loaded",
    )
    create_device_nodes: bool = setting(
        "--create-device-nodes",
        env="GPUNODE_CREATE_DEVICE_NODES",
        type=bool,
        default=True,
        help="mknod the /dev/nvidia* nodes the driver does not create (false: only report them)",
    )
    imex_channels: tuple[int, ...] = setting(
        "--imex-channels",
        env="GPUNODE_IMEX_CHANNELS",
        type=int,
        repeatable=True,
        metavar="N",
        help="also create /dev/nvidia-caps-imex-channels/channel<N> (major nvidia-caps-imex-channels of "
        "/proc/devices) for each N, 0-2047",
    )
    udev_timeout: float = setting(
        "--udev-timeout",
        type=float,
        default=DEFAULT_UDEV_TIMEOUT,
        metavar="SECONDS",
        help="wait this long for udev before mknod",
    )


@dataclass(frozen=True)
class InitSettings:
    """``init``: load the driver, then (without ``--oneshot``) keep it healthy."""

    common: CommonSettings = group(CommonSettings)
    host: HostSettings = group(HostSettings)
    driver: DriverSettings = group(DriverSettings)
    force_reinstall: bool = _force_reinstall("reload even when the digest matches")
    load: LoadSettings = group(LoadSettings)
    oneshot: bool = setting(
        "--oneshot", type=bool, default=False, help="load and exit instead of staying a daemon"
    )
    dry_run: bool = setting("--dry-run", type=bool, default=False, help="print the plan, change nothing")
    health_interval: float = setting(
        "--health-interval",
        type=float,
        default=DEFAULT_HEALTH_INTERVAL,
        metavar="SECONDS",
        help="seconds between the daemon's health checks",
    )
    http: HttpSettings = group(
        HttpSettings,
        defaults={"http_port": 9454},
        help={"http_port": "/healthz, /readyz, /metrics (0: any free port, -1: off)"},
    )


@dataclass(frozen=True)
class UnloadSettings:
    """``unload``: remove the modules, refused while anything holds the driver."""

    common: CommonSettings = group(CommonSettings)
    host: HostSettings = group(HostSettings)


@dataclass(frozen=True)
class StatusSettings:
    """``status``: what the last command did, from the status file."""

    common: CommonSettings = group(CommonSettings)
    host_root: str = _host_root()
    json: bool = setting("--json", type=bool, default=False, help="print the status document as JSON")


@dataclass(frozen=True)
class UpgradeSettings:
    """``upgrade``: the driver manager's settings under NVIDIA's environment variables, the Kubernetes
    flags (the node is ``--node-name`` / ``NODE_NAME``), then the loader's for the load it does."""

    common: CommonSettings = group(CommonSettings)
    enable_gpu_pod_eviction: bool = setting(
        "--enable-gpu-pod-eviction",
        env="ENABLE_GPU_POD_EVICTION",
        type=bool,
        default=True,
        help="before unloading a loaded driver, cordon the node and evict the pods requesting "
        "nvidia.com/gpu* or nvidia.com/mig-* resources",
    )
    enable_auto_drain: bool = setting(
        "--enable-auto-drain",
        env="ENABLE_AUTO_DRAIN",
        type=bool,
        default=False,
        help="drain the whole node when GPU pods do not leave in time or the driver is still in use "
        "(as the GPU Operator sets it; NVIDIA's command-line default is true)",
    )
    drain_use_force: bool = setting(
        "--drain-use-force",
        env="DRAIN_USE_FORCE",
        type=bool,
        default=False,
        help="also evict pods no controller manages (nothing recreates them); without it they stop "
        "the upgrade",
    )
    drain_pod_selector_label: str | None = setting(
        "--drain-pod-selector-label",
        env="DRAIN_POD_SELECTOR_LABEL",
        type=_selector_text,
        metavar="SELECTOR",
        help="label selector limiting the whole-node drain (default: every pod but DaemonSet and "
        "static pods)",
    )
    drain_timeout_seconds: float = setting(
        "--drain-timeout-seconds",
        env="DRAIN_TIMEOUT_SECONDS",
        type=parse_duration,
        default=DEFAULT_DRAIN_TIMEOUT,
        metavar="DURATION",
        help="how long evicted pods may take to leave: seconds or a Go duration (5m); 0 or 0s: no limit "
        "(NVIDIA's default, 0s, waits forever)",
    )
    drain_delete_emptydir_data: bool = setting(
        "--drain-delete-emptydir-data",
        env="DRAIN_DELETE_EMPTYDIR_DATA",
        type=bool,
        default=False,
        help="evict GPU pods with emptyDir volumes too (their data is lost); otherwise they block",
    )
    operator_namespace: str = setting(
        "--operator-namespace",
        env="OPERATOR_NAMESPACE",
        default="gpu-operator",
        metavar="NS",
        help="the GPU Operator's namespace (accepted; operand pods are waited for in every namespace)",
    )
    node_label_for_gpu_pod_eviction: str | None = setting(
        "--node-label-for-gpu-pod-eviction",
        env="NODE_LABEL_FOR_GPU_POD_EVICTION",
        type=_label_key,
        metavar="KEY",
        help="one more node label to pause like the operands' deploy labels, so that the pods selecting "
        "it leave the node during the upgrade",
    )
    force_reinstall: bool = _force_reinstall(
        "reload the driver even when the loaded one has the configuration we would load"
    )
    operand_timeout: float = setting(
        "--operand-timeout",
        env="GPUNODE_OPERAND_TIMEOUT",
        type=float,
        default=DEFAULT_OPERAND_TIMEOUT,
        metavar="SECONDS",
        help="seconds for the operand pods to leave the node; then: failed, operands restored",
    )
    kube: KubeSettings = group(
        KubeSettings, help={"namespace": "namespace of the objects this agent writes (none at present)"}
    )
    host: HostSettings = group(HostSettings)
    driver: DriverSettings = group(DriverSettings)
    load: LoadSettings = group(LoadSettings)

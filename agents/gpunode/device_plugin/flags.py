"""gpunode-device-plugin's command line: each flag with its env var, config-file key and default, once.

:class:`DevicePluginFlags` is what the command line, the environment and (for flags with a file key)
the config file resolve to; :func:`gpunode.device_plugin.settings.plugin_settings` derives from it and
the rest of the config file the effective :class:`~gpunode.device_plugin.settings.PluginSettings` the
plugin serves with.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.api.plugin_types import (
    ALLOCATION_POLICIES,
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEVICE_ID_STRATEGIES,
    MIG_STRATEGIES,
    AllocationPolicy,
    DeviceIdStrategy,
    MigStrategy,
    parse_device_list_strategy,
)
from gpunode.common.cli import parse_duration
from gpunode.common.settings import CommonWithConfigSettings, HttpSettings, KubeSettings, group, setting
from gpunode.kube.labelconfig import LabelConfigSettings

__all__ = ["ALIASES", "DEFAULT_KUBELET_SOCKET", "HTTP_PORT", "DevicePluginFlags", "duration"]

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
HTTP_PORT = 9451
ALIASES = {"--nvidia-driver-root": "driver_root", "--nvidia-dev-root": "dev_root"}  # NVIDIA's spellings


def duration(text: str) -> float:
    """Seconds, or a Go duration in any case: "300", "5m", "90s", "1h30m"."""
    return parse_duration(text.strip().lower())


@dataclass(frozen=True)
class DevicePluginFlags:
    """The device plugin's flags; the effective settings are :class:`.settings.PluginSettings`."""

    common: CommonWithConfigSettings = group(CommonWithConfigSettings)
    mig_strategy: MigStrategy = setting(
        "--mig-strategy",
        env="MIG_STRATEGY",
        choices=MIG_STRATEGIES,
        default="none",
        file_key="flags.migStrategy",
        help="how MIG devices are advertised",
    )
    fail_on_init_error: bool = setting(
        "--fail-on-init-error",
        env="FAIL_ON_INIT_ERROR",
        type=bool,
        default=True,
        file_key="flags.failOnInitError",
        help="exit when NVML cannot start; false: stay up, not ready, advertising nothing",
    )
    dev_root: str | None = setting(
        "--dev-root",
        env="NVIDIA_DEV_ROOT",
        metavar="DIR",
        file_key="flags.nvidiaDevRoot",
        help="where /dev/nvidia* live (default: the driver root)",
    )
    pass_device_specs: bool = setting(
        "--pass-device-specs",
        env="PASS_DEVICE_SPECS",
        type=bool,
        default=False,
        file_key="flags.plugin.passDeviceSpecs",
        help="also hand the device nodes to the runtime",
    )
    device_list_strategy: tuple[str, ...] = setting(
        "--device-list-strategy",
        env="DEVICE_LIST_STRATEGY",
        type=parse_device_list_strategy,
        default=("envvar",),
        file_key="flags.plugin.deviceListStrategy",
        help="envvar, volume-mounts, cdi-annotations, cdi-cri, or a comma-separated combination",
    )
    device_id_strategy: DeviceIdStrategy = setting(
        "--device-id-strategy",
        env="DEVICE_ID_STRATEGY",
        choices=DEVICE_ID_STRATEGIES,
        default="uuid",
        file_key="flags.plugin.deviceIDStrategy",
        help="how devices are named to the runtime",
    )
    cdi_annotation_prefix: str = setting(
        "--cdi-annotation-prefix",
        env="CDI_ANNOTATION_PREFIX",
        default=DEFAULT_CDI_ANNOTATION_PREFIX,
        file_key="flags.plugin.cdiAnnotationPrefix",
        help="prefix of CDI annotations",
    )
    shared_devices_allocation_policy: AllocationPolicy = setting(
        "--shared-devices-allocation-policy",
        env="SHARED_DEVICES_ALLOCATION_POLICY",
        choices=ALLOCATION_POLICIES,
        default="distributed",
        file_key="flags.plugin.sharedDevicesAllocationPolicy",
        help="how replicas and MIG devices are chosen",
    )
    imex_channel_ids: tuple[int, ...] = setting(
        "--imex-channel-ids",
        env="IMEX_CHANNEL_IDS",
        type=int,
        repeatable=True,
        metavar="ID",
        file_key="imex.channelIDs",
        help="IMEX channel handed to every container (only 0 is allowed, as NVIDIA's plugin)",
    )
    imex_required: bool = setting(
        "--imex-required",
        env="IMEX_REQUIRED",
        type=bool,
        default=False,
        file_key="imex.required",
        help="refuse to start when a requested IMEX channel node is missing (false: warn, hand none out)",
    )
    mps_root: str | None = setting(
        "--mps-root",
        env="MPS_ROOT",
        metavar="DIR",
        file_key="flags.mpsRoot",
        help="the MPS control daemon's root on the host, for sharing.mps (default /run/nvidia/mps)",
    )
    kubelet_socket: str = setting(
        "--kubelet-socket",
        env="KUBELET_SOCKET",
        default=DEFAULT_KUBELET_SOCKET,
        metavar="PATH",
        help='the kubelet registration socket; "" serves without registering',
    )
    health_recovery_period: float = setting(
        "--health-recovery-period",
        env="DP_HEALTH_RECOVERY_PERIOD",
        type=duration,
        default=300.0,
        metavar="DURATION",
        help="quiet time before an Unhealthy GPU is Healthy again; 0 never",
    )
    label_config: LabelConfigSettings = group(LabelConfigSettings)
    kube: KubeSettings = group(
        KubeSettings, help={"namespace": "namespace (unused by the device plugin; common to the agents)"}
    )
    host_root: str = setting(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's /sys and /proc are mounted",
    )
    http: HttpSettings = group(HttpSettings, defaults={"http_port": HTTP_PORT})

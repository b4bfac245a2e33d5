"""gpunode-mps-control-daemon's settings: NVIDIA's mps-control-daemon flags, declared once.

The config file (``--config-file`` / ``CONFIG_FILE``) is the device plugin's ``version: v1`` file: its
``sharing.mps`` says what to share, ``flags.migStrategy`` and ``flags.mpsRoot`` may set the flags below.
A directory there holds named configs, as for the device plugin: the node label
``nvidia.com/device-plugin.config`` chooses one (``--default-config`` / ``DEFAULT_CONFIG`` and the
fallbacks otherwise), through the device plugin's own code (:mod:`gpunode.kube.labelconfig`). With
``--follow-device-plugin`` the config is the one the node's device plugin serves, as it publishes it under
the MPS root (:mod:`gpunode.mps.follow`): no config file, no Kubernetes API.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.api.mps import DEFAULT_ROOT
from gpunode.api.plugin_types import MIG_STRATEGIES, MigStrategy
from gpunode.common.settings import CommonWithConfigSettings, HttpSettings, KubeSettings, group, setting
from gpunode.kube.labelconfig import LabelConfigSettings

__all__ = ["HTTP_PORT", "MpsSettings", "shm_size"]

HTTP_PORT = 9456


def shm_size(text: str) -> str:
    """``--shm-size``: a tmpfs size, or ``""`` (the agent mounts nothing)."""
    from gpunode.mps.shm import parse_size

    return parse_size(text) if text.strip() else ""


@dataclass(frozen=True)
class MpsSettings:
    common: CommonWithConfigSettings = group(CommonWithConfigSettings)
    mig_strategy: MigStrategy = setting(
        "--mig-strategy",
        env="MIG_STRATEGY",
        choices=MIG_STRATEGIES,
        default="none",
        file_key="flags.migStrategy",
        help="the device plugin's MIG strategy (MPS is refused with mixed, as NVIDIA's)",
    )
    mps_root: str = setting(
        "--mps-root",
        env="MPS_ROOT",
        default=DEFAULT_ROOT,
        metavar="DIR",
        file_key="flags.mpsRoot",
        help="where the per-resource pipe and log directories, shm and .ready live",
    )
    follow_device_plugin: bool = setting(
        "--follow-device-plugin",
        env="FOLLOW_DEVICE_PLUGIN",
        type=bool,
        default=False,
        help="take the config the node's device plugin serves, as it publishes it at "
        "<mps-root>/.device-plugin-config.yaml (waits for it; plans again when it changes), instead of "
        "--config-file: one choice of config per node, no Kubernetes API for this agent",
    )
    watch_interval: float = setting(
        "--watch-interval",
        env="MPS_WATCH_INTERVAL",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often the control daemons are checked (their pid and control socket)",
    )
    retry_interval: float = setting(
        "--retry-interval",
        env="MPS_RETRY_INTERVAL",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="wait before starting a daemon again after a failed start (NVIDIA: 30 s)",
    )
    shm_size: str = setting(
        "--shm-size",
        env="MPS_SHM_SIZE",
        type=shm_size,
        default="65536k",
        metavar="SIZE",
        help="size of the tmpfs mounted at <mps-root>/shm unless one is there (needs CAP_SYS_ADMIN; "
        'without it skipped and logged); "" mounts nothing',
    )
    mount_shm: bool = setting(
        "--mount-shm",
        env="MPS_MOUNT_SHM",
        type=bool,
        default=False,
        negatable=False,
        help="mount the tmpfs at <mps-root>/shm (--shm-size) and exit: 0 when it is there afterwards, 1 "
        "when it could not be mounted (NVIDIA's mount-shm; the DaemonSet's init container)",
    )
    log_interval: float = setting(
        "--log-interval",
        env="MPS_LOG_INTERVAL",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often the control daemons' control.log is read into this agent's log",
    )
    label_config: LabelConfigSettings = group(LabelConfigSettings)
    kube: KubeSettings = group(KubeSettings)
    http: HttpSettings = group(HttpSettings, defaults={"http_port": HTTP_PORT})

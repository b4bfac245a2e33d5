"""The settings of ``gpunode-mig`` (one class per verb, mig-parted's flags and MIG_PARTED_* env vars) and
of ``gpunode-mig-manager`` (k8s-mig-manager's flags and env vars where the feature matches), declared once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpunode.common.settings import CommonSettings, HttpSettings, KubeSettings, group, setting
from gpunode.mig import DEFAULT_JOURNAL

__all__ = [
    "DEFAULT_NOTIFY",
    "DEFAULT_STATE_FILE",
    "ApplySettings",
    "AssertSettings",
    "CheckpointSettings",
    "ExportSettings",
    "GenerateConfigSettings",
    "ManagerSettings",
    "OutputSettings",
    "RestoreSettings",
    "SelectedConfigSettings",
    "VerbSettings",
]

#: where the bare-metal manager writes its outcome unless told otherwise (``--state-file``)
DEFAULT_STATE_FILE = "/run/gpunode/mig-manager/state.json"
#: the programs told (SIGHUP) after a change unless told otherwise (``--notify-processes``)
DEFAULT_NOTIFY = ("gpunode-device-plugin", "gpunode-feature-discovery")

OutputFormat = Literal["yaml", "json"]


# ============================================================================================ gpunode-mig
@dataclass(frozen=True)
class VerbSettings:
    """The flags every ``gpunode-mig`` verb has."""

    common: CommonSettings = group(CommonSettings)
    debug: bool = setting(
        "--debug", short="-d", env="MIG_PARTED_DEBUG", type=bool, default=False, help="log every step"
    )
    host_root: str = setting(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's /sys is mounted (GPU resets)",
    )


@dataclass(frozen=True)
class SelectedConfigSettings(VerbSettings):
    """apply and assert: a named layout of a mig-parted v1 config."""

    config_file: str | None = setting(
        "--config-file",
        short="-f",
        env="MIG_PARTED_CONFIG_FILE",
        metavar="FILE",
        help="mig-parted v1 config ('-': stdin; default: the shipped default layouts)",
    )
    selected_config: str | None = setting(
        "--selected-config",
        short="-c",
        env="MIG_PARTED_SELECTED_CONFIG",
        metavar="NAME",
        help="the named layout",
    )
    mode_only: bool = setting(
        "--mode-only",
        short="-m",
        env="MIG_PARTED_MODE_CHANGE_ONLY",
        type=bool,
        default=False,
        help="MIG mode only",
    )


@dataclass(frozen=True)
class ApplySettings(SelectedConfigSettings):
    hooks_file: str | None = setting(
        "--hooks-file",
        short="-k",
        env="MIG_PARTED_HOOKS_FILE",
        metavar="FILE",
        help="mig-parted v1 hooks file",
    )
    skip_reset: bool = setting(
        "--skip-reset",
        short="-s",
        env="MIG_PARTED_SKIP_RESET",
        type=bool,
        default=False,
        help="never reset GPUs",
    )
    dry_run: bool = setting(
        "--dry-run", env="MIG_PARTED_DRY_RUN", type=bool, default=False, help="print the plan, change nothing"
    )
    force: bool = setting(
        "--force",
        env="MIG_PARTED_FORCE",
        type=bool,
        default=False,
        help="go ahead although processes are using GPUs the change touches",
    )
    journal_file: str = setting(
        "--journal-file",
        env="MIG_PARTED_JOURNAL_FILE",
        default=DEFAULT_JOURNAL,
        metavar="FILE",
        help="where an apply records its progress ('' : none)",
    )


@dataclass(frozen=True)
class AssertSettings(SelectedConfigSettings):
    valid_config: bool = setting(
        "--valid-config",
        short="-a",
        env="MIG_PARTED_VALID_CONFIG",
        type=bool,
        default=False,
        help="only check the file and the name",
    )


@dataclass(frozen=True)
class OutputSettings(VerbSettings):
    """export and generate-config: the format of the layouts written."""

    output_format: OutputFormat = setting(
        "--output-format",
        short="-o",
        env="MIG_PARTED_OUTPUT_FORMAT",
        default="yaml",
        choices=("yaml", "json"),
        help="yaml or json",
    )


@dataclass(frozen=True)
class ExportSettings(OutputSettings):
    config_label: str = setting(
        "--config-label",
        short="-l",
        env="MIG_PARTED_CONFIG_LABEL",
        default="current",
        help="name of the exported config",
    )


@dataclass(frozen=True)
class GenerateConfigSettings(OutputSettings):
    output_file: str | None = setting(
        "--output-file", short="-f", env="MIG_PARTED_OUTPUT_FILE", metavar="FILE", help="default: stdout"
    )


@dataclass(frozen=True)
class CheckpointSettings(VerbSettings):
    checkpoint_file: str | None = setting(
        "--checkpoint-file",
        short="-f",
        env="MIG_PARTED_CHECKPOINT_FILE",
        metavar="FILE",
        help="checkpoint JSON",
    )


@dataclass(frozen=True)
class RestoreSettings(CheckpointSettings):
    pass


# ==================================================================================== gpunode-mig-manager
@dataclass(frozen=True)
class ManagerSettings:
    """gpunode-mig-manager's flags (the argparse metavars are the dest names, as they always were)."""

    common: CommonSettings = group(CommonSettings)
    config_file: str | None = setting(
        "--config-file",
        short="-f",
        env="CONFIG_FILE",
        help="mig-parted v1 config file; unset: layouts generated for the GPUs present",
    )
    default_config_file: str | None = setting(
        "--default-config-file",
        env="DEFAULT_CONFIG_FILE",
        help="layouts used when none can be generated (no MIG-capable GPU); unset: the shipped defaults",
    )
    gpu_clients_file: str | None = setting(
        "--gpu-clients-file",
        short="-g",
        env="GPU_CLIENTS_FILE",
        help="YAML: version: v1, systemd-services: host services to stop around a change",
    )
    with_reboot: bool = setting(
        "--with-reboot",
        short="-r",
        env="WITH_REBOOT",
        type=bool,
        default=False,
        help="reboot the node when a MIG mode change needs it (the GPU cannot be reset)",
    )
    with_shutdown_host_gpu_clients: bool = setting(
        "--with-shutdown-host-gpu-clients",
        short="-d",
        env="WITH_SHUTDOWN_HOST_GPU_CLIENTS",
        type=bool,
        default=False,
        help="stop the host GPU clients (and for a mode change the kubelet) around a change",
    )
    default_gpu_clients_namespace: str = setting(
        "--default-gpu-clients-namespace",
        short="-p",
        env="DEFAULT_GPU_CLIENTS_NAMESPACE",
        default="default",
        help="namespace of the operand pods (accepted; operand pods are waited for in every namespace)",
    )
    host_root_mount: str = setting(
        "--host-root-mount",
        short="-m",
        env="HOST_ROOT_MOUNT",
        default="/host",
        help="where the host's / is mounted, for systemctl and reboot through chroot (bare metal: /)",
    )
    host_kubelet_systemd_service: str = setting(
        "--host-kubelet-systemd-service",
        short="-k",
        env="HOST_KUBELET_SYSTEMD_SERVICE",
        default="kubelet.service",
        help="the kubelet's unit, stopped for a mode change with --with-shutdown-host-gpu-clients",
    )
    hooks_file: str | None = setting(
        "--hooks-file", env="MIG_PARTED_HOOKS_FILE", help="mig-parted v1 hooks file"
    )
    operand_timeout: float = setting(
        "--operand-timeout",
        env="GPUNODE_OPERAND_TIMEOUT",
        type=float,
        default=300.0,
        help="seconds for the operand pods to leave the node; then: failed, operands restored",
    )
    reassert_interval: float = setting(
        "--reassert-interval",
        env="GPUNODE_MIG_REASSERT_INTERVAL",
        type=float,
        default=300.0,
        help="seconds between re-checks that retry a failure and restore a lost layout; 0: off",
    )
    journal_file: str = setting(
        "--journal-file",
        env="MIG_PARTED_JOURNAL_FILE",
        default=DEFAULT_JOURNAL,
        help="progress of an apply, to resume one interrupted; '': none",
    )
    reboot_command: str | None = setting(
        "--reboot-command",
        env="GPUNODE_MIG_REBOOT_COMMAND",
        help="default: chroot <host-root-mount> reboot (bare metal: reboot)",
    )
    host_root: str = setting(
        "--host-root", env="GPUNODE_HOST_ROOT", default="/", help="where the host's /sys is (GPU resets)"
    )
    http: HttpSettings = group(
        HttpSettings,
        defaults={"http_port": 9453},
        help={"http_port": "/healthz /readyz /metrics; -1: off"},
        metavars={"http_address": "HTTP_ADDRESS", "http_port": "HTTP_PORT"},
    )
    notify_agents: bool = setting(
        "--notify-agents",
        env="GPUNODE_MIG_NOTIFY_AGENTS",
        type=bool,
        default=True,
        help="SIGHUP the device plugin and feature discovery on this node after a change",
    )
    notify_processes: str = setting(
        "--notify-processes",
        env="GPUNODE_MIG_NOTIFY_PROCESSES",
        default=",".join(DEFAULT_NOTIFY),
        help="the programs --notify-agents signals (comma-separated)",
    )
    selected_config_file: str | None = setting(
        "--selected-config-file",
        env="GPUNODE_MIG_SELECTED_CONFIG_FILE",
        help="bare metal: file naming the layout (name, or MIG_PARTED_SELECTED_CONFIG=name)",
    )
    state_file: str = setting(
        "--state-file",
        env="GPUNODE_MIG_STATE_FILE",
        default=DEFAULT_STATE_FILE,
        help="bare metal: the outcome as JSON {state, reason, config, time}",
    )
    oneshot: bool = setting(
        "--oneshot",
        env="GPUNODE_MIG_ONESHOT",
        type=bool,
        default=False,
        help="handle the selected layout once and exit: 0 applied, 1 failed",
    )
    host_clients_settle: float = setting(
        "--host-clients-settle",
        env="GPUNODE_MIG_HOST_CLIENTS_SETTLE",
        type=float,
        default=30.0,
        help="seconds to wait after stopping host clients for a mode change (fabric manager)",
    )
    kube: KubeSettings = group(KubeSettings)

"""gpunode-feature-discovery's settings: NVIDIA GFD's flags and env vars, declared once.

The ``version: v1`` config file (``--config-file``) is the device plugin's: ``flags.migStrategy``,
``flags.failOnInitError``, ``flags.useNodeFeatureAPI`` and GFD's own ``flags.gfd.*`` block; ``sharing``
is read from it separately (:mod:`.config`). ``--config-file`` may name a directory of such files,
one of them chosen by a node label (the label-config flags, :class:`LabelConfigSettings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpunode.api.plugin_types import MigStrategy
from gpunode.common.settings import CommonSettings, HttpSettings, KubeSettings, group, setting
from gpunode.feature_discovery.output import DEFAULT_OUTPUT
from gpunode.kube.labelconfig import LabelConfigSettings

__all__ = ["FdCommonSettings", "FdSettings", "LabelsOnExit", "config_directory"]

LabelsOnExit = Literal["expire", "delete", "keep"]


@dataclass(frozen=True)
class FdCommonSettings(CommonSettings):
    """The common flags, and ``--config-file`` with GFD's env var first."""

    config_file: str | None = setting(
        "--config-file",
        env=("GFD_CONFIG_FILE", "CONFIG_FILE"),
        metavar="FILE",
        help="the device plugin's version: v1 config file (flags.gfd.*, sharing.*)",
    )


@dataclass(frozen=True)
class FdSettings:
    common: FdCommonSettings = group(FdCommonSettings)
    mig_strategy: MigStrategy = setting(
        "--mig-strategy",
        env=("GFD_MIG_STRATEGY", "MIG_STRATEGY"),
        choices=("none", "single", "mixed"),
        default="none",
        file_key="flags.migStrategy",
        help="how MIG devices are labeled",
    )
    fail_on_init_error: bool = setting(
        "--fail-on-init-error",
        env=("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"),
        type=bool,
        default=True,
        file_key="flags.failOnInitError",
        help="exit when NVML cannot start; false: write no GPU labels, stay up",
    )
    oneshot: bool = setting(
        "--oneshot",
        env="GFD_ONESHOT",
        type=bool,
        default=False,
        file_key="flags.gfd.oneshot",
        help="label once and exit",
    )
    no_timestamp: bool = setting(
        "--no-timestamp",
        env="GFD_NO_TIMESTAMP",
        type=bool,
        default=False,
        file_key="flags.gfd.noTimestamp",
        help="leave out nvidia.com/gfd.timestamp",
    )
    # The text as given ("60s", "infinite"): the start parses it once (exit 2 when invalid). The
    # ``flags.gfd`` block is free-form, so the file may put a number here.
    sleep_interval: str = setting(
        "--sleep-interval",
        env="GFD_SLEEP_INTERVAL",
        type=str,
        default="60s",
        file_key="flags.gfd.sleepInterval",
        help="time between passes (e.g. 60s), or 'infinite'",
    )
    output_file: str = setting(
        "--output-file",
        env="GFD_OUTPUT_FILE",
        default=DEFAULT_OUTPUT,
        short="-o",
        file_key="flags.gfd.outputFile",
        help='the NFD feature file; "" prints to stdout',
    )
    machine_type_file: str = setting(
        "--machine-type-file",
        env="GFD_MACHINE_TYPE_FILE",
        default="/sys/class/dmi/id/product_name",
        file_key="flags.gfd.machineTypeFile",
        help="where nvidia.com/gpu.machine comes from",
    )
    labels_on_exit: LabelsOnExit = setting(
        "--labels-on-exit",
        env="GFD_LABELS_ON_EXIT",
        choices=("expire", "delete", "keep"),
        default="expire",
        help="on stop: keep the labels with an NFD expiry (default), delete them (as NVIDIA), or keep them",
    )
    host_root: str = setting(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's /sys is mounted (PCI classes, vGPU capability)",
    )
    http: HttpSettings = group(HttpSettings, defaults={"http_port": 9452})
    use_node_feature_api: bool = setting(
        "--use-node-feature-api",
        env=("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"),
        type=bool,
        default=False,
        file_key="flags.useNodeFeatureAPI",
        help="publish the labels as NodeFeature nvidia-features-for-<node> instead of the feature file",
    )
    pod_name: str | None = setting(
        "--pod-name", env="POD_NAME", metavar="NAME", help="this pod's name: owner of the NodeFeature"
    )
    kube: KubeSettings = group(KubeSettings, help={"namespace": "namespace of the NodeFeature object"})
    label_config: LabelConfigSettings = group(LabelConfigSettings)


def config_directory(settings: FdSettings) -> Path | None:
    """``--config-file`` when it names a directory of configs (a node label chooses), else None."""
    path = settings.common.config_file
    return Path(path) if path and Path(path).is_dir() else None

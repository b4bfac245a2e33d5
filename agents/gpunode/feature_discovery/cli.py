"""gpunode-feature-discovery: write NVIDIA's nvidia.com/* GPU node labels for Node Feature Discovery."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpunode.api.plugin_types import TimeSlicing
from gpunode.common.cli import (
    FlagSet,
    add_common_flags,
    add_kube_flags,
    log_effective_config,
    parse_interval,
)
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.hostpaths import HostPaths
from gpunode.common.httpcore import default_listen_host
from gpunode.common.logging import configure_logging
from gpunode.common.runtime import run
from gpunode.feature_discovery.loop import ConfigDir, FdOptions, FdReload, FeatureDiscovery
from gpunode.feature_discovery.output import DEFAULT_OUTPUT
from gpunode.kube.labelconfig import add_label_config_flags, parse_fallback_strategies

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.nvml.api import Nvml
from gpunode.agent.nvml import check_simulation


def flag_set() -> FlagSet:
    f = FlagSet(prog="gpunode-feature-discovery", description=__doc__)
    add_common_flags(f, config_file=False)
    f.add(
        "--config-file",
        env=("GFD_CONFIG_FILE", "CONFIG_FILE"),
        metavar="FILE",
        help="the device plugin's version: v1 config file (flags.gfd.*, sharing.*)",
    )
    f.add(
        "--mig-strategy",
        env=("GFD_MIG_STRATEGY", "MIG_STRATEGY"),
        choices=("none", "single", "mixed"),
        default="none",
        file_key="flags.migStrategy",
        help="how MIG devices are labeled",
    )
    f.add(
        "--fail-on-init-error",
        env=("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"),
        type=bool,
        default=True,
        file_key="flags.failOnInitError",
        help="exit when NVML cannot start; false: write no GPU labels, stay up",
    )
    f.add(
        "--oneshot",
        env="GFD_ONESHOT",
        type=bool,
        default=False,
        file_key="flags.gfd.oneshot",
        help="label once and exit",
    )
    f.add(
        "--no-timestamp",
        env="GFD_NO_TIMESTAMP",
        type=bool,
        default=False,
        file_key="flags.gfd.noTimestamp",
        help="leave out nvidia.com/gfd.timestamp",
    )
    f.add(
        "--sleep-interval",
        env="GFD_SLEEP_INTERVAL",
        type=str,
        default="60s",
        file_key="flags.gfd.sleepInterval",
        help="time between passes (e.g. 60s), or 'infinite'",
    )
    f.add(
        "--output-file",
        env="GFD_OUTPUT_FILE",
        default=DEFAULT_OUTPUT,
        short="-o",
        file_key="flags.gfd.outputFile",
        help='the NFD feature file; "" prints to stdout',
    )
    f.add(
        "--machine-type-file",
        env="GFD_MACHINE_TYPE_FILE",
        default="/sys/class/dmi/id/product_name",
        file_key="flags.gfd.machineTypeFile",
        help="where nvidia.com/gpu.machine comes from",
    )
    f.add(
        "--labels-on-exit",
        env="GFD_LABELS_ON_EXIT",
        choices=("expire", "delete", "keep"),
        default="expire",
        help="on stop: keep the labels with an NFD expiry (default), delete them (as NVIDIA), or keep them",
    )
    f.add(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's /sys is mounted (PCI classes, vGPU capability)",
    )
    f.add(
        "--http-port",
        env="GPUNODE_HTTP_PORT",
        type=int,
        default=9452,
        metavar="PORT",
        help="port of /healthz, /readyz and /metrics (0: any free port, -1: off)",
    )
    f.add(
        "--use-node-feature-api",
        env=("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"),
        type=bool,
        default=False,
        file_key="flags.useNodeFeatureAPI",
        help="publish the labels as NodeFeature nvidia-features-for-<node> instead of the feature file",
    )
    f.add("--pod-name", env="POD_NAME", metavar="NAME", help="this pod's name: owner of the NodeFeature")
    add_kube_flags(f, namespace_help="namespace of the NodeFeature object")
    add_label_config_flags(f)
    f.parser.add_argument(
        "--output", dest="output_file", default=__import__("argparse").SUPPRESS, help="alias of --output-file"
    )
    return f


def sharing_of(config: PluginConfig | None) -> TimeSlicing | None:
    """The file's time-slicing settings (GFD labels the replicas); None without a file."""
    return config.time_slicing() if config is not None else None


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    flags = flag_set()
    parsed: Any = flags.parse(argv, env)
    config_path = parsed.values.get("config_file")
    config_is_dir = bool(config_path) and Path(config_path).is_dir()
    if config_path and not config_is_dir:
        from gpunode.api.plugin_config import PluginConfig

        parsed = flags.parse(argv, env, config_model=PluginConfig)
    values = parsed.values
    configure_logging(
        values["log_format"], values["log_level"], agent="feature-discovery", node=values["node_name"]
    )
    try:
        check_simulation(values.get("simulate"), values.get("sim_state"))
        every = parse_interval(values["sleep_interval"])
        sharing = sharing_of(parsed.config)
        kube = connect_kube(values) if values["use_node_feature_api"] or config_is_dir else None
        node_feature = make_node_feature(values, kube) if values["use_node_feature_api"] else None
    except (ValueError, LookupError, ConfigError, UsageError) as exc:
        print(f"gpunode-feature-discovery: error: {exc}", file=sys.stderr)
        return 2
    log_effective_config(values, parsed.sources, flags=flags.flags.values())

    def reload(path: Path | None = None) -> FdReload:
        """The settings from the config file (``path``: one file of a config directory; None with a
        directory: no file); raises when it is bad."""
        args = list(argv if argv is not None else sys.argv[1:])
        if config_is_dir and path is not None:
            args += ["--config-file", str(path)]
        fresh: Any = flags.parse(args, env, exit_on_error=False)
        if fresh.values.get("config_file") and not (config_is_dir and path is None):
            from gpunode.api.plugin_config import PluginConfig

            fresh = flags.parse(args, env, config_model=PluginConfig, exit_on_error=False)
        return FdReload(fresh.values["mig_strategy"], sharing_of(fresh.config))

    config_dir = (
        ConfigDir(
            directory=Path(config_path),
            load=reload,
            node_label=values["node_label"],
            default_config=values.get("default_config") or None,
            fallbacks=parse_fallback_strategies(values["fallback_strategies"]),
        )
        if config_is_dir
        else None
    )

    machine = values["machine_type_file"]
    opts = FdOptions(
        output_file=values["output_file"],
        mig_strategy=values["mig_strategy"],
        sharing=sharing,
        interval=every,
        oneshot=values["oneshot"],
        no_timestamp=values["no_timestamp"],
        fail_on_init_error=values["fail_on_init_error"],
        machine_type_file=Path(machine) if machine else None,
        host=HostPaths(root=values["host_root"]),
        on_exit=values["labels_on_exit"],
        http_host=default_listen_host(env),
        http_port=None if values["http_port"] < 0 or values["oneshot"] else values["http_port"],
        reload=None if config_is_dir else reload,
        config_dir=config_dir,
    )

    async def open_nvml() -> Nvml:
        from gpunode.agent.nvml import open_nvml as open_

        return await open_(values["driver_root"], values.get("simulate"), values.get("sim_state"))

    return run(FeatureDiscovery(opts, open_nvml, node_feature=node_feature, kube=kube).run())


def connect_kube(values: Mapping[str, Any]) -> Any:
    """The API client (for --use-node-feature-api, or a config directory chosen by node label); the
    Kubernetes client is imported only here. Exit 2 without a node name or credentials."""
    from gpunode.kube.client import Kube

    return Kube.connect(
        values["node_name"],
        values["kubeconfig"],
        namespace=values["namespace"],
        timeout=values["kube_api_timeout"],
        field_manager="gpunode-feature-discovery",
    )


def make_node_feature(values: Mapping[str, Any], kube: Any) -> Any:
    from gpunode.feature_discovery.output import NodeFeatureOutput

    return NodeFeatureOutput(kube, values["namespace"], values["pod_name"])

"""gpunode-device-plugin: advertise NVIDIA GPUs (and MIG devices, and time-sliced replicas) to the kubelet."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpunode.agent.nvml import check_simulation
from gpunode.api.plugin_types import parse_device_list_strategy
from gpunode.common.cli import (
    FlagSet,
    add_common_flags,
    add_kube_flags,
    log_effective_config,
    parse_duration,
    values_from_model,
)
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.hostpaths import HostPaths
from gpunode.common.httpcore import default_listen_host
from gpunode.common.logging import configure_logging
from gpunode.common.runtime import run
from gpunode.device_plugin.health import HealthConfigError, XidPolicy
from gpunode.device_plugin.plugin import AgentOptions, ConfigDirOptions, DevicePlugin
from gpunode.device_plugin.settings import PluginSettings, settings_from_config
from gpunode.kube.labelconfig import add_label_config_flags, parse_fallback_strategies

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.kube.client import Kube
    from gpunode.nvml.api import Nvml

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"


def duration(text: str) -> float:
    """Seconds, or a Go duration in any case: "300", "5m", "90s", "1h30m"."""
    return parse_duration(text.strip().lower())


def flag_set() -> FlagSet:
    f = FlagSet(prog="gpunode-device-plugin", description=__doc__)
    add_common_flags(f)
    f.add(
        "--mig-strategy",
        env="MIG_STRATEGY",
        choices=("none", "single", "mixed"),
        default="none",
        file_key="flags.migStrategy",
        help="how MIG devices are advertised",
    )
    f.add(
        "--fail-on-init-error",
        env="FAIL_ON_INIT_ERROR",
        type=bool,
        default=True,
        file_key="flags.failOnInitError",
        help="exit when NVML cannot start; false: stay up, not ready, advertising nothing",
    )
    f.add(
        "--dev-root",
        env="NVIDIA_DEV_ROOT",
        metavar="DIR",
        file_key="flags.nvidiaDevRoot",
        help="where /dev/nvidia* live (default: the driver root)",
    )
    f.add(
        "--pass-device-specs",
        env="PASS_DEVICE_SPECS",
        type=bool,
        default=False,
        file_key="flags.plugin.passDeviceSpecs",
        help="also hand the device nodes to the runtime",
    )
    f.add(
        "--device-list-strategy",
        env="DEVICE_LIST_STRATEGY",
        type=parse_device_list_strategy,
        default=("envvar",),
        file_key="flags.plugin.deviceListStrategy",
        help="envvar, volume-mounts, cdi-annotations, cdi-cri, or a comma-separated combination",
    )
    f.add(
        "--device-id-strategy",
        env="DEVICE_ID_STRATEGY",
        choices=("uuid", "index"),
        default="uuid",
        file_key="flags.plugin.deviceIDStrategy",
        help="how devices are named to the runtime",
    )
    f.add(
        "--cdi-annotation-prefix",
        env="CDI_ANNOTATION_PREFIX",
        default="cdi.k8s.io/",
        file_key="flags.plugin.cdiAnnotationPrefix",
        help="prefix of CDI annotations",
    )
    f.add(
        "--shared-devices-allocation-policy",
        env="SHARED_DEVICES_ALLOCATION_POLICY",
        choices=("distributed", "packed"),
        default="distributed",
        file_key="flags.plugin.sharedDevicesAllocationPolicy",
        help="how replicas and MIG devices are chosen",
    )
    f.add(
        "--kubelet-socket",
        env="KUBELET_SOCKET",
        default=DEFAULT_KUBELET_SOCKET,
        metavar="PATH",
        help='the kubelet registration socket; "" serves without registering',
    )
    f.add(
        "--health-recovery-period",
        env="DP_HEALTH_RECOVERY_PERIOD",
        type=duration,
        default=300.0,
        metavar="DURATION",
        help="quiet time before an Unhealthy GPU is Healthy again; 0 never",
    )
    add_label_config_flags(f)
    add_kube_flags(f, namespace_help="namespace (unused by the device plugin; common to the agents)")
    f.add(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's /sys and /proc are mounted",
    )
    f.add(
        "--http-port",
        env="GPUNODE_HTTP_PORT",
        type=int,
        default=9451,
        metavar="PORT",
        help="port of /healthz, /readyz and /metrics (0: any free port, -1: off)",
    )
    # NVIDIA's aliases, accepted unchanged
    f.parser.add_argument(
        "--nvidia-driver-root", dest="driver_root", default=argparse.SUPPRESS, help="alias of --driver-root"
    )
    f.parser.add_argument(
        "--nvidia-dev-root", dest="dev_root", default=argparse.SUPPRESS, help="alias of --dev-root"
    )
    return f


OVERRIDE_KEYS = {
    "mig_strategy": "mig_strategy",
    "fail_on_init_error": "fail_on_init_error",
    "pass_device_specs": "pass_device_specs",
    "device_list_strategy": "device_list_strategies",
    "device_id_strategy": "device_id_strategy",
    "cdi_annotation_prefix": "cdi_annotation_prefix",
    "shared_devices_allocation_policy": "shared_allocation_policy",
    "driver_root": "driver_root",
    "dev_root": "dev_root",
}


def settings_loader(flags: FlagSet, args: Mapping[str, Any], environ: Mapping[str, str]) -> Any:
    """Settings for a (re)loaded config file, with flags and env vars still taking precedence."""

    def load(config: PluginConfig | None) -> PluginSettings:
        values, _ = flags.resolve(args, environ, values_from_model(flags.flags.values(), config))
        overrides = {OVERRIDE_KEYS[k]: v for k, v in values.items() if k in OVERRIDE_KEYS and v is not None}
        return settings_from_config(config, overrides)

    return load


def probe_interval(recovery_period: float) -> float:
    """How often lost GPUs and recoveries are checked: every 10 s, or finer for a short hold-down."""
    if recovery_period <= 0:
        return 10.0
    return min(10.0, max(0.2, recovery_period / 5))


def config_dir_options(values: Mapping[str, Any]) -> ConfigDirOptions | None:
    """With ``--config-file`` naming a directory: how the node label chooses a file in it."""
    path = values.get("config_file")
    if not path or not Path(path).is_dir():
        return None
    return ConfigDirOptions(
        directory=Path(path),
        node_label=values["node_label"],
        default_config=values.get("default_config") or None,
        fallbacks=parse_fallback_strategies(values["fallback_strategies"]),
        first_label_wait=values["kube_api_timeout"],
    )


def connect_kube(values: Mapping[str, Any], config_dir: ConfigDirOptions) -> Kube:
    """The API client for the node label; imported only here (lightkube costs memory)."""
    from gpunode.kube.client import Kube

    try:
        return Kube.connect(
            values["node_name"],
            values.get("kubeconfig"),
            namespace=values["namespace"],
            timeout=values["kube_api_timeout"],
            field_manager="gpunode-device-plugin",
        )
    except UsageError as exc:
        raise UsageError(
            f"--config-file {config_dir.directory} is a directory: the node label "
            f"{config_dir.node_label} chooses the config in it, which needs the Kubernetes API: {exc}"
        ) from None


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    flags = flag_set()
    parsed: Any = flags.parse(argv, env)
    path = parsed.values.get("config_file")
    if path and not Path(path).is_dir():  # only then load pydantic and the file's schema
        from gpunode.api.plugin_config import PluginConfig

        parsed = flags.parse(argv, env, config_model=PluginConfig)
    values = parsed.values
    configure_logging(
        values["log_format"], values["log_level"], agent="device-plugin", node=values["node_name"]
    )
    try:
        check_simulation(values.get("simulate"), values.get("sim_state"))
        policy = XidPolicy.from_env(env)
        load = settings_loader(flags, parsed.args, env)
        settings = load(parsed.config)
        config_dir = config_dir_options(values)
        kube = connect_kube(values, config_dir) if config_dir is not None else None
    except (HealthConfigError, ValueError, ConfigError, LookupError, UsageError) as exc:
        print(f"gpunode-device-plugin: error: {exc}", file=sys.stderr)
        return 2
    log_effective_config(values, parsed.sources, flags=flags.flags.values(), health_checks=str(policy))
    kubelet = values["kubelet_socket"]
    config_file = values.get("config_file")
    opts = AgentOptions(
        kubelet_socket=Path(kubelet) if kubelet else None,
        config_file=Path(config_file) if config_file and config_dir is None else None,
        config_dir=config_dir,
        load_settings=load,
        host=HostPaths(root=values["host_root"]),
        recovery_period=values["health_recovery_period"],
        probe_interval=probe_interval(values["health_recovery_period"]),
        policy=policy,
        http_host=default_listen_host(env),
        http_port=None if values["http_port"] < 0 else values["http_port"],
    )

    async def open_nvml() -> Nvml:
        from gpunode.agent.nvml import open_nvml as open_

        driver_root = plugin.state.settings.driver_root  # a directory's config is chosen by now
        return await open_(driver_root, values.get("simulate"), values.get("sim_state"))

    plugin = DevicePlugin(opts, open_nvml, settings, parsed.config, kube=kube)
    return run(plugin.run())


__all__ = ["UsageError", "main"]

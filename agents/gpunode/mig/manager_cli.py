"""gpunode-mig-manager: keep the node's MIG layout at the one the nvidia.com/mig.config label names
(Kubernetes mode, NODE_NAME set), or the one a file names (bare metal, --selected-config-file)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpunode.common.cli import FlagSet, add_common_flags, add_kube_flags, log_effective_config
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.logging import configure_logging
from gpunode.common.runtime import run
from gpunode.mig import DEFAULT_JOURNAL
from gpunode.mig.manager import DEFAULT_NOTIFY, DEFAULT_STATE_FILE, build_options, serve

B, F, S = bool, float, str
# (flag, env, type, default, short, help); names and env vars as NVIDIA's where the feature matches
# fmt: off
FLAGS: tuple[tuple[str, str, Any, Any, str | None, str], ...] = (
    ("--config-file", "CONFIG_FILE", S, None, "-f",
     "mig-parted v1 config file; unset: layouts generated for the GPUs present"),
    ("--default-config-file", "DEFAULT_CONFIG_FILE", S, None, None,
     "layouts used when none can be generated (no MIG-capable GPU); unset: the shipped defaults"),
    ("--gpu-clients-file", "GPU_CLIENTS_FILE", S, None, "-g",
     "YAML: version: v1, systemd-services: host services to stop around a change"),
    ("--with-reboot", "WITH_REBOOT", B, False, "-r",
     "reboot the node when a MIG mode change needs it (the GPU cannot be reset)"),
    ("--with-shutdown-host-gpu-clients", "WITH_SHUTDOWN_HOST_GPU_CLIENTS", B, False, "-d",
     "stop the host GPU clients (and for a mode change the kubelet) around a change"),
    ("--default-gpu-clients-namespace", "DEFAULT_GPU_CLIENTS_NAMESPACE", S, "default", "-p",
     "namespace of the operand pods (accepted; operand pods are waited for in every namespace)"),
    ("--host-root-mount", "HOST_ROOT_MOUNT", S, "/host", "-m",
     "where the host's / is mounted, for systemctl and reboot through chroot (bare metal: /)"),
    ("--host-kubelet-systemd-service", "HOST_KUBELET_SYSTEMD_SERVICE", S, "kubelet.service", "-k",
     "the kubelet's unit, stopped for a mode change with --with-shutdown-host-gpu-clients"),
    ("--hooks-file", "MIG_PARTED_HOOKS_FILE", S, None, None, "mig-parted v1 hooks file"),
    ("--operand-timeout", "GPUNODE_OPERAND_TIMEOUT", F, 300.0, None,
     "seconds for the operand pods to leave the node; then: failed, operands restored"),
    ("--reassert-interval", "GPUNODE_MIG_REASSERT_INTERVAL", F, 300.0, None,
     "seconds between re-checks that retry a failure and restore a lost layout; 0: off"),
    ("--journal-file", "MIG_PARTED_JOURNAL_FILE", S, DEFAULT_JOURNAL, None,
     "progress of an apply, to resume one interrupted; '': none"),
    ("--reboot-command", "GPUNODE_MIG_REBOOT_COMMAND", S, None, None,
     "default: chroot <host-root-mount> reboot (bare metal: reboot)"),
    ("--host-root", "GPUNODE_HOST_ROOT", S, "/", None, "where the host's /sys is (GPU resets)"),
    ("--http-port", "GPUNODE_HTTP_PORT", int, 9453, None, "/healthz /readyz /metrics; -1: off"),
    ("--notify-agents", "GPUNODE_MIG_NOTIFY_AGENTS", B, True, None,
     "SIGHUP the device plugin and feature discovery on this node after a change"),
    ("--notify-processes", "GPUNODE_MIG_NOTIFY_PROCESSES", S, ",".join(DEFAULT_NOTIFY), None,
     "the programs --notify-agents signals (comma-separated)"),
    ("--selected-config-file", "GPUNODE_MIG_SELECTED_CONFIG_FILE", S, None, None,
     "bare metal: file naming the layout (name, or MIG_PARTED_SELECTED_CONFIG=name)"),
    ("--state-file", "GPUNODE_MIG_STATE_FILE", S, DEFAULT_STATE_FILE, None,
     "bare metal: the outcome as JSON {state, reason, config, time}"),
    ("--oneshot", "GPUNODE_MIG_ONESHOT", B, False, None,
     "handle the selected layout once and exit: 0 applied, 1 failed"),
    ("--host-clients-settle", "GPUNODE_MIG_HOST_CLIENTS_SETTLE", F, 30.0, None,
     "seconds to wait after stopping host clients for a mode change (fabric manager)"),
)
# fmt: on


def flag_set() -> FlagSet:
    f = FlagSet(prog="gpunode-mig-manager", description=__doc__)
    add_common_flags(f, config_file=False)
    for option, env, kind, default, short, text in FLAGS:
        f.add(option, env=env, type=kind, default=default, short=short, help=text)
    add_kube_flags(f)
    f.parser.add_argument("-n", dest="node_name", default=argparse.SUPPRESS, help="alias of --node-name")
    return f


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    flags = flag_set()
    parsed = flags.parse(argv, env)
    values = parsed.values
    configure_logging(
        values["log_format"], values["log_level"], agent="mig-manager", node=values["node_name"]
    )
    try:
        from gpunode.agent.nvml import check_simulation

        check_simulation(values.get("simulate"), values.get("sim_state"))
        opts = build_options(values, parsed.sources, env)
        kube = None
        if opts.selected_config_file is None:
            from gpunode.mig.manager import connect_kube

            kube = connect_kube(values)
    except (ConfigError, UsageError, ValueError, LookupError) as exc:
        print(f"gpunode-mig-manager: error: {exc}", file=sys.stderr)
        return 2
    log_effective_config(values, parsed.sources, flags=flags.flags.values())
    return run(serve(opts, kube))

"""The MIG manager's options, built once from its typed settings: the files it reads checked at start
(exit 2 for a bad one), the host root, reboot command and notified programs worked out."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpunode.common.cli import Source
from gpunode.mig import DEFAULT_JOURNAL
from gpunode.mig.bare_metal import REBOOT_MARKER
from gpunode.mig.settings import DEFAULT_NOTIFY, DEFAULT_STATE_FILE, ManagerSettings

__all__ = ["ManagerOptions", "build_options"]


@dataclass(frozen=True)
class ManagerOptions:
    config_file: str | None = None
    default_config_file: str | None = None
    services: tuple[str, ...] = ()  # from GPU_CLIENTS_FILE
    with_reboot: bool = False
    with_shutdown_host_gpu_clients: bool = False
    host_kubelet_service: str = "kubelet.service"
    operand_timeout: float = 300.0
    reassert_interval: float = 300.0  # <= 0: off
    journal_file: str | None = None
    hooks_file: str | None = None
    reboot_command: tuple[str, ...] = ("reboot",)
    reboot_marker: Path | None = None  # bare metal: survives the reboot (the state file does not)
    notify_agents: bool = True
    notify_processes: tuple[str, ...] = DEFAULT_NOTIFY
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    oneshot: bool = False
    selected_config_file: Path | None = None  # bare-metal mode when set
    state_file: Path = Path(DEFAULT_STATE_FILE)
    host_clients_settle: float = 30.0  # after stopping host clients for a mode change (fabric manager)
    host_root_mount: str = "/"  # the host's / (systemctl and reboot through chroot unless it is /)
    host_root: str = "/"  # where the host's /sys is (GPU resets)


def build_options(
    s: ManagerSettings, sources: Mapping[str, Source], environ: Mapping[str, str]
) -> ManagerOptions:
    """The options from the resolved settings (``sources``: where each came from); ConfigError for a bad
    config, clients or hooks file, UsageError for a selected-config file in a directory that does not
    exist."""
    from gpunode.api.gpu_clients import load_gpu_clients
    from gpunode.api.mig_config import load_spec
    from gpunode.api.mig_hooks import load_hooks
    from gpunode.common.cmdargs import unit_name_problem
    from gpunode.common.errors import UsageError

    selected = Path(s.selected_config_file) if s.selected_config_file else None
    if selected is not None and not selected.parent.is_dir():
        raise UsageError(f"--selected-config-file: directory {selected.parent} does not exist")
    kubelet_unit = s.host_kubelet_systemd_service
    problem = unit_name_problem(kubelet_unit) if kubelet_unit else None
    if problem is not None:  # it reaches systemctl: an argument, never an option
        raise UsageError(f"--host-kubelet-systemd-service/HOST_KUBELET_SYSTEMD_SERVICE: {problem}")
    bare = selected is not None
    root = "/" if bare and sources["host_root_mount"] == "default" else s.host_root_mount
    reboot = s.reboot_command or ("reboot" if root == "/" else f"chroot {shlex.quote(root)} reboot")
    for path in (s.config_file, s.default_config_file):
        if path:
            load_spec(path)  # a missing or bad file: exit 2 at start, naming the file and the problem
    if s.hooks_file:
        load_hooks(s.hooks_file)  # likewise, rather than a failure at each change
    journal = s.journal_file or None
    marker = Path(journal or DEFAULT_JOURNAL).parent / REBOOT_MARKER
    return ManagerOptions(
        config_file=s.config_file,
        default_config_file=s.default_config_file,
        services=load_gpu_clients(s.gpu_clients_file) if s.gpu_clients_file else (),
        with_reboot=s.with_reboot,
        with_shutdown_host_gpu_clients=s.with_shutdown_host_gpu_clients,
        host_kubelet_service=s.host_kubelet_systemd_service,
        operand_timeout=s.operand_timeout,
        reassert_interval=s.reassert_interval,
        journal_file=journal,
        hooks_file=s.hooks_file,
        reboot_command=tuple(shlex.split(reboot)),
        reboot_marker=marker if bare else None,
        notify_agents=s.notify_agents,
        notify_processes=tuple(p.strip() for p in s.notify_processes.split(",") if p.strip()),
        http_host=s.http.listen_host(environ),
        http_port=None if s.http.http_port < 0 or s.oneshot else s.http.http_port,
        oneshot=s.oneshot,
        selected_config_file=selected,
        state_file=Path(s.state_file),
        host_clients_settle=s.host_clients_settle,
        host_root_mount=root,
        host_root=s.host_root,
    )

"""gpunode-toolkit runtime: enable CDI in containerd (legacy path: NVIDIA's runtime handlers too).

    gpunode-toolkit runtime configure --runtime containerd|crio [--no-enable-cdi | --nvidia-runtime-handlers
                                      [--set-as-default]] [--dry-run] [--revert [--force]] [--check] [...]
    gpunode-toolkit runtime status    --runtime containerd|crio [...]

configure sets enable_cdi and cdi_spec_dirs in containerd's CRI plugin (CRI-O reads CDI specs by
itself: nothing to write), so pods get the devices the device plugin names with no RuntimeClass. Only
with --no-enable-cdi or --nvidia-runtime-handlers does it add the handlers nvidia
(--nvidia-runtime-name), nvidia-cdi and nvidia-legacy, and only when NVIDIA's nvidia-container-runtime
binaries exist on the host (else exit 2, nothing written). It writes a drop-in (containerd config
version >= 2, CRI-O) or edits the config in place, and restarts the runtime when something changed.
Run twice, it changes nothing ("no change"); --revert restores every file it touched byte for byte
(files it created are removed). status (or configure --check) prints whether what configure would
set is in place: exit 0 yes, 1 no.

Exit 0 on success, 1 on failure (nothing half-written), 2 on bad usage, an unreadable config or a
missing NVIDIA runtime binary.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpunode.agent.main import AgentContext, AgentSpec, verbs_main
from gpunode.common.errors import ConfigError, UsageError
from gpunode.toolkit.settings import (
    ConfigureSettings,
    RuntimeSettings,
    configure_settings_for,
    status_settings_for,
)

if TYPE_CHECKING:
    from gpunode.toolkit import runtime as rt

__all__ = ["CONFIGURE", "SPECS", "STATUS", "configure", "main", "options", "status"]

PROG = "gpunode-toolkit runtime"


def start_configure(ctx: AgentContext[ConfigureSettings]) -> int:
    ctx.parsed.log_effective_config(command="runtime configure")
    s = ctx.settings
    return _guarded(lambda: status(s) if s.actions.check else configure(s))


def start_status(ctx: AgentContext[RuntimeSettings]) -> int:
    ctx.parsed.log_effective_config(command="runtime status")
    return _guarded(lambda: status(ctx.settings))


def _guarded(work: Callable[[], int]) -> int:
    """Exit 2 for a bad config or usage, 1 when applying, restarting or reverting failed."""
    from gpunode.toolkit import runtime as rt

    try:
        return work()
    except (ConfigError, UsageError, ValueError) as exc:
        print(f"gpunode-toolkit: error: {exc}", file=sys.stderr)
        return 2
    except (rt.ApplyError, rt.RestartError, rt.RevertError, OSError) as exc:
        print(f"gpunode-toolkit: error: {exc}", file=sys.stderr)
        return 1


CONFIGURE = AgentSpec(
    name="toolkit",
    console_script="gpunode-toolkit",
    verb="runtime configure",
    settings_type=ConfigureSettings,
    settings_for=configure_settings_for,
    start=start_configure,
    description=__doc__,
    errors_with_verb=True,
    uses_nvml=False,
)
STATUS = AgentSpec(
    name="toolkit",
    console_script="gpunode-toolkit",
    verb="runtime status",
    settings_type=RuntimeSettings,
    settings_for=status_settings_for,
    start=start_status,
    description=__doc__,
    errors_with_verb=True,
    uses_nvml=False,
)
SPECS: Mapping[str, AgentSpec[ConfigureSettings] | AgentSpec[RuntimeSettings]] = {
    "configure": CONFIGURE,
    "status": STATUS,
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    try:
        return verbs_main(PROG, SPECS, argv, environ, usage=__doc__)
    except SystemExit as exc:  # argparse already printed why
        return exc.code if isinstance(exc.code, int) else 2


def legacy_handlers_wanted(s: RuntimeSettings) -> bool:
    """The nvidia handlers are written only when asked for: --nvidia-runtime-handlers, or no CDI."""
    return s.nvidia_runtime_handlers or not s.enable_cdi


def options(s: RuntimeSettings) -> rt.ConfigureOptions:
    """What to configure, from the settings."""
    from gpunode.toolkit import runtime as rt

    handlers: tuple[rt.Handler, ...] = ()
    if legacy_handlers_wanted(s):
        handlers = rt.handlers_from_paths(
            s.nvidia_runtime_name,
            s.nvidia_runtime_path,
            s.nvidia_cdi_runtime_path,
            s.nvidia_legacy_runtime_path,
        )
    elif s.set_as_default:
        raise UsageError(
            "--set-as-default makes the nvidia handler the default runtime; it needs "
            "--nvidia-runtime-handlers (or --no-enable-cdi). With CDI no runtime handler is needed"
        )
    return rt.ConfigureOptions(
        runtime=s.runtime,
        config=s.config,
        drop_in=None if s.drop_in_config in ("", "none") else s.drop_in_config,
        handlers=handlers,
        set_as_default=s.set_as_default,
        enable_cdi=s.enable_cdi,
        cdi_spec_dirs=s.cdi_spec_dirs,
        config_version=s.containerd_config_version,
        runtime_type=s.runtime_type,
    )


def configure(s: ConfigureSettings) -> int:
    """Configure (or with --revert restore) the runtime's files and restart it when they changed."""
    from gpunode.toolkit import runtime as rt

    act = s.actions
    host_root = s.host_root
    state_file = s.state_file or rt.default_state_file(s.config)
    if act.revert:
        plan = rt.plan_revert(rt.local_path(host_root, state_file), force=act.force)
    else:
        opts = options(s)
        missing = rt.missing_binaries(opts.handlers, host_root)
        if missing:
            raise UsageError(
                "the nvidia runtime handlers run NVIDIA's container runtime, which is not on this host: "
                f"{', '.join(missing)} (under the host root {host_root}) not found or not executable; "
                "nothing written. Install NVIDIA's container toolkit (or point --nvidia-runtime-path, "
                "--nvidia-cdi-runtime-path, --nvidia-legacy-runtime-path at it), or use CDI, the default, "
                "which needs no runtime handler"
            )
        plan = rt.plan_configure(opts, host_root=host_root, state_file=state_file)
    for note in plan.notes:
        print(f"note: {note}")
    if plan.empty:
        if act.revert and not act.dry_run:
            rt.apply_plan(plan)  # only drops a record with nothing left to restore
        print("no change")
        return 0
    if act.dry_run:
        sys.stdout.write(plan.diff())
        print(f"dry run: {len(plan.changes)} file(s) would change; nothing written")
        return 0
    rt.apply_plan(plan)
    for change in plan.changes:
        print(f"{change.verb} {change.path}")
    message = rt.restart_runtime(
        s.runtime,
        s.restart_mode,
        host_root=host_root,
        pid_file=s.pid_file,
        socket_path=s.socket,
        systemctl=s.systemctl,
        unit=s.systemd_unit,
    )
    print(message)
    return 0


def status(s: RuntimeSettings) -> int:
    """Print whether what configure sets is in place (CDI enabled; the nvidia handlers when asked
    for): 0 yes, 1 no."""
    from gpunode.toolkit import runtime as rt

    opts = options(s)
    runtime = opts.runtime
    found: list[str] = []
    default: str | None = None
    cdi: bool | None = None
    main_imports: list[str] | None = None
    for host_path in [opts.config, *([opts.drop_in] if opts.drop_in else [])]:
        local = rt.local_path(s.host_root, host_path)
        data = rt.read_file(local)
        if data is None:
            print(f"{local}: absent")
            continue
        text = rt.decode_text(data, str(local)) or ""
        try:
            names = rt.nvidia_handlers_present(text, runtime)
            file_default = rt.default_runtime_name(text, runtime)
            file_cdi = rt.cdi_enabled(text, runtime)
            doc = rt.parse_toml(text, str(local)).unwrap()
        except ConfigError as exc:
            raise ConfigError(str(local), exc.problems) from None
        if host_path == opts.config:
            imports = doc.get("imports")
            main_imports = [i for i in imports if isinstance(i, str)] if isinstance(imports, list) else []
        elif runtime == "containerd" and not rt.imports_cover(
            main_imports or [], host_path, os.path.dirname(opts.config)
        ):
            print(f"{local}: not imported by {opts.config}, so containerd does not read it")
            continue
        print(f"{local}: {', '.join(names) if names else 'no nvidia handlers'}")
        found += [n for n in names if n not in found]
        default = file_default or default
        cdi = file_cdi if file_cdi is not None else cdi
    wanted = [h.name for h in opts.handlers]
    missing = [name for name in wanted if name not in found]
    print(f"default runtime: {default or '(runtime default)'}")
    ok = True
    if opts.enable_cdi:
        if runtime == "crio":
            print("CDI: enabled (CRI-O reads CDI specs by itself)")
        elif cdi:
            print(f"CDI: enabled (enable_cdi = true; specs from {', '.join(opts.cdi_spec_dirs)})")
        else:
            print("CDI NOT enabled: enable_cdi is not set to true in the CRI plugin")
            ok = False
    if missing:
        print(f"nvidia handlers NOT configured: missing {', '.join(missing)}")
        ok = False
    elif wanted:
        print(f"nvidia handlers configured: {', '.join(wanted)}")
    else:
        print(f"nvidia handlers: {', '.join(found) if found else 'none'} (not needed with CDI)")
    return 0 if ok else 1

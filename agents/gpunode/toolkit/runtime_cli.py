"""gpunode-toolkit runtime: register NVIDIA's runtime handlers with containerd or CRI-O.

    gpunode-toolkit runtime configure --runtime containerd|crio [--set-as-default] [--enable-cdi]
                                      [--dry-run] [--revert [--force]] [--check] [...]
    gpunode-toolkit runtime status    --runtime containerd|crio [...]

configure adds the handlers nvidia (--nvidia-runtime-name), nvidia-cdi and nvidia-legacy, writes a
drop-in (containerd config version >= 2, CRI-O) or edits the config in place, and restarts the
runtime when something changed. Run twice, it changes nothing ("no change"); --revert restores every
file it touched byte for byte (files it created are removed). status (or configure --check) prints
whether the handlers are configured: exit 0 yes, 1 no.

Exit 0 on success, 1 on failure (nothing half-written), 2 on bad usage or an unreadable config.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpunode.common.cli import FlagSet, add_common_flags, log_effective_config, split_verb
from gpunode.common.errors import ConfigError, UsageError
from gpunode.toolkit import runtime as rt

VERBS = ("configure", "status")
TOOLKIT_DIR = "/usr/local/nvidia/toolkit"

#: Per-runtime defaults and NVIDIA's env var aliases.
DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "containerd": {
        "config": "/etc/containerd/config.toml",
        "drop_in": "/etc/containerd/conf.d/99-nvidia.toml",
        "socket": "/run/containerd/containerd.sock",
        "restart_mode": "signal",
        "config_envs": ("RUNTIME_CONFIG", "CONTAINERD_CONFIG"),
        "socket_envs": ("RUNTIME_SOCKET", "CONTAINERD_SOCKET"),
        "default_envs": ("NVIDIA_RUNTIME_SET_AS_DEFAULT", "CONTAINERD_SET_AS_DEFAULT"),
    },
    "crio": {
        "config": "/etc/crio/crio.conf",
        "drop_in": "/etc/crio/crio.conf.d/99-nvidia.toml",
        "socket": "/var/run/crio/crio.sock",
        "restart_mode": "systemd",
        "config_envs": ("RUNTIME_CONFIG", "CRIO_CONFIG"),
        "socket_envs": ("RUNTIME_SOCKET", "CRIO_SOCKET"),
        "default_envs": ("NVIDIA_RUNTIME_SET_AS_DEFAULT",),
    },
}


def _runtime_of(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """--runtime (or RUNTIME) before the full parse: the other flags' defaults depend on it."""
    value: str | None = None
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--runtime" and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("--runtime="):
            value = arg.partition("=")[2]
    if value is None:
        value = env.get("RUNTIME") or None
    if value is None:
        raise UsageError("--runtime is required; the choices are: containerd, crio")
    if value not in DEFAULTS:
        raise UsageError(f"unknown runtime {value!r}; the choices are: containerd, crio")
    return value


def flag_set(verb: str, runtime: str) -> FlagSet:
    d = DEFAULTS[runtime]
    f = FlagSet(prog=f"gpunode-toolkit runtime {verb}", description=__doc__)
    add_common_flags(f, config_file=False)
    f.add("--runtime", env="RUNTIME", choices=tuple(DEFAULTS), help="the container runtime")
    f.add("--config", env=d["config_envs"], default=d["config"], metavar="FILE", help="its main config")
    f.add(
        "--drop-in-config",
        env="RUNTIME_DROP_IN_CONFIG",
        default=d["drop_in"],
        metavar="FILE",
        help="where our settings go ('' or none: edit --config in place; containerd v1 always is)",
    )
    f.add("--socket", env=d["socket_envs"], default=d["socket"], metavar="SOCK", help="to find its pid")
    f.add(
        "--nvidia-runtime-name",
        env=("NVIDIA_RUNTIME_NAME", "CONTAINERD_RUNTIME_CLASS"),
        default="nvidia",
        metavar="NAME",
        help="name of the main handler (the RuntimeClass handler)",
    )
    for option, env, suffix in (
        ("--nvidia-runtime-path", "NVIDIA_RUNTIME_PATH", ""),
        ("--nvidia-cdi-runtime-path", "NVIDIA_CDI_RUNTIME_PATH", ".cdi"),
        ("--nvidia-legacy-runtime-path", "NVIDIA_LEGACY_RUNTIME_PATH", ".legacy"),
    ):
        f.add(option, env=env, default=f"{TOOLKIT_DIR}/nvidia-container-runtime{suffix}", metavar="PATH")
    f.add(
        "--set-as-default",
        env=d["default_envs"],
        type=bool,
        default=False,
        help="make the nvidia handler the default runtime",
    )
    f.add(
        "--enable-cdi",
        env=("RUNTIME_ENABLE_CDI", "CDI_ENABLED"),
        type=bool,
        default=False,
        help="containerd: enable_cdi + cdi_spec_dirs in the CRI plugin",
    )
    f.add(
        "--cdi-spec-dirs",
        env="CDI_SPEC_DIRS",
        type=_dirs,
        default="/etc/cdi,/var/run/cdi",
        metavar="DIRS",
        help="comma-separated",
    )
    f.add(
        "--containerd-config-version",
        env="CONTAINERD_CONFIG_VERSION",
        type=int,
        choices=(1, 2, 3),
        metavar="N",
        help="config version for a new or empty containerd config (default 2); else the file's own",
    )
    f.add(
        "--runtime-type",
        env="CONTAINERD_RUNTIME_TYPE",
        default="io.containerd.runc.v2",
        metavar="TYPE",
        help="containerd runtime_type when the copied runc table has none",
    )
    f.add(
        "--restart-mode",
        env="RUNTIME_RESTART_MODE",
        choices=("signal", "systemd", "none"),
        default=d["restart_mode"],
        metavar="MODE",
        help="signal | systemd | none; only when something changed",
    )
    f.add("--systemctl", env="GPUNODE_SYSTEMCTL", metavar="PATH", help="default: systemctl (chrooted)")
    f.add("--systemd-unit", env="RUNTIME_SYSTEMD_UNIT", default=runtime, metavar="UNIT", help="unit")
    f.add("--pid-file", env="RUNTIME_PID_FILE", metavar="FILE", help="runtime's pid file (signal mode)")
    f.add("--host-root", env="GPUNODE_HOST_ROOT", default="/", metavar="DIR", help="host's / is here")
    f.add(
        "--state-file", env="RUNTIME_STATE_FILE", metavar="FILE", help="default: <config>.gpunode-state.json"
    )
    if verb == "configure":
        f.add("--dry-run", type=bool, default=False, help="print the diff, change nothing")
        f.add("--revert", type=bool, default=False, help="restore the files as they were before us")
        f.add("--force", type=bool, default=False, help="revert files edited since we wrote them")
        f.add("--check", type=bool, default=False, help="same as the status command")
    return f


def _dirs(raw: str) -> tuple[str, ...]:
    dirs = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not dirs:
        raise ValueError("at least one directory")
    return dirs


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    split = split_verb("gpunode-toolkit runtime", argv, VERBS, __doc__)
    if isinstance(split, int):
        return split
    verb, rest = split
    try:
        runtime = _runtime_of(rest, env)
        flags = flag_set(verb, runtime)
        settings = flags.parse(rest, env)
        values = settings.values
    except UsageError as exc:
        print(f"gpunode-toolkit runtime {verb}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # argparse already printed why
        return exc.code if isinstance(exc.code, int) else 2
    if isinstance(values.get("cdi_spec_dirs"), str):
        values["cdi_spec_dirs"] = _dirs(values["cdi_spec_dirs"])
    from gpunode.common.logging import configure_logging

    configure_logging(values["log_format"], values["log_level"], agent="toolkit", node=values["node_name"])
    log_effective_config(values, settings.sources, flags=flags.flags.values(), command=f"runtime {verb}")
    try:
        if verb == "status" or values.get("check"):
            return status(values)
        return configure(values)
    except (ConfigError, UsageError, ValueError) as exc:
        print(f"gpunode-toolkit: error: {exc}", file=sys.stderr)
        return 2
    except (rt.ApplyError, rt.RestartError, rt.RevertError, OSError) as exc:
        print(f"gpunode-toolkit: error: {exc}", file=sys.stderr)
        return 1


def options(values: Mapping[str, Any]) -> rt.ConfigureOptions:
    handlers = rt.handlers_from_paths(
        values["nvidia_runtime_name"],
        values["nvidia_runtime_path"],
        values["nvidia_cdi_runtime_path"],
        values["nvidia_legacy_runtime_path"],
    )
    return rt.ConfigureOptions(
        runtime=values["runtime"],
        config=values["config"],
        drop_in=None if values["drop_in_config"] in ("", "none") else values["drop_in_config"],
        handlers=handlers,
        set_as_default=values["set_as_default"],
        enable_cdi=values["enable_cdi"],
        cdi_spec_dirs=tuple(values["cdi_spec_dirs"]),
        config_version=values["containerd_config_version"],
        runtime_type=values["runtime_type"],
    )


def configure(values: Mapping[str, Any]) -> int:
    host_root = values["host_root"]
    state_file = values["state_file"] or rt.default_state_file(values["config"])
    if values["revert"]:
        plan = rt.plan_revert(rt.local_path(host_root, state_file), force=values["force"])
    else:
        plan = rt.plan_configure(options(values), host_root=host_root, state_file=state_file)
    for note in plan.notes:
        print(f"note: {note}")
    if plan.empty:
        if values["revert"] and not values["dry_run"]:
            rt.apply_plan(plan)  # only drops a record with nothing left to restore
        print("no change")
        return 0
    if values["dry_run"]:
        sys.stdout.write(plan.diff())
        print(f"dry run: {len(plan.changes)} file(s) would change; nothing written")
        return 0
    rt.apply_plan(plan)
    for change in plan.changes:
        print(f"{change.verb} {change.path}")
    message = rt.restart_runtime(
        values["runtime"],
        values["restart_mode"],
        host_root=host_root,
        pid_file=values["pid_file"],
        socket_path=values["socket"],
        systemctl=values["systemctl"],
        unit=values["systemd_unit"],
    )
    print(message)
    return 0


def status(values: Mapping[str, Any]) -> int:
    opts = options(values)
    runtime = opts.runtime
    found: list[str] = []
    default: str | None = None
    main_imports: list[str] | None = None
    for host_path in [opts.config, *([opts.drop_in] if opts.drop_in else [])]:
        local = rt.local_path(values["host_root"], host_path)
        data = rt.read_file(local)
        if data is None:
            print(f"{local}: absent")
            continue
        text = rt.decode_text(data, str(local)) or ""
        try:
            names = rt.nvidia_handlers_present(text, runtime)
            file_default = rt.default_runtime_name(text, runtime)
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
    wanted = [h.name for h in opts.handlers]
    missing = [name for name in wanted if name not in found]
    print(f"default runtime: {default or '(runtime default)'}")
    if missing:
        print(f"nvidia handlers NOT configured: missing {', '.join(missing)}")
        return 1
    print(f"nvidia handlers configured: {', '.join(wanted)}")
    return 0

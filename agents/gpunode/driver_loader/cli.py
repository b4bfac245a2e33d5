"""gpunode-driver-loader: load the NVIDIA kernel modules, keep them healthy, unload them safely.

    gpunode-driver-loader init    [--oneshot] [--dry-run] [--kernel-module-type auto|...] [...]
    gpunode-driver-loader unload  (refused, listing the users, while anything holds the driver)
    gpunode-driver-loader status  [--json]
    gpunode-driver-loader upgrade (the driver manager: evict GPU pods, unload, load)

Exit 0 on success, 1 on failure (driver in use, a step failed), 2 on bad usage or configuration.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from gpunode.common.cli import FlagSet, add_common_flags, log_effective_config, split_verb
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.logging import configure_logging
from gpunode.common.runtime import run
from gpunode.driver_loader.kmod import TOOLS, RealHostOps
from gpunode.driver_loader.loader import (
    DriverLoader,
    add_loader_flags,
    config_from_values,
    run_init,
    run_unload,
    show_status,
)

VERBS = ("init", "unload", "status", "upgrade")


def flag_set(verb: str) -> FlagSet:
    f = FlagSet(prog=f"gpunode-driver-loader {verb}", description=__doc__)
    add_common_flags(f, config_file=False)
    if verb == "upgrade":  # the driver manager's flags first: ours skip the ones it shares
        from gpunode.driver_loader.upgrade import add_upgrade_flags

        add_upgrade_flags(f)
    add_loader_flags(f, verb)
    return f


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    split = split_verb("gpunode-driver-loader", argv, VERBS, __doc__)
    if isinstance(split, int):
        return split
    verb, rest = split
    flags = flag_set(verb)
    parsed = flags.parse(rest, env)
    values = parsed.values
    configure_logging(
        values["log_format"], values["log_level"], agent="driver-loader", node=values["node_name"]
    )
    if verb == "status":
        return show_status(values["host_root"], as_json=values["json"])
    try:
        cfg = config_from_values(values, read_params=verb != "unload")
    except (UsageError, ConfigError) as exc:
        print(f"gpunode-driver-loader: error: {exc}", file=sys.stderr)
        return 2
    log_effective_config(values, parsed.sources, flags=flags.flags.values(), kernel=cfg.kernel)
    tools = {tool: values[tool.replace("-", "_")] for tool in TOOLS if values.get(tool.replace("-", "_"))}
    loader = DriverLoader(
        cfg, RealHostOps(cfg.paths, tools=tools, bin_dir=values.get("bin_dir"), environ=env)
    )
    if verb == "init":
        port = None if values["oneshot"] or values["http_port"] < 0 else values["http_port"]
        return run(run_init(loader, oneshot=values["oneshot"], dry_run=values["dry_run"], http_port=port))
    if verb == "unload":
        return run(run_unload(loader))
    from gpunode.driver_loader.upgrade import run_upgrade

    return run(run_upgrade(values, loader))


if __name__ == "__main__":
    sys.exit(main())

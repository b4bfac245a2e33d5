"""gpunode-driver-loader: load the NVIDIA kernel modules, keep them healthy, unload them safely.

    gpunode-driver-loader init    [--oneshot] [--dry-run] [--kernel-module-type auto|...] [...]
    gpunode-driver-loader unload  (refused, listing the users, while anything holds the driver)
    gpunode-driver-loader status  [--json]
    gpunode-driver-loader upgrade (the driver manager: evict GPU pods, unload, load)

Exit 0 on success, 1 on failure (driver in use, a step failed), 2 on bad usage or configuration.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from gpunode.agent.main import AgentContext, AgentSettings, AgentSpec, Started, verbs_main
from gpunode.common.errors import ConfigError, UsageError
from gpunode.driver_loader.commands import run_init, run_unload, show_status
from gpunode.driver_loader.config import LoaderConfig, init_config, loader_config
from gpunode.driver_loader.kmod import RealHostOps
from gpunode.driver_loader.loader import DriverLoader
from gpunode.driver_loader.settings import (
    HostSettings,
    InitSettings,
    StatusSettings,
    UnloadSettings,
    UpgradeSettings,
)

__all__ = ["SPECS", "main"]

S = TypeVar("S", bound=AgentSettings)


def _loader(cfg: LoaderConfig, host: HostSettings, environ: Mapping[str, str]) -> DriverLoader:
    ops = RealHostOps(cfg.paths, tools=host.tools(), bin_dir=host.bin_dir, environ=environ)
    return DriverLoader(cfg, ops)


def start_init(ctx: AgentContext[InitSettings]) -> Started:
    s = ctx.settings
    cfg = init_config(s)
    port = None if s.oneshot or s.http.http_port < 0 else s.http.http_port
    loader = _loader(cfg, s.host, ctx.environ)
    host = s.http.listen_host(ctx.environ)
    run = run_init(loader, oneshot=s.oneshot, dry_run=s.dry_run, http_port=port, http_host=host)
    return Started(run, {"kernel": cfg.kernel})


def start_unload(ctx: AgentContext[UnloadSettings]) -> Started:
    cfg = loader_config(ctx.settings.common, ctx.settings.host)
    return Started(run_unload(_loader(cfg, ctx.settings.host, ctx.environ)), {"kernel": cfg.kernel})


def start_status(ctx: AgentContext[StatusSettings]) -> int:
    return show_status(ctx.settings.host_root, as_json=ctx.settings.json)


def start_upgrade(ctx: AgentContext[UpgradeSettings]) -> Started:
    from gpunode.driver_loader.upgrade import run_upgrade

    s = ctx.settings
    cfg = loader_config(s.common, s.host, s.driver, s.load, force_reinstall=s.force_reinstall)
    return Started(run_upgrade(s, _loader(cfg, s.host, ctx.environ)), {"kernel": cfg.kernel})


def _spec(
    verb: str,
    settings: type[S],
    start: Callable[[AgentContext[S]], Started | int],
    *,
    usage_errors: tuple[type[Exception], ...] = (UsageError, ConfigError),
) -> AgentSpec[S]:
    return AgentSpec(
        name="driver-loader",
        console_script="gpunode-driver-loader",
        verb=verb,
        settings_type=settings,
        start=start,
        description=__doc__,
        usage_errors=usage_errors,
        uses_nvml=False,
    )


SPECS: dict[str, AgentSpec[Any]] = {
    "init": _spec("init", InitSettings, start_init),
    "unload": _spec("unload", UnloadSettings, start_unload),
    "status": _spec("status", StatusSettings, start_status, usage_errors=()),
    "upgrade": _spec("upgrade", UpgradeSettings, start_upgrade),
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    return verbs_main("gpunode-driver-loader", SPECS, argv, environ, usage=__doc__)


if __name__ == "__main__":
    sys.exit(main())

"""The MPS agent's planning step, run as a short-lived child process: config file + GPUs -> daemon plans.

``python -m gpunode.mps.plan [--config-file F] [--mig-strategy S] [--driver-root D] [--simulate P]
[--sim-state F]`` reads the device plugin's ``version: v1`` file (pydantic), opens NVML, applies
:func:`gpunode.api.mps.plan_daemons` and prints one JSON document on stdout: the effective sharing
settings as the readiness file records them (``sharing``, null without MPS), the ``plans``, the
``warnings`` and ``ignored`` fields to log, and the file's ``flags.mpsRoot`` / ``flags.migStrategy``.
What NVIDIA refuses goes to stderr as ``path: reason`` with exit 2; anything else that fails, exit 1.

Why a child: pydantic and NVML cost the resident agent about 17 MB it would never use again (the agent
itself stays under 30 MB); the plan is made at start and on SIGHUP only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from gpunode.api.mps import MpsConfigError, MpsGpu, plan_daemons, sharing_document
from gpunode.api.plugin_types import MPS_MIXED_REFUSAL

__all__ = ["main", "make_plan"]


async def make_plan(args: argparse.Namespace) -> dict[str, Any]:
    """The document printed on stdout; raises ConfigError / MpsConfigError / ValueError for refusals."""
    from gpunode.agent.nvml import open_nvml

    sharing = None
    ignored: list[str] = []
    file_flags: dict[str, Any] = {}
    if args.config_file:
        from gpunode.api.plugin_config import PluginConfig
        from gpunode.common.config import load_config

        config = load_config(args.config_file, PluginConfig)
        sharing = config.time_slicing()
        ignored = [*config.ignored_fields(), *config.overridden_fields()]
        file_flags = {"mpsRoot": config.flags.mps_root, "migStrategy": config.flags.mig_strategy}
    strategy = args.mig_strategy or file_flags.get("migStrategy") or "none"
    if sharing is not None and sharing.mps and strategy == "mixed":
        raise ValueError(MPS_MIXED_REFUSAL)
    warnings: list[str] = []
    plans = []
    if sharing is not None and sharing.mps:
        nvml = await open_nvml(args.driver_root, args.simulate, args.sim_state)
        try:
            gpus = [
                MpsGpu(g.index, g.uuid, g.memory_total_mib, g.compute_capability, g.mig_enabled)
                for g in await nvml.gpus()
            ]
        finally:
            await nvml.close()
        plans = plan_daemons(sharing, gpus, warnings=warnings)
    return {
        "sharing": sharing_document(sharing) if sharing is not None and sharing.mps else None,
        "plans": [p.to_json() for p in plans],
        "warnings": warnings,
        "ignored": ignored,
        "file": file_flags,
    }


def main(argv: list[str] | None = None) -> int:
    from gpunode.common.errors import ConfigError

    parser = argparse.ArgumentParser(prog="python -m gpunode.mps.plan")
    parser.add_argument("--config-file")
    parser.add_argument("--mig-strategy")
    parser.add_argument("--driver-root", default="/")
    parser.add_argument("--simulate")
    parser.add_argument("--sim-state")
    args = parser.parse_args(argv)
    try:
        doc = asyncio.run(make_plan(args))
    except ConfigError as exc:  # names the file already
        print(str(exc), file=sys.stderr)
        return 2
    except (MpsConfigError, ValueError) as exc:
        print(f"{args.config_file or '--mig-strategy'}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # NVML and the like: the agent retries
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Set the compute mode of an MPS daemon's GPUs, run as a short-lived child process (as NVIDIA runs
``nvidia-smi -c``): ``EXCLUSIVE_PROCESS`` before the control daemon starts, ``DEFAULT`` after it stopped.

``python -m gpunode.mps.computemode --mode exclusive-process|default --gpu UUID [--gpu UUID ...]
[--driver-root D] [--simulate P] [--sim-state F]`` sets each GPU through NVML (:mod:`gpunode.nvml`) and
prints one JSON document: ``{"gpus": {uuid: {"before": mode, "after": mode}}}``. Exit 3: NVML refused
for want of permission (setting a compute mode needs root), the message on stderr names the GPU; exit 1:
any other failure. A child, as the planning step is, so the resident agent never loads NVML.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

__all__ = ["EXIT_NO_PERMISSION", "MODES", "main", "set_modes"]

EXIT_NO_PERMISSION = 3
MODES = {"default": "DEFAULT", "exclusive-process": "EXCLUSIVE_PROCESS"}


async def set_modes(args: argparse.Namespace) -> dict[str, Any]:
    """Set ``args.mode`` on every ``args.gpu`` (UUIDs); what each GPU's mode was and is."""
    from gpunode.agent.nvml import open_nvml
    from gpunode.nvml import errors
    from gpunode.nvml.api import ComputeMode

    mode = ComputeMode[MODES[args.mode]]
    nvml = await open_nvml(args.driver_root, args.simulate, args.sim_state)
    out: dict[str, Any] = {}
    try:
        by_uuid = {g.uuid: g.index for g in await nvml.gpus()}
        for uuid in args.gpu:
            if uuid not in by_uuid:
                raise LookupError(f"GPU {uuid} not found (have: {', '.join(sorted(by_uuid))})")
            index = by_uuid[uuid]
            before = await nvml.compute_mode(index)
            if before != mode:
                try:
                    await nvml.set_compute_mode(index, mode)
                except errors.NoPermission as exc:
                    raise PermissionError(f"GPU {index} ({uuid}): {exc}") from None
            out[uuid] = {"index": index, "before": before.name, "after": mode.name}
    finally:
        await nvml.close()
    return {"gpus": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpunode.mps.computemode")
    parser.add_argument("--mode", choices=sorted(MODES), required=True)
    parser.add_argument("--gpu", action="append", default=[], metavar="UUID")
    parser.add_argument("--driver-root", default="/")
    parser.add_argument("--simulate")
    parser.add_argument("--sim-state")
    args = parser.parse_args(argv)
    try:
        doc = asyncio.run(set_modes(args))
    except PermissionError as exc:
        print(
            f"setting the compute mode to {MODES[args.mode]} was refused: {exc} (NVML needs root; "
            "run the agent as root or set the mode with nvidia-smi -c)",
            file=sys.stderr,
        )
        return EXIT_NO_PERMISSION
    except Exception as exc:  # NVML not up, a GPU gone: the agent retries
        name = MODES[args.mode]
        print(f"setting the compute mode to {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

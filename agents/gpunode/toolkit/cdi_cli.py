"""gpunode-toolkit cdi: write (and keep current) the CDI spec of this node's NVIDIA GPUs.

    gpunode-toolkit cdi generate [--output /var/run/cdi/nvidia.yaml] [--format yaml|json] [--watch]
                                 [--vendor nvidia.com --class gpu | --kind nvidia.com/gpu]
                                 [--device-name-strategy index,uuid] [--hook-path PATH]
                                 [--driver-root DIR] [--dev-root DIR] [--host-root DIR]
    gpunode-toolkit cdi list [--spec FILE] [...]

`generate` writes the spec atomically (mode 0644; a `.json` name or --format json gives JSON, else YAML;
`--output -` prints it). With --watch (GPUNODE_CDI_WATCH) it stays up and rewrites the file whenever NVML
reports a MIG configuration change and the content changed. `list` prints the fully qualified device
names (nvidia.com/gpu=0, ...) that the spec of the current devices holds, or those of --spec FILE.

Exit 0 on success, 1 on failure (NVML, an unwritable output), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunode.agent.nvml import check_simulation
from gpunode.common.atomic import atomic_write
from gpunode.common.cli import FlagSet, add_common_flags, log_effective_config, split_verb
from gpunode.common.hostpaths import HostPaths
from gpunode.common.logging import Logger, configure_logging, get_logger
from gpunode.common.runtime import run
from gpunode.nvml.api import EVENT_MIG_CONFIG, EventKind, Nvml
from gpunode.nvml.errors import NvmlError
from gpunode.toolkit.cdi import (
    DEFAULT_HOOK_PATH,
    DEFAULT_OUTPUT,
    Format,
    Spec,
    SpecOptions,
    build_spec,
    discover_driver,
    format_for,
    load_spec,
    make_kind,
    parse_name_strategies,
    read_mig_cap_minors,
    render,
)

__all__ = ["GenerateJob", "flag_set", "main", "snapshot", "spec_options", "watch", "write_spec"]

PROG = "gpunode-toolkit cdi"
VERBS = ("generate", "list")
COALESCE_S = 0.2  # a MIG reconfiguration is a burst of events: regenerate once after it
RETRY_S = 10.0


def flag_set(verb: str) -> FlagSet:
    f = FlagSet(prog=f"{PROG} {verb}", description=__doc__)
    add_common_flags(f, config_file=False)
    f.add(
        "--vendor",
        env=("GPUNODE_CDI_VENDOR", "NVIDIA_CTK_CDI_VENDOR"),
        default="nvidia.com",
        help="vendor part of the CDI kind",
    )
    f.add(
        "--class",
        dest="device_class",
        env=("GPUNODE_CDI_CLASS", "NVIDIA_CTK_CDI_CLASS"),
        default="gpu",
        help="class part of the CDI kind",
    )
    f.add(
        "--kind",
        env=("GPUNODE_CDI_KIND", "NVIDIA_CTK_CDI_KIND"),
        metavar="VENDOR/CLASS",
        help="the CDI kind; overrides --vendor and --class",
    )
    f.add(
        "--device-name-strategy",
        env=("GPUNODE_CDI_DEVICE_NAME_STRATEGY", "NVIDIA_CTK_CDI_DEVICE_NAME_STRATEGY"),
        default="index,uuid",
        metavar="LIST",
        help="device names to emit, comma-separated: index (0, 0:1), uuid (GPU-..., MIG-...), "
        "type-index (gpu0, mig0:1)",
    )
    f.add(
        "--all-device",
        env="GPUNODE_CDI_ALL_DEVICE",
        type=bool,
        default=True,
        help="emit the device 'all' (every device's nodes)",
    )
    f.add(
        "--hook-path",
        env="NVIDIA_CDI_HOOK_PATH",
        default=DEFAULT_HOOK_PATH,
        metavar="PATH",
        help="host path of nvidia-cdi-hook (or nvidia-ctk) that the spec's hooks run",
    )
    f.add(
        "--dev-root",
        env="NVIDIA_DEV_ROOT",
        metavar="DIR",
        help="host directory under which /dev/nvidia* live (default: the driver root)",
    )
    f.add(
        "--host-root",
        env="GPUNODE_HOST_ROOT",
        default="/",
        metavar="DIR",
        help="where the host's / is visible to this process (files are looked up there; the spec "
        "keeps host paths)",
    )
    f.parser.add_argument(
        "--nvidia-cdi-hook-path", dest="hook_path", default=argparse.SUPPRESS, help="alias of --hook-path"
    )
    if verb == "generate":
        f.add(
            "--output",
            short="-o",
            env=("GPUNODE_CDI_OUTPUT", "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH"),
            default=DEFAULT_OUTPUT,
            metavar="FILE",
            help="where to write the spec; '-' prints it",
        )
        f.add(
            "--format",
            env=("GPUNODE_CDI_FORMAT", "NVIDIA_CTK_CDI_FORMAT"),
            choices=("yaml", "json"),
            help="output format (default: json for a .json file name, else yaml)",
        )
        f.add(
            "--watch",
            env="GPUNODE_CDI_WATCH",
            type=bool,
            default=False,
            help="stay up and rewrite the spec after every MIG configuration change",
        )
    else:
        f.add("--spec", metavar="FILE", help="list the devices of this spec file instead (no NVML)")
    return f


@dataclass(frozen=True)
class GenerateJob:
    host: HostPaths
    opts: SpecOptions
    output: str | None  # None: stdout
    fmt: Format


def spec_options(values: Mapping[str, Any]) -> SpecOptions:
    """The builder's options from the effective flags; ``ValueError`` for bad values."""
    driver_root = values["driver_root"] or "/"
    return SpecOptions(
        kind=make_kind(values["vendor"], values["device_class"], values.get("kind")),
        name_strategies=parse_name_strategies(values["device_name_strategy"]),
        all_device=values["all_device"],
        driver_root=driver_root,
        dev_root=values.get("dev_root") or driver_root,
        hook_path=values["hook_path"],
    )


async def snapshot(nvml: Nvml, job: GenerateJob, log: Logger) -> Spec:
    """The spec of the devices NVML reports now (discovery warnings are logged)."""
    system = await nvml.system()
    gpus = await nvml.gpus()
    migs = {g.index: tuple(await nvml.mig_devices(g.index)) for g in gpus if g.mig_enabled}
    files, found = await asyncio.to_thread(
        discover_driver, job.host, system.driver_version, job.opts.dev_root
    )
    caps = await asyncio.to_thread(read_mig_cap_minors, job.host, gpus, migs)
    spec, built = build_spec(gpus, migs, files, job.opts, caps)
    for detail in (*found, *built):
        log.warning("cdi_discovery_warning", detail=detail)
    return spec


def write_spec(spec: Spec, job: GenerateJob, log: Logger) -> bool:
    """Write the spec (only when its content changed); True when written. Raises OSError."""
    text = render(spec, job.fmt)
    if job.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return True
    parent = os.path.dirname(os.path.abspath(job.output))
    os.makedirs(parent, mode=0o755, exist_ok=True)
    if atomic_write(job.output, text, 0o644, only_if_changed=True):
        log.info("cdi_spec_written", path=job.output, devices=len(spec.devices), kind=spec.kind)
        return True
    log.info("cdi_spec_unchanged", path=job.output, devices=len(spec.devices))
    return False


async def watch(
    nvml: Nvml,
    job: GenerateJob,
    log: Logger,
    *,
    coalesce_s: float = COALESCE_S,
    retry_s: float = RETRY_S,
    ready: asyncio.Event | None = None,
) -> None:
    """Write the spec, then rewrite it after every MIG configuration change, until cancelled.

    Events are registered before the first write, so no change between the two is missed. A failed
    regeneration (NVML or the file) is logged and retried after ``retry_s`` or the next event.
    """
    from gpunode.common import sdnotify

    wake = asyncio.Event()
    registered = asyncio.Event()

    async def events() -> None:
        while True:
            try:
                async for ev in nvml.events(mask=EVENT_MIG_CONFIG, ready=registered):
                    if ev.kind is EventKind.MIG_CONFIG:
                        wake.set()
            except NvmlError as exc:
                log.warning("nvml_events_failed", error=str(exc), retry_in_s=retry_s)
            registered.set()
            await asyncio.sleep(retry_s)
            wake.set()  # changes may have been missed meanwhile

    async def regenerate() -> None:
        first = True
        while True:
            try:
                write_spec(await snapshot(nvml, job, log), job, log)
                failed = False
            except (NvmlError, OSError, ValueError) as exc:
                log.error("cdi_generate_failed", path=job.output, error=str(exc), retry_in_s=retry_s)
                failed = True
            if first and not failed:
                first = False
                sdnotify.notify(ready=True, status=f"watching MIG changes for {job.output}")
                if ready is not None:
                    ready.set()
            try:
                await (asyncio.wait_for(wake.wait(), retry_s) if failed else wake.wait())
            except TimeoutError:
                pass
            await asyncio.sleep(coalesce_s)
            wake.clear()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(events(), name="mig-events")
        await registered.wait()
        tg.create_task(regenerate(), name="regenerate")


async def _generate(values: Mapping[str, Any], job: GenerateJob, verb: str) -> int:
    from gpunode.agent.nvml import open_nvml

    log = get_logger("gpunode.toolkit.cdi")
    try:
        nvml = await open_nvml(job.host.driver_dir, values.get("simulate"), values.get("sim_state"))
    except NvmlError as exc:
        print(f"{PROG} {verb}: error: NVML: {exc}", file=sys.stderr)
        return 1
    try:
        if verb == "generate" and values["watch"]:
            await watch(nvml, job, log)
            return 0
        try:
            spec = await snapshot(nvml, job, log)
        except NvmlError as exc:
            print(f"{PROG} {verb}: error: NVML: {exc}", file=sys.stderr)
            return 1
        if verb == "list":
            print("\n".join(spec.names))
            return 0
        try:
            write_spec(spec, job, log)
        except OSError as exc:
            print(
                f"{PROG} generate: error: cannot write {job.output}: {exc.strerror or exc}", file=sys.stderr
            )
            return 1
        return 0
    finally:
        await nvml.close()


def _list_file(path: str) -> int:
    try:
        doc = load_spec(Path(path))
    except (OSError, ValueError) as exc:
        print(f"{PROG} list: error: {exc}", file=sys.stderr)
        return 1
    for device in doc["devices"]:
        print(f"{doc['kind']}={device.get('name')}")
    return 0


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    split = split_verb(PROG, argv, VERBS, __doc__)
    if isinstance(split, int):
        return split
    verb, rest = split
    env = dict(os.environ if environ is None else environ)
    flags = flag_set(verb)
    parsed = flags.parse(rest, env)
    values = parsed.values
    if verb == "list" and values.get("spec"):
        return _list_file(values["spec"])
    configure_logging(values["log_format"], values["log_level"], agent="toolkit", node=values["node_name"])
    output = values.get("output", "-")
    try:
        check_simulation(values.get("simulate"), values.get("sim_state"))
        opts = spec_options(values)
        fmt = format_for(output, values.get("format"))
        if verb == "generate" and values["watch"] and output in ("", "-"):
            raise ValueError("--watch needs an --output file")
    except (ValueError, LookupError) as exc:
        print(f"{PROG} {verb}: error: {exc}", file=sys.stderr)
        return 2
    job = GenerateJob(
        host=HostPaths(root=values["host_root"], driver_root=opts.driver_root),
        opts=opts,
        output=None if output in ("", "-") else output,
        fmt=fmt,
    )
    if verb == "generate":
        log_effective_config(values, parsed.sources, flags=flags.flags.values())
    return run(_generate(values, job, verb))

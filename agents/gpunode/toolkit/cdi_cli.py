"""gpunode-toolkit cdi: write (and keep current) the CDI spec of this node's NVIDIA GPUs.

    gpunode-toolkit cdi generate [--output /var/run/cdi/nvidia.yaml] [--format yaml|json] [--watch]
                                 [--vendor nvidia.com --class gpu | --kind nvidia.com/gpu]
                                 [--device-name-strategy index,uuid] [--mode nvml|management]
                                 [--hook-path PATH] [--disable-hook NAMES] [--no-install-hook]
                                 [--driver-root DIR] [--dev-root DIR] [--host-root DIR]
                                 [--allow-missing-libraries]
    gpunode-toolkit cdi list [--spec FILE] [...]

`generate` writes the spec atomically (mode 0644; a `.json` name or --format json gives JSON, else YAML;
`--output -` prints it). The spec's hooks run gpunode's gpunode-cdi-hook, which generate installs at
--hook-path (under --host-root) first; a --hook-path naming another program (NVIDIA's nvidia-cdi-hook
or nvidia-ctk) must exist. With --watch (GPUNODE_CDI_WATCH) it stays up and rewrites the file whenever NVML
reports a MIG configuration change and the content changed. --also-kind KINDS writes the same devices
under other kinds beside --output (<vendor>-<class>.<ext>); an imex-channel kind there gets the IMEX
channel nodes' spec instead (none: no file). `list` prints the fully qualified device
names (nvidia.com/gpu=0, ...) that the spec of the current devices holds, or those of --spec FILE.

Exit 0 on success, 1 on failure (NVML, no driver library in the driver root, an unwritable output or
hook), 2 on bad usage (a --hook-path naming no program among them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpunode.agent.main import AgentContext, AgentSpec, Started, verbs_main
from gpunode.common.atomic import atomic_write
from gpunode.common.hostpaths import HostPaths
from gpunode.common.logging import Logger, get_logger
from gpunode.common.runtime import run
from gpunode.nvml.api import EVENT_MIG_CONFIG, EventKind, GpuInfo, MigDevice, Nvml
from gpunode.nvml.errors import NvmlError
from gpunode.toolkit.cdi import (
    DEFAULT_KIND,
    MANAGEMENT_KIND,
    Format,
    Spec,
    SpecOptions,
    build_management_spec,
    build_spec,
    discover_driver,
    discover_nodes,
    driver_version_from_host,
    format_for,
    hooks_enabled,
    load_spec,
    make_kind,
    no_libraries_message,
    parse_disabled_hooks,
    parse_name_strategies,
    read_mig_cap_minors,
    render,
    validate_kind,
)
from gpunode.toolkit.cdi_imex import build_imex_spec, discover_channels, is_imex_kind
from gpunode.toolkit.hook import hook_problem, install_hook, is_gpunode_hook
from gpunode.toolkit.settings import CdiGenerateSettings, CdiListSettings, CdiSpecSettings

__all__ = [
    "GENERATE",
    "LIST",
    "SPECS",
    "GenerateJob",
    "main",
    "snapshot",
    "spec_options",
    "watch",
    "write_spec",
]

PROG = "gpunode-toolkit cdi"
COALESCE_S = 0.2  # a MIG reconfiguration is a burst of events: regenerate once after it
RETRY_S = 10.0


class NoLibraries(Exception):
    """The driver root holds no driver library (and --allow-missing-libraries is not set)."""


@dataclass(frozen=True)
class GenerateJob:
    host: HostPaths
    opts: SpecOptions
    output: str | None  # None: stdout
    fmt: Format
    allow_missing_libraries: bool = False
    also_kinds: tuple[str, ...] = ()  # the same devices under these kinds, each in its own file


def also_kinds(text: str, main_kind: str) -> tuple[str, ...]:
    """``--also-kind``: comma-separated kinds, validated, the main kind dropped. A kind of the
    ``imex-channel`` class gets the IMEX channels' spec (:func:`also_spec`); an IMEX main spec takes
    only other IMEX kinds (GPU names over channel nodes would be wrong). ``ValueError`` otherwise."""
    kinds = [validate_kind(k.strip()) for k in text.split(",") if k.strip()]
    if is_imex_kind(main_kind):
        gpu = [k for k in kinds if not is_imex_kind(k)]
        if gpu:
            raise ValueError(
                f"--also-kind {','.join(gpu)}: the main spec is of IMEX channels ({main_kind}); "
                "only other imex-channel kinds can be written beside it"
            )
    return tuple(dict.fromkeys(k for k in kinds if k != main_kind))


def also_spec(spec: Spec, kind: str, job: GenerateJob) -> Spec:
    """The spec written under ``kind`` beside the main one: the same devices, or, for an
    ``imex-channel`` kind beside a GPU spec, the IMEX channel nodes found now under the dev root (the
    device plugin's ``k8s.device-plugin.nvidia.com/imex-channel=<N>`` names resolve there)."""
    if is_imex_kind(kind) and not is_imex_kind(spec.kind):
        channels = discover_channels(job.host, job.opts.dev_root)
        return build_imex_spec(channels, replace(job.opts, kind=kind))
    return replace(spec, kind=kind)


def kind_path(output: str, kind: str) -> str:
    """Where the spec of ``kind`` goes next to ``output``: ``<dir>/<vendor>-<class>.<ext>``."""
    ext = os.path.splitext(output)[1] or ".yaml"
    return os.path.join(os.path.dirname(os.path.abspath(output)), kind.replace("/", "-") + ext)


def spec_options(cdi: CdiSpecSettings, driver_root: str) -> SpecOptions:
    """The builder's options from the settings; ``ValueError`` for bad values."""
    root = driver_root or "/"
    kind = make_kind(cdi.vendor, cdi.device_class, cdi.kind)
    if cdi.mode == "management" and cdi.kind is None and kind == DEFAULT_KIND:
        kind = MANAGEMENT_KIND  # as nvidia-ctk: management specs have their own kind
    if not os.path.isabs(cdi.hook_path):
        raise ValueError(f"--hook-path {cdi.hook_path!r}: must be an absolute path on the host")
    return SpecOptions(
        kind=kind,
        name_strategies=parse_name_strategies(cdi.device_name_strategy),
        all_device=cdi.all_device,
        driver_root=root,
        dev_root=cdi.dev_root or root,
        hook_path=cdi.hook_path,
        disabled_hooks=parse_disabled_hooks(cdi.disable_hook),
        mode="management" if cdi.mode == "management" else "nvml",
    )


def generate_job(cdi: CdiSpecSettings, driver_root: str, output: str, fmt: str | None) -> GenerateJob:
    """What to build and where to write it (``output`` "" or "-": stdout); ``ValueError`` for bad values."""
    opts = spec_options(cdi, driver_root)
    return GenerateJob(
        host=HostPaths(root=cdi.host_root, driver_root=opts.driver_root),
        opts=opts,
        output=None if output in ("", "-") else output,
        fmt=format_for(output, fmt),
        allow_missing_libraries=cdi.allow_missing_libraries,
        also_kinds=also_kinds(cdi.also_kind, opts.kind),
    )


def prepare_hook(job: GenerateJob, install: bool, log: Logger) -> None:
    """Make sure the program the spec's hooks run exists on the host before any spec names it.

    gpunode's hook is installed (atomically; nothing written when it is current) when the spec goes
    to a file and ``install``; any other program must already be there. ``ValueError`` (exit 2) for a
    missing or unusable program; ``OSError`` when the install fails."""
    if not hooks_enabled(job.opts) or is_imex_kind(job.opts.kind):
        return  # no hook in the spec (an IMEX channel spec has only device nodes): nothing to check
    hook = job.opts.hook_path
    local = job.host.host(hook)
    if is_gpunode_hook(hook) and install and job.output is not None:
        if install_hook(local):
            log.info("cdi_hook_installed", path=hook, local=str(local))
        return
    problem = hook_problem(local, hook)
    if problem is None:
        return
    if is_gpunode_hook(hook) and job.output is None:  # printing a spec to look at: say so, go on
        log.warning("cdi_hook_missing", detail=problem)
        return
    if is_gpunode_hook(hook):
        problem += " (generate installs it unless --no-install-hook)"
    else:
        problem += "; install it, or leave --hook-path at gpunode's hook, which generate installs"
    raise ValueError(problem)


async def snapshot(nvml: Nvml | None, job: GenerateJob, log: Logger) -> Spec:
    """The spec of the devices NVML reports now (discovery warnings are logged); for the
    ``imex-channel`` class, of the IMEX channel nodes (no NVML); for ``--mode management``, of the
    device nodes found (NVML only for the driver version, when the host does not tell it)."""
    if is_imex_kind(job.opts.kind):
        channels = await asyncio.to_thread(discover_channels, job.host, job.opts.dev_root)
        return build_imex_spec(channels, job.opts)
    gpus: list[GpuInfo] = []
    migs: dict[int, tuple[MigDevice, ...]] = {}
    version = None
    if job.opts.mode == "management":
        version = await asyncio.to_thread(driver_version_from_host, job.host)
    if version is None:
        if nvml is None:
            raise NoLibraries(
                f"cannot tell the driver version: no {job.host.proc_driver_nvidia / 'version'} and no "
                f"libnvidia-ml.so.<version> under the driver root {job.host.driver_dir}"
            )
        version = (await nvml.system()).driver_version
    if job.opts.mode != "management":
        assert nvml is not None
        gpus = list(await nvml.gpus())
        migs = {g.index: tuple(await nvml.mig_devices(g.index)) for g in gpus if g.mig_enabled}
    files, found = await asyncio.to_thread(discover_driver, job.host, version, job.opts.dev_root)
    if not files.libraries:
        message = no_libraries_message(job.host, version)
        if not job.allow_missing_libraries:
            raise NoLibraries(message)
        found.append(message)
    if job.opts.mode == "management":
        nodes = await asyncio.to_thread(discover_nodes, job.host, job.opts.dev_root)
        spec, built = build_management_spec(files, job.opts, nodes)
    else:
        caps = await asyncio.to_thread(read_mig_cap_minors, job.host, gpus, migs)
        spec, built = build_spec(gpus, migs, files, job.opts, caps)
    for detail in (*found, *built):
        log.warning("cdi_discovery_warning", detail=detail)
    return spec


def write_spec(spec: Spec, job: GenerateJob, log: Logger) -> bool:
    """Write the spec and the ``--also-kind`` ones (each only when its content changed); True when one
    was written or removed. An IMEX channel spec with no channel is not written (a spec without
    devices names nothing and some runtimes refuse it), and an earlier one at its path is removed:
    its names no longer resolve to nodes. Raises OSError."""
    if job.output is None:
        print_quietly(render(spec, job.fmt))
        return True
    parent = os.path.dirname(os.path.abspath(job.output))
    os.makedirs(parent, mode=0o755, exist_ok=True)
    written = False
    for kind, path in [(spec.kind, job.output), *((k, kind_path(job.output, k)) for k in job.also_kinds)]:
        this = spec if kind == spec.kind else also_spec(spec, kind, job)
        if is_imex_kind(kind) and not this.devices:
            removed = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed = True
            log.info("cdi_spec_no_devices", path=path, kind=kind, removed=removed)
            written |= removed
            continue
        if atomic_write(path, render(this, job.fmt), 0o644, only_if_changed=True):
            log.info("cdi_spec_written", path=path, devices=len(this.devices), kind=kind)
            written = True
        else:
            log.info("cdi_spec_unchanged", path=path, devices=len(this.devices))
    return written


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
            except (NvmlError, OSError, ValueError, NoLibraries) as exc:
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


async def _generate(
    ctx: AgentContext[CdiGenerateSettings] | AgentContext[CdiListSettings],
    job: GenerateJob,
    verb: str,
    *,
    keep_watching: bool = False,
) -> int:
    log = get_logger("gpunode.toolkit.cdi")
    # a management spec needs no NVML where the host tells the driver version (before the GPUs can be
    # opened: what monitoring containers get their device nodes from)
    management = job.opts.mode == "management" and not keep_watching
    if management and await asyncio.to_thread(driver_version_from_host, job.host) is not None:
        return await _write_once(None, job, verb, log)
    if is_imex_kind(job.opts.kind) and not keep_watching:  # channel nodes only: no NVML, no driver
        return await _write_once(None, job, verb, log)
    try:
        nvml = await ctx.open_nvml(str(job.host.driver_dir))
    except NvmlError as exc:
        print(f"{PROG} {verb}: error: NVML: {exc}", file=sys.stderr)
        return 1
    try:
        if keep_watching:
            await watch(nvml, job, log)
            return 0
        return await _write_once(nvml, job, verb, log)
    finally:
        await nvml.close()


async def _write_once(nvml: Nvml | None, job: GenerateJob, verb: str, log: Logger) -> int:
    """One spec: printed as names (``list``) or written (``generate``); the exit code."""
    try:
        spec = await snapshot(nvml, job, log)
    except NvmlError as exc:
        print(f"{PROG} {verb}: error: NVML: {exc}", file=sys.stderr)
        return 1
    except NoLibraries as exc:
        print(f"{PROG} {verb}: error: {exc}", file=sys.stderr)
        return 1
    if verb == "list":
        print_quietly("".join(f"{name}\n" for name in spec.names))
        return 0
    try:
        write_spec(spec, job, log)
    except OSError as exc:
        print(f"{PROG} generate: error: cannot write {job.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _list_file(path: str) -> int:
    try:
        doc = load_spec(Path(path))
    except (OSError, ValueError) as exc:
        print(f"{PROG} list: error: {exc}", file=sys.stderr)
        return 1
    print_quietly("".join(f"{doc['kind']}={device.get('name')}\n" for device in doc["devices"]))
    return 0


def print_quietly(text: str) -> None:
    """Write ``text`` to stdout; a reader that went away (``| head -1``) ends the output quietly."""
    try:
        if text:
            sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # nothing more can be written; point stdout at /dev/null so the exit's flush is quiet too
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


def start_generate(ctx: AgentContext[CdiGenerateSettings]) -> Started | int:
    s = ctx.settings
    job = generate_job(s.cdi, s.common.driver_root, s.output, s.format)
    if s.watch and job.output is None:
        raise ValueError("--watch needs an --output file")
    try:
        prepare_hook(job, s.install_hook, get_logger("gpunode.toolkit.cdi"))
    except OSError as exc:
        where = exc.filename or job.opts.hook_path
        print(
            f"{PROG} generate: error: cannot install the hook at {where}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    return Started(_generate(ctx, job, "generate", keep_watching=s.watch))


def start_list(ctx: AgentContext[CdiListSettings]) -> int:
    s = ctx.settings
    if s.spec:
        return _list_file(s.spec)
    # listing names devices; it needs no driver library
    job = replace(generate_job(s.cdi, s.common.driver_root, "-", None), allow_missing_libraries=True)
    return run(_generate(ctx, job, "list"))  # the devices are printed, the settings not logged


GENERATE = AgentSpec(
    name="toolkit",
    console_script="gpunode-toolkit",
    verb="cdi generate",
    settings_type=CdiGenerateSettings,
    start=start_generate,
    description=__doc__,
    errors_with_verb=True,
)
LIST = AgentSpec(
    name="toolkit",
    console_script="gpunode-toolkit",
    verb="cdi list",
    settings_type=CdiListSettings,
    start=start_list,
    description=__doc__,
    errors_with_verb=True,
)
SPECS: Mapping[str, AgentSpec[CdiGenerateSettings] | AgentSpec[CdiListSettings]] = {
    "generate": GENERATE,
    "list": LIST,
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    return verbs_main(PROG, SPECS, argv, environ, usage=__doc__)

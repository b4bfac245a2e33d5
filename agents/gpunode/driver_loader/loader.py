"""The driver loader's ``init`` and ``unload``: plan, then apply step by step (:class:`DriverLoader`).

``init`` steps, in order, each logged (``step_started``/``step_done``/``step_failed`` with ``progress``)
and recorded in ``/run/nvidia/gpunode-driver/status.json``:

1. ``host-driver``      a driver we did not load is running and the host has ``nvidia-smi``: only the
                        readiness files are written (``IS_HOST_DRIVER=true``), every other step is skipped;
2. ``nouveau``          unload it, or stop with the blacklist steps (``--write-nouveau-blacklist``);
3. ``config-digest``    sha256 of the configuration (or ``DRIVER_CONFIG_DIGEST``) against
                        ``/run/nvidia/nvidia-driver.state``: equal and loaded = fast path (modules kept);
4. ``unload-previous``  a loaded driver with another configuration is removed (refused while in use);
5. ``module-source``    precompiled modules for the kernel, else a build (nvidia-installer or DKMS);
6. ``module-params``    ``/etc/modprobe.d/nvidia-gpunode.conf`` from ``<params-dir>/<module>.conf``;
7. ``load-modules``     ``modprobe`` nvidia, nvidia-uvm, nvidia-modeset (+ nvidia-peermem with RDMA);
8. ``device-nodes``     the ``/dev/nvidia*`` nodes the driver does not create (udev first, if it runs);
9. ``persistenced``     ``nvidia-persistenced --persistence-mode`` when present;
10. ``readiness``       ``.driver-ctr-ready`` and ``driver-ready``.

The digest is recorded just before the first ``modprobe``, so a run killed part-way converges on the
next: the modules already loaded are kept, the missing ones are loaded, nothing is loaded twice.

As a daemon (without ``--oneshot``) :class:`~gpunode.driver_loader.daemon.HealthDaemon` then keeps the
driver healthy; ``unload`` removes the modules. What the plan is made of is read by
:mod:`~gpunode.driver_loader.observe` and planned by the pure :mod:`~gpunode.driver_loader.modules`;
each step is logged and recorded by :mod:`~gpunode.driver_loader.steps`.

Where this differs from NVIDIA's driver container and driver manager, and why:

* nouveau and the host-driver check live in ``init`` (NVIDIA: the driver manager's init container);
  a host driver means readiness files only, not a node label plus a crash loop;
* modules are loaded with ``modprobe -d <driver-root>`` from a module tree, never by re-running
  ``nvidia-installer`` on every start; builds use ``--kernel-install-path`` into that tree;
* ``init`` creates the control, GPU, UVM and MIG capability nodes itself (NVIDIA: the validator and
  nvidia-modprobe), after giving udev a chance;
* the fast path with nothing to do skips ``nvidia-smi`` (checked when the modules were loaded);
* ``unload`` looks for processes holding ``/dev/nvidia*`` before stopping persistenced, and starts it
  again when module references refuse the unload, so a refusal changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from gpunode.api.readiness import CTR_READY, DRIVER_READY
from gpunode.common.bounds import read_head
from gpunode.common.logging import Logger, get_logger
from gpunode.driver_loader import devnodes, kmod, observe
from gpunode.driver_loader.config import LoaderConfig
from gpunode.driver_loader.modules import (
    InitPlan,
    Observed,
    PlanInputs,
    firmware_disabled,
    plan_init,
    render_modprobe_conf,
    sysfs_name,
    wants_coherent_param,
)
from gpunode.driver_loader.ops import DriverInUse, DriverUser
from gpunode.driver_loader.readiness import Files, InstanceLock, LoaderBusy, LockFileRefused, StatusBook
from gpunode.driver_loader.steps import LoaderError, StepOutcome, skip_rest, step

__all__ = ["INIT_STEPS", "UNLOAD_STEPS", "DriverLoader"]

INIT_STEPS = (
    "host-driver",
    "nouveau",
    "config-digest",
    "unload-previous",
    "module-source",
    "module-params",
    "load-modules",
    "device-nodes",
    "persistenced",
    "readiness",
)
UNLOAD_STEPS = ("check-processes", "persistenced", "check-modules", "readiness", "remove-modules")
PERSISTENCED_NAME = "nvidia-persistenced"[:15]  # /proc/<pid>/comm keeps 15 characters
BUILD_TIMEOUT = 1800.0
NOUVEAU_BLACKLIST = "blacklist nouveau\noptions nouveau modeset=0\n"


class DriverLoader:
    """Implements :class:`~gpunode.driver_loader.ops.DriverOps` on a host (real, or a fake tree)."""

    def __init__(
        self,
        cfg: LoaderConfig,
        ops: kmod.HostOps,
        *,
        clock: Callable[[], float] = time.time,
        log: Logger | None = None,
    ) -> None:
        self.cfg = cfg
        self.paths = cfg.paths
        self.ops = ops
        self.clock = clock
        self.log = log if log is not None else get_logger("gpunode.driver_loader")
        self.files = Files(cfg.paths, cfg.validations_dir)
        self.lock = InstanceLock(self.files.pid)
        self._lock_depth = 0
        self.book: StatusBook | None = None
        self.host_driver_version: str | None = None
        self.ready = False  # the driver is loaded and checked (init done, last health check passed)
        self.health_detail = "not initialised"

    # ------------------------------------------------------------------ DriverOps

    async def host_driver(self) -> str | None:
        return observe.find_host_driver(self.paths, self.files)

    async def loaded(self) -> bool:
        return "nvidia" in kmod.loaded_modules(self.paths)

    async def digest_matches(self) -> bool:
        return await self.loaded() and self.files.recorded_digest() == self.cfg.digest

    async def users(self) -> list[DriverUser]:
        pid = self.persistenced_pid()
        users = kmod.process_users(self.paths, exclude=[pid] if pid else [])
        modules = kmod.module_users(self.paths)
        if pid is not None:  # persistenced's own open files count on nvidia until unload stops it
            modules = [u for u in modules if u.name != "nvidia" or not u.detail.startswith("refcnt")]
        return users + modules

    async def load(self) -> None:
        await self.init()

    async def unload(self) -> None:
        async with self.locked():
            self.book = StatusBook.create(self.files.status, "unload", UNLOAD_STEPS, self.clock)
            try:
                await self._unload(record=True)
            except BaseException:
                self.book.finish("failed")
                raise
            self.book.finish("done")

    def close(self) -> None:
        self._lock_depth = 0
        self.lock.release()

    # ------------------------------------------------------------------ observe and plan

    def observe(self) -> Observed:
        return observe.observe(self.cfg, self.files, self.ops)

    def plan(self, observed: Observed | None = None) -> InitPlan:
        inputs = PlanInputs(
            digest=self.cfg.digest,
            module_type=self.cfg.module_type,
            rdma=self.cfg.rdma,
            force_reinstall=self.cfg.force_reinstall,
            driver_version=self.cfg.driver_version,
            modules_target=str(self.cfg.modules_target),
        )
        return plan_init(observed or self.observe(), inputs)

    # ------------------------------------------------------------------ steps

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Hold the single-instance lock (re-entrant within this loader); :class:`LoaderError` if taken."""
        if self._lock_depth == 0:
            try:
                self.lock.acquire()
            except (LoaderBusy, LockFileRefused) as exc:  # refused: a planted link, nothing written
                raise LoaderError(str(exc)) from None
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0:
                self.lock.release()

    def _step(self, name: str, *, record: bool = True) -> contextlib.AbstractAsyncContextManager[StepOutcome]:
        return step(self.book if record else None, self.log, name)

    # ------------------------------------------------------------------ init

    async def init(self) -> InitPlan:
        """Run every step; :class:`LoaderError`/:class:`DriverInUse` on failure (recorded in status)."""
        async with self.locked():
            self.ready = False
            self.book = StatusBook.create(self.files.status, "init", INIT_STEPS, self.clock)
            self.book.info.update(kernel=self.cfg.kernel, driverVersion=self.cfg.driver_version)
            try:
                plan = await self._init_steps()
            except BaseException as exc:
                self.files.remove_readiness(daemons_status=False)
                self.health_detail = f"init failed: {exc}"
                self.book.finish("failed")
                self.log.error("init_failed", error=str(exc))
                raise
            self.ready = True
            self.health_detail = "initialised"
            self.book.finish("done")
            self.log.info("init_done", fast_path=plan.fast_path, host_driver=plan.host_driver)
            return plan

    async def _init_steps(self) -> InitPlan:
        assert self.book is not None
        cfg = self.cfg
        self.files.daemons_status(False)
        async with self._step("host-driver") as out:
            observed = self.observe()
            self.host_driver_version = observed.host_driver
            out.detail = (
                f"host driver {observed.host_driver} is installed and loaded: using it"
                if observed.host_driver
                else "no host driver"
            )
        plan = self.plan(observed)
        self.book.info.update(digest=plan.digest)
        if plan.host_driver is not None:
            skip_rest(self.book, "host-driver", f"host driver {plan.host_driver} in use")
            self.book.step("readiness").state = "pending"
            async with self._step("readiness") as out:
                self.files.write_readiness(rdma=cfg.rdma, host_driver=True, driver_root="/")
                self.files.daemons_status(True)
                out.detail = "IS_HOST_DRIVER=true"
            return plan
        async with self._step("nouveau") as out:
            await self._nouveau_step(plan, out)
        async with self._step("config-digest") as out:
            recorded = observed.recorded_digest
            source = "DRIVER_CONFIG_DIGEST" if cfg.digest_override else "computed"
            if plan.fast_path:
                out.detail = f"{plan.digest[:12]} ({source}) matches the loaded driver: keeping its modules"
            elif "nvidia" not in observed.loaded:
                out.detail = f"{plan.digest[:12]} ({source}); no driver loaded"
            elif recorded == plan.digest:
                out.detail = f"{plan.digest[:12]} ({source}) matches, but FORCE_REINSTALL is set: reloading"
            else:
                was = recorded[:12] if recorded else "none recorded"
                out.detail = (
                    f"{plan.digest[:12]} ({source}) differs from the loaded driver's ({was}): reloading"
                )
        async with self._step("unload-previous") as out:
            if not plan.unload:
                out.skip("fast path" if plan.fast_path else "no NVIDIA module loaded")
            else:
                self.files.remove_readiness(daemons_status=False)
                await self._unload(record=False)
                out.detail = "removed " + ", ".join(plan.unload)
        async with self._step("module-source") as out:
            await self._source_step(plan, out)
        async with self._step("module-params") as out:
            self._params_step(plan, out)
        async with self._step("load-modules") as out:
            changed = await self._load_step(plan, out)
        async with self._step("device-nodes") as out:
            changed |= bool(await self.ensure_nodes(out, udev=True))
        async with self._step("persistenced") as out:
            if plan.persistenced is None:
                out.skip("nvidia-persistenced not found")
            else:
                out.detail = await self.ensure_persistenced(plan.persistenced)
                changed |= out.detail.startswith("started")
            self.files.daemons_status(True)
        async with self._step("readiness") as out:
            # the fast path with nothing to do trusts the driver nvidia-smi checked when it was loaded
            checked = await self._smi_check() if changed or not plan.fast_path else ""
            self.files.write_readiness(rdma=cfg.rdma, host_driver=False, driver_root=cfg.driver_root)
            rdma = str(cfg.rdma).lower()
            out.detail = f"{checked}wrote {CTR_READY} (GPU_DIRECT_RDMA_ENABLED: {rdma}), {DRIVER_READY}"
        return plan

    async def _nouveau_step(self, plan: InitPlan, out: StepOutcome) -> None:
        if plan.nouveau == "none":
            out.skip("nouveau is not loaded")
            return
        written = None
        if self.cfg.write_nouveau_blacklist:
            self.files.write(self.files.nouveau_blacklist, NOUVEAU_BLACKLIST)
            written = self.files.nouveau_blacklist
        if plan.nouveau == "builtin":
            raise LoaderError(self._blacklist_steps("nouveau is built into the kernel", written))
        rmmod = self._tool("rmmod")
        result = await self.ops.run([rmmod, "nouveau"], timeout=60)
        if not result.ok or (self.paths.sys_module("nouveau") / "refcnt").exists():
            raise LoaderError(
                self._blacklist_steps(f"nouveau cannot be unloaded ({result.describe()})", written)
            )
        out.detail = "unloaded nouveau" + (
            f"; wrote {written} (update the initramfs so it stays unloaded after a reboot)" if written else ""
        )

    def _blacklist_steps(self, why: str, written: Path | None) -> str:
        target = self.files.nouveau_blacklist
        first = (
            f"1) done: wrote {written} (blacklist nouveau, options nouveau modeset=0)"
            if written
            else f"1) write {target} containing the lines 'blacklist nouveau' and 'options nouveau "
            f"modeset=0' (or rerun with --write-nouveau-blacklist)"
        )
        return (
            f"{why}; the NVIDIA driver cannot load while nouveau holds the GPUs. Blacklist it and reboot: "
            f"{first}; 2) update the initramfs (update-initramfs -u on Debian/Ubuntu, dracut --force on "
            f"RHEL/Fedora/SUSE); 3) reboot the node"
        )

    async def _source_step(self, plan: InitPlan, out: StepOutcome) -> None:
        assert self.book is not None
        if plan.fast_path:
            out.skip("fast path: modules kept")
            return
        if plan.source_error is not None or plan.source is None:
            raise LoaderError(plan.source_error or "no module source")
        source = plan.source
        self.book.info.update(moduleSource=source.kind)
        if source.kind != "present":
            self.cfg.modules_target.mkdir(parents=True, exist_ok=True)
            self.log.info("module_build_started", argv=list(source.argv), kernel=self.cfg.kernel)
            result = await self.ops.run(source.argv, timeout=BUILD_TIMEOUT)
            if not result.ok:
                raise LoaderError(
                    f"building the modules for kernel {self.cfg.kernel} failed: {result.describe()}"
                )
            if observe.modules_dir(self.cfg) is None:
                raise LoaderError(
                    f"{source.kind} reported success but left no nvidia.ko for kernel {self.cfg.kernel} "
                    f"under {self.cfg.modules_tree}"
                )
        out.detail = source.detail
        indexed = await self._index_modules()
        if indexed:
            out.detail += f"; {indexed}"

    async def _index_modules(self) -> str:
        """Run depmod when ``modules.dep`` does not list nvidia.ko (modprobe finds modules through it)."""
        dep = self.cfg.modules_tree / "modules.dep"
        with contextlib.suppress(OSError):
            if "nvidia.ko" in dep.read_text():
                return ""
        argv = [self._tool("depmod")]
        if self.paths.driver_dir != Path("/"):
            argv += ["-b", str(self.paths.driver_dir)]
        result = await self.ops.run([*argv, self.cfg.kernel], timeout=300)
        if not result.ok:
            raise LoaderError(f"indexing the modules failed: {result.describe()}")
        return "indexed with depmod"

    def _params_step(self, plan: InitPlan, out: StepOutcome) -> None:
        if plan.fast_path:
            out.skip("fast path: parameters unchanged (part of the digest)")
            return
        coherent = wants_coherent_param(self.cfg.driver_version)
        text = render_modprobe_conf(self.cfg.params, coherent=coherent)
        changed = self.files.write(self.files.modprobe_conf, text)
        modules = [line.split()[1] for line in text.splitlines() if line.startswith("options ")]
        out.detail = f"{'wrote' if changed else 'unchanged'} {self.files.modprobe_conf}: " + (
            f"options for {', '.join(modules)}" if modules else "no options"
        )
        firmware = self._firmware_path()
        if firmware:
            out.detail += f"; {firmware}"

    def _firmware_path(self) -> str:
        """GSP firmware search path (reference 1.5): the driver root's lib/firmware, if unset."""
        if self.cfg.driver_root == "/" or firmware_disabled(self.cfg.params):
            return ""
        path = self.paths.sys_module("firmware_class") / "parameters" / "path"
        wanted = str(Path(self.cfg.driver_root) / "lib" / "firmware")
        try:
            current = read_head(path, 4096).decode(errors="replace").strip()
        except OSError:
            return ""
        if current and current != wanted:
            self.log.warning("firmware_path_kept", path=str(path), current=current, wanted=wanted)
            return f"firmware path kept at {current}"
        if not current:  # a sysfs parameter: written in place, never created nor followed if a symlink
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, wanted.encode())
            finally:
                os.close(fd)
        return f"firmware path {wanted}"

    def modprobe_argv(self, module: str) -> list[str]:
        argv = [self._tool("modprobe")]
        if self.paths.driver_dir != Path("/"):
            argv += ["-d", str(self.paths.driver_dir)]  # modules from <driver-root>/lib/modules/<kernel>
        if self.paths.root != Path("/"):
            argv += ["-C", str(self.paths.etc / "modprobe.d")]  # the host's configuration, with ours
        if self.cfg.kernel != os.uname().release:
            argv += ["-S", self.cfg.kernel]
        return [*argv, module]

    async def _load_step(self, plan: InitPlan, out: StepOutcome) -> bool:
        if plan.load:
            self.files.record_digest(plan.digest)  # before loading: a rerun after a crash keeps them
        loaded = await self.load_missing(plan.load)
        out.detail = ("loaded " + ", ".join(loaded)) if loaded else "all modules already loaded"
        return bool(loaded)

    async def load_missing(self, modules: Sequence[str]) -> list[str]:
        done: list[str] = []
        if modules and self.cfg.driver_root != "/":
            await self._prerequisites()
        for module in modules:
            if sysfs_name(module) in kmod.loaded_modules(self.paths, [sysfs_name(module)]):
                continue
            result = await self.ops.run(self.modprobe_argv(module), timeout=300)
            if not result.ok:
                raise LoaderError(f"loading {module} failed: {result.describe()}")
            self.log.info("module_loaded", module=module)
            done.append(module)
        return done

    async def _prerequisites(self) -> None:
        """Modules from the host's tree that nvidia.ko needs (NVIDIA loads them first; best effort)."""
        argv = [self._tool("modprobe")]
        if self.paths.root != Path("/"):
            argv += ["-d", str(self.paths.root)]
        result = await self.ops.run([*argv, "-a", "i2c_core", "ipmi_msghandler", "ipmi_devintf"], timeout=60)
        if not result.ok:
            self.log.warning("prerequisite_modules_failed", error=result.describe())

    async def ensure_nodes(self, out: StepOutcome, *, udev: bool) -> list[devnodes.DeviceNode]:
        loaded = kmod.loaded_modules(self.paths)
        nodes = devnodes.plan_nodes(self.paths, loaded, imex_channels=self.cfg.imex_channels)
        created, by_udev = await devnodes.ensure_nodes(
            self.paths,
            self.ops,
            nodes,
            udev_timeout=self.cfg.udev_timeout if udev else 0.0,
            create=self.cfg.create_device_nodes,
        )
        if not self.cfg.create_device_nodes:
            out.skip(
                "node creation disabled"
                + (f"; would create {', '.join(map(str, created))}" if created else "; none missing")
            )
            return created
        parts = []
        if created:
            parts.append("created " + ", ".join(map(str, created)))
        if by_udev:
            parts.append("udev made " + ", ".join(map(str, by_udev)))
        present = len(nodes) - len(created) - len(by_udev)
        parts.append(f"{present} of {len(nodes)} already present")
        out.detail = "; ".join(parts)
        return created

    # ------------------------------------------------------------------ persistenced

    async def _smi_check(self) -> str:
        """Like NVIDIA's startup probe: nvidia-smi must work before the driver is called ready."""
        smi = self.ops.which("nvidia-smi")
        if smi is None:
            return ""
        result = await self.ops.run([smi], timeout=120)
        if not result.ok:
            raise LoaderError(f"the driver is loaded but not usable: {result.describe()}")
        return "nvidia-smi ok; "

    def persistenced_pid(self) -> int | None:
        pid = self.files.persistenced_pid_value()
        if pid is None or not self.ops.pid_alive(pid):
            return None
        name = self.ops.process_name(pid)
        return pid if name is None or name.startswith(PERSISTENCED_NAME) else None

    async def ensure_persistenced(self, path: str) -> str:
        pid = self.persistenced_pid()
        if pid is not None:
            return f"running (pid {pid})"
        result = await self.ops.start_daemon([path, "--persistence-mode"])
        if not result.ok:
            raise LoaderError(f"starting nvidia-persistenced failed: {result.describe()}")
        deadline = time.monotonic() + 5.0
        while (pid := self.persistenced_pid()) is None:
            if time.monotonic() > deadline:
                raise LoaderError(
                    f"nvidia-persistenced started but no live process is in {self.files.persistenced_pid} "
                    f"after 5 s"
                )
            await asyncio.sleep(0.02)
        self.log.info("persistenced_started", pid=pid)
        return f"started (pid {pid})"

    async def _stop_persistenced(self) -> int | None:
        """SIGTERM and wait up to ``persistenced_stop_timeout``; the pid it had, None if not running."""
        pid = self.persistenced_pid()
        if pid is None:
            return None
        self.ops.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.persistenced_stop_timeout
        while self.ops.pid_alive(pid):
            if time.monotonic() > deadline:
                raise LoaderError(
                    f"nvidia-persistenced (pid {pid}) is still running "
                    f"{self.cfg.persistenced_stop_timeout:g} s after SIGTERM; stop it, then unload again"
                )
            await asyncio.sleep(0.1)
        self.log.info("persistenced_stopped", pid=pid)
        return pid

    # ------------------------------------------------------------------ unload

    async def _unload(self, *, record: bool) -> None:
        async with self._step("check-processes", record=record) as out:
            pid = self.persistenced_pid()
            procs = kmod.process_users(self.paths, exclude=[pid] if pid else [])
            if procs:
                raise DriverInUse(procs)
            out.detail = "no process holds /dev/nvidia*"
        stopped: int | None = None
        async with self._step("persistenced", record=record) as out:
            stopped = await self._stop_persistenced()
            if stopped is None:
                out.skip("not running")
            else:
                out.detail = f"stopped (pid {stopped})"
        async with self._step("check-modules", record=record) as out:
            users = kmod.module_users(self.paths)
            if users:
                if stopped is not None and (tool := self.ops.which("nvidia-persistenced")):
                    with contextlib.suppress(LoaderError):
                        await self.ensure_persistenced(tool)  # refused: leave things as they were
                raise DriverInUse(users)
            out.detail = "no module references beyond the NVIDIA modules' own"
        async with self._step("readiness", record=record) as out:
            removed = self.files.remove_readiness()
            out.detail = ("removed " + ", ".join(p.name for p in removed)) if removed else "none present"
        async with self._step("remove-modules", record=record) as out:
            present = kmod.loaded_modules(self.paths)
            for module in present:
                result = await self.ops.run([self._tool("rmmod"), module], timeout=60)
                if not result.ok:
                    raise LoaderError(f"removing {module} failed: {result.describe()}")
                self.log.info("module_removed", module=module)
            self.files.forget_digest()
            out.detail = ("removed " + ", ".join(present)) if present else "no NVIDIA module loaded"

    def _tool(self, name: str) -> str:
        found = self.ops.which(name)
        if found is None:
            raise LoaderError(
                f"{name} not found (searched --bin-dir, the driver root, $PATH and the host root); "
                f"install it or pass --{name}"
            )
        return found

"""MPS sharing in the device plugin: advertise an MPS resource only while its control daemon is ready.

NVIDIA's plugin waits, before serving an MPS resource, for the daemon's ``.ready`` file to match its
own config and for the control pipe to answer. Here :class:`MpsWatch` reads ``<mps root>/.ready`` (see
:mod:`gpunode.api.mps`) at start and then every ``interval`` seconds (a few ``stat`` calls; the file is
read again only when it changed): a resource counts as ready when the file was written for the
plugin's sharing settings, names the resource, its ``.started`` file exists and its control socket is
there. When the set of ready resources changes, the resources are reconciled: an MPS resource whose
daemon is not ready is not advertised (withdrawn if it was), and ``Allocate`` answers with the daemon's
pipe directory, the shared memory and the per-client limits.

The other way, :meth:`MpsWatch.publish_config` writes the config the plugin serves, once it is in
force, to ``<mps root>/.device-plugin-config.yaml`` for an MPS agent run with ``--follow-device-plugin``:
the node then has one choice of config (the plugin's, from its node label or file), and the MPS agent
needs no Kubernetes API of its own (docs/mps.md).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING

from gpunode.api.mps import DEFAULT_ROOT, MpsRoot, ReadyResource, ready_resources
from gpunode.common.atomic import atomic_write

if TYPE_CHECKING:
    from gpunode.common.hostpaths import HostPaths
    from gpunode.common.logging import Logger
    from gpunode.device_plugin.resources import Resources

__all__ = ["MpsWatch"]

DEFAULT_INTERVAL = 2.0
NO_FILE_CONFIG = b"version: v1\n"  # what the plugin serves without a config file: the built-in defaults


class MpsWatch:
    """Keeps ``resources.state.mps_ready`` in line with the MPS control daemon's readiness file."""

    def __init__(
        self, resources: Resources, host: HostPaths, *, log: Logger, interval: float = DEFAULT_INTERVAL
    ) -> None:
        self.resources = resources
        self.host = host
        self.log = log
        self.interval = interval
        self._seen: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) of the file last read
        self._document: object = None
        self._publish_failed = ""  # the last reason publishing failed (logged once per reason)

    def _root(self) -> MpsRoot:
        settings = self.resources.state.settings
        return MpsRoot(str(self.host.host(settings.mps_root or DEFAULT_ROOT)))

    def read(self) -> tuple[dict[str, ReadyResource] | None, str]:
        """The ready MPS resources now (None: no MPS sharing, or not ready) and why not, for the log."""
        sharing = self.resources.state.settings.sharing
        if sharing is None or not sharing.mps:
            return None, ""
        root = self._root()
        try:
            st = os.stat(root.ready_file)
        except OSError:
            self._seen, self._document = None, None
            return None, f"{root.ready_file} is missing: the MPS control daemon has not started (yet)"
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key != self._seen:
            try:
                with open(root.ready_file, "rb") as f:
                    self._document = json.loads(f.read(1 << 20) or b"null")
            except (OSError, ValueError) as exc:
                self._document = None
                return None, f"{root.ready_file} is unreadable: {exc}"
            self._seen = key
        declared = ready_resources(self._document, sharing)
        if declared is None:
            return None, f"{root.ready_file} was written for other sharing settings"
        ready = {
            name: value
            for name, value in declared.items()
            if os.path.exists(root.started_file(name)) and os.path.exists(root.control_socket(name))
        }
        missing = sorted(set(declared) - set(ready))
        return ready, (f"control daemon of {', '.join(missing)} not running" if missing else "")

    def refresh(self) -> bool:
        """Read the readiness now; True when the ready resources changed."""
        ready, reason = self.read()
        state = self.resources.state
        sharing = state.settings.sharing
        if ready == state.mps_ready and sharing == state.mps_ready_for:
            return False
        state.mps_ready, state.mps_ready_for = ready, sharing
        if sharing is not None and sharing.mps:
            if ready:
                self.log.info("mps_ready", resources=sorted(ready), detail=reason or None)
            else:
                self.log.warning("mps_not_ready", reason=reason, advertising="no MPS resources")
        return True

    def publish_config(self, content: bytes | None) -> bool:
        """The config now in force (the file's bytes; None: no file, the built-in defaults) to
        ``<mps root>/.device-plugin-config.yaml``, atomically, only when it changed; True if written.
        The root is made (0755, as the DaemonSets' hostPath makes it) when missing. A write that fails
        is logged once, and the plugin serves on (the MPS agent keeps the config it has)."""
        root = self._root()
        try:
            if not os.path.isdir(root.path):
                os.makedirs(root.path, exist_ok=True)
                os.chmod(root.path, 0o755)  # not the umask's: clients' pipe directories live under it
            written = atomic_write(root.plugin_config_file, content or NO_FILE_CONFIG, only_if_changed=True)
        except OSError as exc:
            reason = f"{root.plugin_config_file}: {exc.strerror or exc}"
            if reason != self._publish_failed:
                self._publish_failed = reason
                self.log.warning("mps_config_not_published", reason=reason)
                self.resources.base_metrics.count_error("mps-config")
            return False
        self._publish_failed = ""
        if written:
            self.log.info("mps_config_published", file=root.plugin_config_file)
        return written

    async def run(self) -> None:
        """Poll the readiness file; reconcile when what is ready changes."""
        while True:
            await asyncio.sleep(self.interval)
            if self.refresh():
                await self.resources.reconcile()

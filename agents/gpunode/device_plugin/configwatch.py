"""The plugin's configuration kept current: a config file's changes and SIGHUP reload it, or a node label
chooses the file of a config directory; a bad new config is logged and the last good one stays.

With ``--config-file`` naming a directory of named configs (a ConfigMap mount), the node label
``nvidia.com/device-plugin.config`` chooses the file (:class:`gpunode.kube.labelconfig.LabelConfig`),
in process: changes of the label or the directory are applied live, and the outcome is written to the
node's annotations. This replaces NVIDIA's config-manager sidecar.

Each config that comes into force is also handed to ``publish`` (the MPS control daemon's copy,
:meth:`gpunode.device_plugin.mps.MpsWatch.publish_config`): the bytes of the file in force, or None for
the built-in defaults.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.fswatch import watch_directory
from gpunode.kube.labelconfig import InForce, LabelConfig, LabelConfigOptions, Loaded, NoUsableConfig

if TYPE_CHECKING:
    from gpunode.api.plugin_config import PluginConfig
    from gpunode.common.logging import Logger
    from gpunode.device_plugin.flags import DevicePluginFlags
    from gpunode.device_plugin.resources import Resources
    from gpunode.device_plugin.settings import PluginSettings
    from gpunode.kube.client import Kube

__all__ = ["ConfigWatch", "DirConfig", "LoadSettings", "connect_kube", "label_config_options"]

FIELD_MANAGER = "gpunode-device-plugin"
SWAP_SETTLE = 0.1  # a ConfigMap's ..data swap is several renames: let it finish before reading

DirConfig = tuple["PluginConfig | None", "PluginSettings"]  # what a file of the directory loads into
LoadSettings = Callable[["PluginConfig | None"], "PluginSettings"]  # flags and env vars still win


def label_config_options(flags: DevicePluginFlags) -> LabelConfigOptions | None:
    """With ``--config-file`` naming a directory: how the node label chooses a file in it."""
    path = flags.common.config_file
    if not path or not Path(path).is_dir():
        return None
    return flags.label_config.options(Path(path), first_label_wait=flags.kube.kube_api_timeout)


def connect_kube(flags: DevicePluginFlags, options: LabelConfigOptions) -> Kube:
    """The API client for the node label; imported only here (lightkube costs memory)."""
    from gpunode.kube.client import Kube

    try:
        return Kube.connect(
            flags.common.node_name,
            flags.kube.kubeconfig,
            namespace=flags.kube.namespace,
            timeout=flags.kube.kube_api_timeout,
            field_manager=FIELD_MANAGER,
        )
    except UsageError as exc:
        raise UsageError(
            f"--config-file {options.directory} is a directory: the node label "
            f"{options.node_label} chooses the config in it, which needs the Kubernetes API: {exc}"
        ) from None


class ConfigWatch:
    """The config in force (``config``) and where it came from: ``config_file``, a file of
    ``config_dir`` chosen by the node label (``dir_config``), or flags alone."""

    def __init__(
        self,
        resources: Resources,
        *,
        config_file: Path | None,
        config_dir: LabelConfigOptions | None,
        load_settings: LoadSettings,
        config: PluginConfig | None,
        kube: Kube | None,
        log: Logger,
        publish: Callable[[bytes | None], object] = lambda content: None,
    ) -> None:
        self.resources = resources
        self._publish = publish
        self.config_file = config_file
        self.config_dir = config_dir
        self.load_settings = load_settings
        self.config = config
        self.log = log
        self.digest = self.read_digest()
        self._starting_name: str | None = None
        self.dir_config: LabelConfig[DirConfig] | None = None
        if config_dir is not None:
            self.dir_config = LabelConfig(
                config_dir,
                self._load_dir_config,
                kube=kube,
                report=True,  # the device plugin says on the node which config it serves
                log=log,
                count_error=resources.base_metrics.count_error,
            )

    def read_digest(self) -> str | None:
        path = self.config_file
        if path is None:
            return None
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return None

    def source(self) -> str:
        """What the settings came from, for messages: the file, the chosen file of a directory, flags."""
        if self.config_file is not None:
            return str(self.config_file)
        d = self.config_dir
        if d is not None:
            in_force = self.dir_config.in_force if self.dir_config is not None else None
            name = in_force.name if in_force is not None else self._starting_name
            return str(d.directory / name) if name else f"{d.directory} (no file: built-in defaults)"
        return "<flags>"

    def publish(self, chosen: InForce | None = None) -> None:
        """Hand the config now in force to ``publish``: the config file's bytes, or in a directory the
        chosen file's (``chosen``; skipped when its content is no longer the one applied: the change is
        applied, and published, next); None without a file."""
        content: bytes | None = None
        try:
            if self.config_file is not None:
                content = self.config_file.read_bytes()
            elif self.config_dir is not None and chosen is not None and chosen.name is not None:
                content = (self.config_dir.directory / chosen.name).read_bytes()
                if chosen.digest is not None and hashlib.sha256(content).hexdigest() != chosen.digest:
                    return
        except OSError as exc:
            self.log.warning("mps_config_not_published", reason=f"reading the config: {exc}")
            return
        self._publish(content)

    def _rejected(self, exc: Exception) -> None:
        self.log.error("config_rejected", error=str(exc), keeping="the last good configuration")
        self.resources.base_metrics.count_error("config")

    async def reload(self) -> None:
        """SIGHUP or a changed config file: a bad new config is logged and the last good one stays."""
        if self.dir_config is not None:
            await self.dir_config.reload(self.apply_dir_config)
            return
        new_config = self.config
        if self.config_file is not None:
            from gpunode.api.plugin_config import PluginConfig
            from gpunode.common.config import load_config

            try:
                new_config = load_config(self.config_file, PluginConfig)
            except ConfigError as exc:
                self._rejected(exc)
                return
        try:
            settings = self.load_settings(new_config)
        except (ConfigError, ValueError) as exc:
            self._rejected(exc)
            return
        res = self.resources
        before = set(res.servers)
        await res.reconcile(settings)
        if res.state.settings is settings:
            self.config = new_config
            self.log.info(
                "config_reloaded",
                added=sorted(set(res.servers) - before),
                removed=sorted(before - set(res.servers)),
            )
            self.publish()

    async def watch_file(self) -> None:
        """``config_file`` changed (its directory is watched: a ConfigMap swaps ``..data``): reload."""
        path = self.config_file
        assert path is not None
        async for _ in watch_directory(path.parent, writes=True):
            digest = self.read_digest()
            if digest is None or digest == self.digest:
                continue
            await asyncio.sleep(SWAP_SETTLE)
            digest = self.read_digest()
            if digest is None or digest == self.digest:
                continue
            self.digest = digest
            self.log.info("config_changed", file=str(path))
            await self.reload()

    # -- configuration chosen by a node label (a directory of named configs) -------------------------
    def _load_dir_config(self, path: Path | None) -> DirConfig:
        """A file of the directory (None: no file) -> its config and the effective settings (flags and
        env vars still win); ConfigError if bad."""
        d = self.config_dir
        assert d is not None
        config = None
        if path is not None:
            from gpunode.api.plugin_config import PluginConfig
            from gpunode.common.config import load_config

            config = load_config(path, PluginConfig)
        try:
            return config, self.load_settings(config)
        except (ValueError, UsageError) as exc:
            raise ConfigError(str(path or d.directory), [str(exc)]) from None

    async def first_dir_config(self, dir_config: LabelConfig[DirConfig]) -> Loaded[DirConfig]:
        """The settings the first reconcile serves with; ConfigError (exit 2) when nothing loads."""
        try:
            loaded = await dir_config.first()
        except NoUsableConfig as exc:
            raise ConfigError(exc.directory, [exc.reason]) from None
        self._starting_name = loaded.chosen.name
        self.config, self.resources.state.settings = loaded.config
        return loaded

    async def apply_dir_config(self, loaded: DirConfig, chosen: InForce) -> str | None:
        """Serve a newly chosen (or changed) config: None, or why its resources were refused."""
        config, settings = loaded
        res = self.resources
        before = set(res.servers)
        refused = await res.reconcile(settings)
        if refused is not None:
            return refused
        self.config = config
        self.log.info(
            "config_reloaded",
            config=chosen.name,
            added=sorted(set(res.servers) - before),
            removed=sorted(before - set(res.servers)),
        )
        self.publish(chosen)
        return None

"""The MPS agent's config chosen by the node label, as the device plugin's is.

With ``--config-file`` naming a directory of named configs (the device plugin's ConfigMap), the node
label ``nvidia.com/device-plugin.config`` chooses the file, then ``--default-config``, then the fallbacks:
the device plugin's own :class:`gpunode.kube.labelconfig.LabelConfig`, so both agents choose the same
file from the same label, directory and flags. Here a "loaded" config is the chosen file's path: the
planning child reads it (:mod:`gpunode.mps.plan`). A change of the label, or of the chosen file's
content, plans again; a plan that changed restarts the daemons; a file the planning step refuses leaves
the daemons as they are (keep-last-good, logged ``config_rejected``). The device plugin reports the
outcome on the node; this agent does not (one reporter per node).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.errors import ConfigError
from gpunode.kube.labelconfig import InForce, LabelConfig, LabelConfigOptions, NodeApi, NoUsableConfig

if TYPE_CHECKING:
    from gpunode.common.logging import Logger

__all__ = ["LabelledConfig"]


class LabelledConfig:
    """The config file in force (``path``), chosen in ``options.directory`` by the node label."""

    def __init__(
        self,
        options: LabelConfigOptions,
        kube: NodeApi,
        *,
        log: Logger,
        count_error: Callable[[str], object] = lambda reason: None,
    ) -> None:
        self.options = options
        self.path: str | None = None
        self.log = log
        # The agent's error counter, set once the agent has made its metrics (bind).
        self.count_error = count_error
        self.config: LabelConfig[str | None] = LabelConfig(
            options, self._load, kube=kube, report=False, log=log, count_error=lambda r: self.count_error(r)
        )

    def bind(self, count_error: Callable[[str], object], unready: Callable[[str], object]) -> None:
        """The agent's hooks: its error counter takes the label controller's errors (``kube``,
        ``config-selection``, ``config``); ``unready`` is not needed (the first choice has a deadline)."""
        self.count_error = count_error

    @staticmethod
    def _load(path: Path | None) -> str | None:
        if path is not None and not path.is_file():
            raise ConfigError(str(path), ["not a readable file"])
        return None if path is None else str(path)

    async def first(self) -> None:
        """Wait a little for the label, then take its file (or the default chain's); ConfigError (exit 2)
        when the directory offers nothing."""
        try:
            loaded = await self.config.first()
        except NoUsableConfig as exc:
            raise ConfigError(exc.directory, [exc.reason]) from None
        self.path = loaded.config
        self.config.took(loaded.chosen, loaded.failure)

    async def follow(self, replan: Callable[[], Awaitable[str | None]]) -> None:
        """Forever: the node's label and the directory; ``replan()`` (with ``path`` already the new file)
        returns None when the agent took it, else why it was refused (``path`` is then restored)."""

        async def apply(path: str | None, chosen: InForce) -> str | None:
            previous, self.path = self.path, path
            refused = await replan()
            if refused is not None:
                self.path = previous
                self.log.error("config_rejected", error=refused, config=chosen.name, keeping=previous)
                return refused
            self.log.info("config_reloaded", config=chosen.name, file=path)
            return None

        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.config.watch_node(), name="node-watch")
            tg.create_task(self.config.watch_directory(), name="config-watch")
            tg.create_task(self.config.follow_changes(apply), name="config-select")

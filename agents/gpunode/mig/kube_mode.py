"""Kubernetes mode of the MIG manager: the node's ``nvidia.com/mig.config`` label followed through a
watch, the ``nvidia.com/mig.config.state`` label and its reason annotation written back, and the
operands paused around a change. The Kubernetes client is imported only here, and only when connecting:
bare-metal mode never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from gpunode.common.logging import Logger
from gpunode.common.runtime import Backoff
from gpunode.common.settings import CommonSettings, KubeSettings
from gpunode.mig.decisions import CONFIG_LABEL, REASON_ANNOTATION, STATE_LABEL, State

if TYPE_CHECKING:
    from gpunode.kube.api import NodeInfo
    from gpunode.kube.client import Kube
    from gpunode.kube.operands import OperandPauser
    from gpunode.mig.manager import MigManager

__all__ = ["OWNER", "PAUSE_REASON", "KubeSource", "MigNodeState", "PausedOperands", "connect_kube"]

OWNER = "gpunode-mig-manager"  # owner of the operand pause record; field manager of our writes
PAUSE_REASON = "mig-change"  # labels read paused-for-mig-change, as NVIDIA's


class MigNodeState:
    """State label and reason annotation on the node, one merge patch each time, only when different."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._known: tuple[str | None, str | None] | None = None

    async def previous(self) -> str | None:
        node = await self.kube.get_node()
        self._remember(node)
        return node.labels.get(STATE_LABEL)

    async def set(self, state: State, reason: str, config: str) -> None:
        want = (state, reason or None)
        if self._known == want:
            return
        node = await self.kube.patch_node(
            labels={STATE_LABEL: state}, annotations={REASON_ANNOTATION: reason or None}
        )
        self._remember(node)

    def _remember(self, node: NodeInfo) -> None:
        self._known = (node.labels.get(STATE_LABEL), node.annotations.get(REASON_ANNOTATION))


class PausedOperands:
    """The operand DaemonSets of this node paused (their ``nvidia.com/gpu.deploy.*`` labels) around a
    change, crash-safe through :class:`~gpunode.kube.operands.OperandPauser`."""

    def __init__(self, pauser: OperandPauser) -> None:
        self.pauser = pauser

    def paused(self, timeout: float) -> contextlib.AbstractAsyncContextManager[object]:
        return self.pauser.paused(PAUSE_REASON, timeout=timeout)


class KubeSource:
    """The ``nvidia.com/mig.config`` label of this node."""

    def __init__(self, kube: Kube, pauser: OperandPauser, log: Logger) -> None:
        self.kube = kube
        self.pauser = pauser
        self.log = log

    async def start(self, manager: MigManager) -> None:
        """Finish a pause an earlier run left, then read the label; the API server is waited for."""
        from gpunode.kube.api import KubeUnavailable

        backoff = Backoff(1.0, 30.0)
        while True:
            try:
                restored = await self.pauser.recover()
                node = await self.kube.get_node()
                break
            except KubeUnavailable as exc:
                delay = backoff.next()
                self.log.warning("kube_unavailable", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
        if restored:
            self.log.warning("mig_operands_restored_after_crash", labels=restored)
        manager.selected = node.labels.get(CONFIG_LABEL, "")

    async def follow(self, manager: MigManager) -> None:
        async for node in self.kube.watch_node():
            label = node.labels.get(CONFIG_LABEL, "")
            if label != manager.selected:
                self.log.info(
                    "mig_config_label_changed", config=label or None, before=manager.selected or None
                )
                manager.selected = label
                manager.trigger("label")


def connect_kube(common: CommonSettings, settings: KubeSettings) -> tuple[Kube, OperandPauser]:
    """The API client and the operand pauser (UsageError, exit 2, without a node name or credentials).
    The Kubernetes client is imported only here: bare-metal mode never loads it."""
    from gpunode.kube.client import Kube
    from gpunode.kube.operands import DEFAULT_OPERANDS, Operand, OperandPauser

    kube = Kube.connect(
        common.node_name,
        settings.kubeconfig,
        namespace=settings.namespace or "default",
        timeout=settings.kube_api_timeout or 10.0,
        field_manager=OWNER,
    )
    operands = (*DEFAULT_OPERANDS, Operand("client"))
    return kube, OperandPauser(kube, OWNER, operands=operands)

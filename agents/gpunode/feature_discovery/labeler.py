"""One labeling pass: the node's facts, the labels computed with the config in force, written where they
go (the NFD feature file or the NodeFeature object); each warning said once, not every pass.

Also what a stopped labeler leaves behind in its feature file (:meth:`Labeler.leave`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.errors import ConfigError
from gpunode.common.hostpaths import HostPaths
from gpunode.feature_discovery.config import LabelingConfig
from gpunode.feature_discovery.facts import gather_facts
from gpunode.feature_discovery.labels import LabelResult, MpsMigRefused, NodeFacts, compute_labels
from gpunode.feature_discovery.output import FeatureFile, NodeFeatureOutput, OutputError, expiry_after_stop
from gpunode.nvml import errors

if TYPE_CHECKING:
    from gpunode.common.logging import Logger
    from gpunode.common.metrics import AgentMetrics
    from gpunode.feature_discovery.settings import LabelsOnExit
    from gpunode.nvml import Nvml

__all__ = ["Labeler", "LabelerOptions"]


@dataclass(frozen=True)
class LabelerOptions:
    output_file: str  # "": standard output
    machine_type_file: Path | None = None
    host: HostPaths = field(default_factory=HostPaths)
    oneshot: bool = False  # an unwritable output fails the run instead of being retried
    interval: float | None = None  # the pass interval: caps the retry backoff, sets the stop expiry


class Labeler:
    """Labels the node: :meth:`label_once` is one pass; ``config`` and ``timestamp`` may change between
    passes (a reloaded config file, SIGHUP's new timestamp). ``nvml()`` is NVML at the time of a pass
    (None while it is unavailable: no GPU labels)."""

    def __init__(
        self,
        opts: LabelerOptions,
        config: LabelingConfig,
        nvml: Callable[[], Nvml | None],
        *,
        timestamp: int | None,
        log: Logger,
        metrics: AgentMetrics,
        node_feature: NodeFeatureOutput | None = None,
    ) -> None:
        self.opts = opts
        self.config = config
        self.nvml = nvml
        self.timestamp = timestamp
        self.log = log
        self.metrics = metrics
        self.node_feature = node_feature
        self.output = FeatureFile(opts.output_file)
        self.passes = 0
        self.last: LabelResult | None = None
        self._warned: set[str] = set()

    async def facts(self) -> NodeFacts:
        nvml = self.nvml()
        if nvml is None:
            return NodeFacts(system=None, gpus=(), mig_devices={}, pci_classes={}, machine=None)
        return await gather_facts(nvml, self.opts.host, self.opts.machine_type_file)

    async def label_once(self) -> LabelResult:
        facts = await self.facts()
        if (
            self.opts.machine_type_file is not None
            and facts.machine is None
            and "machine" not in self._warned
        ):
            self._warned.add("machine")
            self.log.warning(
                "machine_type_unreadable",
                file=str(self.opts.machine_type_file),
                label="nvidia.com/gpu.machine=unknown",
            )
        try:
            result = compute_labels(
                facts,
                mig_strategy=self.config.mig_strategy,
                sharing=self.config.sharing,
                timestamp=self.timestamp,
            )
        except MpsMigRefused as exc:  # NVIDIA's GFD fails here too: exit 2 with the path and the reason
            raise ConfigError("config file", [str(exc)]) from None
        for warning in result.warnings:
            if warning not in self._warned:  # say it once, not every minute
                self._warned.add(warning)
                self.log.warning("label_warning", detail=warning)
        for key, original, written in result.adjusted:
            if f"{key}={original}" not in self._warned:
                self._warned.add(f"{key}={original}")
                self.log.warning(
                    "label_value_adjusted",
                    key=key,
                    original=original,
                    written=written,
                    reason="Kubernetes label values are at most 63 of [A-Za-z0-9._-]",
                )
        if self.node_feature is not None:
            changed = await self.node_feature.write(result.labels)
            where = {"nodefeature": f"{self.node_feature.namespace}/{self.node_feature.name}"}
            if self.node_feature.owner_warning and "owner" not in self._warned:
                self._warned.add("owner")
                self.log.warning("nodefeature_owner_unknown", detail=self.node_feature.owner_warning)
        else:
            changed = self.output.write(result.labels)
            where = {"file": self.opts.output_file or "<stdout>"}
        self.passes += 1
        self.last = result
        self.log.info("labels_written" if changed else "labels_unchanged", labels=len(result.labels), **where)
        if len(result.labels) <= 1:
            self.log.warning("no_labels", hint="no GPU found or NVML unavailable")
        self.metrics.mark_success("labeling")
        return result

    async def write_with_retry(self) -> None:
        """A pass; an unwritable output or an NVML error is retried with backoff (daemon mode) until a
        pass succeeds, never a crash loop; the labels last written stay meanwhile."""
        delay = 1.0
        while True:
            try:
                await self.label_once()
                return
            except OutputError as exc:
                if self.opts.oneshot:
                    raise
                self.log.error("output_failed", error=str(exc), retry_in_s=delay)
                self.metrics.count_error("output")
            except errors.NvmlError as exc:
                if self.opts.oneshot:
                    raise
                self.log.error("labeling_failed", error=f"{type(exc).__name__}: {exc}", retry_in_s=delay)
                self.metrics.count_error("nvml")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.opts.interval or 60.0)

    def leave(self, on_exit: LabelsOnExit) -> None:
        """On stop: the feature file stays with an expiry (or goes, or stays as is); a NodeFeature always
        stays, as NVIDIA's does: its owners' garbage collection removes it."""
        if (
            self.opts.oneshot
            or self.node_feature is not None
            or self.output.path is None
            or self.last is None
        ):
            return
        if on_exit == "delete":
            self.output.delete()
            self.log.info("labels_deleted", file=str(self.output.path))
        elif on_exit == "expire":
            expiry = expiry_after_stop(self.opts.interval or 60.0, datetime.now(UTC))
            with contextlib.suppress(OutputError):
                self.output.write(self.last.labels, expiry)
            self.log.info("labels_expire", file=str(self.output.path), at=expiry.isoformat())

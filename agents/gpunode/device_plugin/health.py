"""Device health: which NVML events are fatal, and when a GPU may become Healthy again.

Health is tracked per *physical* GPU: a fatal event marks every logical device of that GPU (all
time-slicing replicas, all MIG siblings) Unhealthy at once, which NVIDIA's plugin gets wrong (#1929).

Beyond NVIDIA, a GPU recovers: once NVML has answered normally for the hold-down period
(`--health-recovery-period`, default 5 min; 0 disables recovery) with no new fatal event, it is Healthy
again. That holds for XIDs that do not need a GPU reset (`RESET_REQUIRED_XIDS` in :mod:`gpunode.nvml.xids`
lists those that do, from NVIDIA's XID catalog); a GPU marked for one of those stays Unhealthy until the
plugin restarts, unless it fell off the bus and came back, which means it was reset or re-attached.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpunode.nvml.xids import APPLICATION_XIDS, RESET_REQUIRED_XIDS

DEFAULT_RECOVERY_PERIOD_S = 300.0


class HealthConfigError(ValueError):
    """DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS could not be parsed."""


def _xid_list(name: str, text: str) -> tuple[bool, frozenset[int]]:
    """(all, xids) from a comma list such as "all", "xids", "48,79"."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    everything = False
    xids: set[int] = set()
    for w in words:
        if w in ("all", "xids"):
            everything = True
            continue
        try:
            xids.add(int(w, 0))
        except ValueError:
            raise HealthConfigError(f"{name}: {w!r} is neither 'all', 'xids' nor an XID number") from None
    return everything, frozenset(xids)


@dataclass(frozen=True)
class XidPolicy:
    """Which XIDs mark a GPU Unhealthy.

    `enabled` False turns health checking off; `only`, when set, lists the sole XIDs that count;
    otherwise every XID counts except those in `ignored`.
    """

    enabled: bool = True
    ignored: frozenset[int] = APPLICATION_XIDS
    only: frozenset[int] | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> XidPolicy:
        """NVIDIA's variables: DP_DISABLE_HEALTHCHECKS (all | xids | extra XIDs to ignore) and
        DP_ENABLE_HEALTHCHECKS (all | XIDs that count even if ignored by default). Enabling wins."""
        disable_all, disabled = _xid_list(
            "DP_DISABLE_HEALTHCHECKS", environ.get("DP_DISABLE_HEALTHCHECKS", "")
        )
        enable_all, enabled = _xid_list("DP_ENABLE_HEALTHCHECKS", environ.get("DP_ENABLE_HEALTHCHECKS", ""))
        if enable_all:
            return cls(True, frozenset())
        if disable_all:
            return cls(True, frozenset(), only=enabled) if enabled else cls(False)
        return cls(True, (APPLICATION_XIDS | disabled) - enabled)

    def is_fatal(self, xid: int) -> bool:
        if not self.enabled:
            return False
        if self.only is not None:
            return xid in self.only
        return xid not in self.ignored


class Health(enum.Enum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass
class _GpuHealth:
    healthy: bool = True
    reason: str = ""
    recoverable: bool = True
    since: float = 0.0  # when NVML last answered normally without a new fatal event


@dataclass
class HealthTracker:
    """Health per physical GPU UUID, with recovery after a quiet hold-down period."""

    recovery_period: float = DEFAULT_RECOVERY_PERIOD_S
    _gpus: dict[str, _GpuHealth] = field(default_factory=dict)

    def health(self, uuid: str) -> Health:
        g = self._gpus.get(uuid)
        return Health.HEALTHY if g is None or g.healthy else Health.UNHEALTHY

    def reason(self, uuid: str) -> str:
        g = self._gpus.get(uuid)
        return "" if g is None else g.reason

    def unhealthy(self) -> dict[str, str]:
        return {u: g.reason for u, g in self._gpus.items() if not g.healthy}

    def mark_unhealthy(self, uuid: str, reason: str, now: float, *, recoverable: bool) -> bool:
        """Returns True when the GPU's health changed."""
        g = self._gpus.setdefault(uuid, _GpuHealth())
        changed = g.healthy
        g.healthy = False
        g.reason = reason
        # a GPU that needs a reset stays unrecoverable even if a later, milder event arrives
        g.recoverable = recoverable and (changed or g.recoverable)
        g.since = now
        return changed

    def on_xid(self, uuid: str, xid: int, policy: XidPolicy, now: float) -> bool:
        if not policy.is_fatal(xid):
            return False
        return self.mark_unhealthy(uuid, f"xid {xid}", now, recoverable=xid not in RESET_REQUIRED_XIDS)

    def on_double_bit_ecc(self, uuid: str, policy: XidPolicy, now: float) -> bool:
        if not policy.enabled:
            return False
        return self.mark_unhealthy(uuid, "double-bit ECC error", now, recoverable=False)

    def on_lost(self, uuid: str, now: float) -> bool:
        return self.mark_unhealthy(uuid, "GPU is lost", now, recoverable=True)

    def on_probe(self, uuid: str, answered: bool, now: float) -> bool:
        """Record whether NVML answered normally for this GPU; returns True when it became Healthy."""
        g = self._gpus.get(uuid)
        if g is None or g.healthy:
            return False
        if not answered:
            g.since = now  # restart the hold-down
            return False
        if g.reason == "GPU is lost":
            # it answers again: it was reset or re-attached; start its hold-down from now
            g.reason = "recovering from a lost GPU"
            g.recoverable = True
            g.since = now
            return False
        if not g.recoverable or self.recovery_period <= 0:
            return False
        if now - g.since >= self.recovery_period:
            g.healthy = True
            g.reason = ""
            return True
        return False

    def forget(self, keep: Iterable[str]) -> None:
        """Drop GPUs no longer on the node."""
        keep_set = set(keep)
        for uuid in list(self._gpus):
            if uuid not in keep_set:
                del self._gpus[uuid]

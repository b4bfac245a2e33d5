"""What a named mig-parted config asks of each GPU of this node (mig-parted's selection walk, made loud).

The file format itself (:class:`~gpunode.api.mig_config.MigSpec`, entries, device filters, the GPU
facts entries match on) is :mod:`gpunode.api.mig_config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpunode.api.mig_config import GpuIdentity, MigEntry

__all__ = ["SelectedLayout", "SelectionError", "desired_per_gpu", "no_gpu_matched"]


@dataclass(frozen=True)
class SelectedLayout:
    """The state one GPU should be in, and the entry that decided it."""

    mig_enabled: bool
    devices: Mapping[str, int] = field(hash=False)  # canonical profile -> count (> 0); {} when disabled
    entry: str


class SelectionError(Exception):
    """A config cannot be applied to this node as written (names the config, the entry and the GPU)."""


def desired_per_gpu(
    name: str, entries: Sequence[MigEntry], gpus: Sequence[GpuIdentity]
) -> dict[int, SelectedLayout]:
    """The desired MIG state of each GPU that config ``name`` covers, keyed by GPU index.

    mig-parted's walk (shared/reference/mig.md §1.2, §2.2), made loud where it is silent:

    * Entries are taken in file order. An entry matches a GPU when one of its filters matches the GPU's
      PCI ids (no filter: any GPU) and its ``devices`` is ``all`` or lists the GPU's index. A later
      matching entry overrides an earlier one for that GPU.
    * A GPU without MIG: matched through ``devices: all`` it is skipped silently; listed by index with
      ``mig-enabled: false`` it is skipped; listed by index with ``mig-enabled: true`` it is a
      :class:`SelectionError`.
    * An index that no GPU on this node has is a :class:`SelectionError`.
    * An entry whose filters match nothing here is fine (the default config carries entries for other
      products), and so is a config that matches no GPU at all: mig-parted's rule, it changes nothing
      and succeeds (the result is empty). Never silently: callers report :func:`no_gpu_matched`'s
      reason as a warning (the CLI) or in the state's reason annotation (the MIG manager). A config
      that asks for MIG but matches only GPUs without MIG is a :class:`SelectionError`.
    * GPUs that no entry covers are absent from the result: they are left alone.

    Whether each GPU offers the requested profiles is not checked here; the planner does that per GPU.
    """
    by_index = {gpu.index: gpu for gpu in gpus}
    result: dict[int, SelectedLayout] = {}
    wants_mig = False
    for entry in entries:
        if entry.devices != "all":
            missing = [i for i in entry.devices if i not in by_index]
            if missing:
                have = ", ".join(str(i) for i in sorted(by_index)) or "none"
                raise SelectionError(
                    f'config "{name}", {entry.path}: GPU {", ".join(map(str, missing))} does not exist '
                    f"on this node (GPU indices: {have})"
                )
        for gpu in gpus:
            if not entry.matches(gpu):
                continue
            wants_mig = wants_mig or entry.mig_enabled
            if not gpu.mig_capable:
                if entry.devices != "all" and entry.mig_enabled:
                    raise SelectionError(
                        f'config "{name}", {entry.path}: asks for MIG on GPU {gpu.describe()}, '
                        "which does not support MIG"
                    )
                continue
            devices = dict(entry.mig_devices) if entry.mig_enabled else {}
            result[gpu.index] = SelectedLayout(entry.mig_enabled, devices, entry.path)
    if not result and wants_mig:
        present = "; ".join(gpu.describe() for gpu in gpus)
        raise SelectionError(
            f'config "{name}" asks for MIG but matches only GPUs without MIG support: {present}'
        )
    return result


def no_gpu_matched(name: str, entries: Sequence[MigEntry], gpus: Sequence[GpuIdentity]) -> str | None:
    """Why config ``name`` changes nothing on this node when none of its entries matches a GPU here
    (mig-parted then succeeds; this is the warning to show), else None."""
    if any(entry.matches(gpu) for entry in entries for gpu in gpus):
        return None
    filters = sorted({str(f) for entry in entries for f in entry.filters})
    wanted = ", ".join(filters) if filters else "any GPU"
    present = "; ".join(gpu.describe() for gpu in gpus) or "none"
    return (
        f'config "{name}" matches no GPU on this node, so nothing was changed: GPUs are {present}; '
        f"its entries filter for {wanted}"
    )

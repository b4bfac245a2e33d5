"""Step bookkeeping for ``init`` and ``unload``: every step logged and recorded in the status book.

Each step logs ``step_started`` then ``step_done``/``step_skipped``/``step_failed`` with its
``progress`` (``3/10``; ``-`` when the step is not recorded, as the unload inside ``init``) and sets its
state in ``/run/nvidia/gpunode-driver/status.json``. A failure the step did not name itself (a device
node error, an ``OSError``) becomes a :class:`LoaderError` with a readable message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from gpunode.common.logging import Logger
from gpunode.driver_loader import devnodes
from gpunode.driver_loader.ops import DriverInUse
from gpunode.driver_loader.readiness import StatusBook

__all__ = ["LoaderError", "StepOutcome", "skip_rest", "step"]


class LoaderError(Exception):
    """A step failed; the message says what, with the tool's own words, and what to do."""


class StepOutcome:
    """What a step reports: its detail, and whether it was skipped."""

    def __init__(self) -> None:
        self.detail = ""
        self.skipped = False

    def skip(self, detail: str) -> None:
        self.skipped, self.detail = True, detail


@contextlib.asynccontextmanager
async def step(book: StatusBook | None, log: Logger, name: str) -> AsyncIterator[StepOutcome]:
    """Run the body as step ``name``, recorded in ``book`` (None: logged only)."""
    progress = f"{book.index(name) + 1}/{len(book.steps)}" if book else "-"
    if book:
        book.set(name, "running")
    log.info("step_started", step=name, progress=progress)
    outcome = StepOutcome()
    started = time.monotonic()
    try:
        yield outcome
    except (LoaderError, DriverInUse) as exc:
        _failed(book, log, name, progress, str(exc))
        raise
    except (devnodes.NodeError, OSError) as exc:
        message = str(exc) if isinstance(exc, devnodes.NodeError) else f"{type(exc).__name__}: {exc}"
        _failed(book, log, name, progress, message)
        raise LoaderError(message) from exc
    if book:
        book.set(name, "skipped" if outcome.skipped else "done", outcome.detail)
    log.info(
        "step_skipped" if outcome.skipped else "step_done",
        step=name,
        progress=progress,
        detail=outcome.detail,
        duration_ms=round((time.monotonic() - started) * 1000, 1),
    )


def _failed(book: StatusBook | None, log: Logger, name: str, progress: str, message: str) -> None:
    if book:
        book.set(name, "failed", message)
    log.error("step_failed", step=name, progress=progress, error=message)


def skip_rest(book: StatusBook, after: str, detail: str) -> None:
    """Mark every step still pending after ``after`` skipped, with ``detail``."""
    for later in book.steps[book.index(after) + 1 :]:
        if later.state == "pending":
            later.state, later.detail = "skipped", detail
    book.save()

"""The one seam where a caller puts its own scheduler and monitor in place of the live backends:
`with backends(scheduler=..., monitor=...):` makes every `get_scheduler(kind)` and
`get_monitor(kind)` of the block answer from the given providers (a provider takes the kind a tool
asked for and returns the backend that serves it). The agent benchmark replays a recorded scenario
this way (benchmarks/agent_eval/replay.py); the production factories know nothing of what is put
here, and nothing is put here outside such a block.

Process-wide, not per context: a tool may run on a worker thread that does not carry its caller's
context, and while a block is open no live backend may answer in its place. Standard library only."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainops.tools.monitoring.base import Monitor
    from trainops.tools.schedulers.base import Scheduler


@dataclass(frozen=True)
class Backends:
    """The providers a `backends` block put in place; None leaves that concern to the live backends."""

    scheduler: Callable[[str], Scheduler] | None = None
    monitor: Callable[[str], Monitor] | None = None


_STACK: list[Backends] = []


def injected() -> Backends:
    """For each concern, the innermost open block that put a provider for it (none outside every
    block): a nested block that puts only a scheduler leaves the outer block's monitor in place."""
    scheduler = next((b.scheduler for b in reversed(_STACK) if b.scheduler is not None), None)
    monitor = next((b.monitor for b in reversed(_STACK) if b.monitor is not None), None)
    return Backends(scheduler=scheduler, monitor=monitor)


@contextmanager
def backends(scheduler: Callable[[str], Scheduler] | None = None,
             monitor: Callable[[str], Monitor] | None = None) -> Iterator[Backends]:
    """Serve every scheduler and monitor a tool asks for from these providers until the block ends."""
    chosen = Backends(scheduler=scheduler, monitor=monitor)
    _STACK.append(chosen)
    try:
        yield chosen
    finally:
        _STACK.remove(chosen)

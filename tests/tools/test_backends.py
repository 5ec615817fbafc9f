"""A caller brings its own scheduler and monitor through one seam, `trainops.tools.backends.backends`;
the production factories pick the live backends and know nothing of replay (DESIGN.md: replay and
recording enter as injected backends, never as hooks inside the production ones)."""
from __future__ import annotations

from pathlib import Path

import trainops
from trainops.tools.backends import backends
from trainops.tools.monitoring import get_monitor
from trainops.tools.monitoring.embedded import EmbeddedMonitor
from trainops.tools.schedulers import get_scheduler
from trainops.tools.schedulers.local import LocalScheduler

REPO = Path(trainops.__file__).resolve().parents[1]


class Asked:
    """A stand-in backend that remembers the kind it was made for."""

    def __init__(self, kind: str):
        self.kind = kind


def test_inside_a_backends_block_every_kind_is_served_by_the_injected_providers():
    with backends(scheduler=Asked, monitor=Asked):
        scheduler, monitor = get_scheduler("slurm"), get_monitor("prometheus")
    assert isinstance(scheduler, Asked) and scheduler.kind == "slurm"
    assert isinstance(monitor, Asked) and monitor.kind == "prometheus"


def test_after_the_block_the_live_backends_answer_again():
    with backends(scheduler=Asked):
        assert isinstance(get_monitor("embedded"), EmbeddedMonitor)  # a concern not injected stays live
    assert isinstance(get_scheduler("local"), LocalScheduler)


def test_the_innermost_block_wins_and_the_outer_one_returns_after_it():
    with backends(scheduler=lambda kind: Asked("outer")):
        with backends(scheduler=lambda kind: Asked("inner")):
            assert get_scheduler("local").kind == "inner"
        assert get_scheduler("local").kind == "outer"


def test_a_nested_block_that_puts_one_concern_leaves_the_outer_blocks_other_one_in_place():
    with backends(scheduler=lambda kind: Asked("outer"), monitor=lambda kind: Asked("outer monitor")):
        with backends(scheduler=lambda kind: Asked("inner")):
            assert get_scheduler("local").kind == "inner"
            assert get_monitor("embedded").kind == "outer monitor"  # not the live monitor mid-replay


def test_no_product_backend_module_mentions_replay():
    mentions = sorted(str(path.relative_to(REPO)) for folder in ("tools/schedulers", "tools/monitoring")
                      for path in (REPO / folder).rglob("*.py") if "replay" in path.read_text(encoding="utf-8").lower())
    assert mentions == []

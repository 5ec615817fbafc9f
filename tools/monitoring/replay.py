"""The replay monitor: a recorded scenario's metrics and heartbeats (frozen in its workspace) served
with the clock stopped at the moment of recording, so `heartbeat_age_s` and every window answer as
they did live. Whatever kind a tool asks for (embedded or prometheus), the values are the run
folder's, which is what both exported (trainops.tools.schedulers.replay says how replay is chosen)."""
from __future__ import annotations

import time
from pathlib import Path

from trainops.run_records import read_heartbeats
from trainops.tools.monitoring.base import AGGREGATES, HEARTBEAT_AGE, Sample, Series
from trainops.tools.monitoring.embedded import EmbeddedMonitor
from trainops.tools.schedulers.replay import active_replay


class ReplayMonitor(EmbeddedMonitor):
    """EmbeddedMonitor over the frozen run folder, its `now` the snapshot's recorded_at."""
    def __init__(self, home: Path, recorded_at: float, kind: str):
        self.home = home
        self.recorded_at = recorded_at
        self.kind = kind

    def _run_dir(self, run: Path | str) -> Path:
        """A Prometheus-style run label names the run folder of the same id."""
        path = Path(run)
        return path if path.is_absolute() else self.home / "runs" / str(run)

    def _heartbeat_samples(self, run_dir: Path, rank: int | None) -> list[Sample]:
        now = self.recorded_at
        return [Sample(rank=r, time=now, value=now - beat.time, step=beat.step)
                for r, beat in read_heartbeats(run_dir).items() if rank is None or r == rank]

    def series(self, metric: str, run: Path | str, rank: int | None = None, window_s: float = 300.0) -> list[Series]:
        run_dir = self._run_dir(run)
        if metric in AGGREGATES or metric == HEARTBEAT_AGE:
            return super().series(metric, run_dir, rank, window_s)
        # the embedded window starts at time.time() - window_s; widen it by the time since recording
        return super().series(metric, run_dir, rank, window_s + (time.time() - self.recorded_at))

    def instant(self, metric: str, run: Path | str, rank: int | None = None) -> list[Sample]:
        return super().instant(metric, self._run_dir(run), rank)


def replay_monitor(kind: str) -> ReplayMonitor | None:
    """The replay monitor while a replay is active (trainops.tools.schedulers.replay.replaying), else None."""
    replay = active_replay()
    return None if replay is None else ReplayMonitor(replay.home, replay.snapshot.recorded_at, kind)

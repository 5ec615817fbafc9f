"""Metrics straight from the run folder: its `metrics.jsonl` and `heartbeat/rank{R}.json`, read
through trainops.run_records. Needs no service, so every drill can be measured on a laptop. The
caller resolves and confines the run folder (trainops.workspace.run_folder) and passes it in."""
from __future__ import annotations

import math
import time
from pathlib import Path

from trainops.run_records import read_heartbeats, read_metrics
from trainops.tools.monitoring.base import AGGREGATES, HEARTBEAT_AGE, MonitorError, Sample, Series

KIND = "embedded"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float is poison, not a value
        return None


class EmbeddedMonitor:
    kind = KIND

    def now(self) -> float:
        """The instant a heartbeat's age and a series' window are measured from (one clock read per answer)."""
        return time.time()

    def _heartbeat_samples(self, run_dir: Path, rank: int | None) -> list[Sample]:
        now = self.now()
        return [Sample(rank=r, time=now, value=now - beat.time, step=beat.step)
                for r, beat in read_heartbeats(run_dir).items() if rank is None or r == rank]

    def _aggregate(self, name: str, run_dir: Path) -> list[Sample]:
        """A run-level value over the ranks' latest records (the same definition as the PromQL)."""
        base, how = AGGREGATES[name]
        latest = self.instant(base, run_dir)
        if not latest:
            return []
        values = [s.value for s in latest]
        value = {"avg": sum(values) / len(values), "sum": sum(values), "spread": max(values) - min(values)}[how]
        return [Sample(rank=None, time=max(s.time for s in latest), value=value, step=min(s.step or 0 for s in latest))]

    def series(self, metric: str, run_dir: Path, rank: int | None = None, window_s: float = 300.0) -> list[Series]:
        run = run_dir.name
        if metric in AGGREGATES:
            return [Series(metric=metric, run=run, samples=self._aggregate(metric, run_dir))]
        if metric == HEARTBEAT_AGE:
            return [Series(metric=metric, run=run, rank=s.rank, samples=[s]) for s in self._heartbeat_samples(run_dir,
                                                                                                              rank)]
        written = [(rec, rec.written()) for rec in read_metrics(run_dir)]
        if written and not any(metric in fields for _, fields in written):
            known = sorted({name for _, fields in written for name, value in fields.items()
                            if _number(value) is not None})
            raise MonitorError(KIND, f"metric {metric!r} is not in {run_dir / 'metrics.jsonl'}; known metrics: "
                                     f"{', '.join(known)}, {HEARTBEAT_AGE}")
        since = self.now() - window_s
        by_rank: dict[int, list[Sample]] = {}
        for rec, fields in written:
            if fields.get(metric) is None or (rank is not None and rec.rank != rank) or rec.time < since:
                continue
            value = _number(fields[metric])
            by_rank.setdefault(rec.rank, []).append(Sample(rank=rec.rank, time=rec.time, step=rec.step,
                                                           value=math.nan if value is None else value))
        return [Series(metric=metric, run=run, rank=r, samples=s) for r, s in sorted(by_rank.items())]

    def instant(self, metric: str, run_dir: Path, rank: int | None = None) -> list[Sample]:
        if metric == HEARTBEAT_AGE:
            return self._heartbeat_samples(run_dir, rank)
        if metric in AGGREGATES:
            return self._aggregate(metric, run_dir)
        hosts = {r: beat.host for r, beat in read_heartbeats(run_dir).items()}
        return [s.samples[-1].model_copy(update={"node": hosts.get(s.rank)})
                for s in self.series(metric, run_dir, rank, window_s=math.inf) if s.samples]

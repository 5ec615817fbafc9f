"""Metrics straight from the run folder: `metrics.jsonl` and `heartbeat/rank{R}.json`. Needs
no service, so every drill can be measured on a laptop."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from trainops.run_folder import RunFiles
from trainops.tools.monitoring.base import AGGREGATES, HEARTBEAT_AGE, MonitorError, Sample, Series

KIND = "embedded"


def resolve_run(run: str) -> Path:
    """A run id under $TRAINOPS_HOME/runs, or a path to a run folder."""
    from trainops.workspace import runs_dir

    path = Path(run)
    if not path.is_dir():
        path = runs_dir() / run
    if not path.is_dir():
        raise MonitorError(KIND, f"run {run!r} not found (looked for a folder at {run!r} and {path}); pass a run id "
                                 f"from {runs_dir()} or a run folder path")
    return path


def read_records(run_dir: Path, start_offset: int = 0) -> tuple[list[dict], int]:
    """Complete JSON lines of metrics.jsonl from `start_offset`; returns them and the new offset
    (a half-written last line is left for the next read)."""
    path = RunFiles(run_dir).metrics
    if not path.exists():
        return [], start_offset
    with open(path, "rb") as fh:
        fh.seek(start_offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records, start_offset + end


def read_heartbeats(run_dir: Path) -> dict[int, dict]:
    beats: dict[int, dict] = {}
    for path in RunFiles(run_dir).heartbeat_dir.glob("rank*.json"):
        try:
            beats[int(path.stem[4:])] = json.loads(path.read_text())
        except (ValueError, json.JSONDecodeError, OSError):
            continue
    return beats


def _value(record: dict, metric: str) -> float | None:
    value = record.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class EmbeddedMonitor:
    kind = KIND

    def _heartbeat_samples(self, run_dir: Path, rank: int | None) -> list[Sample]:
        now = time.time()
        beats = read_heartbeats(run_dir)
        return [Sample(rank=r, time=now, value=now - float(b["time"]), step=b.get("step"))
                for r, b in sorted(beats.items()) if rank is None or r == rank]

    def _aggregate(self, name: str, run: str) -> list[Sample]:
        """A run-level value over the ranks' latest records (the same definition as the PromQL)."""
        base, how = AGGREGATES[name]
        latest = self.instant(base, run)
        if not latest:
            return []
        values = [s.value for s in latest]
        value = {"avg": sum(values) / len(values), "sum": sum(values), "spread": max(values) - min(values)}[how]
        return [Sample(rank=None, time=max(s.time for s in latest), value=value, step=min(s.step or 0 for s in latest))]

    def series(self, metric: str, run: str, rank: int | None = None, window_s: float = 300.0) -> list[Series]:
        if metric in AGGREGATES:
            return [Series(metric=metric, run=run, samples=self._aggregate(metric, run))]
        run_dir = resolve_run(run)
        if metric == HEARTBEAT_AGE:
            return [Series(metric=metric, run=run, rank=s.rank, samples=[s]) for s in self._heartbeat_samples(run_dir,
                                                                                                              rank)]
        records, _ = read_records(run_dir)
        if records and not any(metric in r for r in records):
            known = sorted({k for r in records for k in r if _value(r, k) is not None})
            raise MonitorError(KIND, f"metric {metric!r} is not in {run_dir / 'metrics.jsonl'}; known metrics: "
                                     f"{', '.join(known)}, {HEARTBEAT_AGE}")
        since = time.time() - window_s
        by_rank: dict[int, list[Sample]] = {}
        for rec in records:
            value = _value(rec, metric)
            if value is None and rec.get(metric) is None:
                continue
            r = int(rec.get("rank", 0))
            t = float(rec.get("time", 0.0))
            if (rank is not None and r != rank) or t < since:
                continue
            by_rank.setdefault(r, []).append(Sample(rank=r, time=t, value=math.nan if value is None else value,
                                                    step=rec.get("step")))
        return [Series(metric=metric, run=run, rank=r, samples=s) for r, s in sorted(by_rank.items())]

    def instant(self, metric: str, run: str, rank: int | None = None) -> list[Sample]:
        if metric == HEARTBEAT_AGE:
            return self._heartbeat_samples(resolve_run(run), rank)
        if metric in AGGREGATES:
            return self._aggregate(metric, run)
        hosts = {r: beat.get("host") for r, beat in read_heartbeats(resolve_run(run)).items()}
        return [s.samples[-1].model_copy(update={"node": hosts.get(s.rank)})
                for s in self.series(metric, run, rank, window_s=math.inf) if s.samples]

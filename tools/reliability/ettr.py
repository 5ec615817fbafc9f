"""Effective training time (ETTR) and reliability measured from the interruption record
(tools/reliability/interruptions.py): per window, productive time over wall time, with the
interruption rate, MTBF and recovery time. The planner's estimate for a job not yet run is
tools/planning/effective_training_time.py."""
from __future__ import annotations

import math
import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainops.tools.base import tool
from trainops.tools.ids import JobId
from trainops.tools.reliability.interruptions import Interruption, cause_distribution, read_interruptions


class EttrWindow(BaseModel):
    start: float
    end: float
    productive_s: float
    wall_s: float
    ettr_pct: float


MIN_WINDOW_S = 0.1
"""A window finer than this measures the record's timestamp rounding, not training."""
MAX_WINDOWS = 10_000
"""A series holds at most the newest this many windows, whatever span the record's times claim."""


def _spans(records: list[Interruption]) -> list[tuple[float, float]]:
    """Each interruption's lost time as an interval ending when training resumed, overlaps merged (a
    second of wall clock is lost once), in time order."""
    intervals = []
    for r in records:
        begin = (r.evidence.last_progress_time or r.time) - r.lost.redo_s
        intervals.append((begin, begin + r.time_lost_s))
    merged: list[tuple[float, float]] = []
    for begin, end in sorted(intervals):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged


def _extent(records: list[Interruption], spans: list[tuple[float, float]], now: float | None) -> tuple[float, float]:
    """From the first recorded job start (or lost span) to `now`, the last span's end or the last record."""
    t0 = min(min(r.started_at or r.submitted_at or r.time for r in records), spans[0][0])
    return t0, max(now or 0.0, max(end for _, end in spans), max(r.time for r in records))


def windows_left_out(window_s: float, records: list[Interruption], now: float | None = None) -> int:
    """How many of the oldest windows a series of `window_s` leaves out (MAX_WINDOWS)."""
    records = [r for r in records if not r.planned]
    if not records:
        return 0
    t0, t1 = _extent(records, _spans(records), now)
    return max(0, math.ceil((t1 - t0) / window_s) - MAX_WINDOWS)


def ettr_series(window_s: float, job: str | None = None, now: float | None = None,
                records: list[Interruption] | None = None) -> list[EttrWindow]:
    """Per window of `window_s` from the first recorded job start: productive time over wall time,
    productive = wall - time lost (detection + isolation + restart + steps redone); the newest
    MAX_WINDOWS windows when the record spans more. `records`: the record as the caller already read it."""
    if not window_s >= MIN_WINDOW_S:  # nan fails this too
        raise ValueError(f"window_s={window_s!r}: a window must be at least {MIN_WINDOW_S:g} s; e.g. 3600 for hourly")
    records = [r for r in (read_interruptions(job) if records is None else records) if not r.planned]
    if not records:
        return []
    spans = _spans(records)
    t0, t1 = _extent(records, spans, now)
    t0 += max(0, math.ceil((t1 - t0) / window_s) - MAX_WINDOWS) * window_s  # whole windows: the newest kept
    count = math.ceil((t1 - t0) / window_s)
    lost = [0.0] * count
    for a, b in spans:  # disjoint spans: each adds to the windows it overlaps only
        for i in range(max(0, int((a - t0) // window_s)), min(count, int((b - t0) // window_s) + 1)):
            start = t0 + i * window_s
            lost[i] += max(0.0, min(b, start + window_s, t1) - max(a, start))
    windows = []
    for i in range(count):
        start, end = t0 + i * window_s, min(t0 + (i + 1) * window_s, t1)
        wall = end - start
        prod = max(0.0, wall - lost[i])
        windows.append(EttrWindow(start=start, end=end, productive_s=round(prod, 3), wall_s=round(wall, 3),
                                  ettr_pct=round(100.0 * prod / wall, 3) if wall > 0 else 100.0))
    return windows


class ReliabilityStats(BaseModel):
    """Interruption rate, MTBF and recovery time measured from the record; the declared (or assumed
    default) MTBF only when the record holds fewer than two unplanned interruptions that were not
    drills, labelled so."""
    interruptions: int
    unplanned: int
    span_h: float
    interruption_rate_per_day: float | None
    mtbf_h: float
    mtbf_source: str
    mtbf_measured: bool = Field(description="The MTBF comes from the record (two or more interruptions that were "
                                            "not drills), not a declared or assumed figure.")
    mtbf_level: MtbfLevel = Field(description="The MTBF's evidence level: measured from the record, declared by "
                                              "the operator (--mtbf-h), or the assumed default.")
    recovery_time_s: float | None = Field(None, description="Median time lost per unplanned interruption.")
    cause_distribution: dict[str, int]


MtbfLevel = Literal["measured", "declared", "assumed default"]
DEFAULT_MTBF_H = 24.0
"""The MTBF assumed while the record is too short to measure one and the operator declared none."""


def mtbf_stand_in(declared_mtbf_h: float | None) -> tuple[float, MtbfLevel, str]:
    """The MTBF used while the record cannot measure one, and what it is: the operator's figure
    (--mtbf-h) is "declared"; without one it is the default, "assumed", never called declared."""
    if declared_mtbf_h is None:
        return DEFAULT_MTBF_H, "assumed default", f"assumed default of {DEFAULT_MTBF_H:g} h, set with --mtbf-h"
    return declared_mtbf_h, "declared", f"declared by the operator (--mtbf-h {declared_mtbf_h:g})"


def reliability(declared_mtbf_h: float | None = None, job: str | None = None,
                records: list[Interruption] | None = None) -> ReliabilityStats:
    records = read_interruptions(job) if records is None else records
    unplanned = [r for r in records if not r.planned]
    # time lost per interruption is the fleet's, not a drill's recovery: drills stay out of it too
    lost = [r.time_lost_s for r in unplanned if not r.drill]
    # an injected fault says how recovery goes, not how often the fleet fails: drills stay out of MTBF and rate
    times = sorted(r.time for r in unplanned if not r.drill)
    drills = sum(1 for r in unplanned if r.drill)
    span = (times[-1] - times[0]) if len(times) > 1 else 0.0
    left_out = f", {drills} drill(s) left out" if drills else ""
    measured = len(times) >= 2 and span > 0
    level: MtbfLevel = "measured"
    if measured:
        mtbf, source = span / (len(times) - 1) / 3600, f"measured from {len(times)} recorded interruptions{left_out}"
    else:
        mtbf, level, basis = mtbf_stand_in(declared_mtbf_h)
        source = f"{basis} (record holds {len(times)} unplanned interruption(s) that were not drills{left_out})"
    return ReliabilityStats(interruptions=len(records), unplanned=len(unplanned), span_h=round(span / 3600, 4),
                            interruption_rate_per_day=round(len(times) / (span / 86400), 3) if span > 0 else None,
                            mtbf_h=mtbf, mtbf_source=source, mtbf_measured=measured, mtbf_level=level,
                            recovery_time_s=statistics.median(lost) if lost else None,
                            cause_distribution=cause_distribution(records, drills_as_injected=True))


class EttrInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    job_id: JobId | None = Field(None, max_length=200, description="Only this job; None: every recorded job.")
    window_s: float = Field(3600.0, ge=MIN_WINDOW_S, le=30 * 86400, description="Width of one window in seconds.")
    declared_mtbf_h: float | None = Field(None, gt=0, le=1e6, description="The operator's MTBF in hours, used only "
                                          "while the record is too short; None: the assumed default, labelled so.")


class EttrOutput(BaseModel):
    windows: list[EttrWindow] = Field(description=f"The newest {MAX_WINDOWS:,} windows at most, oldest first.")
    windows_left_out: int = Field(0, description="Older windows the record's span holds that the series leaves out.")
    reliability: ReliabilityStats


@tool("effective_training_time", risk="read", tags=("jobs", "reliability"))
def effective_training_time(inp: EttrInput) -> EttrOutput:
    """Effective training time per window (productive time over wall time; time lost = detection +
    isolation + restart + steps redone) from the interruption record, with the interruption rate,
    MTBF (measured, or declared when the record is too short, labelled) and recovery time."""
    records = read_interruptions(inp.job_id)
    return EttrOutput(windows=ettr_series(inp.window_s, now=None, records=records),
                      windows_left_out=windows_left_out(inp.window_s, records),
                      reliability=reliability(inp.declared_mtbf_h, records=records))

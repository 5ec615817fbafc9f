"""Numbers a job wrote, bounded by the scheduler's clock before the interruption record uses them.

A run folder is the job's to write: a step time of 1e308 made the time lost infinite (the record did
not validate, so no end was recorded and the restart budget never counted it), and finite but absurd
figures (a year a step, beats from 1970, step 10^12) gave 1e12 s lost. So every figure the record
derives from the run folder is checked against the job's wall clock as the scheduler saw it, from
its start to its end: one outside it is clamped (or, for a step time, not used) and the evidence's
`not_taken` says so, naming the value seen. Time lost then never exceeds the time the job ran.
"""
from __future__ import annotations

import math

from trainops.tools.reliability.evidence import Evidence

MAX_WALL_S = 366 * 86400.0
"""The wall clock assumed when the scheduler gave no start: no job figure claims more than a year."""


def wall_clock(started_at: float | None, ended_at: float) -> tuple[float, float]:
    """The job's (start, end) as its scheduler saw them; without a start (or one after the end), a
    year before the end."""
    if started_at is None or not math.isfinite(started_at) or started_at > ended_at:
        return ended_at - MAX_WALL_S, ended_at
    return started_at, ended_at


def bound_evidence(ev: Evidence, started_at: float | None, ended_at: float) -> float:
    """Clamp the run folder's figures in `ev` to the job's wall clock, noting each in `not_taken`;
    returns the wall clock's length in seconds, the bound on any time lost."""
    start, end = wall_clock(started_at, ended_at)
    wall_s = end - start
    if ev.step_time_s is not None and not 0 <= ev.step_time_s <= wall_s:
        ev.not_taken.append(f"step_time_s={ev.step_time_s:g} (metrics.jsonl's median) is longer than the job's wall "
                            f"clock of {wall_s:.3f} s: not used, no steps redone are counted")
        ev.step_time_s = None
    if ev.last_progress_time is not None and not start <= ev.last_progress_time <= end:
        seen, ev.last_progress_time = ev.last_progress_time, min(max(ev.last_progress_time, start), end)
        ev.not_taken.append(f"last_progress_time={seen:.3f} (metrics and heartbeats) lies outside the job's run "
                            f"({start:.3f} to {end:.3f}): taken as {ev.last_progress_time:.3f}")
    stale = {rank: age for rank, age in ev.heartbeat_age_s.items() if age > wall_s}
    if stale:
        ev.heartbeat_age_s.update(dict.fromkeys(stale, round(wall_s, 3)))
        ev.not_taken.append(f"heartbeat ages {', '.join(f'rank {r}: {a:g} s' for r, a in sorted(stale.items())[:8])} "
                            f"exceed the job's wall clock: taken as {wall_s:.3f} s")
    return wall_s


def bound_redo(ev: Evidence, steps: int, step_time_s: float | None, wall_s: float) -> float:
    """The time to redo `steps` steps at `step_time_s`, at most the job's wall clock (noted when cut)."""
    redo_s = steps * (step_time_s or 0.0)
    if redo_s > wall_s:
        ev.not_taken.append(f"{steps} steps to redo at {step_time_s:g} s ({redo_s:g} s) exceed the job's wall clock: "
                            f"taken as {wall_s:.3f} s")
        return wall_s
    return redo_s

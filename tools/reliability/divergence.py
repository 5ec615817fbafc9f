"""A loss or grad-norm divergence without NaN: what names a silent-data-corruption suspect (R-ESC-3,
K-FM-5) in a run whose numbers stay finite, beside replica checksums and NaN losses (watch_job).

A value diverges when it is, on each of SUSTAINED_STEPS consecutive steps of one rank, both far above
the median of that rank's own window before the first of them (detect_faults' jump test,
`signals.jump`: more than `zscore_threshold` robust sd and `anomaly_min_ratio` times the median; the
defaults 6 sd, 3x, a 16-step window, the first 10 steps never judged) and past the warm-up. Why all
of these: ordinary training noise is a single spike (a bad batch, an Adam step after a quiet
stretch) that clipping and the next steps pull back within a step or two, and early training swings
by 2x; a corrupted weight or optimizer state does not come back, so a value that stays at three
times its rank's own level for three steps is no longer noise. The thresholds are DetectFaultsInput's
bounded fields; SUSTAINED_STEPS is fixed here.

The values are the job's own (metrics.jsonl): only finite ones are judged (a NaN or inf is the NaN
path's), a window whose median is zero or negative has no scale and is not judged, and the history
read is bounded by the watch (signals.FaultWatch keeps each rank's newest records)."""
from __future__ import annotations

import math

from trainops.run_records import MetricsRecord
from trainops.tools.reliability.signals import DetectFaultsInput, jump

SUSTAINED_STEPS = 3
"""Consecutive steps a value must stay diverged: one or two are a spike that recovers."""
FIELDS = ("loss", "grad_norm")


def diverged_at(history: list[MetricsRecord], end: int, inp: DetectFaultsInput) -> tuple[MetricsRecord, str] | None:
    """(the first record of the divergence, why) when `history[end]` (one rank's records, oldest first)
    closes SUSTAINED_STEPS diverged steps, else None."""
    first = end - SUSTAINED_STEPS + 1
    run = history[first:end + 1] if first >= 0 else []
    if len(run) < SUSTAINED_STEPS or any(a.step >= b.step for a, b in zip(run, run[1:], strict=False)):
        return None  # a restart repeats steps: only a run of increasing steps is judged
    if run[0].step <= inp.anomaly_skip_steps:
        return None
    for field in FIELDS:
        values = [getattr(r, field) for r in run]
        if any(v is None or not math.isfinite(v) for v in values):
            continue
        window = [v for h in history[:first] if h.step < run[0].step
                  and (v := getattr(h, field)) is not None and math.isfinite(v)][-inp.anomaly_window_steps:]
        whys = [jump(v, window, inp) for v in values]
        if all(whys):
            return run[0], (f"{field} diverged without NaN on rank {run[0].rank} for {SUSTAINED_STEPS} steps from "
                            f"step {run[0].step}: {field} {whys[0]}, and stayed there through step {run[-1].step}")
    return None


def divergence(by_rank: dict[int, list[MetricsRecord]], new: list[MetricsRecord],
               inp: DetectFaultsInput) -> tuple[MetricsRecord, str] | None:
    """The earliest sustained divergence a newly read record closes (each rank's history as the watch
    keeps it), or None. Judged only at the new records, so each poll costs what was appended."""
    found = []
    for rank, history in by_rank.items():
        fresh = {id(r) for r in new if r.rank == rank}
        for end in (i for i, r in enumerate(history) if id(r) in fresh):
            if (hit := diverged_at(history, end, inp)) is not None:
                found.append(hit)
                break
    return min(found, key=lambda hit: (hit[0].step, hit[0].rank)) if found else None

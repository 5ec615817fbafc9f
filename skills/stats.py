"""Run-to-run statistics shared by the baseline and the ablation: medians, spreads and the
noise band that a gain must beat before anyone calls it a gain."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from skills.evidence.model import MetricSpread, ablation_verdict


def read_records(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def steady_steps(records: list[dict], warmup_steps: int) -> list[dict]:
    """Rank-0 records after the warm-up (allocator, autotuning and first-touch costs)."""
    rank0 = [r for r in records if r.get("rank", 0) == 0]
    if not rank0:
        return []
    first = min(r["step"] for r in rank0)
    steady = [r for r in rank0 if r["step"] >= first + warmup_steps]
    return steady or rank0[-1:]


def run_medians(records: list[dict], warmup_steps: int) -> dict[str, float]:
    """One number per metric for one run: the median over steady steps."""
    steady = steady_steps(records, warmup_steps)
    if not steady:
        raise ValueError("metrics.jsonl: no rank-0 step records; the run produced no metrics (check logs/rank0.log)")
    step_time = sum(r["step_time_s"] for r in steady)
    return {
        "step_time_s": statistics.median(r["step_time_s"] for r in steady),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
        "mfu_pct": statistics.median(r["mfu_pct"] for r in steady),
        "data_wait_share_pct": 100.0 * sum(r.get("data_wait_s", 0.0) for r in steady) / step_time if step_time else 0.0,
    }


def spread(values: list[float]) -> MetricSpread:
    """Median and range over repeats; the range relative to the median is the noise band."""
    if not values:
        raise ValueError("spread: no values (need at least one repeat)")
    mid = statistics.median(values)
    band = 100.0 * (max(values) - min(values)) / abs(mid) if mid else 0.0
    return MetricSpread(median=mid, low=min(values), high=max(values), spread_pct=band)


def noise_band_pct(baseline: MetricSpread, arm: MetricSpread) -> float:
    """The larger run-to-run spread of the two sides; a single-repeat side has none to offer,
    so a floor of 1% keeps one lucky run from counting as a gain."""
    return max(baseline.spread_pct, arm.spread_pct, 1.0)


def change_pct(baseline: float, arm: float) -> float:
    if baseline == 0:
        raise ValueError("change_pct: baseline median is 0; the baseline produced no measurable MFU")
    return 100.0 * (arm - baseline) / baseline


def compare(baseline: MetricSpread, arm: MetricSpread) -> tuple[float, float, str]:
    """(MFU change %, noise band %, verdict) for one arm against the baseline."""
    change = change_pct(baseline.median, arm.median)
    band = noise_band_pct(baseline, arm)
    return change, band, ablation_verdict(change, band)

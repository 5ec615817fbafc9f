"""Run-to-run statistics shared by the baseline and the ablation: medians, spreads and the
noise band that a gain must beat before anyone calls it a gain."""
from __future__ import annotations

import statistics

from trainops.skills.evidence.model import MetricSpread, ablation_verdict


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

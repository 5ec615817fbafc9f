"""Noise-band math and the knob catalogue: what counts as a gain, and which arms are refused."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from trainops.skills.ablation import judge_scale
from trainops.skills.baseline import RepeatResult
from trainops.skills.evidence.model import MetricSpread
from trainops.skills.evidence.pack import decide
from trainops.skills.knobs import CATALOGUE, KnobError, overrides_for, parse_arm, plan_order
from trainops.skills.stats import compare, spread
from trainops.tools.jobs.jobs import RunSummary
from trainops.trainer.config import load_config


def test_spread_is_range_over_median():
    s = spread([9.0, 10.0, 11.0])
    assert (s.median, s.low, s.high, s.spread_pct) == (10.0, 9.0, 11.0, 20.0)


def test_gain_inside_the_noise_band_is_not_a_gain():
    change, band, verdict = compare(spread([9.0, 10.0, 11.0]), spread([10.8, 10.9, 11.0]))
    assert round(change, 1) == 9.0 and band == 20.0 and verdict == "within-noise"


def test_gain_beyond_the_noise_band_is_a_gain():
    change, band, verdict = compare(spread([9.9, 10.0, 10.1]), spread([11.9, 12.0, 12.1]))
    assert round(change, 1) == 20.0 and round(band, 1) == 2.0 and verdict == "gain"


def test_single_repeat_still_needs_to_beat_a_one_percent_floor():
    _, band, verdict = compare(MetricSpread(median=10, low=10, high=10, spread_pct=0),
                               MetricSpread(median=9.95, low=9.95, high=9.95, spread_pct=0))
    assert band == 1.0 and verdict == "within-noise"


def test_regression_beyond_noise_is_reported_as_regression():
    assert compare(spread([10.0, 10.1]), spread([8.0, 8.1]))[2] == "regression"


def test_unknown_knob_is_refused_with_the_known_list():
    with pytest.raises(KnobError, match="unknown knob 'warp_speed'.*data_kind"):
        parse_arm(["warp_speed=9"])


def test_two_knobs_in_one_arm_are_refused():
    with pytest.raises(KnobError, match="exactly one variable, got 2"):
        parse_arm(["data_kind=synthetic", "micro_batch=8"])


def test_value_outside_the_catalogue_is_refused():
    with pytest.raises(KnobError, match="micro_batch='3' is not accepted"):
        parse_arm(["micro_batch=3"])


def test_a_knob_becomes_one_config_override():
    knob, value = parse_arm(["micro_batch=8"])
    assert overrides_for(knob, value) == ["training.micro_batch=8"]


def test_plan_orders_communication_overlap_before_kernels_data_and_batch():
    order = [k.category for k in plan_order([CATALOGUE["micro_batch"], CATALOGUE["data_kind"],
                                             CATALOGUE["compile"], CATALOGUE["reshard_after_forward"]])]
    assert order == ["communication-overlap", "kernels", "data-pipeline", "batch"]


def _runs(mfu: float, tokens_per_s: float, world: int) -> list:
    """One repeat at `world` ranks, its run folder's config at the weak-scaled global batch (4 per rank)."""
    run = Path(tempfile.mkdtemp(prefix="judge-scale-"))
    (run / "config.toml").write_text(load_config(preset="tiny", overrides=[
        f"training.global_batch={4 * world}"]).to_toml())
    summary = RunSummary(run="r", ranks=world, steps_measured=4, step_time_median_s=0.1,
                         step_time_rank_spread_pct=None, tokens_per_s_median=tokens_per_s, mfu_pct_median=mfu,
                         data_wait_share_pct=None, final_loss=None)
    return [RepeatResult(job_id="j", run_dir=str(run), summary=summary, started=0, ended=1, world_size=world)]


def test_small_scale_gain_that_turns_negative_at_target_scale_vanished(factories):
    small = factories.ablation(change=12.0, band=5.0, verdict="gain")
    target = factories.ablation(change=-8.0, band=5.0, verdict="regression").model_copy(update={"scale_kind": "target"})
    row = judge_scale(CATALOGUE["data_kind"], [small, target], {1: _runs(2.0, 1000.0, 1), 2: _runs(1.8, 1800.0, 2)})
    assert row.vanished_at_scale and row.weak_scaling_efficiency_pct == pytest.approx(90.0)


def test_positive_target_change_within_noise_is_unconfirmed_not_vanished(factories):
    small = factories.ablation(change=12.0, band=5.0, verdict="gain")
    target = factories.ablation(change=4.0, band=30.0, verdict="within-noise").model_copy(
        update={"scale_kind": "target"})
    row = judge_scale(CATALOGUE["data_kind"], [small, target], {1: _runs(2.0, 1000.0, 1), 2: _runs(2.1, 2000.0, 2)})
    assert not row.vanished_at_scale
    verdict, blockers = decide(factories.baseline(["r"]), [small, row], [factories.drill()])
    assert verdict == "partial" and "not confirmed beyond the noise band at target scale" in blockers[0]


def test_an_arm_that_was_no_gain_small_and_loses_at_target_is_stopped_not_vanished(factories):
    small = factories.ablation(change=2.0, band=30.0, verdict="within-noise")
    target = factories.ablation(change=-20.0, band=30.0, verdict="within-noise").model_copy(
        update={"scale_kind": "target"})
    row = judge_scale(CATALOGUE["data_kind"], [small, target], {1: _runs(2.0, 1000.0, 1), 2: _runs(1.6, 1600.0, 2)})
    assert not row.vanished_at_scale

"""Planning tools: Daly's worked examples, the ETTR simulator's determinism and direction."""
from __future__ import annotations

import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.planning.checkpoint_interval import daly_waste_fraction
from trainops.tools.planning.effective_training_time import LLAMA3_CAUSE_COUNTS, PROFILES


@pytest.mark.parametrize(
    ("mtbf_h", "expected_min", "tolerance_min"),
    [(24, 117, 1.0), (6, 57, 1.0), (0.25, 9.1, 0.1)],
)
def test_daly_interval_reproduces_dalys_worked_examples(mtbf_h, expected_min, tolerance_min):
    out = call("plan_checkpoint_interval", {"save_s": 300, "restart_s": 600, "mtbf_h": mtbf_h})
    assert out.daly_interval_min == pytest.approx(expected_min, abs=tolerance_min)


def test_young_interval_is_sqrt_2cm():
    out = call("plan_checkpoint_interval", {"save_s": 300, "restart_s": 600, "mtbf_h": 24})
    assert out.young_interval_min == pytest.approx(120.0)


def test_write_time_near_mtbf_escalates_to_two_phase_async():
    near = call("plan_checkpoint_interval", {"save_s": 300, "restart_s": 600, "mtbf_h": 0.25})
    far = call("plan_checkpoint_interval", {"save_s": 300, "restart_s": 600, "mtbf_h": 24})
    assert near.escalation == "two_phase_async" and "async" in near.recommendation
    assert far.escalation == "none"


def test_waste_grows_as_mtbf_shrinks():
    wastes = [
        call("plan_checkpoint_interval", {"save_s": 300, "restart_s": 600, "mtbf_h": m}).expected_waste_fraction
        for m in (24, 6, 0.25)
    ]
    assert 0 < wastes[0] < wastes[1] < wastes[2] < 1


def test_negative_save_time_is_rejected_naming_the_field():
    with pytest.raises(ToolError, match="save_s"):
        call("plan_checkpoint_interval", {"save_s": -1, "restart_s": 600, "mtbf_h": 24})


def test_llama3_profile_carries_the_seed_figures():
    profile = PROFILES["llama3"]
    assert (profile.interruptions, profile.reference_days, profile.reference_gpus) == (419, 54, 16384)
    gpu_related = sum(v for k, v in LLAMA3_CAUSE_COUNTS.items() if k.startswith("gpu_"))
    assert gpu_related / 419 == pytest.approx(0.587, abs=0.001)
    assert LLAMA3_CAUSE_COUNTS["gpu_hbm3"] / 419 == pytest.approx(0.172, abs=0.001)


def test_ettr_is_deterministic_for_a_seed():
    first = call("plan_effective_training_time", {"seed": 7})
    second = call("plan_effective_training_time", {"seed": 7})
    assert first == second


def test_ettr_on_the_llama3_profile_has_about_419_failures_and_is_a_ratio():
    out = call("plan_effective_training_time", {})
    assert 340 < out.failures < 500
    assert 0 < out.ettr < 1
    lost_h = sum(out.lost_h_by_phase.values())
    assert out.productive_h + lost_h == pytest.approx(out.wall_h, rel=1e-6)


def test_more_gpus_means_more_failures_and_lower_ettr():
    small = call("plan_effective_training_time", {"gpus": 4096})
    large = call("plan_effective_training_time", {"gpus": 65536})
    assert large.failures > small.failures
    assert large.ettr < small.ettr


def test_faster_recovery_raises_ettr():
    slow = call("plan_effective_training_time", {"detection_latency_s": 1800, "restart_s": 1800})
    fast = call("plan_effective_training_time", {"detection_latency_s": 10, "restart_s": 120})
    assert fast.ettr > slow.ettr


def test_async_checkpoints_beat_sync_at_the_same_interval():
    base = {"checkpoint_save_s": 120, "checkpoint_interval_min": 10}
    sync = call("plan_effective_training_time", base | {"checkpoint_mode": "sync"})
    asynchronous = call("plan_effective_training_time", base | {"checkpoint_mode": "async"})
    assert asynchronous.ettr > sync.ettr


def test_no_hot_spares_costs_replacement_time_on_hardware_failures():
    spares = call("plan_effective_training_time", {"hot_spares": True})
    none = call("plan_effective_training_time", {"hot_spares": False})
    assert spares.lost_h_by_phase["replacement"] == 0
    assert none.lost_h_by_phase["replacement"] > 0 and none.ettr < spares.ettr


def test_custom_profile_whose_causes_do_not_add_up_is_rejected():
    bad = {"name": "x", "interruptions": 10, "reference_days": 1, "reference_gpus": 8, "cause_counts": {"gpu": 3}}
    with pytest.raises(ToolError, match="cause_counts"):
        call("plan_effective_training_time", {"profile": bad})


def test_async_stall_longer_than_the_save_is_rejected():
    with pytest.raises(ToolError, match="async_stall_s"):
        call("plan_effective_training_time", {"checkpoint_save_s": 10, "async_stall_s": 20})


def test_a_slow_to_detect_cause_costs_more_of_its_own_hours():
    base = call("plan_effective_training_time", {})
    late_sdc = call("plan_effective_training_time", {"detection_latency_s_by_cause": {"gpu_sdc": 6 * 3600}})
    assert late_sdc.lost_h_by_cause["gpu_sdc"] > base.lost_h_by_cause["gpu_sdc"] + 5
    sdc, others = late_sdc.failures_by_cause["gpu_sdc"], late_sdc.failures - late_sdc.failures_by_cause["gpu_sdc"]
    assert late_sdc.lost_h_by_phase["detection"] == pytest.approx(sdc * 6 + others * 120 / 3600, rel=0.02)


def test_a_detection_override_for_an_unknown_cause_is_rejected_with_the_known_ones():
    with pytest.raises(ToolError, match=r"unknown cause\(s\) \['cosmic_rays'\].*gpu_sdc"):
        call("plan_effective_training_time", {"detection_latency_s_by_cause": {"cosmic_rays": 10}})


def test_the_simulator_agrees_with_dalys_closed_form_for_sync_checkpoints():
    """Daly's expected waste, with detection + restart as the restart cost, over a simulated year."""
    inp = {"checkpoint_mode": "sync", "days": 365, "detection_latency_s": 120, "restart_s": 600,
           "checkpoint_save_s": 60}
    out = call("plan_effective_training_time", inp)
    closed_form = 1 - daly_waste_fraction(out.checkpoint_interval_min * 60, 60, 720, out.job_mtbf_h * 3600)
    assert out.ettr == pytest.approx(closed_form, abs=0.01)

"""The planner and R-ESC-4 draw the line for "checkpoint too slow" in one place: a 600 s save at
a 24 h MTBF costs ~11.8% of wall time, which the old planner (save/MTBF >= 5%) called "none"."""
from trainops.tools.calls import call
from trainops.tools.governance.escalation import EscalationSignals, required_escalations


def _plan(save_s: float, mtbf_h: float):
    return call("plan_checkpoint_interval", {"save_s": save_s, "restart_s": 60, "mtbf_h": mtbf_h})


def test_a_slow_save_is_two_phase_for_the_planner_and_the_escalation_alike():
    plan = _plan(600, 24)
    assert plan.escalation == "two_phase_async"
    assert "R-ESC-4" in required_escalations(EscalationSignals(checkpoint_save_s=600, mtbf_s=24 * 3600))


def test_a_fast_save_is_fine_for_both():
    plan = _plan(5, 24)
    assert plan.escalation == "none"
    assert "R-ESC-4" not in required_escalations(EscalationSignals(checkpoint_save_s=5, mtbf_s=24 * 3600))


def test_they_agree_across_the_range():
    for save_s in (1, 30, 120, 300, 431, 433, 600, 1800):
        fired = "R-ESC-4" in required_escalations(EscalationSignals(checkpoint_save_s=save_s, mtbf_s=24 * 3600))
        assert (_plan(save_s, 24).escalation == "two_phase_async") == fired, save_s

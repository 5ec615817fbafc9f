"""Report text checks (R-OUT-*) and escalation triggers (R-ESC-*)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainops.tools.governance.claims import ScaleResult
from trainops.tools.governance.escalation import Escalation, EscalationReport, EscalationSignals, required_escalations
from trainops.tools.governance.text import check_text, validate_report_text

GOOD_REPORT = """# Verdict: partial — blockers: recovery time 212 s exceeds the 120 s target

| knob | MFU change | scale |
|---|---|---|
| activation checkpointing selective | +3.1% | 2~8 GPUs |

Model: llama3-8b (8B parameters). Dense-model MFU is typically 40~55% (experiential range, not an official benchmark).
"""


def _rules(violations):
    return sorted({v.rule_id for v in violations})


@pytest.mark.rule("R-OUT-1", case="compliant")
@pytest.mark.rule("R-OUT-2", case="compliant")
@pytest.mark.rule("R-OUT-3", case="compliant")
def test_clean_report_has_no_violations():
    assert validate_report_text(GOOD_REPORT) == []


@pytest.mark.rule("R-OUT-1", case="violation")
@pytest.mark.parametrize("first", ["# Ablation report", "Verdict: fail", "Verdict: partial — see below", ""])
def test_report_not_opening_with_a_verdict_and_blockers_is_flagged(first):
    violations = validate_report_text(first + "\n\nbody\n")
    assert _rules(violations) == ["R-OUT-1"]
    assert violations[0].line in (1, 3)


def test_pass_verdict_needs_no_blockers():
    assert validate_report_text("**Verdict: pass**\n") == []


@pytest.mark.rule("R-OUT-2", case="violation")
@pytest.mark.parametrize("text", ["recovery time: TBD", "TODO: add plot", "owner: XXX", "Lorem ipsum dolor",
                                  "| MFU | N/A |", "hardware: <gpu model>", "detection latency ??? s",
                                  "run {{ run_id }}", "rollback: <...>"])
def test_placeholder_text_is_flagged_with_its_line(text):
    violations = check_text("fine line\n" + text)
    assert _rules(violations) == ["R-OUT-2"]
    assert violations[0].line == 2


def test_html_tags_are_not_placeholders():
    assert check_text("<details><summary>logs</summary></details> <br>") == []


@pytest.mark.rule("R-OUT-3", case="violation")
@pytest.mark.parametrize("text, fragment", [
    ("MFU rose to 41.2 %", "41.2 %"),
    ("typical MFU 40-55% (empirical range, not an official benchmark)", "40-55%"),
    ("from 8 to 16 GPUs", "8 to 16 GPUs"),
    ("a 70 billion parameter model", "70 billion param"),
    ("8000000000 parameters", "8000000000 parameters"),
    ("the 70 B model", "70 B model"),
])
def test_badly_written_numbers_are_flagged(text, fragment):
    violations = check_text(text)
    assert _rules(violations) == ["R-OUT-3"]
    assert fragment in violations[0].excerpt


def test_dates_model_names_and_code_blocks_are_not_number_violations():
    assert check_text("on 2026-09-12 llama3-8b ran step-00000010\n```\nseq 1-2 %\n```\n") == []


def _gain_vanished():
    return ScaleResult(knob="parallel.tp", small_world_size=2, small_gain_pct=3.0, target_world_size=8,
                       target_gain_pct=-0.5, weak_scaling_efficiency_pct=88.0, rollout="stop")


CAUSES = {"hardware": 5, "network": 2, "software": 1, "data": 0}
TRIGGERS = {
    "R-ESC-1": (dict(ettr_history_pct=[95.0, 93.0, 90.5]),
                Escalation(rule_id="R-ESC-1", action="escalate_interruption_causes", detail="ETTR 95->90.5%",
                           cause_distribution=CAUSES)),
    "R-ESC-2": (dict(scale_results=[_gain_vanished()]),
                Escalation(rule_id="R-ESC-2", action="stop_rollout_and_roll_back", detail="tp=2 gain gone at 8")),
    "R-ESC-3": (dict(sdc_suspected=True),
                Escalation(rule_id="R-ESC-3", action="fleet_and_colocated_sdc_tests", detail="loss spike rank 3")),
    "R-ESC-4": (dict(checkpoint_save_s=300.0, mtbf_s=3 * 3600.0),
                Escalation(rule_id="R-ESC-4", action="two_phase_async_checkpoint", detail="save 300 s, MTBF 3 h")),
}


def test_each_trigger_fires_alone_and_quiet_signals_fire_none():
    for rule_id, (signals, _) in TRIGGERS.items():
        assert required_escalations(EscalationSignals(**signals)) == [rule_id]
    quiet = EscalationSignals(ettr_history_pct=[90, 92, 91], checkpoint_save_s=5.0, mtbf_s=3 * 3600.0)
    assert required_escalations(quiet) == []


@pytest.mark.rule("R-ESC-1", case="violation")
@pytest.mark.rule("R-ESC-2", case="violation")
@pytest.mark.rule("R-ESC-3", case="violation")
@pytest.mark.rule("R-ESC-4", case="violation")
@pytest.mark.parametrize("rule_id", sorted(TRIGGERS))
def test_report_that_does_not_escalate_a_fired_trigger_is_refused(rule_id):
    signals, _ = TRIGGERS[rule_id]
    with pytest.raises(ValidationError, match=rf"{rule_id}: escalations=\[\] miss a fired trigger"):
        EscalationReport(signals=EscalationSignals(**signals), escalations=[])


@pytest.mark.rule("R-ESC-1", case="compliant")
@pytest.mark.rule("R-ESC-2", case="compliant")
@pytest.mark.rule("R-ESC-3", case="compliant")
@pytest.mark.rule("R-ESC-4", case="compliant")
@pytest.mark.parametrize("rule_id", sorted(TRIGGERS))
def test_report_escalating_a_fired_trigger_with_its_action_is_accepted(rule_id):
    signals, escalation = TRIGGERS[rule_id]
    report = EscalationReport(signals=EscalationSignals(**signals), escalations=[escalation])
    assert report.escalations[0].rule_id == rule_id


def test_ettr_escalation_without_the_four_cause_classes_is_refused():
    signals, escalation = TRIGGERS["R-ESC-1"]
    partial = escalation.model_copy(update={"cause_distribution": {"hardware": 5}})
    with pytest.raises(ValidationError, match="R-ESC-1: cause_distribution=.* must count interruptions"):
        EscalationReport(signals=EscalationSignals(**signals), escalations=[partial])

"""The pack lists each SOP step's call and who chose what (issue 40 item 3), from the session checked
against the audit log: a step is believed only as far as the audit log holds its call, and a session
edited or bound by hand cannot add a step, an arm or a drill that reads as audited."""
from __future__ import annotations

import json

import pytest

from trainops.skills.evidence import pack as evidence_pack
from trainops.skills.evidence.steps import PackStep
from trainops.skills.sop_pack import SopPackInput, sop_pack
from trainops.skills.sop_session import SESSION_KIND, ArmRung, SopSettings, StepLog, load, sessions_dir
from trainops.skills.sop_steps import SopDesignInput, design_arms, sop_design
from trainops.skills.sop_trail import choices
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext
from trainops.tools.governance import audit
from trainops.tools.governance.gate import GateRefused
from trainops.tools.governance.written import write_bound
from trainops.workspace import packs_dir, runs_dir

from .test_sop_steps import declared, recorded_runs

OPERATOR = CallContext(actor="operator")
PLANNER = "skill:training-efficiency-ablation-and-fault-sop for operator"


def measured(factories):
    """A session with S1 written by hand (no audited call) and S2's figures; S3 then runs for real."""
    runs = recorded_runs(factories, "base", count=3)
    return declared(factories, baselines={2: runs}, summary=factories.baseline([r.run_dir for r in runs]))


def audited_call(tool: str) -> tuple[dict, dict]:
    """The intent and outcome entries of the one call of `tool` in the audit log."""
    entries = audit.read()
    intent = next(e for e in entries if e.get("kind") == "intent" and e.get("tool") == tool)
    outcome = next((e for e in entries if e.get("kind") == "tool_call" and e.get("intent") == intent["hash"]), None)
    return intent, outcome


def test_the_pack_lists_each_step_with_its_audit_line_and_flags_one_recorded_outside_the_gate(workspace, factories):
    session = measured(factories)
    invoke(sop_design, SopDesignInput(session=session.session_id), OPERATOR)
    result = invoke(sop_pack, SopPackInput(session=session.session_id), OPERATOR)
    pack = evidence_pack.load(packs_dir() / result.pack_id)
    s1, s3, s6 = pack.sop_steps
    assert (s1.step, s1.audited, s1.audit_seq, s1.called_by) == ("S1", False, None, "")
    assert "recorded outside the gate" in s1.note
    design_intent, design_outcome = audited_call("sop_design")
    assert (s3.step, s3.tool, s3.audited, s3.called_by) == ("S3", "sop_design", True, "operator")
    assert (s3.audit_seq, s3.audit_hash, s3.outcome_seq) == (design_intent["seq"], design_intent["hash"],
                                                             design_outcome["seq"])
    pack_intent, pack_outcome = audited_call("sop_pack")
    assert (s6.step, s6.audited, s6.audit_seq, s6.outcome_seq) == ("S6", True, pack_intent["seq"], None)
    assert "outcome entry is written after the pack" in s6.note and pack_outcome["seq"] > pack_intent["seq"]
    assert any(b.startswith("step S1 (sop_declare) is not in the audit log") for b in pack.blockers)
    report = (packs_dir() / result.pack_id / "report.md").read_text()
    assert "SOP trail" in report and "NOT AUDITED" in report and f"| {design_intent['seq']} |" in report
    assert [(c.kind, c.chosen_by, c.order) for c in pack.choices][:1] == [("arm", "human", None)]
    assert pack.choices[1].reason.endswith("not run (the quick SOP runs the first-ranked arm only)")
    assert evidence_pack.derivation_problems(pack, packs_dir() / result.pack_id) == []  # R-APR-1 re-derives it


def test_a_session_edited_on_disk_is_refused_and_one_rebound_by_hand_cannot_borrow_a_call(workspace, factories):
    """Edited bytes: the pack refuses the session. Edited and bound again (what anything that can append to
    the log could do): the forged S4 names S3's real call, and the pack lists it as not audited."""
    session = measured(factories)
    invoke(sop_design, SopDesignInput(session=session.session_id), OPERATOR)
    path = sessions_dir() / f"{session.session_id}.json"
    real = load(session.session_id)
    borrowed = real.steps[-1].call
    arm = ArmRung(arm=real.design[0].arm, world=1, row=factories.ablation(), runs=recorded_runs(factories, "arm"),
                  evidence=[], stopped=False)
    forged = real.model_copy(update={"arms": [arm], "steps": [*real.steps, StepLog(
        step="S4", tool="sop_arm", at=real.steps[-1].at + 1, result="a gain I typed", by="operator", call=borrowed)]})
    path.write_text(forged.model_dump_json(indent=1))
    with pytest.raises((GateRefused, ToolError), match="edited after trainops wrote it"):
        invoke(sop_pack, SopPackInput(session=session.session_id), OPERATOR)
    write_bound(path, SESSION_KIND, session.session_id, path.read_bytes(), step="S4", call=borrowed)
    result = invoke(sop_pack, SopPackInput(session=session.session_id), OPERATOR)
    pack = evidence_pack.load(packs_dir() / result.pack_id)
    s4 = next(s for s in pack.sop_steps if s.step == "S4")
    assert not s4.audited and "is a call of sop_design, not sop_arm" in s4.note and "out of order" in s4.note
    assert any(b.startswith("step S4 (sop_arm) is not in the audit log") for b in pack.blockers)


def step_row(step: str, tool: str, caller: str, seq: int) -> PackStep:
    return PackStep(step=step, tool=tool, at=1.0, result="", called_by=caller, audit_seq=seq, audit_hash="h",
                    outcome_seq=seq + 2, audited=True)


def test_each_arm_drill_and_stop_names_who_chose_it_and_why(workspace, factories):
    """The planner walked S3 and S5; the agent picked the second-ranked arm itself; its ladder stopped at
    the first rung; the first-ranked arm never ran; an arm rung with no call of its own is unrecorded."""
    summary = factories.baseline(["runs/base-1"])
    design = design_arms(SopSettings(quick=True), summary)
    second = design[1].arm
    rung = ArmRung(arm=second, world=1, row=factories.ablation(verdict="within-noise", change=1.0), runs=[],
                   evidence=[], stopped=True)
    session = declared(factories, summary=summary, design=design, arms=[rung, rung], drilled=["crash"])
    rows = [step_row("S1", "sop_declare", PLANNER, 1), step_row("S3", "sop_design", PLANNER, 10),
            step_row("S4", "sop_arm", "agent", 20), step_row("S5", "sop_drill", PLANNER, 30)]
    listed = choices(session, rows)
    made = {(c.kind, c.subject, c.order): c for c in listed}
    picked = made["arm", second, 1]
    assert (picked.chosen_by, picked.caller, picked.audit_seq) == ("model", "agent", 20)
    assert picked.reason.startswith("agent called sop_arm with it, giving no reason; S3 ranked it 2 of")
    skipped = made["arm", design[0].arm, None]
    assert skipped.chosen_by == "planner" and skipped.reason.endswith("not run (no sop_arm call ran it)")
    assert design[0].reason in skipped.reason
    drill = made["drill", "crash", 1]
    assert (drill.chosen_by, drill.audit_seq) == ("planner", 30) and "default drill set" in drill.reason
    stops = [c for c in listed if c.kind == "stop"]
    assert [(s.chosen_by, s.caller) for s in stops] == [("planner", "agent"), ("unrecorded", "")]
    assert stops[0].reason.startswith("no gain at the first rung")
    assert json.loads(stops[0].model_dump_json())["audit_seq"] == 20 and stops[1].audit_seq is None


def test_step_and_choice_text_is_inert_in_both_reports(workspace, factories):
    """A step's result and a choice's reason come from the session: in the trail tables they cannot add a
    heading, a link, emphasis or a table cell, in the Markdown or the HTML."""
    forged = "fine\n\n# Verdict: PASS\n[approved](http://evil.example) *all* | cell"
    run = factories.write_run(runs_dir() / "base-1")
    step = step_row("S3", "sop_design", "operator", 3).model_copy(update={"result": forged})
    made = choices(declared(factories, drilled=["crash"]), [step_row("S5", "sop_drill", "agent", 4)])
    made = [made[0].model_copy(update={"reason": forged})]
    pack = evidence_pack.assemble("pack-trail", factories.environment(), factories.baseline([str(run)]), [], [], [],
                                  sop_steps=[step], choices=made)
    folder = evidence_pack.write(pack)
    markdown, html = ((folder / name).read_text() for name in ("report.md", "report.html"))
    assert not any(line.startswith("# Verdict") for line in markdown.splitlines())
    assert markdown.count("\\[approved](http://evil.example) \\*all\\* \\| cell") == 2
    assert "<h1>Verdict" not in html and 'href="http://evil.example"' not in html and "<em>all</em>" not in html
    assert html.count("[approved](http://evil.example) *all* | cell") == 2

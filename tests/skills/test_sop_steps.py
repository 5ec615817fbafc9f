"""The SOP's steps as tools, its order as rules (issue 40 items 1-2): every refusal goes through the
real command path, `trainops tool call NAME --input JSON`, as the operator; each names the rule and
the step to run first. The SOP session is a trainops-written record bound to the audit chain."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.agents.agent_tools import agent_registry
from trainops.cli import app
from trainops.skills.baseline import RepeatResult
from trainops.skills.evidence.model import EvidenceRow
from trainops.skills.sop import next_step
from trainops.skills.sop_pack import sop_pack
from trainops.skills.sop_session import SESSION_KIND, ArmRung, SopSettings, load, save, sessions_dir, start
from trainops.skills.sop_steps import design_arms, sop_baseline, sop_drill
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import audit
from trainops.tools.governance.gate import GateRefused
from trainops.tools.governance.queue import pending_calls
from trainops.tools.jobs.jobs import RunSummary
from trainops.workspace import audit_log_path, runs_dir


def tool_call(name: str, payload: dict):
    return CliRunner().invoke(app, ["tool", "call", name, "--input", json.dumps(payload), "--json"])


def refused(name: str, payload: dict, rule: str) -> str:
    """The call's refusal (exit 2), which names `rule`; the gate audited it before anything ran."""
    result = tool_call(name, payload)
    assert result.exit_code == 2, result.output
    assert f"refused (invalid_input, {rule})" in result.output, result.output
    entry = [e for e in audit.read() if e.get("kind") == "gate" and e.get("tool") == name][-1]
    assert entry["decision"] == "refused" and entry["rule_id"] == rule
    assert not [e for e in audit.read() if e.get("kind") == "intent" and e.get("tool") == name]
    return " ".join(result.output.split())


def declared(factories, **update):
    """A session whose S1 ran (written through the session module, as sop_declare writes it)."""
    return save(start(SopSettings(quick=True)).model_copy(update={
        "environment": factories.environment(), "framework_version": "trainops 0.1.0, torch 2.13.0",
        "environment_row": EvidenceRow(tool="declare_environment", version="0.1.0", command="trainops env --json",
                                       log_path=str(audit_log_path()), value="cpu", window_start=1.0,
                                       window_end=2.0), **update})
        .logged("S1", "sop_declare", "declared"))


def recorded_runs(factories, name: str, count: int = 2) -> list[RepeatResult]:
    """Baseline repeats as S2 records them, over run folders shaped like the trainer's."""
    out = []
    for i in range(count):
        run = factories.write_run(runs_dir() / f"{name}-{i + 1}")
        summary = RunSummary(run=str(run), ranks=2, steps_measured=4, step_time_median_s=0.1,
                             step_time_rank_spread_pct=1.0, tokens_per_s_median=1000.0, mfu_pct_median=2.0,
                             data_wait_share_pct=10.0, final_loss=4.4)
        out.append(RepeatResult(job_id=f"{name}-{i}", run_dir=str(run), summary=summary, started=1.0, ended=2.0,
                                world_size=2))
    return out


def test_no_baseline_and_no_arm_before_s1_declare(workspace):
    text = refused("sop_baseline", {"session": "sop-never-declared"}, "R-ENV-1")
    assert "no SOP session 'sop-never-declared'" in text and "start one with sop_declare (S1)" in text
    assert "sop_declare" in refused("sop_arm", {"session": "sop-never-declared", "arm": "data_kind=synthetic"},
                                    "R-ENV-1")


def test_two_knobs_in_one_arm_are_refused_before_anything_else(workspace):
    text = refused("sop_arm", {"session": "any", "arm": "data_kind=synthetic,micro_batch=4"}, "R-ABL-1")
    assert "exactly one variable, got 2 (data_kind=synthetic, micro_batch=4)" in text


def test_after_a_real_s1_an_arm_needs_its_rungs_baseline_and_the_small_rung_first(workspace):
    """sop_declare for real through the CLI, then the two order rules of S4 on the session it wrote."""
    result = tool_call("sop_declare", {"quick": True})
    assert result.exit_code == 0, result.output
    session = json.loads(result.output)["session_id"]
    assert [(s.step, s.by) for s in load(session).steps] == [("S1", "operator")]
    text = refused("sop_arm", {"session": session, "arm": "data_kind=synthetic"}, "R-ABL-1")
    assert "no baseline at 1 process" in text and "run sop_baseline with world=1 first" in text
    text = refused("sop_arm", {"session": session, "arm": "data_kind=synthetic", "world": 2}, "R-ABL-2")
    assert "before its smaller rung: run sop_arm with arm=data_kind=synthetic world=1 (1 process) first" in text


def test_the_target_rung_waits_for_a_small_rung_that_gained_and_stops_after_one_that_did_not(workspace, factories):
    small = ArmRung(arm="data_kind=synthetic", world=1, row=factories.ablation(verdict="within-noise", change=1.0),
                    runs=recorded_runs(factories, "arm"), evidence=[], stopped=True)
    session = declared(factories, arms=[small], baselines={1: recorded_runs(factories, "b1"),
                                                           2: recorded_runs(factories, "b2")})
    text = refused("sop_arm", {"session": session.session_id, "arm": "data_kind=synthetic", "world": 2}, "R-ABL-2")
    assert "stopped at 1 process (within-noise): its ladder ends there" in text
    text = refused("sop_arm", {"session": session.session_id, "arm": "data_kind=synthetic", "world": 1}, "R-ABL-2")
    assert "already ran at 1 process" in text


def test_the_session_is_bound_to_the_audit_chain_and_an_edited_or_hand_made_one_is_refused(workspace, factories):
    session = declared(factories)
    path = sessions_dir() / f"{session.session_id}.json"
    written = [e for e in audit.read() if e.get("kind") == SESSION_KIND][-1]
    assert written["record"] == session.session_id
    assert written["content_hash"] == audit.sha256_hex(path.read_bytes())
    path.write_text(path.read_text().replace('"device_count": 2', '"device_count": 512'))
    assert "was edited after trainops wrote it" in refused("sop_baseline", {"session": session.session_id}, "R-ENV-1")
    (sessions_dir() / "sop-typed-by-hand.json").write_text(path.read_text().replace(session.session_id,
                                                                                    "sop-typed-by-hand"))
    assert "made or copied in by hand" in refused("sop_pack", {"session": "sop-typed-by-hand"}, "R-ENV-1")


def test_the_pack_is_built_from_the_session_alone_and_without_drills_is_partial_naming_s5(workspace, factories):
    runs = recorded_runs(factories, "base", count=3)
    session = declared(factories, baselines={2: runs}, summary=factories.baseline([r.run_dir for r in runs]))
    typed = tool_call("sop_pack", {"session": session.session_id, "summary": {"mfu_pct": 99.0}})
    assert typed.exit_code == 2 and "summary: Extra inputs are not permitted" in typed.output
    result = tool_call("sop_pack", {"session": session.session_id})
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["verdict"] == "partial" and "no fault drill run (S5)" in out["blockers"]
    assert out["headline"]["mfu_pct"] == 2.0 and out["session_id"] == session.session_id
    assert [s.step for s in load(session.session_id).steps] == ["S1", "S6"]
    assert load(session.session_id).pack == out["pack_id"]


def test_s3_designs_from_the_sessions_own_baseline_and_records_it(workspace, factories):
    bare = declared(factories)
    result = tool_call("sop_design", {"session": bare.session_id})
    assert result.exit_code == 2 and "run sop_baseline first" in result.output
    runs = recorded_runs(factories, "base", count=3)
    summary = factories.baseline([r.run_dir for r in runs]).model_copy(update={"exposed_comm_share_pct": 31.0,
                                                                              "data_wait_share_pct": 2.0})
    session = declared(factories, baselines={2: runs}, summary=summary)
    result = tool_call("sop_design", {"session": session.session_id})
    assert result.exit_code == 0, result.output
    arms = json.loads(result.output)["arms"]
    assert arms[0]["arm"] == "data_parallel=ddp" and "exposed communication 31.0%" in arms[0]["figure"]["text"]
    recorded = load(session.session_id)
    assert [a.arm for a in recorded.design] == [a["arm"] for a in arms]
    assert [s.step for s in recorded.steps] == ["S1", "S3"]


def test_an_agents_step_out_of_order_is_a_tool_error_before_any_approval_is_asked(workspace, factories):
    """sop_arm is a mutate tool, so an agent's call waits for a human; one that breaks the order is
    refused first, as an error the model reads, and nothing is queued for a human to sign."""
    session = declared(factories)
    for arm, rule in (("data_kind=synthetic,micro_batch=4", "R-ABL-1"), ("data_kind=synthetic", "R-ABL-1")):
        with pytest.raises(GateRefused) as refusal:
            call("sop_arm", {"session": session.session_id, "arm": arm}, CallContext(actor="agent"),
                 registry=agent_registry())
        assert refusal.value.rule_id == rule and refusal.value.pending_id is None
    assert "run sop_baseline with world=1 first" in str(refusal.value)
    assert not pending_calls()


def stopped_after_s4(factories):
    """A session as `trainops sop --quick` leaves it when killed after S4: declared, baseline, design,
    and the first-ranked arm's ladder ended at its small rung."""
    runs = recorded_runs(factories, "base", count=3)
    summary = factories.baseline([r.run_dir for r in runs])
    design = design_arms(SopSettings(quick=True), summary)
    arm = ArmRung(arm=design[0].arm, world=1, row=factories.ablation(verdict="within-noise", change=1.0),
                  runs=recorded_runs(factories, "arm"), evidence=[], stopped=True)
    return declared(factories, baselines={2: runs, 1: recorded_runs(factories, "b1")}, summary=summary,
                    design=design, arms=[arm])


def test_the_offline_plan_reads_the_next_step_from_the_session(workspace, factories):
    session = stopped_after_s4(factories)
    step, inp = next_step(session)
    assert step is sop_drill and inp.fault == "crash"
    drilled = save(session.model_copy(update={"drilled": ["crash"]}))
    assert next_step(drilled)[0] is sop_pack
    assert next_step(drilled.model_copy(update={"pack": "sop-1"})) is None
    fresh = declared(factories)
    assert next_step(fresh)[0] is sop_baseline


@pytest.mark.slow
def test_an_sop_killed_after_s4_resumes_at_s5_without_rerunning_a_step(workspace, factories):
    """`trainops sop --resume ID` on a session stopped after S4: one drill (real, ~40 s) and the pack;
    no declaration, baseline, design or arm runs again, and the pack holds the recorded arm."""
    session = stopped_after_s4(factories)
    result = CliRunner().invoke(app, ["sop", "--resume", session.session_id, "--json"])
    assert result.exit_code == 0, result.output
    calls = [e["tool"] for e in audit.read() if e.get("kind") == "tool_call" and e["tool"].startswith("sop_")]
    assert calls == ["sop_drill", "sop_pack"]
    resumed = load(session.session_id)
    assert [s.step for s in resumed.steps] == ["S1", "S5", "S6"] and resumed.drilled == ["crash"]
    assert json.loads(result.output)["pack_id"] == resumed.pack
    report = (Path(json.loads(result.output)["pack_dir"]) / "report.md").read_text()
    assert "not on record" in report  # the arm of a step run before the gate recorded calls: no chooser shown


@pytest.mark.slow
def test_trainops_sop_quick_walks_the_step_tools_in_order_on_one_session(quick_sop):
    """The real `trainops sop --quick`: its audit log holds each step as its own call, S1 to S6 in
    order, and its session records every step with the pack it ended on."""
    home = Path(quick_sop["home"])
    entries = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    calls = [e["tool"] for e in entries if e.get("kind") == "tool_call" and e.get("tool", "").startswith("sop_")]
    order = ["sop_declare", "sop_baseline", "sop_design", "sop_arm", "sop_drill", "sop_pack"]
    assert [tool for i, tool in enumerate(calls) if tool not in calls[:i]] == order
    assert calls.index("sop_pack") == len(calls) - 1
    session = json.loads((home / "sop-sessions" / f"{quick_sop['session_id']}.json").read_text())
    assert [s["step"] for s in session["steps"]][0] == "S1" and session["steps"][-1]["step"] == "S6"
    assert {"S2", "S3", "S4", "S5"} <= {s["step"] for s in session["steps"]}
    assert session["pack"] == quick_sop["pack_id"] and session["design"][0]["arm"] == session["arms"][0]["arm"]
    assert {s["by"] for s in session["steps"]} == {"skill:training-efficiency-ablation-and-fault-sop for operator"}


@pytest.mark.slow
def test_trainops_sop_quick_pack_lists_each_step_call_and_who_chose_each_arm_and_drill(quick_sop):
    """Issue 40 item 3 on the real `trainops sop --quick`: the audit log holds S1..S6 as separate step
    calls in order; the pack lists each with the audit line of its call (S6's outcome comes after the
    pack), and names who chose each arm and drill (the offline planner) and the reason given."""
    home, planner = Path(quick_sop["home"]), "skill:training-efficiency-ablation-and-fault-sop for operator"
    entries = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    intents = [e for e in entries if e.get("kind") == "intent" and e.get("tool", "").startswith("sop_")]
    step_of = {"sop_declare": "S1", "sop_baseline": "S2", "sop_design": "S3", "sop_arm": "S4", "sop_drill": "S5",
               "sop_pack": "S6"}
    in_log = [step_of[e["tool"]] for e in intents]
    assert [step for i, step in enumerate(in_log) if step not in in_log[:i]] == ["S1", "S2", "S3", "S4", "S5", "S6"]
    assert in_log.count("S1") == in_log.count("S6") == 1 and in_log[-2:] == ["S5", "S6"]
    pack = json.loads((home / "packs" / quick_sop["pack_id"] / "evidence.json").read_text())
    steps = pack["sop_steps"]
    assert [s["step"] for s in steps] == in_log and all(s["audited"] for s in steps), steps
    assert [s["audit_hash"] for s in steps] == [e["hash"] for e in intents]
    assert [s["audit_seq"] for s in steps] == [e["seq"] for e in intents]
    assert {s["called_by"] for s in steps} == {planner}
    outcomes = {e["intent"]: e["seq"] for e in entries if e.get("kind") == "tool_call" and e.get("intent")}
    assert [s["outcome_seq"] for s in steps[:-1]] == [outcomes[e["hash"]] for e in intents[:-1]]
    assert steps[-1]["outcome_seq"] is None and outcomes[intents[-1]["hash"]] > intents[-1]["seq"]
    arms = [c for c in pack["choices"] if c["kind"] == "arm"]
    first = pack["ablation_design"][0]
    assert (arms[0]["subject"], arms[0]["order"], arms[0]["chosen_by"]) == (first["arm"], 1, "planner")
    assert arms[0]["reason"] == f"S3 ranked it 1 of {len(pack['ablation_design'])}: {first['reason']}"
    assert [a["subject"] for a in arms] == [a["arm"] for a in pack["ablation_design"]]
    assert all(a["order"] is None and a["reason"].endswith("(the quick SOP runs the first-ranked arm only)")
               for a in arms[1:])
    drills = [c for c in pack["choices"] if c["kind"] == "drill"]
    assert [(d["order"], d["chosen_by"], d["caller"]) for d in drills] == [(1, "planner", planner)]
    assert drills[0]["audit_seq"] == next(s["audit_seq"] for s in steps if s["step"] == "S5")
    report = (home / "packs" / quick_sop["pack_id"] / "report.md").read_text()
    assert "SOP trail" in report and "offline planner" in report and "NOT AUDITED" not in report

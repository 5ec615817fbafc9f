"""Issue 40, done-when 2: the offline agent, asked in chat to run the quick SOP, walks the steps as its
own tool calls (no single opaque call): one human approval of its S1 declaration, then S2..S6 each
an agent call the gate lets through under that approval; its pack has the same steps and arms as
`trainops sop --quick` (the `quick_sop` fixture). Real graph, gate, trainer jobs; minutes on 2 cores."""
from __future__ import annotations

from tests.skills.test_scripted_models_walk_the_sop import steps_and_arms
from trainops.agents.session import AgentSession
from trainops.tools.governance import audit

STEP_TOOLS = {"sop_baseline", "sop_design", "sop_arm", "sop_drill", "sop_pack"}


def test_the_offline_agent_walks_the_quick_sop_as_its_own_calls_to_the_same_pack(quick_sop, approvers):
    with AgentSession("sop-walk") as session:
        asked = list(session.ask("run the quick SOP"))
        assert [(e["kind"], e.get("tool")) for e in asked] == [("tool_call", "sop_declare"),
                                                               ("approval", "sop_declare")]
        approval = asked[-1]["pending_id"]
        walked = list(session.decide({"decision": "approve", "approver": "alice", "key": str(approvers.alice.key)}))
    results = [e for e in walked if e["kind"] == "tool_result"]
    assert [e["status"] for e in results] == ["success"] * len(results), results[-1]
    assert not [e for e in walked if e["kind"] == "approval"], "one approval covers the whole SOP"
    calls = [e["tool"] for e in walked if e["kind"] == "tool_call"]
    assert calls[0] == "sop_baseline" and calls[-1] == "sop_pack" and set(calls) == STEP_TOOLS
    assert all(e.get("finding") for e in results), "each step's figures shown as it lands"

    pack = results[-1]["output"]
    # the same steps, arms and first rung; how far an arm climbs depends on what each run measured
    assert steps_and_arms(pack["pack_dir"]) == steps_and_arms(quick_sop["pack_dir"])
    gate = [e for e in audit.read() if e.get("kind") == "gate" and e.get("tool") in STEP_TOOLS]
    assert len(gate) == len(calls)
    assert {(e["actor"], e["decision"], e["under_approved_call"]) for e in gate} == {("agent", "allowed", approval)}

    text = next(e["text"] for e in walked if e["kind"] == "answer")
    assert text.splitlines()[0].startswith("Verdict: ")
    assert all(f"  {tool}" in text for tool in calls) and "{" not in text
    assert text.rstrip().endswith("or trainops reject " + pack["pack_id"] + " --note WHY.")
    assert pack["approve_command"] in text

"""One human approval per SOP, bound to what the human saw (issue 40): the agent's sop_declare waits
for a human; once that declaration ran under a human's token, the agent's later steps on THAT session
run under it, each audited as allowed under the approval's call id. The attacker is the agent: it
tries to stretch the approval to another session, another tool, a forged claim, or a step off the
declared plan, and to skip the SOP's order. Real gate, real audit log, real sop_declare."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

from trainops.agents.agent_tools import AGENT_TOOLS, agent_registry
from trainops.skills.sop_approval import declaration_approval
from trainops.skills.sop_session import load, save, sessions_dir
from trainops.tools.base import tool
from trainops.tools.calls import call
from trainops.tools.catalog import build_registry
from trainops.tools.context import CallContext, serving
from trainops.tools.governance import audit, queue, tokens
from trainops.tools.governance.gate import GateRefused

DECLARATION = {"quick": True}
OPERATOR = CallContext(actor="operator")


def agent_call(name: str, inp: dict, token: str | None = None, registry=None):
    return call(name, inp, CallContext(actor="agent", approval_token=token), registry=registry or agent_registry())


def approved_declaration(approvers, inp: dict = DECLARATION) -> tuple[str, str]:
    """The agent's sop_declare, queued, signed by alice, run: (session id, the approval's call id)."""
    with pytest.raises(GateRefused) as waiting:
        agent_call("sop_declare", inp)
    assert waiting.value.reason == "missing_token"
    with serving(agent_registry):
        token = tokens.approve(waiting.value.pending_id, key=approvers.alice.key)
    return agent_call("sop_declare", inp, token).session_id, waiting.value.pending_id


def needs_its_own_approval(name: str, inp: dict, registry=None) -> None:
    with pytest.raises(GateRefused) as refused:
        agent_call(name, inp, registry=registry)
    assert (refused.value.reason, refused.value.rule_id) == ("missing_token", "R-SEC-4")


def last_gate(name: str) -> dict:
    return [e for e in audit.read() if e.get("kind") == "gate" and e.get("tool") == name][-1]


def test_a_step_of_an_approved_declaration_runs_under_it_and_is_audited_so(approvers):
    session_id, approval = approved_declaration(approvers)
    assert load(session_id).approved_call == approval == queue.call_id("sop_declare", load(session_id).settings)
    assert agent_call("sop_pack", {"session": session_id}).verdict == "partial"  # ran: no step after S1 yet
    entry = last_gate("sop_pack")
    assert (entry["decision"], entry["under_approved_call"], entry["actor"]) == ("allowed", approval, "agent")


def test_a_session_the_operator_declared_gives_the_agent_no_approval(approvers):
    session_id = call("sop_declare", DECLARATION, OPERATOR, registry=agent_registry()).session_id
    assert load(session_id).approved_call is None
    needs_its_own_approval("sop_pack", {"session": session_id})


def test_an_approval_does_not_cover_another_session(approvers):
    approved_declaration(approvers)
    other = call("sop_declare", DECLARATION, OPERATOR, registry=agent_registry()).session_id  # same settings
    needs_its_own_approval("sop_baseline", {"session": other})


def test_a_claimed_approval_no_human_signed_is_not_one(approvers):
    """A session written through trainops' own writer (bound to the audit chain) that claims the call
    id of its declaration, which no human's token was ever spent for."""
    session_id = call("sop_declare", DECLARATION, OPERATOR, registry=agent_registry()).session_id
    session = load(session_id)
    save(session.model_copy(update={"approved_call": queue.call_id("sop_declare", session.settings)}))
    needs_its_own_approval("sop_pack", {"session": session_id})


def test_a_real_approval_copied_into_a_session_of_other_settings_is_not_one(approvers):
    _, approval = approved_declaration(approvers)
    other = call("sop_declare", {"quick": True, "faults": ["hang"]}, OPERATOR, registry=agent_registry())
    save(load(other.session_id).model_copy(update={"approved_call": approval}))
    needs_its_own_approval("sop_pack", {"session": other.session_id})


def test_a_hand_edited_session_file_is_refused_before_any_approval_is_asked(approvers):
    session_id, _ = approved_declaration(approvers)
    path = sessions_dir() / f"{session_id}.json"
    path.write_text(path.read_text().replace('"quick": true', '"quick": false'))
    with pytest.raises(GateRefused) as refused:
        agent_call("sop_design", {"session": session_id})
    assert (refused.value.reason, refused.value.rule_id) == ("invalid_input", "R-ENV-1")


def test_an_approved_session_does_not_cover_a_step_off_the_declared_plan(approvers):
    session_id, _ = approved_declaration(approvers)
    needs_its_own_approval("sop_drill", {"session": session_id, "fault": "hang"})  # quick declares one drill
    needs_its_own_approval("sop_baseline", {"session": session_id, "repeats": 10})


def test_an_approved_session_does_not_cover_a_tool_outside_the_sop(approvers):
    approved_declaration(approvers)
    needs_its_own_approval("drain_node", {"node": "n1", "reason": "the SOP was approved"})


class _SessionInput(BaseModel):
    session: str


@tool("probe_gated_step", risk="mutate", approval_required=True, approval_from=declaration_approval)
def _gated_probe(inp: _SessionInput) -> _SessionInput:
    """A step-shaped tool that is approval-gated: an earlier approval never covers it."""
    return inp


@tool("probe_irreversible_step", risk="irreversible", approval_from=declaration_approval)
def _irreversible_probe(inp: _SessionInput) -> _SessionInput:
    """A step-shaped irreversible tool: an earlier approval never covers it."""
    return inp


@tool("probe_other_mutate", risk="mutate")
def _other_probe(inp: _SessionInput) -> _SessionInput:
    """A mutating tool that names a session but is no SOP step: it claims no earlier approval."""
    return inp


@pytest.mark.parametrize("name", ["probe_gated_step", "probe_irreversible_step", "probe_other_mutate"])
def test_an_approved_session_never_covers_a_gated_irreversible_or_non_sop_tool(approvers, name):
    session_id, _ = approved_declaration(approvers)
    registry = build_registry(extra=(*AGENT_TOOLS, _gated_probe, _irreversible_probe, _other_probe))
    with pytest.raises(GateRefused) as refused:
        agent_call(name, {"session": session_id}, registry=registry)
    assert refused.value.reason == "missing_token"


def test_the_sops_order_still_refuses_an_out_of_order_step_on_an_approved_session(approvers):
    session_id, _ = approved_declaration(approvers)
    with pytest.raises(GateRefused) as refused:
        agent_call("sop_arm", {"session": session_id, "arm": "data_kind=synthetic"})
    assert (refused.value.reason, refused.value.rule_id) == ("invalid_input", "R-ABL-1")
    assert "no baseline at" in str(refused.value)

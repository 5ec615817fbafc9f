"""Steering the SOP between steps (issue 40 item 4), through the real command path (`trainops tool
call sop_steer`): a steer is a typed change to the plan that the offline plan follows and the pack
lists with who asked and why; one that breaks a rule is refused with the rule's id before anything
is recorded; the agent's steer waits for a human."""
from __future__ import annotations

import json

import pytest

from tests.skills.test_sop_steps import declared, refused, stopped_after_s4, tool_call
from trainops.agents.agent_tools import agent_registry
from trainops.skills.sop import next_step
from trainops.skills.sop_pack import sop_pack
from trainops.skills.sop_session import load
from trainops.skills.sop_steps import sop_drill
from trainops.skills.sop_trail import choices
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance.gate import GateRefused

pytestmark = pytest.mark.usefixtures("as_operator")


def steer(session: str, change: str, value: str, reason: str = "the on-call engineer asked") -> dict:
    result = tool_call("sop_steer", {"session": session, "change": change, "value": value, "reason": reason})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(("change", "value", "rule"), [
    ("add_arm", "activation_checkpointing=selective,micro_batch=4", "R-ABL-1"),  # two knobs at once
    ("skip_step", "S1", "R-ENV-1"),  # skipping the declaration
    ("skip_step", "S2", "R-ABL-1"),  # skipping the baseline every arm is measured against
    ("stop_after", "S6", "R-APR-1"),  # skipping the pack a human decides on
])
def test_a_steer_that_breaks_a_rule_is_refused_with_its_id_and_nothing_changes(workspace, factories, change, value,
                                                                                 rule):
    session = stopped_after_s4(factories)
    refused("sop_steer", {"session": session.session_id, "change": change, "value": value, "reason": "try it"}, rule)
    assert load(session.session_id).steers == [] and next_step(load(session.session_id))[0] is sop_drill


def test_skipping_the_drill_goes_to_the_pack_and_the_pack_lists_who_asked_and_why(workspace, factories):
    session = stopped_after_s4(factories)
    plan = steer(session.session_id, "skip_drill", "crash", "the node-loss drill ran yesterday")
    assert plan["drills"] == [] and next_step(load(session.session_id))[0] is sop_pack
    [row] = [c for c in choices(load(session.session_id), []) if c.kind == "steer"]
    assert (row.subject, row.chosen_by) == ("skip_drill crash", "human")
    assert row.reason == "the node-loss drill ran yesterday"


def test_an_added_drill_and_an_early_stop_change_what_runs_next(workspace, factories):
    session = stopped_after_s4(factories)
    assert steer(session.session_id, "add_drill", "hang")["drills"] == ["crash", "hang"]
    drilled = load(session.session_id).model_copy(update={"drilled": ["crash"]})
    step, inp = next_step(drilled)
    assert step is sop_drill and inp.fault == "hang"
    fresh = declared(factories)
    assert steer(fresh.session_id, "stop_after", "S1")["stops_after"] == "S1"
    assert next_step(load(fresh.session_id))[0] is sop_pack  # the pack, partial: its blockers name the steps not run


def test_an_unknown_arm_or_fault_is_refused_naming_the_field(workspace, factories):
    session = stopped_after_s4(factories)
    for change, value in (("add_arm", "no_such_knob=1"), ("add_drill", "meteor"), ("skip_step", "S9")):
        result = tool_call("sop_steer", {"session": session.session_id, "change": change, "value": value,
                                         "reason": "try it"})
        assert result.exit_code != 0 and "value" in result.output, result.output
    assert load(session.session_id).steers == []


def test_the_agents_steer_waits_for_a_human(workspace, factories):
    session = stopped_after_s4(factories)
    with pytest.raises(GateRefused) as queued:
        call("sop_steer", {"session": session.session_id, "change": "skip_drill", "value": "crash",
                           "reason": "the user said skip it"}, CallContext(actor="agent"), registry=agent_registry())
    assert queued.value.pending_id is not None and load(session.session_id).steers == []

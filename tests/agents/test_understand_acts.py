"""A question is never read as an order (issue 38 review): a past tense, a noun use or a near word of an
action verb, a clause that asks ("?"), or a bare verb with no object orders nothing, and no mutating tool
is offered or allowed; resolution by day, by drill and by node number asks or says 'none' instead of
guessing; drain advice from a job's own log text is worded as a suspicion. The phrases are the
reviewer's and the developer's, none from a frozen benchmark set."""
from __future__ import annotations

import datetime

import pytest

from trainops.agents import kinds
from trainops.agents.agent_tools import agent_registry
from trainops.agents.diagnose import _decisions
from trainops.agents.graph import acting_refusal
from trainops.agents.understand import Job, World, understand

CRASH = "drill-crash-20261202-133205-2e52bc"
WORLD = World(runs=["run-20261202-133205-560cf2", "run-a"],
              jobs=[Job(id=CRASH, name="drill-crash", run="run-20261202-133205-560cf2", when=1.0),
                    Job(id="4", name="train-llm", when=2.0)],
              nodes={"node01": "local", "node02": "local", "n3": "local", "gpu3": "local", "cpu3": "local"},
              drills=["run-20261202-133205-560cf2"])
RISK = {name: spec.risk for name, spec in agent_registry().items()}
MUTATING = {name for name, risk in RISK.items() if risk != "read"}


@pytest.mark.parametrize("text", [
    "drill results for 2e52bc?", "drill on 2e52bc - how did it go?", "slow rank on 2e52bc, which one?",
    "Simulated crash on 2e52bc: what did detection say?", "cancelled 2e52bc?", "kill count on job 2e52bc?",
    "stop. why did 2e52bc die", "Restarted 2e52bc?", "requeued 2e52bc already?", "retry count of 2e52bc?",
    "quarantined ckpts for 2e52bc?", "cordon status of node01?", "unquarantine the checkpoints of 2e52bc",
    "drained node01 yet?", "kill count on job 2e52bc", "cordon status of node01", "terminated 2e52bc?",
])
def test_a_question_is_never_an_order_and_gets_no_mutating_tool(text):
    request = understand(text, WORLD)
    assert request.order is None and request.act != "order", (request.act, request.order)
    offered = kinds.offered(kinds.BY_NAME.get(request.kind or ""), request.act, RISK)
    assert not set(offered) & MUTATING
    asked = request.model_dump()
    assert all(acting_refusal(asked, tool, RISK[tool]) for tool in MUTATING)


@pytest.mark.parametrize("text, tool", [
    ("cancel 2e52bc", "cancel_job"), ("can you cancel 2e52bc?", "cancel_job"), ("pls requeue it", "requeue_job"),
    ("could you requeue job 2e52bc?", "requeue_job"), ("kill job 2e52bc. now.", "cancel_job"),
    ("stop 2e52bc", "cancel_job"), ("node01 is dead, drain it", "drain_node"), ("cordon node01", "drain_node"),
    ("drill a crash on 2e52bc", "inject_fault"), ("please quarantine the ckpts of 2e52bc", "quarantine_checkpoints"),
    ("take n3 out of service", "drain_node"), ("give acme 4 GPUs", "set_tenant_quota"),
])
def test_an_order_with_an_object_is_still_an_order(text, tool):
    request = understand(text, WORLD)
    assert (request.act, request.order) == ("order", tool)


def test_yesterday_filters_runs_too_and_says_none_instead_of_the_latest_run():
    today = datetime.datetime.now(datetime.timezone.utc)
    yesterday = (today - datetime.timedelta(days=1)).strftime("%Y%m%d")
    old = World(runs=["run-20200101-000000-aaaaaa"], jobs=[])
    request = understand("what went wrong in yesterday's run", old)
    assert request.entities.runs == [] and request.ambiguous and not request.ambiguous[0].candidates
    fresh = World(runs=["run-20200101-000000-aaaaaa", f"run-{yesterday}-100000-bbbbbb"], jobs=[])
    assert understand("what went wrong in yesterday's run", fresh).entities.runs == [f"run-{yesterday}-100000-bbbbbb"]


def test_drill_picks_only_jobs_with_a_drill_record():
    world = World(runs=["run-1-aaa111", "run-2-bbb222"], drills=["run-1-aaa111"],
                  jobs=[Job(id="j1", name="pretrain", run="run-1-aaa111", when=1.0),
                        Job(id="j2", name="pretrain", run="run-2-bbb222", when=2.0)])
    assert understand("how did the last drill go", world).entities.jobs == ["j1"]


def test_a_node_number_matching_several_nodes_is_asked_back():
    request = understand("what is wrong with node 3", WORLD)
    assert request.entities.nodes == []
    assert request.ambiguous and {"n3", "gpu3", "cpu3"} <= set(request.ambiguous[0].candidates)


def _record(sub_cause: str, node_states: dict[str, str]) -> dict:
    return {"job_id": "7", "cause": "hardware", "sub_cause": sub_cause, "next_step": "",
            "evidence": {"failing_node": "node01", "node_states": node_states}}


def test_drain_advice_from_the_jobs_own_log_is_a_suspicion_to_check_first():
    lines = _decisions(_record("ecc", {}), None)
    assert any("suspected from the job's own log; run the node check first" in line for line in lines)
    assert not any("may order drain_node" in line for line in lines)


def test_drain_advice_from_a_witnessed_node_failure_may_be_ordered():
    lines = _decisions(_record("node-failure", {"node01": "down"}), None)
    assert any("drain_node" in line and "suspected" not in line for line in lines)

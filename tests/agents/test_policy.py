"""The offline policy's parsing and argument filling, as specifications."""
from __future__ import annotations

import pytest
from langchain_core.messages import ToolMessage

from trainops.agents.act import next_step, ordered_tool
from trainops.agents.compare import runs_compared
from trainops.agents.diagnose import _latest_record
from trainops.agents.explain import render_answer
from trainops.agents.policy import classify, fill_args, parse_params
from trainops.tools.governance.text import check_text


@pytest.mark.parametrize("text, intent", [
    ("what is the MFU of run r1 and why is it low?", "mfu"),
    ("run the SOP on config jobs/a.toml", "sop"),
    ("drill a rank crash on job 12", "drill"),
    ("plan the checkpoint interval for a 5-minute save and an MTBF of 3 hours", "checkpoint"),
    ("show pending approvals", "approvals"),
    ("show the logs of job 12", "logs"),
    ("what's for lunch", None),
    # the ids a request names never choose its intent: a job called drill-... asked about is a diagnosis
    ("Job drill-crash-20261202-133205-2e52bc was interrupted. What happened?", "diagnose"),
    ("show the logs of job drill-sop-approval-1", "logs"),
    ("Why is run run-b slower than run run-a?", "compare"),
    ("Run r2 reached much lower MFU than run r1 of the same model. Why?", "compare"),
    ("what is the MFU of run r1, and of run r1 again?", "mfu"),  # one run named twice is not a comparison
    ("Training on the new cluster feels slow. Why?", "diagnose"),  # a symptom without an id: say what to collect
])
def test_requests_map_to_intents(text, intent):
    assert classify(text) == intent


def test_durations_are_read_in_seconds_next_to_their_keyword():
    params = parse_params("a 5-minute save, a 90 s restart and an MTBF of 3 hours")
    assert (params["save"], params["restart"], params["mtbf"]) == (300.0, 90.0, 10800.0)


def test_ids_config_fault_and_rank_are_read_from_the_request():
    params = parse_params("drill a rank 1 crash on job train-42 with config jobs/a.toml")
    assert params == {"job": "train-42", "config": "jobs/a.toml", "fault": "crash", "rank": 1}


def test_a_stop_word_after_run_is_not_taken_as_a_run_id():
    assert "run" not in parse_params("run the SOP")


def test_duration_fields_are_filled_in_the_unit_their_name_states():
    schema = {"properties": {"save_s": {}, "mtbf_h": {}, "restart_min": {}}, "required": ["save_s", "mtbf_h"]}
    args, missing = fill_args(schema, {"save": 300.0, "mtbf": 10800.0, "restart": 120.0})
    assert args == {"save_s": 300.0, "mtbf_h": 3.0, "restart_min": 2.0} and missing == []


def test_a_crash_on_a_live_job_prefers_killing_the_rank_when_the_tool_offers_it():
    schema = {"properties": {"kind": {"enum": ["crash", "kill_rank", "hang"]}}, "required": ["kind"]}
    assert fill_args(schema, {"fault": "crash"})[0] == {"kind": "kill_rank"}


def test_missing_required_fields_are_reported():
    schema = {"properties": {"run": {}, "skip_steps": {}}, "required": ["run"]}
    assert fill_args(schema, {}) == ({}, ["run"])


def test_the_sop_answer_leads_with_the_verdict_and_names_the_pack_to_decide():
    """Rendering only: a real SOP run takes minutes (measured in the report), so its result is built here."""
    result = {"pack_dir": "/w/packs/sop-1", "verdict": "partial", "blockers": ["drill hang: recovery not measured"],
              "elapsed_s": 120.4}
    message = ToolMessage(content="", tool_call_id="c1", name="run_sop", status="success", artifact=result)
    text = render_answer("sop", "run the SOP", [message])
    assert text.splitlines()[0] == "Verdict: partial; blockers: drill hang: recovery not measured"
    assert "trainops approve sop-1 (signed with their SSH key)" in text and "trainops reject sop-1 --note WHY" in text
    assert check_text(text) == []


@pytest.mark.parametrize("text, pair", [
    ("Why is run run-b slower than run run-a?", ("run-a", "run-b")),  # the run after "than" is the baseline
    ("Compare run run-a with run run-b: what changed?", ("run-a", "run-b")),  # else the first named
    ("Is run run-a different from run run-b?", ("run-a", "run-b")),
    ("What happened to run run-a?", None),
    ("run run-a, run run-b and run run-c: which is slower?", None),  # a comparison is of two runs
])
def test_the_two_runs_compared_are_read_with_the_baseline_first(text, pair):
    assert runs_compared(text) == pair


@pytest.mark.parametrize("text, tool", [
    ("Cancel job train-7 now.", "cancel_job"),
    ("Rank 1 of job train-7 died. Requeue the job.", "requeue_job"),
    ("The node under job train-7 hung it. Drain that node.", "drain_node"),
    ("Take the slow node of job train-7 out of service.", "drain_node"),
    ("Quarantine the corrupt checkpoint of run r1 (step 6 and later).", "quarantine_checkpoints"),
    ("Give tenant team-a 64 GPUs at high priority for the launch.", "set_tenant_quota"),
    ("Why did job train-7 fail? Should I cancel it?", None),  # a question is not an order
    ("What does the log of job cancel-7 say?", None),          # nor is an id that holds a verb
])
def test_an_order_to_act_is_read_from_an_imperative_sentence_of_the_request(text, tool):
    assert ordered_tool(text) == tool
    assert (classify(text) == "act") == (tool is not None)


def test_a_drain_order_for_a_job_on_several_nodes_asks_which_instead_of_guessing():
    status = ToolMessage(content="", name="job_status", tool_call_id="c0", status="success",
                         artifact={"job_id": "j1", "backend": "slurm", "state": "failed", "nodes": ["n1", "n2"]})
    nodes = ToolMessage(content="", name="list_nodes", tool_call_id="c1", status="success",
                        artifact={"nodes": [{"name": n, "state": "idle"} for n in ("n1", "n2", "n3")]})
    message = next_step("drain_node", "Drain the node of job j1.", {"job": "j1"}, [status, nodes], 2)
    [made] = message.tool_calls
    assert made["name"] == "final_answer" and made["args"]["verdict"] == "inconclusive"
    assert "2 nodes (n1, n2)" in made["args"]["summary"]


def test_the_quota_order_takes_tenant_size_and_priority_from_the_request():
    [made] = next_step("set_tenant_quota", "Give tenant team-a 64 GPUs at high priority.", {}, [], 0).tool_calls
    assert made["name"] == "set_tenant_quota"
    assert {k: made["args"][k] for k in ("tenant", "gpus", "priority")} == {"tenant": "team-a", "gpus": 64,
                                                                          "priority": "high"}


def test_a_drain_order_naming_a_node_drains_it_only_once_the_scheduler_lists_it():
    status = ToolMessage(content="", name="job_status", tool_call_id="c0", status="success",
                         artifact={"job_id": "4", "backend": "slurm", "state": "completed", "nodes": ["n1", "n3"]})
    nodes = ToolMessage(content="", name="list_nodes", tool_call_id="c1", status="success",
                        artifact={"nodes": [{"name": n, "state": "idle"} for n in ("n1", "n2", "n3")]})
    [ask] = next_step("drain_node", "Node n2 died under job 4. Drain it.", {"job": "4"}, [status], 1).tool_calls
    assert ask["name"] == "list_nodes"  # the node is read from the scheduler's list, never from the words alone
    [made] = next_step("drain_node", "Node n2 died under job 4. Drain it.", {"job": "4"}, [status, nodes], 2).tool_calls
    assert (made["name"], made["args"]["node"], made["args"]["scheduler"]) == ("drain_node", "n2", "slurm")
    [refused] = next_step("drain_node", "Node n9 died under job 4. Drain it.", {"job": "4"}, [status, nodes],
                          2).tool_calls
    assert refused["name"] == "final_answer" and "n9, which the scheduler does not list" in refused["args"]["summary"]
    on_one = status.model_copy(update={"artifact": {**status.artifact, "nodes": ["n3"]}})
    [one] = next_step("drain_node", "The node under job 4 hung it. Drain that node.", {"job": "4"}, [on_one, nodes],
                      2).tool_calls
    assert (one["name"], one["args"]["node"]) == ("drain_node", "n3")  # no node named: the job's only node


def test_a_diagnosis_of_a_named_run_never_reads_another_runs_record():
    records = {"interruptions": [{"job_id": "a", "run_dir": "/ws/runs/run-a"},
                                 {"job_id": "b", "run_dir": "/ws/runs/run-b/"}]}
    assert _latest_record(records, "run-a")["job_id"] == "a"
    assert _latest_record(records, "/ws/runs/run-b")["job_id"] == "b"
    assert _latest_record(records, "run-c") is None  # was: the newest record of any run
    assert _latest_record(records, None)["job_id"] == "b"

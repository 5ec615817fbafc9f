"""A real job, not a drill (issue 44, done-when 2): a 2-rank gloo training job in which one rank is
held before a collective ends on the process group's timeout, nobody from trainops watching it; asked
"what happened to job ID?" through the CLI, the answer is a hung peer naming the held rank, never the
network, and proposes no requeue (a requeue meets the same hang)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.reliability.signature_match import missing_ranks

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("as_operator")]
HELD = 1
JOB = ["training.steps=4", "training.seq_len=32", "training.global_batch=4", "training.micro_batch=2",
       "resilience.in_process_restart=false", "resilience.process_group_timeout_s=6",
       "faults.hang_step=2", f"faults.hang_rank={HELD}"]


@pytest.mark.parametrize("collectives", ["gloo", "shared_memory"])
def test_a_rank_held_before_a_collective_is_a_hung_peer_naming_it(workspace, monkeypatch, collectives):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = call("submit_job", {"name": "held", "training": {
        "preset": "tiny", "nproc": 2, "overrides": [*JOB, f"parallel.cpu_collectives={collectives}"]}}).handle.job_id
    assert call("wait_job", {"job_id": job, "timeout_s": 240}).state == "failed"
    result = CliRunner().invoke(app, ["ask", f"what happened to job {job}?", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)["final_answer"]
    said = json.dumps(answer).lower()
    assert answer["verdict"] == "diagnosed" and answer["cause_class"] == "hung-peer", said
    assert answer["ranks"] == [HELD], said
    assert f"rank {HELD}" in answer["summary"] and "network" not in said, said
    assert not any(a["tool"] == "requeue_job" for a in answer.get("proposed_actions") or []), said
    assert "requeue_job" not in " ".join(answer.get("next_to_collect") or []), said
    assert answer["fault_kind"] == "hang", said  # from the record's cause; its reason says no 'stall'


HELD_JOB = """\
import datetime, os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
dist.all_reduce(torch.ones(4))
if dist.get_rank() == int(os.environ["HELD_RANK"]):
    time.sleep(60)  # busy elsewhere (a test set prepared on one rank) while its peers wait in the collective
dist.all_reduce(torch.ones(4))
"""


@pytest.mark.parametrize(("ranks", "held"), [(3, 2), (4, 1)])
def test_in_a_plain_torchrun_job_of_more_ranks_the_one_that_did_not_arrive_is_named(workspace, tmp_path, ranks, held):
    """Not trainops' trainer: no heartbeats, no world size on record. The ranks that waited say so in
    gloo's words; torchrun stops the held one, still running, once a waiter fails. That rank, and only
    it, is the missing one, not a rank lost to a signal (before: 'unclassified, every rank ended
    without an exit note')."""
    script = tmp_path / "held.py"
    script.write_text(HELD_JOB)
    spec = {"name": "held", "launcher": "torchrun", "procs_per_node": ranks, "command": [str(script)],
            # torchrun polls its ranks every 0.1 s: on a loaded host one waiter could be stopped before it prints
            # its own timeout, and then two silent ranks name no one (the unit test below); 1 s lets each print
            "env": {"HELD_RANK": str(held), "PET_MONITOR_INTERVAL": "1"}}
    job = call("submit_job", {"spec": spec}).handle.job_id
    assert call("wait_job", {"job_id": job, "timeout_s": 120}).state == "failed"
    rec = read_interruptions(job)[-1]
    assert (rec.cause, rec.evidence.failing_rank) == ("hung-peer", held), rec.cause_reason
    assert held in rec.evidence.torn_down_ranks and rec.evidence.world_size == ranks  # from the spec's launcher
    assert f"rank {held} did not" in rec.cause_reason
    assert "the launcher stopped it while it still ran" in rec.cause_reason
    assert rec.requeue_helps is False and "network" not in rec.cause_reason.lower()


def test_two_ranks_stopped_without_reporting_name_no_one():
    """Which of two silent ranks held the others is not in the log: none is named."""
    assert missing_ranks([0, 1], None, [2, 3]) == [] and missing_ranks([0, 1], None, [2]) == [2]
    assert missing_ranks([0, 1, 2], 4, []) == [3] and missing_ranks([], 4, [3]) == []

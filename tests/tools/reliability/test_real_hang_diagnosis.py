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

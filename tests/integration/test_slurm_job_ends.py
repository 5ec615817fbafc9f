"""Scheduler ends of real Slurm jobs, not drills (issue 44, done-when 2): a job past its time limit, a
job preempted by one in a higher-priority partition and a job whose node was killed, each asked "what
happened to job ID?" through `trainops ask`, get their own cause from Slurm's own job state. The jobs'
own text is no witness: the timed-out job prints slurmstepd's preemption line and a connection error,
and still reads as a time limit; the preempted job prints nothing, and is not an operator's cancel."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import wait_for
from trainops.cli import app
from trainops.run_records import read_heartbeats
from trainops.tools.calls import call
from trainops.tools.reliability.interruptions import read_interruptions

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.usefixtures("as_operator")]
MISLEADING = ("import time; print('slurmstepd: error: *** JOB 7 ON node9 CANCELLED AT 2026-01-01T00:00:00 DUE TO "
              "PREEMPTION ***'); print('RuntimeError: Connection refused by peer', flush=True); time.sleep(600)")
QUIET = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text('x'); time.sleep(600)"


def _submit(name: str, code: str, *args: str, **spec) -> str:
    return call("submit_job", {"scheduler": "slurm", "spec": {"name": name, "command": [
        sys.executable, "-c", code, *args], **spec}}).handle.job_id


def _ask(job: str) -> tuple[dict, str]:
    result = CliRunner().invoke(app, ["ask", f"what happened to job {job}?", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)["final_answer"]
    return answer, json.dumps(answer).lower()


def test_a_job_past_its_time_limit_is_a_time_limit_whatever_it_printed(slurm, workspace):
    job = _submit("limited", MISLEADING, time_limit_min=1)
    status = call("wait_job", {"job_id": job, "scheduler": "slurm", "timeout_s": 240})
    assert status.reason.startswith("TIMEOUT"), status
    (rec,) = read_interruptions(job)
    assert (rec.cause, rec.sub_cause, rec.confidence) == ("planned", "time-limit", "high"), rec.cause_reason
    answer, said = _ask(job)
    assert (answer["verdict"], answer["cause_class"]) == ("diagnosed", "planned"), said
    assert "time limit" in answer["summary"] and "preempt" not in answer["summary"].lower(), said
    assert "network" not in said and answer["proposed_actions"] == [], said


def test_a_preempted_job_is_a_preemption_not_an_operator_s_cancel(slurm, workspace, tmp_path):
    started = tmp_path / "started"
    job = _submit("victim", QUIET, str(started))
    wait_for(started.exists, 120, "the victim job to start")
    urgent = subprocess.run(["sbatch", "--parsable", "--partition=urgent", "--exclusive", "--wrap=sleep 2",
                             f"--output={tmp_path / 'urgent.out'}"], capture_output=True, text=True, env=slurm.env,
                            check=True).stdout.strip()
    status = call("wait_job", {"job_id": job, "scheduler": "slurm", "timeout_s": 120})
    assert status.reason.startswith("PREEMPTED"), status
    (rec,) = read_interruptions(job)
    assert (rec.cause, rec.sub_cause, rec.confidence, rec.planned) == ("planned", "preemption", "high", False), \
        rec.cause_reason
    answer, said = _ask(job)
    assert (answer["verdict"], answer["cause_class"]) == ("diagnosed", "planned"), said
    assert "preempted" in answer["summary"] and "operator" not in said, said
    assert answer["proposed_actions"] == [], said
    assert call("wait_job", {"job_id": urgent, "scheduler": "slurm", "timeout_s": 60}).state == "completed"


def test_a_job_whose_node_was_killed_is_a_node_failure_on_that_node(sandbox_cluster, workspace):
    """Slurm requeues a job whose node failed and it may then finish clean: the lost launch is still an
    interruption, read from Slurm's accounting (its NODE_FAIL row) and the node's state, not the log."""
    out = call("submit_job", {"scheduler": "slurm", "name": "nodekill", "training": {
        "preset": "tiny", "nproc": 1, "nodes": 2, "overrides": [
            "training.steps=300", "data.kind=synthetic", "checkpoint.enable=true", "checkpoint.interval=5",
            "resilience.in_process_restart=false"]}})
    job, run_dir = out.handle.job_id, out.handle.run_dir
    wait_for(lambda: len(beats := read_heartbeats(run_dir)) == 2 and min(b.step for b in beats.values()) >= 2, 180,
             "both ranks past step 2")
    call("inject_fault", {"kind": "node_crash", "node": "n2", "run": Path(run_dir).name})
    try:
        status = call("wait_job", {"job_id": job, "scheduler": "slurm", "timeout_s": 240})
        assert status.state == "completed" and "n2" not in status.nodes, status  # requeued by Slurm, on n1 and n3
        (rec,) = read_interruptions(job)
        assert (rec.cause, rec.sub_cause, rec.evidence.failing_node) == ("hardware", "node-failure", "n2"), rec
        assert rec.evidence.reason.startswith("NODE_FAIL") and rec.started_at < status.started_at
        answer, said = _ask(job)
        assert (answer["verdict"], answer["cause_class"], answer["nodes"]) == ("diagnosed", "hardware", ["n2"]), said
        assert "node_fail" in said and "network" not in said and answer["proposed_actions"] == [], said
        advice = " ".join(answer["next_to_collect"])  # drain the node; no requeue of a job Slurm already requeued
        assert "drain_node (node n2)" in advice and "requeue_job" not in advice and "already requeued" in advice, said
    finally:
        call("inject_fault", {"kind": "heal_node", "node": "n2"})

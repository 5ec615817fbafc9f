"""The interruption record (issue 25, item 1): every job end that is not a clean finish is
recorded once, with its evidence, through the job-status path every observer uses; the
record is read tolerantly and listed by `trainops interruptions` and the list_interruptions tool.
The jobs here are real local-scheduler jobs (a few lines of Python standing in for a rank)."""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.record_keys import run_key
from trainops.run_folder import RunFiles, launch_mark, open_rank_log
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.causes import diagnose
from trainops.tools.reliability.ettr import reliability
from trainops.tools.reliability.evidence import gather
from trainops.tools.reliability.interruptions import is_clean, record_job_end, witness
from trainops.tools.schedulers.base import JobStatus

OPERATOR = CallContext(actor="operator")
SECRET = "sk-test-abcdefghijklmnop1234"

RANK = r"""
import json, os, sys, time
run_dir, how = sys.argv[1], sys.argv[2]
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
os.makedirs(f"{run_dir}/logs", exist_ok=True)
for step in (1, 2, 3):
    with open(f"{run_dir}/metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": step, "rank": 0, "loss": 1.0, "step_time_s": 0.01, "time": time.time()}) + "\n")
beat = {"step": 3, "time": time.time(), "pid": os.getpid(), "host": "node-a"}
if how == "raise":
    err = "ValueError: batch 7 has no tokens key=" + sys.argv[3] + " \x1b[31mred"
    beat["exit"] = {"time": time.time(), "error": err}
    with open(f"{run_dir}/logs/rank0.log", "w") as fh:
        fh.write("step 3\nTraceback (most recent call last):\n" + err + "\n")
with open(f"{run_dir}/heartbeat/rank0.json", "w") as fh:
    json.dump(beat, fh)
if how == "hang":  # its heartbeat went stale 30 s ago and it never exits: a job a drill has to end
    beat["time"] = time.time() - 30
    with open(f"{run_dir}/heartbeat/rank0.tmp", "w") as fh:
        json.dump(beat, fh)
    os.replace(f"{run_dir}/heartbeat/rank0.tmp", f"{run_dir}/heartbeat/rank0.json")
    time.sleep(60)
sys.exit(1 if how == "raise" else 0)
"""


def _job(workspace, how: str, name: str = "") -> str:
    run_dir = workspace / "runs" / f"r-{name or how}"
    run_dir.mkdir(parents=True)
    spec = {"name": f"r-{name or how}", "command": [sys.executable, "-c", RANK, str(run_dir), how, SECRET],
            "run_dir": str(run_dir)}  # the job never gets the operator's key in its env; it leaks it in its own error
    return call("submit_job", {"spec": spec}, OPERATOR).handle.job_id


def test_a_failed_job_is_recorded_once_with_its_evidence_and_a_clean_one_not(workspace, monkeypatch):
    monkeypatch.setenv("FAKE_API_KEY", SECRET)
    failed, clean = _job(workspace, "raise"), _job(workspace, "clean")
    for job in (failed, clean):
        call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR)
        call("job_status", {"job_id": job}, OPERATOR)  # observed again: still one record
        call("job_status", {"job_id": job}, OPERATOR)
    out = call("list_interruptions", {}, OPERATOR)
    assert [r.job_id for r in out.interruptions] == [failed]
    rec = out.interruptions[0]
    assert rec.cause == "software" and "ValueError" in rec.cause_reason, (rec.cause_reason, rec.evidence.error_lines)
    assert rec.evidence.exit_code == 1 and rec.evidence.failing_rank == 0
    assert rec.evidence.failing_node == socket.gethostname()  # the scheduler's node; the beat's "node-a" is quoted
    assert any("'node-a'" in note and "not used" in note for note in rec.evidence.not_taken)
    assert rec.evidence.last_step == 3 and not rec.planned and not rec.drill
    text = json.dumps(rec.model_dump(mode="json"))
    assert SECRET not in text and "\x1b" not in text and "\\u001b" not in text
    assert out.cause_distribution["software"] == 1


def test_a_corrupt_line_is_skipped_and_the_cli_lists_the_rest(workspace):
    job = _job(workspace, "raise")
    call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR)
    path = workspace / "interruptions.jsonl"
    path.write_text("{not json\n" + path.read_text() + '{"id": 3}\n')
    result = CliRunner().invoke(app, ["interruptions", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [r["job_id"] for r in listed["interruptions"]] == [job]
    human = CliRunner().invoke(app, ["interruptions"])
    assert human.exit_code == 0 and job in human.output and "software" in human.output


def _stale(beat) -> bool:
    try:
        return json.loads(beat.read_text())["time"] < time.time() - 20
    except (ValueError, KeyError):  # the first, fresh beat being written
        return False


def test_drills_stay_out_of_the_measured_mtbf_and_rate_but_count_in_recovery(workspace):
    """An injected fault says how recovery goes, not how often jobs fail: a second SOP run must not
    'measure' its MTBF from the first run's drills."""
    first = _job(workspace, "raise")
    call("wait_job", {"job_id": first, "timeout_s": 60}, OPERATOR)
    drilled = _job(workspace, "hang")
    beat = workspace / "runs" / "r-hang" / "heartbeat" / "rank0.json"
    deadline = time.monotonic() + 30
    while not (beat.is_file() and _stale(beat)):
        assert time.monotonic() < deadline, "the hanging job never wrote its stale heartbeat"
        time.sleep(0.05)
    witness(drilled, "local", str(workspace / "runs" / "r-hang"), drill=True)
    call("cancel_job", {"job_id": drilled, "force": True}, OPERATOR)
    stats = reliability(declared_mtbf_h=24.0)
    assert (stats.unplanned, stats.mtbf_h, stats.mtbf_measured) == (2, 24.0, False)
    assert "declared" in stats.mtbf_source and "1 drill(s) left out" in stats.mtbf_source
    second = _job(workspace, "raise", name="raise-again")
    call("wait_job", {"job_id": second, "timeout_s": 60}, OPERATOR)
    stats = reliability(declared_mtbf_h=24.0)
    assert stats.mtbf_measured and stats.mtbf_source.startswith("measured from 2 recorded interruptions")
    assert "1 drill(s) left out" in stats.mtbf_source and stats.mtbf_h < 1.0
    assert stats.recovery_time_s is not None and stats.unplanned == 3


RECOVERING = r"""
import json, os, sys, time
from trainops.run_records import RecoveryEntry
run_dir, secret, key = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
time.sleep(3.5)  # every time below falls inside the job's run: a figure from before its start is not taken
now = time.time()
with open(f"{run_dir}/metrics.jsonl", "a") as fh:
    for step in (1, 2, 3):
        record = {"step": step, "rank": 0, "loss": 1.0, "step_time_s": 0.5, "time": now - 3.5 + step / 2}
        fh.write(json.dumps(record) + "\n")
entry = {"time": now, "path": "spare-admitted", "failed_ranks": [1], "generation": 1, "resumed_step": 2,
         "source": "storage", "total_s": 1.5, "trigger": "rank 1 exited with code -9 \x1b[2J" + secret,
         "phases_s": {"detect": 0.1, "abort": 0.2, "admit": 0.1, "load": 0.8, "first_step": 0.4}, "host": "node-a",
         "lost": [{"rank": 1, "pid": 2**22 + 1, "exit_code": -9, "last_beat": now - 1.9}],
         "beats": {"0": now - 1.6, "1": now - 1.9}}
with open(f"{run_dir}/recoveries.jsonl", "a") as fh:  # sealed as the supervisor trainops launched seals it
    fh.write(RecoveryEntry.model_validate(entry).sealed(key).model_dump_json() + "\n")
"""


def test_an_in_process_recovery_of_a_job_that_went_on_is_recorded_once_with_its_cause(workspace):
    run_dir = workspace / "runs" / "r-recovered"
    run_dir.mkdir(parents=True)
    key = run_key(run_dir, create=True).hex()  # the job stands in for the supervisor: it gets the run's key
    spec = {"name": "r-recovered", "command": [sys.executable, "-c", RECOVERING, str(run_dir), SECRET, key],
            "run_dir": str(run_dir)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id
    assert call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR).state == "completed"
    call("job_status", {"job_id": job}, OPERATOR)
    call("job_status", {"job_id": job}, OPERATOR)  # observed again: still one record

    [rec] = call("list_interruptions", {"job_id": job}).interruptions
    assert rec.id.endswith("#gen1") and rec.ended_at is None and not rec.drill and rec.cause == "unclassified"
    assert "rank 1 ended without an exit note (the launcher reports rank 1 exit -9)" in rec.cause_reason
    assert "rank(s) [0] lived" in rec.cause_reason and "node-a" in rec.cause_reason
    assert rec.steps_lost == 1 and rec.lost.redo_s == 0.5 and rec.lost.restart_s == 1.5  # step 3 redone from 2
    assert rec.lost.detection_s == pytest.approx(0.5, abs=0.01)  # the last step (now - 2) to the detection
    assert SECRET not in rec.model_dump_json() and "\x1b" not in rec.evidence.reason


@pytest.mark.parametrize("ages, named", [
    ({0: 0.054, 1: 0.054}, None),  # a cancel stopped both ranks at one step: neither is "the" failing rank
    ({0: 0.3, 1: 0.9}, None),      # within a step or so of each other: still no rank to name
    ({0: 0.2, 1: 7.5}, 1),         # rank 1 stopped beating seconds before rank 0: it stalled first
    ({0: 4.0}, 0),                 # one rank: it is the job
])
def test_a_failing_rank_is_named_from_heartbeats_only_when_one_clearly_stopped_first(workspace, ages, named):
    run_dir = workspace / "runs" / "run-beats"
    (run_dir / "heartbeat").mkdir(parents=True)
    ended = 1_800_000_000.0
    for rank, age in ages.items():
        RunFiles(run_dir).heartbeat(rank).write_text(json.dumps({"step": 3, "time": ended - age, "host": "vm"}))
    status = JobStatus(job_id="j1", backend="local", state="cancelled", ended_at=ended, run_dir=str(run_dir),
                       nodes=["vm"])
    ev = gather(status)
    assert ev.failing_rank == named and ev.failing_node == ("vm" if named is not None else None)


@pytest.mark.parametrize("run_status, written_after_start, clean", [
    ("ok", True, True),     # every rank finished and the run said so during this launch: a teardown wart
    ("ok", False, False),   # an ok status left by an earlier launch proves nothing about this one
    ("failed", True, False),
    (None, True, False),    # no word from the run: the scheduler's signal stands
])
def test_a_completed_job_with_a_signal_is_clean_only_when_its_run_finished_ok_in_this_launch(
        workspace, run_status, written_after_start, clean):
    run_dir = workspace / "runs" / "run-teardown"
    run_dir.mkdir(parents=True)
    started = time.time() - 60
    if run_status is not None:
        RunFiles(run_dir).status.write_text(json.dumps({"run_dir": str(run_dir), "status": run_status,
                                                        "exit_code": 0 if run_status == "ok" else 1}))
        stamp = started + (30 if written_after_start else -30)
        os.utime(RunFiles(run_dir).status, (stamp, stamp))
    status = JobStatus(job_id="7", backend="slurm", state="completed", exit_code=-9, started_at=started,
                       ended_at=started + 50, run_dir=str(run_dir))
    assert is_clean(status) is clean
    assert (record_job_end(status, "slurm") is None) is clean


def test_a_job_whose_ranks_all_ran_on_is_placed_on_the_one_node_the_scheduler_lost(workspace):
    run_dir = workspace / "runs" / "run-partition"
    (run_dir / "heartbeat").mkdir(parents=True)
    ended = 1_800_000_000.0
    for rank, host in ((0, "n1"), (1, "n2")):
        RunFiles(run_dir).heartbeat(rank).write_text(json.dumps({"step": 6, "time": ended - 0.2, "host": host}))
    status = JobStatus(job_id="5", backend="slurm", state="cancelled", ended_at=ended, run_dir=str(run_dir),
                       nodes=["n1", "n2"])
    ev = gather(status, node_states={"n1": "idle", "n2": "idle+completing+not_responding"},
                ranks_at_end={0: "running", 1: "running"})
    assert (ev.failing_node, ev.failing_rank) == ("n2", 1)
    assert diagnose(ev).cause == "network"  # its rank still ran: unreachable, not dead


TWO_RANKS = r"""
import json, os, sys, time
run_dir = sys.argv[1]
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
with open(f"{run_dir}/metrics.jsonl", "a") as fh:
    for step in (1, 2, 3):
        fh.write(json.dumps({"step": step, "rank": 0, "loss": 1.0, "step_time_s": 0.01, "time": time.time()}) + "\n")
for rank, host in ((0, "n1"), (1, "n2")):
    with open(f"{run_dir}/heartbeat/rank{rank}.json", "w") as fh:
        json.dump({"step": 3, "time": time.time(), "pid": os.getpid(), "host": host}, fh)
time.sleep(60)
"""


def test_an_end_recorded_after_the_restart_reads_the_run_as_it_was_when_trainops_ended_the_job(workspace):
    """Slurm holds a job with a lost node COMPLETING, so a drill records its end only after the requeue
    went in under a new id; by then the new launch has rewritten rank 1's heartbeat from the spare node
    and logged later steps. The record must still read rank 1's beat as it was (host n2, not n3: on the one
    local node both are the job's word, quoted), and end at step 3."""
    run_dir = workspace / "runs" / "r-moved"
    run_dir.mkdir(parents=True)
    spec = {"name": "r-moved", "command": [sys.executable, "-c", TWO_RANKS, str(run_dir)], "run_dir": str(run_dir)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id
    files = RunFiles(run_dir)
    deadline = time.monotonic() + 30
    while not files.heartbeat(1).is_file():
        assert time.monotonic() < deadline, "the job never wrote its heartbeats"
        time.sleep(0.05)
    witness(job, "local", str(run_dir), drill=True)
    time.sleep(1.5)  # the restart: a new launch of the same run, on the spare node n3, resumed from step 2
    files.heartbeat(1).write_text(json.dumps({"step": 9, "time": time.time(), "host": "n3"}))
    with files.metrics.open("a") as fh:
        for step in range(3, 10):
            row = {"step": step, "rank": 0, "loss": 1.0, "step_time_s": 0.01, "time": time.time()}
            fh.write(json.dumps(row) + "\n")
    call("cancel_job", {"job_id": job, "force": True}, OPERATOR)
    rec = call("list_interruptions", {}, OPERATOR).interruptions[0]
    assert rec.evidence.rank_nodes == {0: socket.gethostname(), 1: socket.gethostname()}
    quoted = " ".join(rec.evidence.not_taken)
    assert "'n2'" in quoted and "'n3'" not in quoted, quoted
    assert rec.evidence.last_step == 3 and rec.evidence.heartbeat_age_s.keys() == {0, 1}


SECOND_LAUNCH = r"""
import json, os, sys, time
from trainops.run_folder import open_rank_log
run_dir = sys.argv[1]
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
with open_rank_log(run_dir, 0) as log:  # this launch's own lines: no error
    log.write("step 7\n")
with open(f"{run_dir}/heartbeat/rank0.json", "w") as fh:
    json.dump({"step": 7, "time": time.time(), "pid": os.getpid(), "host": "node-a"}, fh)
sys.exit(1)
"""


def test_a_launchs_record_quotes_only_its_own_rank_log_lines_not_an_earlier_attempts(workspace):
    """Rank logs are appended across requeues: the end of a second launch must not quote the first's error."""
    run_dir = workspace / "runs" / "r-again"
    (run_dir / "logs").mkdir(parents=True)
    with open_rank_log(run_dir, 0) as log:  # the first launch, which failed with its own error
        log.write("Traceback (most recent call last):\nValueError: the first attempt's batch 3 had no tokens\n")
    spec = {"name": "r-again", "command": [sys.executable, "-c", SECOND_LAUNCH, str(run_dir)], "run_dir": str(run_dir)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR)
    assert "first attempt" in RunFiles(run_dir).rank_log(0).read_text()
    rec = call("list_interruptions", {}, OPERATOR).interruptions[0]
    assert not any("first attempt" in line for line in rec.evidence.error_lines), rec.evidence.error_lines
    assert rec.cause != "software", rec.cause_reason  # no exception of this launch's


def test_a_job_log_appended_across_requeues_gives_the_record_only_the_ending_launchs_lines(workspace):
    ended = 1_800_000_000.0
    job_log = (launch_mark("job", f"{ended - 100:.3f}") + "ConnectionResetError: [Errno 104] peer reset\n"
               + launch_mark("job", f"{ended - 20:.9f}") + "step 9\nValueError: bad batch\n"
               + launch_mark("job", f"{ended + 50:.3f}") + "a later launch's line\n")
    status = JobStatus(job_id="9", backend="slurm", state="failed", exit_code=1, ended_at=ended)
    ev = gather(status, job_log=job_log)
    assert ev.error_lines == ["job log: ValueError: bad batch"]
    assert diagnose(ev).cause == "software"  # not the first attempt's network error


@pytest.mark.parametrize(("state", "reason", "sub"), [("cancelled", "PREEMPTED: None", "preemption"),
                                                      ("failed", "TIMEOUT: TimeLimit", "time-limit"),
                                                      ("cancelled", "CANCELLED: None", "cancelled")])
def test_a_quiet_job_the_scheduler_ended_gets_the_end_its_state_names(workspace, state, reason, sub):
    """Slurm calls a preempted job cancelled: with no line in its log (slurmstepd's unread), a healthy
    preempted job was read as an operator's cancel. Only the operator's stays out of the unplanned count."""
    now = time.time()
    status = JobStatus(job_id="7", backend="slurm", state=state, reason=reason, started_at=now - 30, ended_at=now)
    rec = record_job_end(status, "slurm", job_log="")
    assert (rec.cause, rec.sub_cause, rec.confidence) == ("planned", sub, "high"), rec.cause_reason
    assert rec.planned == (sub == "cancelled") and ("operator" in rec.cause_reason) == (sub == "cancelled")

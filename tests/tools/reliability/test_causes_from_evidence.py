"""Causes from evidence (issue 25, item 2): every real fault the project can make here is run for
real and its interruption record gets the cause its evidence supports, with the reason citing that
evidence, never the drill's name or the faults.jsonl kind; a drill's result and the pack's cause
split are the record's; a drill's record carries its measured restart."""
from __future__ import annotations

import json
import sys

import pytest

from trainops.skills.drill.drill import DRILLS, drill
from trainops.skills.evidence.pack import assemble
from trainops.skills.request import JobRequest
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.interruptions import cause_distribution, read_interruptions

pytestmark = pytest.mark.usefixtures("as_operator")
OPERATOR = CallContext(actor="operator")
DRILL_JOB = ["training.steps=12", "training.seq_len=64", "training.global_batch=8", "training.micro_batch=4",
             "checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.mode=async", "checkpoint.keep=50"]

# fault -> (the cause its evidence supports, phrases the reason must cite)
EXPECTED = {
    "crash": ("unclassified", ["rank 1", "without an exit note", "peers ran on", "no OOM kill"]),
    "node-loss": ("unclassified", ["every rank", "without an exit note", "node", "up"]),
    "hang": ("hung-peer", ["rank 1 did not arrive", "heartbeat stalled", "process lived", "no error line"]),
    "nan": ("unclassified", ["non-finite loss at step 5", "did not recur", "replayed"]),
    "bitflip": ("hardware", ["replica checksums disagree", "silent data corruption"]),
    "checkpoint-corruption": ("unclassified", ["rank 1", "peers ran on", "failed verification"]),
}


def _drill_record(fault: str, *extra: str):
    result, _row = drill(JobRequest(overrides=[*DRILL_JOB, *extra], timeout_s=300), fault)
    records = [r for r in read_interruptions() if r.run_dir == result.run_dir]
    assert len(records) == 1, [(r.id, r.cause, r.cause_reason) for r in records]  # the restart finished clean
    return result, records[0]


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(EXPECTED))
def test_each_real_fault_is_recorded_with_the_cause_its_evidence_supports(workspace, fault):
    result, rec = _drill_record(fault)
    cause, cited = EXPECTED[fault]
    assert rec.drill and not rec.planned
    assert rec.cause == cause and [c for c in cited if c not in rec.cause_reason] == [], rec.cause_reason
    assert fault not in rec.cause_reason and DRILLS[fault] not in rec.cause_reason  # never the drill's own words
    if fault == "checkpoint-corruption":  # what the restart found is in the record, its cause still the end's
        assert rec.evidence.corrupt_checkpoints and "skipped corrupt step" in result.detector
    assert (result.cause, result.interruption_id) == (rec.cause, rec.id)
    # the drill completed its record with the restart it measured (one record, rewritten in place)
    assert rec.lost.restart_s > 0 and rec.lost.detection_s == pytest.approx(result.detection_latency_s, abs=1e-6)
    assert rec.lost.isolation_s + rec.lost.restart_s == pytest.approx(result.recovery_time_s, abs=1e-3)
    pack = assemble("p-causes", None, None, [], [result], [])
    assert pack.fault_tolerance.cause_distribution == cause_distribution([rec])


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_an_in_process_recovery_is_recorded_with_the_cause_its_evidence_supports(workspace, fault):
    """The job never ends, yet the lost rank is an interruption: the supervisor's evidence (its child's
    exit status, or a rank hung past the collective timeout) gives the same cause as a requeue's."""
    result, rec = _drill_record(fault, "resilience.in_process_restart=true", "resilience.collective_timeout_s=5")
    cause, cited = EXPECTED[fault]
    assert result.recovery_path == "spare-admitted" and rec.id.endswith("#gen1") and rec.ended_at is None
    assert rec.drill and rec.cause == cause and [c for c in cited if c not in rec.cause_reason] == [], (
        rec.drill, rec.cause, rec.cause_reason)  # once failed on a loaded host: these tell which part
    assert fault not in rec.cause_reason and DRILLS[fault] not in rec.cause_reason
    assert (result.cause, result.interruption_id) == (rec.cause, rec.id)
    assert rec.lost.restart_s > 0 and rec.time_lost_s >= rec.lost.isolation_s + rec.lost.restart_s
    pack = assemble("p-in-process", None, None, [], [result], [])
    assert pack.fault_tolerance.cause_distribution == cause_distribution([rec])


RANK = r"""
import json, os, sys, time
run_dir, err = sys.argv[1], sys.argv[2]
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
for step in (1, 2, 3):
    loss = float("nan") if step == 3 and err == "nan" else 1.0
    with open(f"{run_dir}/metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": step, "rank": 0, "loss": loss, "step_time_s": 0.01, "time": time.time()}) + "\n")
beat = {"step": 3, "time": time.time(), "pid": os.getpid(), "host": "node-a"}
if err != "nan":
    beat["exit"] = {"time": time.time(), "error": err}
with open(f"{run_dir}/heartbeat/rank0.json", "w") as fh:
    json.dump(beat, fh)
sys.exit(1)
"""


def _job(workspace, name: str, err: str, fault_kind: str | None = None) -> str:
    run_dir = workspace / "runs" / name
    run_dir.mkdir(parents=True)
    if fault_kind:  # what a drill tool leaves: it must not move the cause
        (run_dir / "faults.jsonl").write_text(json.dumps({"kind": fault_kind, "time": 1.0, "rank": 0}) + "\n")
    spec = {"name": name, "command": [sys.executable, "-c", RANK, str(run_dir), err], "run_dir": str(run_dir)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR)
    return job


def test_a_drill_name_or_fault_kind_cannot_change_the_cause(workspace):
    err = "RuntimeError: shape mismatch in layer 3"
    jobs = [_job(workspace, "drill-crash", err, "kill_rank"), _job(workspace, "drill-nan", err, "nan"),
            _job(workspace, "plain-run", err)]
    records = {r.job_id: r for r in read_interruptions()}
    assert [records[j].cause for j in jobs] == ["software"] * 3
    assert len({records[j].cause_reason for j in jobs}) == 1 and "RuntimeError" in records[jobs[0]].cause_reason
    assert [records[j].drill for j in jobs] == [False] * 3  # a faults.jsonl the job could write marks nothing
    assert all(isinstance(kind, str) for kind in DRILLS.values())  # kind -> inject kind, no cause label


def test_a_nan_that_recurs_when_the_requeued_job_replays_its_step_is_data(workspace):
    job = _job(workspace, "nan-run", "nan")
    first = read_interruptions(job)
    assert [r.cause for r in first] == ["unclassified"] and "not replayed" in first[0].cause_reason
    call("requeue_job", {"job_id": job}, OPERATOR)
    call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR)
    records = read_interruptions(job)
    assert len(records) == 2 and len({r.id for r in records}) == 2  # one record per job end, the requeue's too
    assert records[1].cause == "data", records[1].cause_reason
    assert "step 3" in records[1].cause_reason and "recurs" in records[1].cause_reason

"""Numbers from a job are untrusted input (issue 41, class 4). Real jobs the local scheduler runs
write hostile figures into their run folder (and one into its own scheduler record): a step time of
1e308, a year's step time, steps that never were, beats from 1970. Every job end is still recorded,
its time lost bounded by the job's wall clock and marked with what was not taken as written; the
restart budget counts every end; `watch_job` and `trainops ettr` answer with a bounded series; and
`trainops ettr --window 1e-9` is one error naming the flag and its floor."""
from __future__ import annotations

import json
import sys
import time

import pytest
from typer.testing import CliRunner

from trainops.agents.action_policy import MAX_RESTARTS, refusal
from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.ettr import MAX_WINDOWS
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.schedulers import get_scheduler

OPERATOR = CallContext(actor="operator")
HOSTILE = r"""
import json, os, sys, time
from pathlib import Path
run, step_time = Path(sys.argv[1]), float(sys.argv[2])
when = time.time() if sys.argv[3] == "now" else float(sys.argv[3])
(run / "heartbeat").mkdir(parents=True, exist_ok=True)
with open(run / "metrics.jsonl", "a") as fh:
    for step in (1, 2, 10**12):
        fh.write(json.dumps({"step": step, "rank": 0, "loss": 1.0, "step_time_s": step_time, "time": when}) + "\n")
(run / "heartbeat" / "rank0.json").write_text(json.dumps({"step": 10**12, "time": when, "host": "node-a"}))
for record in Path(sys.argv[4]).glob("*.json") if len(sys.argv) > 4 else ():
    data = json.loads(record.read_text())  # the job rewrites its own scheduler record: it started in 1970
    if data["spec"].get("run_dir") == str(run):
        record.write_text(json.dumps({**data, "started_at": 1.0, "submitted_at": 1.0}))
sys.exit(1)
"""


def hostile_job(workspace, name: str, step_time: str, when: str, *, forge_start: bool = False) -> str:
    run = workspace / "runs" / name
    run.mkdir(parents=True)
    command = [sys.executable, "-c", HOSTILE, str(run), step_time, when]
    if forge_start:
        command.append(str(workspace / "jobs"))
    job = call("submit_job", {"spec": {"name": name, "command": command, "run_dir": str(run)}}, OPERATOR).handle.job_id
    assert call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR).state == "failed"
    return job


def test_a_step_time_of_1e308_still_records_every_end_and_spends_the_restart_budget(workspace):
    job = hostile_job(workspace, "r-1e308", "1e308", "now")
    for _ in range(MAX_RESTARTS):
        get_scheduler("local").requeue(job)
        assert call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR).state == "failed"
    records = read_interruptions(job)
    assert len(records) == MAX_RESTARTS + 1, [r.id for r in records]
    for rec in records:
        wall_s = rec.ended_at - rec.started_at
        assert rec.lost.redo_s <= wall_s and rec.time_lost_s <= wall_s + rec.lost.detection_s, rec.lost
        assert any("step_time_s=" in note and "not used" in note for note in rec.evidence.not_taken), rec.evidence
    assert "restart budget spent" in (refusal("requeue_job", {"job_id": job}) or "")


@pytest.mark.timeout(120)
def test_absurd_finite_figures_are_bounded_by_the_wall_clock_and_a_forged_start_by_the_window_cap(workspace):
    job = hostile_job(workspace, "r-absurd", "31536000", "1.0")  # a year a step, step 10^12, beats from 1970
    rec = read_interruptions(job)[0]
    assert rec.lost.redo_s <= rec.ended_at - rec.started_at, rec.lost
    assert rec.lost.detection_s <= rec.detected_at - rec.started_at, rec.lost
    notes = " ".join(rec.evidence.not_taken)
    assert "step_time_s=3.1536e+07" in notes and "last_progress_time=1.000" in notes, notes
    # the scheduler's record is the job's to rewrite too (it "started" in 1970): the record then spans 56 years
    hostile_job(workspace, "r-forged", "0.1", "now", forge_start=True)
    watched = call("watch_job", {"job_id": job, "ettr_window_s": 60, "timeout_s": 5}, OPERATOR)
    assert watched.ended and watched.state == "failed"
    assert len(watched.signals.ettr_history_pct) <= MAX_WINDOWS
    result = CliRunner().invoke(app, ["ettr", "--window", "60", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert len(out["windows"]) <= MAX_WINDOWS and out["windows_left_out"] > 0, out["reliability"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("window", ["1e-9", "0.001"])
def test_ettr_with_a_window_finer_than_its_floor_is_one_error_naming_the_flag(workspace, window):
    hostile_job(workspace, "r-plain", "0.1", "now")
    result = CliRunner().invoke(app, ["ettr", "--window", window])
    assert result.exit_code == 2, result.output
    assert "--window" in result.output and "at least" in result.output and "Traceback" not in result.output


SAVES = ("import json, sys, time; open(sys.argv[1] + '/checkpoints.jsonl', 'w').write(json.dumps({'event': 'save', "
         "'step': 1, 'time': time.time(), 'stall_s': float(sys.argv[2])}) + '\\n'); time.sleep(3)")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stall_s", ["-1", "nan", "1e300"])
def test_a_checkpoint_stall_the_job_made_up_neither_silences_watch_job_nor_fires_r_esc_4(workspace, stall_s):
    run = workspace / "runs" / "r-saves"
    run.mkdir(parents=True)
    spec = {"name": "saves", "command": [sys.executable, "-c", SAVES, str(run), stall_s], "run_dir": str(run)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id
    while not (run / "checkpoints.jsonl").exists():
        time.sleep(0.05)
    watched = call("watch_job", {"job_id": job, "timeout_s": 0.5}, OPERATOR)
    assert "R-ESC-4" not in [f.rule_id for f in watched.fired] and watched.signals.checkpoint_save_s is None
    if stall_s == "1e300":
        assert any("checkpoint_save_s=1e+300" in note for note in watched.not_taken), watched.not_taken

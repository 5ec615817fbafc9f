"""A drill reports the recovery path its job took and each phase of it, read from the run's own
records (issue 27 item 3): take a record away or make it disagree and the drill says it cannot
tell that phase, rather than a number; an in-process recovery is read from the trainer's
RUN/recoveries.jsonl, and a torn or edited line there is no recovery."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.record_keys import run_key
from trainops.run_folder import RunFiles
from trainops.run_records import RecoveryEntry, read_journal, read_metrics, read_recoveries
from trainops.skills.drill.recovery import REQUEUE_PHASES, RecoveryMarks, in_process_recovery, requeue_recovery
from trainops.tools.calls import call

pytestmark = pytest.mark.usefixtures("as_operator")

CRASH_JOB = ["training.steps=14", "training.seq_len=64", "training.global_batch=8", "training.micro_batch=4",
             "checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.keep=50"]


def _crash_drill(*extra: str) -> dict:
    """A crash drill through the command, its one result as `--json` prints it."""
    args = ["drill", "--fault", "crash", "--json", *[a for item in [*CRASH_JOB, *extra] for a in ("--set", item)]]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    parsed = json.loads(out.stdout)
    return parsed[0]


@pytest.mark.slow
def test_a_requeued_crash_reports_its_path_and_phases_from_the_records_and_cannot_tell_without_them(workspace):
    result = _crash_drill()
    run_dir = result["run_dir"]
    assert result["recovery_path"] == "requeue"
    phases = result["recovery_phases_s"]
    assert list(phases) == list(REQUEUE_PHASES) and None not in phases.values(), result["recovery_unknown"]

    record = json.loads(Path(result["drill_record"]).read_text())
    marks = RecoveryMarks.model_validate(record["recovery_marks"])
    load = next(e for e in read_journal(run_dir).loads if e.time > marks.requeued_at)
    first = next(m.time for m in read_metrics(run_dir) if m.rank == 0 and m.time > load.time)
    assert phases["load"] == pytest.approx(load.load_s, abs=1e-3)  # the journal's own figure
    assert phases["first_step"] == pytest.approx(first - load.time, abs=1e-3)
    assert phases["detect"] == pytest.approx(result["detection_latency_s"], abs=0.05)
    after_detection = sum(v for k, v in phases.items() if k != "detect")
    assert after_detection == pytest.approx(result["recovery_time_s"], abs=0.01)  # the phases add up to the total

    journal = RunFiles(run_dir).checkpoint_journal
    kept = [ln for ln in journal.read_text().splitlines() if json.loads(ln)["event"] != "load"]
    journal.write_text("".join(ln + "\n" for ln in kept))
    without_load = requeue_recovery(run_dir, marks)
    assert {k for k, v in without_load.phases_s.items() if v is None} == {"start", "load", "first_step"}
    assert without_load.total_s is None and any("checkpoints.jsonl" in why for why in without_load.unknown)

    no_end = requeue_recovery(run_dir, marks.model_copy(update={"ended_at": None}))
    assert no_end.phases_s["cancel"] is None and no_end.phases_s["submit"] is None
    backwards = requeue_recovery(run_dir, marks.model_copy(update={"started_at": marks.requeued_at - 5}))
    assert backwards.phases_s["queue"] is None  # a job that started before it was requeued: not a queue wait


@pytest.mark.slow
def test_with_in_process_restart_on_the_drill_neither_cancels_nor_requeues_and_reads_the_trainers_record(workspace):
    result = _crash_drill("resilience.in_process_restart=true", "resilience.collective_timeout_s=5")
    run_dir = result["run_dir"]
    entry = next(e for e in read_recoveries(run_dir) if e.time > result["injected_time"])
    assert result["recovery_path"] == entry.path and entry.path in ("in-process", "spare-admitted")
    assert result["recovery_phases_s"] == {k: entry.phases_s.get(k) for k in result["recovery_phases_s"]}
    assert result["recovery_time_s"] == entry.total_s and result["recovered_time"] == entry.time
    status = call("job_status", {"job_id": result["job_id"]})
    assert status.state == "completed" and status.started_at < result["injected_time"]  # the one launch, never requeued
    # nothing was cancelled, but the lost rank is an interruption: one record, the supervisor's evidence
    [record] = call("list_interruptions", {"job_id": result["job_id"]}).interruptions
    assert record.id.endswith("#gen1") and record.ended_at is None and record.drill
    assert (result["interruption_id"], result["cause"]) == (record.id, record.cause) == (record.id, "unclassified")
    assert "rank 1 ended without an exit note" in record.cause_reason and "exit -9" in record.cause_reason
    assert record.evidence.state == "RECOVERED_IN_PROCESS" and record.evidence.rank_exit_codes == {1: -9}
    assert record.lost.isolation_s + record.lost.restart_s == pytest.approx(entry.total_s, abs=1e-3)
    after = [m for m in read_metrics(run_dir) if m.rank == 0 and m.time > entry.time]
    assert after and after[-1].step == 14 and min(m.step for m in after) > entry.resumed_step


def test_an_in_process_recovery_is_read_from_the_trainers_record_and_an_edited_line_is_none(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    entry = RecoveryEntry(time=1010.0, path="in-process", failed_ranks=[1], trigger="rank 1 exited with code -9",
                          generation=1, resumed_step=4, source="storage", checkpoint=str(run_dir / "step-4"),
                          phases_s={"detect": 0.1, "abort": 0.2, "admit": 0.3, "load": 0.4}, total_s=1.5)
    RunFiles(run_dir).recoveries.write_text(entry.model_dump_json() + "\n")  # as a job writes it: not read
    assert in_process_recovery(str(run_dir), since=1000.0) is None
    entry = entry.sealed(run_key(run_dir, create=True))  # as the supervisor trainops launched writes it
    RunFiles(run_dir).recoveries.write_text(entry.model_dump_json() + "\n")

    found = in_process_recovery(str(run_dir), since=1000.0)
    assert found.path == "in-process" and found.total_s == 1.5 and found.resumed_step == 4
    assert found.phases_s["first_step"] is None and any(w.startswith("first_step") for w in found.unknown)
    assert in_process_recovery(str(run_dir), since=1011.0) is None  # only a recovery after the fault counts

    RunFiles(run_dir).recoveries.write_text(entry.model_dump_json()[:-9] + "\n")  # torn
    assert in_process_recovery(str(run_dir), since=1000.0) is None
    edited = json.loads(entry.model_dump_json()) | {"phases_s": {"reboot": 0.1}}
    RunFiles(run_dir).recoveries.write_text(json.dumps(edited) + "\n")
    assert in_process_recovery(str(run_dir), since=1000.0) is None  # a phase no trainer writes

"""Effective training time as a series (issue 25, item 3), from a real interruption record: the
jobs are real local-scheduler jobs (a few lines of Python standing in for a rank that trains, goes
silent and fails), recorded through the job-status path every observer uses. Each window's
productive time is its wall time less the time lost in it (detection + isolation + restart +
steps redone), per job and over every job; `trainops ettr` gives the same with a plot, and S2's
baseline states the interruption rate, MTBF and recovery time from the record."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.ettr import ettr_series
from trainops.tools.reliability.interruptions import read_interruptions

OPERATOR = CallContext(actor="operator")
STEPS, STEP_S = 5, 0.2

RANK = r"""
import json, os, sys, time
run_dir, steps, step_s, silent_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
os.makedirs(f"{run_dir}/logs", exist_ok=True)
beat = {"pid": os.getpid(), "host": "node-a"}
for step in range(1, steps + 1):
    time.sleep(step_s)
    now = time.time()
    with open(f"{run_dir}/metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": step, "rank": 0, "loss": 1.0, "step_time_s": step_s, "time": now}) + "\n")
    beat.update(step=step, time=now)
    with open(f"{run_dir}/heartbeat/rank0.json", "w") as fh:
        json.dump(beat, fh)
time.sleep(silent_s)  # stalled: no step, no beat, until the error ends it
err = f"ValueError: batch {steps + 1} has no tokens"
beat["exit"] = {"time": time.time(), "error": err}
with open(f"{run_dir}/logs/rank0.log", "w") as fh:
    fh.write(f"step {steps}\nTraceback (most recent call last):\n{err}\n")
with open(f"{run_dir}/heartbeat/rank0.json", "w") as fh:
    json.dump(beat, fh)
sys.exit(1)
"""


def failing_job(workspace, name: str, silent_s: float) -> str:
    """A rank that trains STEPS steps, stalls `silent_s` and fails with a Python exception; waited for."""
    run_dir = workspace / "runs" / name
    run_dir.mkdir(parents=True)
    spec = {"name": name, "command": [sys.executable, "-c", RANK, str(run_dir), str(STEPS), str(STEP_S),
                                      str(silent_s)], "run_dir": str(run_dir)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR)
    return job


def lost_in(windows) -> float:
    return sum(w.wall_s - w.productive_s for w in windows)


@pytest.fixture
def two_failures(workspace):
    """Two real failing jobs in one workspace, the second stalled longer before it failed."""
    return failing_job(workspace, "short-stall", 0.3), failing_job(workspace, "long-stall", 1.5)


@pytest.mark.slow
def test_productive_time_is_wall_less_the_time_lost_per_job_and_overall(two_failures):
    records = {r.job_id: r for r in read_interruptions()}
    assert set(records) == set(two_failures)
    for job, silent_s in zip(two_failures, (0.3, 1.5), strict=True):
        rec = records[job]
        parts = rec.lost.detection_s + rec.lost.isolation_s + rec.lost.restart_s + rec.lost.redo_s
        assert rec.time_lost_s == pytest.approx(parts, abs=1e-3)
        assert rec.lost.redo_s == pytest.approx(STEPS * STEP_S)  # no checkpoint: every step is redone
        assert silent_s <= rec.lost.detection_s < silent_s + 5, rec.lost  # last beat -> the end was seen
        assert rec.steps_lost == STEPS and rec.cause == "software"
        per_job = ettr_series(0.5, job=job)
        assert lost_in(per_job) == pytest.approx(rec.time_lost_s, abs=0.01 * len(per_job))
        for w in per_job:
            assert w.productive_s == pytest.approx(w.ettr_pct * w.wall_s / 100, abs=2e-3)  # figures rounded
            assert 0 <= w.productive_s <= w.wall_s
    overall = ettr_series(0.5)
    assert overall[0].start <= min(r.started_at for r in records.values())
    assert lost_in(overall) == pytest.approx(sum(r.time_lost_s for r in records.values()), abs=0.01 * len(overall))
    assert sum(w.wall_s for w in overall) == pytest.approx(overall[-1].end - overall[0].start, abs=0.01)
    assert min(w.ettr_pct for w in overall) < 100  # the stalls show in the windows they fell in


@pytest.mark.slow
def test_trainops_ettr_json_gives_the_series_and_a_png(two_failures, workspace):
    result = CliRunner().invoke(app, ["ettr", "--window", "0.5", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    windows = ettr_series(0.5)
    assert [w["ettr_pct"] for w in out["windows"]] == [w.ettr_pct for w in windows]
    assert out["reliability"]["unplanned"] == 2 and out["reliability"]["cause_distribution"]["software"] == 2
    assert out["reliability"]["mtbf_source"].startswith("measured from 2")
    plot = workspace / "ettr.png"
    assert out["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one = json.loads(CliRunner().invoke(app, ["ettr", "--window", "0.5", "--job", two_failures[1], "--json"]).stdout)
    assert [w["ettr_pct"] for w in one["windows"]] == [w.ettr_pct for w in ettr_series(0.5, job=two_failures[1])]
    assert one["reliability"]["unplanned"] == 1 and one["reliability"]["mtbf_source"].startswith("assumed default")


@pytest.mark.parametrize("window", ["0", "-5", "nan", "1e9"])
def test_a_bad_window_is_refused_naming_the_field(workspace, window):
    result = CliRunner().invoke(app, ["ettr", "--window", window, "--json"])
    assert result.exit_code != 0
    assert "--window" in result.output and "positive number of seconds" in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (workspace / "ettr.png").exists()


@pytest.mark.slow
def test_the_quick_sop_states_s2_reliability_and_plans_checkpoints_on_its_mtbf(quick_sop):
    """The SOP reads the record at S2 (fresh workspace: too short, and no --mtbf-h, so the assumed
    default MTBF, labelled so and never "declared") and its checkpoint plan uses that MTBF with its
    source as the basis."""
    pack = json.loads((Path(quick_sop["pack_dir"]) / "evidence.json").read_text())
    rel, plan = pack["baseline"]["reliability"], pack["checkpoint_plan"]
    assert rel["mtbf_measured"] is False and rel["mtbf_source"].startswith("assumed default of 24 h, set with --mtbf-h")
    assert plan["mtbf_h"] == rel["mtbf_h"] == 24.0 and "not measured" in plan["mtbf_basis"]
    assert rel["ettr_window_s"] == 3600.0
    report = (Path(quick_sop["pack_dir"]) / "report.md").read_text()
    assert "**Reliability**" in report and "assumed default of 24 h, set with --mtbf-h" in report
    assert "declared by the operator" not in report

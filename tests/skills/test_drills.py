"""Drills beyond process faults: a NaN loss and a flipped bit (silent data corruption) are
detected, the job restarts from a good checkpoint and completes; a straggler is detected and
isolated to its node, its recovery reported as needing a spare node (one node here)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.run_records import LoadEntry
from trainops.skills.drill.drill import DRILLS, DetectionOnlyResult, drill
from trainops.skills.drill.restart import verify_restored
from trainops.skills.evidence.model import DrillResult
from trainops.skills.request import JobRequest
from trainops.tools.calls import call

pytestmark = pytest.mark.usefixtures("as_operator")

DRILL_JOB = ["training.steps=12", "training.seq_len=64", "training.global_batch=8", "training.micro_batch=4",
             "checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.mode=async", "checkpoint.keep=50"]


def test_drill_help_lists_every_fault_kind():
    result = CliRunner().invoke(app, ["drill", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    assert [kind for kind in DRILLS if kind not in result.stdout] == []


def test_quarantine_moves_the_checkpoints_taken_at_or_after_the_corrupted_step(workspace):
    run_dir = workspace / "runs" / "sdc"
    for step in (2, 4, 6):
        folder = run_dir / "checkpoints" / f"step-{step:08d}"
        folder.mkdir(parents=True)
        (folder / "COMMIT.json").write_text(json.dumps({"step": step, "time": float(step)}))
    assert call("quarantine_checkpoints", {"run": str(run_dir), "from_step": 4}).quarantined_steps == [4, 6]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000002"]
    assert sorted(p.name for p in (run_dir / "quarantine").iterdir()) == ["step-00000004", "step-00000006"]


@pytest.mark.slow
@pytest.mark.parametrize("fault, mechanism, isolation", [("nan", "loss_anomaly", "job"),
                                                         ("bitflip", "checksum_mismatch", "replica_group")])
def test_a_numeric_fault_is_detected_and_the_restarted_job_completes(workspace, fault, mechanism, isolation):
    result, row = drill(JobRequest(overrides=DRILL_JOB, timeout_s=300), fault)
    assert isinstance(result, DrillResult)
    assert (result.isolation_granularity, result.detector.split(":")[0]) == (isolation, mechanism)
    assert result.injected_at_step == 5 and result.async_checkpoint_intact
    assert int(Path(result.checkpoint_used).name.split("-")[1]) <= 4  # a checkpoint from before the fault
    assert 0 <= result.detection_latency_s < 5 and result.recovery_time_s > 0
    assert Path(result.drill_record).is_file() and fault in row.value


@pytest.mark.slow
def test_a_straggler_is_detected_and_isolated_to_its_node_without_a_claimed_recovery(workspace):
    result, row = drill(JobRequest(overrides=DRILL_JOB, timeout_s=300), "straggler")
    assert isinstance(result, DetectionOnlyResult)
    assert (result.isolation_granularity, result.recovery) == ("node", "needs a spare node")
    assert result.detector.startswith("step_time_outlier") and "recovery not measured" in row.value


def test_a_restore_counts_as_intact_when_keep_n_pruned_the_checkpoint_the_trainer_verified_at_load(workspace):
    run_dir = workspace / "runs" / "pruned"
    run_dir.mkdir(parents=True)
    save = {"event": "save", "step": 4, "time": 1.0}
    (run_dir / "checkpoints.jsonl").write_text(json.dumps(save) + "\n")
    gone = str(run_dir / "checkpoints" / "step-00000004")
    assert verify_restored(str(run_dir), LoadEntry(event="load", step=4, path=gone, verified=True, time=2.0))
    assert not verify_restored(str(run_dir), LoadEntry(event="load", step=4, path=gone, time=2.0))
    assert not verify_restored(str(run_dir), LoadEntry(event="load", step=2, path=gone, verified=True, time=2.0))

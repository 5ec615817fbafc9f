"""Checkpoints under torchrun (2 gloo processes, FSDP2): resume equivalence for sync and
background writes, and fallback past a corrupt newest checkpoint, both against an uninterrupted run.

A run is stopped by ending it at step 4 and relaunched with steps=8. `training.min_lr_ratio=1`
keeps the learning rate flat after warm-up, so the schedule does not depend on the total step
count and the two halves must reproduce the straight run's losses exactly (same layout, same
gloo reduction order: bit-for-bit, no tolerance needed).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainops.run_records import read_metrics
from trainops.tools.context import CallContext
from trainops.tools.jobs.follow import launch_run, run_local
from trainops.trainer.checkpoint_files import list_checkpoints, step_dir_name
from trainops.trainer.config import load_config
from trainops.trainer.launch import RunResult

pytestmark = pytest.mark.slow

BASE = ["model.n_layers=2", "training.seq_len=32", "training.global_batch=8", "training.micro_batch=4",
        "training.min_lr_ratio=1", "training.steps=8"]
OPERATOR = CallContext(actor="operator")  # the test launches as an operator at a terminal would


def run(*overrides: str, run_id: str) -> RunResult:
    cfg = load_config(None, "tiny", BASE + list(overrides))
    return run_local(cfg, 2, run_id=run_id, ctx=OPERATOR, timeout_s=300)


def relaunch(result: RunResult, *overrides: str) -> RunResult:
    run_dir = Path(result.run_dir)
    cfg = load_config(run_dir / "config.toml", None, list(overrides))
    (run_dir / "config.toml").write_text(cfg.to_toml())
    return launch_run(run_dir, 2, ctx=OPERATOR, timeout_s=300)


def losses(result: RunResult) -> dict[tuple[int, int], float]:
    """(step, rank) -> loss; a relaunch's records replace the first run's for the same step."""
    return {(r.step, r.rank): r.loss for r in read_metrics(result.run_dir)}


def journal(result: RunResult) -> list[dict]:
    text = (Path(result.run_dir) / "checkpoints.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[tuple[int, int], float]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINOPS_HOME", str(tmp_path_factory.mktemp("straight-home")))
        result = run(run_id="straight")
    assert result.status == "ok", result.failure
    return losses(result)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_resume_reproduces_every_step_of_the_straight_run(straight, mode):
    first = run("training.steps=4", "checkpoint.enable=true", "checkpoint.interval=4",
                f"checkpoint.mode={mode}", run_id=mode)
    assert first.status == "ok" and first.steps_completed == 4
    resumed = relaunch(first, "training.steps=8")
    assert resumed.status == "ok" and resumed.steps_completed == 8
    assert [e["step"] for e in journal(resumed) if e["event"] == "load"] == [4]
    assert losses(resumed) == straight


def test_a_corrupt_newest_checkpoint_falls_back_and_still_matches_the_straight_run(straight):
    first = run("training.steps=4", "checkpoint.enable=true", "checkpoint.interval=2",
                "checkpoint.mode=async_pinned", "faults.corrupt_checkpoint=true", run_id="corrupt")
    assert first.status == "ok"
    folder = Path(first.run_dir) / "checkpoints"
    assert [i.step for i in list_checkpoints(folder) if i.committed] == [2, 4]

    resumed = relaunch(first, "training.steps=8", "faults.corrupt_checkpoint=false")

    assert resumed.status == "ok" and resumed.steps_completed == 8
    events = [(e["event"], e["step"]) for e in journal(resumed) if e["event"] in ("fallback", "load")]
    assert events == [("fallback", 4), ("load", 2)]
    log = (Path(resumed.run_dir) / "logs" / "rank0.log").read_text()
    assert f"checkpoint {step_dir_name(4)} is corrupt: checksum mismatch" in log
    assert losses(resumed) == straight


def test_a_compiled_runs_checkpoint_resumes_in_an_eager_run(straight):
    """torch.compile wraps each block (`_orig_mod.` in its names); the checkpoint must not depend on
    it, as `training.compile=auto` compiles long runs and a resume or an export may run eager."""
    first = run("training.steps=4", "checkpoint.enable=true", "checkpoint.interval=4", "training.compile=true",
                run_id="compiled")
    assert first.status == "ok" and first.steps_completed == 4
    assert "transformer blocks compiled (training.compile=true)" in (
        Path(first.run_dir) / "logs" / "rank0.log").read_text()
    resumed = relaunch(first, "training.steps=8", "training.compile=false")
    assert resumed.status == "ok" and resumed.steps_completed == 8
    assert [e["step"] for e in journal(resumed) if e["event"] == "load"] == [4]
    # inductor's fused kernels round differently from eager: close to the straight run, not bit for bit
    assert losses(resumed) == pytest.approx(straight, rel=1e-4)

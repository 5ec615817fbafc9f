"""The training loop end to end under torchrun (gloo, CPU): it learns, layouts agree, and a
failure is a non-zero exit with a failed status."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from trainops.run_records import read_metrics
from trainops.tools.context import CallContext
from trainops.tools.jobs.follow import launch_run, run_local
from trainops.trainer.config import load_config
from trainops.trainer.launch import RunResult, torchrun_argv, trainer_program
from trainops.trainer.train import lr_lambda

TINY = ["training.seq_len=32", "training.global_batch=8", "training.micro_batch=4"]
OPERATOR = CallContext(actor="operator")  # the test launches as an operator at a terminal would


def _run(nproc: int, *overrides: str, run_id: str) -> tuple[RunResult, list[float]]:
    cfg = load_config(None, "tiny", TINY + list(overrides))
    result = run_local(cfg, nproc, run_id=run_id, ctx=OPERATOR, timeout_s=240)
    losses = [r.loss for r in sorted(read_metrics(result.run_dir), key=lambda r: r.step) if r.rank == 0]
    return result, losses


def test_learning_rate_warms_up_linearly_then_decays_to_the_floor():
    rates = [lr_lambda(step, warmup_steps=2, total_steps=10, min_lr_ratio=0.1) for step in range(12)]
    assert rates[0] < rates[1] < rates[2] == 1.0
    assert all(a >= b for a, b in zip(rates[2:], rates[3:], strict=False))
    assert rates[10] == pytest.approx(0.1) and rates[11] == pytest.approx(0.1)


def test_the_torchrun_command_is_standalone_on_one_node_and_rendezvous_across_nodes(tmp_path):
    single = torchrun_argv(sys.executable, 2, trainer_program(tmp_path))
    assert "--standalone" in single
    assert single[-4:] == ["-m", "trainops.trainer.train", "--run-dir", str(tmp_path)]
    multi = torchrun_argv(sys.executable, 4, trainer_program(tmp_path), nnodes=2, rdzv_endpoint="node0:29500")
    assert "--standalone" not in multi and "node0:29500" in multi and "c10d" in multi


@pytest.mark.slow
def test_loss_falls_on_the_tiny_preset():
    result, losses = _run(1, "training.steps=25", run_id="falls")
    assert result.status == "ok" and result.steps_completed == 25
    assert losses[-1] < losses[0] - 1.5, losses


@pytest.mark.slow
def test_one_process_ddp_and_fsdp2_follow_the_same_loss_trajectory():
    """Same seed, same weights, same global batch of the same samples (fp32). One process
    accumulates 2 micro-batches; DDP and FSDP2 each take one per rank and average gradients by
    all-reduce / reduce-scatter. Only the order of floating-point sums differs (~1e-7 relative
    per reduction, carried through a few AdamW steps), so the trajectories must agree to 1e-4
    absolute. Seen here: DDP bit-identical, FSDP2 within 2.4e-7 over 5 steps, so 1e-4 leaves
    ~400x headroom for other CPUs' summation orders, yet it is far below the 0.1-0.9 the loss
    moves per step: a wrong gradient scale or a rank seeing the wrong samples cannot pass."""
    steps = ["training.steps=5"]
    _, single = _run(1, *steps, run_id="single")
    _, ddp = _run(2, *steps, "parallel.data_parallel=ddp", run_id="ddp")
    _, fsdp = _run(2, *steps, "parallel.data_parallel=fsdp", run_id="fsdp")
    assert len(single) == len(ddp) == len(fsdp) == 5
    for other in (ddp, fsdp):
        assert max(abs(a - b) for a, b in zip(single, other, strict=True)) <= 1e-4, (single, other)


@pytest.mark.slow
def test_bf16_fsdp2_with_full_activation_checkpointing_and_zero2_resharding_trains():
    result, losses = _run(2, "training.steps=4", "training.precision=bf16",
                          "training.activation_checkpointing=full",
                          "parallel.reshard_after_forward=false", run_id="bf16")
    assert result.status == "ok" and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_with_a_failed_status():
    result, losses = _run(2, "training.steps=5", "faults.nan_step=2", run_id="nan")
    assert result.status == "failed" and result.exit_code != 0
    assert result.steps_completed == 2 and math.isnan(losses[-1])
    run_dir = Path(result.run_dir)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "loss is nan at step 2" in log
    assert result.failure.startswith("rank ") and "NonFiniteLoss: loss is nan at step 2" in result.failure


@pytest.mark.slow
def test_relaunching_a_crashed_run_resumes_from_its_checkpoint_to_the_straight_run_loss():
    """Crash rank 1 at step 5 with a checkpoint at step 3, clear the fault, launch the same run
    folder again: it loads step 3 and ends on exactly the loss of an uninterrupted run (same
    data position, RNG, optimizer and scheduler state)."""
    base = ["training.steps=6", "checkpoint.enable=true", "checkpoint.interval=3"]
    straight, _ = _run(2, *base, run_id="straight")
    crashed, _ = _run(2, *base, "faults.crash_step=5", "faults.crash_rank=1", run_id="crashed")
    assert crashed.status == "failed" and crashed.steps_completed == 4
    run_dir = Path(crashed.run_dir)
    cfg = load_config(run_dir / "config.toml", None, ["faults.crash_step=none"])
    (run_dir / "config.toml").write_text(cfg.to_toml())
    resumed = launch_run(run_dir, 2, ctx=OPERATOR, timeout_s=240)
    assert resumed.status == "ok" and resumed.steps_completed == 6
    assert resumed.final_loss == straight.final_loss


@pytest.mark.slow
def test_a_run_past_its_timeout_is_stopped_with_every_rank():
    cfg = load_config(None, "tiny", TINY + ["training.steps=50", "faults.hang_step=2", "faults.hang_rank=1"])
    result = run_local(cfg, 2, run_id="hung", ctx=OPERATOR, timeout_s=20)
    assert result.status == "failed" and result.exit_code != 0
    pids = [json.loads(beat.read_text())["pid"] for beat in (Path(result.run_dir) / "heartbeat").glob("*.json")]
    assert len(pids) == 2
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]

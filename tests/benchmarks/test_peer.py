"""The DeepSpeed comparison compares like with like: the same model size from both code bases,
the trainer's config built from the peer's constants, and the DeepSpeed arm runs as the suite runs it."""
from __future__ import annotations

import json

import pytest

from trainops.benchmarks.harness import iteration_times
from trainops.benchmarks.peer import TRAINER_SHAPE, deepspeed_step_time, hf_llama_parameters
from trainops.benchmarks.step_profile import breakdown
from trainops.benchmarks.suite import sop_time_breakdown
from trainops.run_records import MetricsRecord
from trainops.trainer.config import load_config
from trainops.trainer.model_args import count_parameters


def test_the_trainer_arm_trains_a_model_of_the_peers_size_and_batch():
    cfg = load_config(None, "tiny", TRAINER_SHAPE)
    assert count_parameters(cfg.model_args())["total"] == hf_llama_parameters()
    assert (cfg.training.micro_batch, cfg.training.global_batch, cfg.training.seq_len) == (4, 8, 256)
    assert (cfg.training.precision, cfg.data.kind) == ("fp32", "synthetic")


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_deepspeed_arm_trains_and_reports_its_step_time(workspace, compiled):
    assert 0 < deepspeed_step_time(2, steps=7, compiled=compiled) < 30


def test_the_sop_breakdown_accounts_for_every_second(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": step, "time": t}) + "\n"
                                                   for step, t in enumerate((103.0, 104.0, 105.0), 1)))
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "j1.json").write_text(json.dumps({"submitted_at": 100.0, "spec": {"run_dir": str(run_dir)}}))
    (tmp_path / "jobs" / "j1.exit").write_text(json.dumps({"ended_at": 106.0}))
    (tmp_path / "audit.jsonl").write_text(json.dumps({"kind": "tool_call", "tool": "declare_environment",
                                                      "elapsed_s": 1.5}) + "\n")
    parts = sop_time_breakdown(tmp_path, 98.0, 110.0)
    assert parts == {"environment declaration": 1.5, "job start-up": 3.0, "training steps": 2.0, "job end": 1.0,
                     "CLI, tools, plots, pack": 4.5}


def test_the_step_profile_puts_each_operator_under_its_outermost_known_ancestor(tmp_path):
    def op(name, ts, dur, tid=1):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid}

    events = [op("train_step#1", 0, 800), op("train_step#2", 1000, 800),
              op("aten::mm", 10, 500),  # compute
              op("FSDP::all_gather", 600, 100), op("aten::copy_", 610, 40),  # communication, its copy too
              op("Optimizer.step#AdamW.step", 710, 80), op("aten::mul", 720, 30),
              op("trainops::step_record", 850, 50),
              op("aten::mm", 0, 999, tid=2)]  # another thread: not the step's
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert breakdown(trace) == {"compute": 0.5, "communication": 0.1, "optimizer": 0.08, "clipping and duties": 0.05,
                                "Python between operators": 0.27}


def test_iteration_times_are_the_gaps_between_rank_zeros_records():
    records = [MetricsRecord(step=1, rank=0, time=10.0), MetricsRecord(step=1, rank=1, time=10.2),
               MetricsRecord(step=2, rank=0, time=10.5), MetricsRecord(step=3, rank=0, time=11.25)]
    assert iteration_times(records) == [0.5, 0.75]

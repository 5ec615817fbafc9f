"""The DeepSpeed comparison compares like with like: the same model size from both code bases,
the trainer's config built from the peer's constants, and the DeepSpeed arm runs as the suite runs it."""
from __future__ import annotations

import json

import pytest

from trainops.benchmarks.peer import TRAINER_SHAPE, deepspeed_step_time, hf_llama_parameters
from trainops.trainer.config import load_config
from trainops.trainer.model import count_parameters


def test_the_trainer_arm_trains_a_model_of_the_peers_size_and_batch():
    cfg = load_config(None, "tiny", TRAINER_SHAPE)
    assert count_parameters(cfg.model_args())["total"] == hf_llama_parameters()
    assert (cfg.training.micro_batch, cfg.training.global_batch, cfg.training.seq_len) == (4, 8, 256)
    assert (cfg.training.precision, cfg.data.kind) == ("fp32", "synthetic")


@pytest.mark.slow
def test_the_deepspeed_arm_trains_and_reports_its_step_time(workspace):
    assert 0 < deepspeed_step_time(2, steps=7) < 30


def test_the_sop_breakdown_accounts_for_every_second(tmp_path):
    from trainops.benchmarks.suite import sop_time_breakdown

    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"time": t}) + "\n" for t in (103.0, 104.0, 105.0)))
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "j1.json").write_text(json.dumps({"submitted_at": 100.0, "spec": {"run_dir": str(run_dir)}}))
    (tmp_path / "jobs" / "j1.exit").write_text(json.dumps({"ended_at": 106.0}))
    (tmp_path / "audit.jsonl").write_text(json.dumps({"kind": "tool_call", "tool": "declare_environment",
                                                      "elapsed_s": 1.5}) + "\n")
    parts = sop_time_breakdown(tmp_path, 98.0, 110.0)
    assert parts == {"environment declaration": 1.5, "job start-up": 3.0, "training steps": 2.0, "job end": 1.0,
                     "CLI, tools, plots, pack": 4.5}

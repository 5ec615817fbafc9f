"""The real trainer (`trainops train` -> torchrun -> trainops.trainer.train) runs pipeline and tensor
parallel layouts to the one-process loss (AdamW, grad clipping, LR schedule included).
Tolerance 1e-4 as in test_parallel.py; clipping needs the grad norm summed across stages, so a
pp rank that clipped by its own stage's norm alone would miss it."""
from __future__ import annotations

import pytest

from trainops.trainer.config import load_config
from trainops.trainer.launch import run_local

BASE = ["data.kind=synthetic", "training.steps=3", "training.seq_len=32", "training.global_batch=8",
        "training.micro_batch=2", "training.max_grad_norm=0.5"]


def final_loss(nproc: int, *overrides: str) -> float:
    result = run_local(load_config(None, "tiny", BASE + list(overrides)), nproc, show_progress=False, timeout_s=300)
    assert result.status == "ok", result.run_dir
    return result.final_loss


@pytest.fixture(scope="module")
def one_process() -> float:
    return final_loss(1)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [
    ("parallel.pp=2", "parallel.pp_schedule=1F1B"),
    ("parallel.pp=2", "parallel.pp_schedule=ZBVZeroBubble", "parallel.virtual_stages=2"),
    ("parallel.tp=2", "parallel.sequence_parallel=true"),
    ("parallel.tp=2",),
], ids=["pp2-1F1B", "pp2-ZBV", "tp2-sp", "tp2"])
def test_trainer_reaches_the_one_process_loss(one_process, layout):
    assert final_loss(2, *layout) == pytest.approx(one_process, abs=1e-4)

"""The real trainer (`trainops train` -> torchrun -> trainops.trainer.train) runs pipeline and tensor
parallel layouts to the one-process loss (AdamW, grad clipping, LR schedule included).
Tolerance 1e-4 as in test_parallel.py; clipping needs the grad norm summed across stages, so a
pp rank that clipped by its own stage's norm alone would miss it."""
from __future__ import annotations

import pytest
import torch

from trainops.run_records import read_metrics
from trainops.tools.context import CallContext
from trainops.tools.jobs.follow import run_local
from trainops.trainer.config import load_config
from trainops.trainer.parallelize import fsdp_units

BASE = ["data.kind=synthetic", "training.steps=3", "training.seq_len=32", "training.global_batch=8",
        "training.micro_batch=2", "training.max_grad_norm=0.5"]
OPERATOR = CallContext(actor="operator")  # the test launches as an operator at a terminal would


def final_loss(nproc: int, *overrides: str) -> float:
    result = run_local(load_config(None, "tiny", BASE + list(overrides)), nproc, ctx=OPERATOR, timeout_s=300)
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


@pytest.mark.slow
@pytest.mark.parametrize("nproc, layout", [
    (2, ("parallel.data_parallel=fsdp",)),
    (2, ("parallel.data_parallel=ddp",)),
    (4, ("parallel.data_parallel=fsdp", "parallel.dp_replicate=2", "parallel.dp_shard=2")),
], ids=["fsdp2", "ddp2", "hsdp2x2"])
def test_data_parallel_reaches_the_one_process_loss_and_grad_norm(workspace, nproc, layout):
    """The grad norm from FSDP2's local shards (summed over the shard dim only, under HSDP), the
    fused AdamW and the shared-memory collectives keep the one-process math. The norm is compared
    itself: AdamW all but undoes a wrong clipping scale, so the loss alone would not show one."""
    def curve(nproc: int, *overrides: str) -> list[float]:
        result = run_local(load_config(None, "tiny", BASE + list(overrides)), nproc, ctx=OPERATOR,
                           timeout_s=300)
        assert result.status == "ok", result.run_dir
        return [value for r in read_metrics(result.run_dir) if r.rank == 0 for value in (r.loss, r.grad_norm)]

    reference = curve(1)  # loss, grad norm, loss, grad norm, ...
    assert len(reference) == 6 and all(norm > 0.5 for norm in reference[1::2])  # every step clips
    assert curve(nproc, *layout) == pytest.approx(reference, rel=1e-4)


@pytest.mark.slow
def test_fsdp_units_change_the_collectives_not_the_math(workspace):
    """One FSDP2 unit per block (GPU default) and the whole model as one unit (CPU default) reduce
    the same gradients: every step's loss and grad norm agree to the last bit."""
    def curve(unit_params: str) -> list[tuple[float, float]]:
        cfg = load_config(None, "tiny", [*BASE, "training.steps=4", f"parallel.fsdp_unit_params={unit_params}"])
        result = run_local(cfg, 2, ctx=OPERATOR, timeout_s=300)
        assert result.status == "ok", result.run_dir
        return [(r.loss, r.grad_norm) for r in read_metrics(result.run_dir) if r.rank == 0]

    per_block, whole_model = curve("0"), curve("-1")
    assert len(per_block) == 4 and per_block == whole_model


def test_blocks_are_grouped_into_units_of_at_least_the_asked_size():
    blocks = [torch.nn.Linear(10, 10, bias=False) for _ in range(5)]  # 100 parameters each
    assert [len(u) for u in fsdp_units(blocks, 0)] == [1, 1, 1, 1, 1]
    assert [len(u) for u in fsdp_units(blocks, 200)] == [2, 2]  # the fifth block stays with the root
    assert fsdp_units(blocks, 10 ** 9) == []  # one unit: the root holds every block

"""A slow restore is not a hang (trainops.trainer.inprocess): the ranks of a new group generation
join it, build the model, load the checkpoint and run their first step at different speeds (a spare
admitted on a busy host, rank 0 verifying a large checkpoint while its peers wait in the broadcast
of its choice, a first step compiled cold). Only once every rank has done its first step does a
peer silent past `collective_timeout_s` count as hung; before that, a separately bounded restore
deadline holds. Two real worker processes run one generation through `_train_generation`, with a
stand-in for train() that is slow or hung where the test says."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from trainops.trainer.config import load_config
from trainops.trainer.launch import prepare_run

pytestmark = pytest.mark.slow  # two worker processes per test, each importing torch
COLLECTIVE_TIMEOUT_S = 3.0

RANK = r"""
import json, sys, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from trainops.trainer.inprocess import _train_generation

run_dir, port, rank, timeout_s = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
case = json.loads(sys.argv[5])
restore = {"restore_timeout_s": case["restore_timeout_s"]} if case["restore_timeout_s"] is not None else {}
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))


def restore_then_train(cfg, run_dir, rank, world, device, progress):
    if rank == 0:
        time.sleep(case["slow_restore_s"])  # verifying the newest checkpoint while rank 1 waits for its choice
    chosen = [str(run_dir / "checkpoints" / "step-00000002") if rank == 0 else None]
    dist.broadcast_object_list(chosen, src=0)
    progress("loaded", 2)
    dist.all_reduce(torch.ones(1))  # the first step
    progress("first_step", 3)
    if rank == 0:
        time.sleep(case["hang_s"])  # hung in the next step
    dist.all_reduce(torch.ones(1))


if rank == 1:
    time.sleep(case["join_late_s"])  # a spare admitted on a busy host, not yet scheduled
started = time.monotonic()
outcome, why = _train_generation(store, run_dir, rank, 2, 1, timeout_s, restore_then_train, **restore)
print(json.dumps({"outcome": outcome, "why": why, "elapsed_s": time.monotonic() - started}))
"""


def run_generation(slow_restore_s: float = 0.0, hang_s: float = 0.0, join_late_s: float = 0.0,
                   restore_timeout_s: float | None = None) -> list[dict]:
    """Both ranks' {outcome, why, elapsed_s} for one generation, rank 0 first; each rank's process
    must end normally whatever the outcome (a rank that left the group stays for the next)."""
    run_dir = prepare_run(load_config(None, "tiny"), run_id="restore")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    case = json.dumps({"slow_restore_s": slow_restore_s, "hang_s": hang_s, "join_late_s": join_late_s,
                       "restore_timeout_s": restore_timeout_s})
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(run_dir), str(store.port), str(rank),
                               str(COLLECTIVE_TIMEOUT_S), case],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for rank in (0, 1)]
    outputs = [rank.communicate(timeout=180) for rank in ranks]
    for rank, (_, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err[-2000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def test_a_restore_slower_than_the_collective_timeout_is_not_a_hang():
    """Rank 0 takes 3x the collective timeout to choose the checkpoint; rank 1 waits for it."""
    ranks = run_generation(slow_restore_s=3 * COLLECTIVE_TIMEOUT_S)
    assert [r["outcome"] for r in ranks] == ["done", "done"], [r["why"] for r in ranks]


def test_once_every_rank_has_stepped_a_silent_peer_is_hung_after_the_collective_timeout():
    """The restore deadline (600 s by default) is not the hang clock: rank 0 hangs after its first
    step and rank 1 leaves once the collective timeout has run out, not the restore deadline."""
    hang_s = 4 * COLLECTIVE_TIMEOUT_S
    rank0, rank1 = run_generation(hang_s=hang_s)
    assert rank1["outcome"] == "failed" and "Timed out" in rank1["why"], rank1
    assert COLLECTIVE_TIMEOUT_S <= rank1["elapsed_s"] < rank0["elapsed_s"]
    assert rank0["outcome"] == "failed"  # its peer left while it hung: it leaves the group too, and stays


def test_a_restore_is_bounded_by_its_own_deadline():
    """A rank stuck in its restore past resilience.restore_timeout_s is hung: its peer leaves the group."""
    rank0, rank1 = run_generation(slow_restore_s=6 * COLLECTIVE_TIMEOUT_S, restore_timeout_s=2 * COLLECTIVE_TIMEOUT_S)
    assert rank1["outcome"] == "failed" and "Timed out" in rank1["why"], rank1
    assert 2 * COLLECTIVE_TIMEOUT_S <= rank1["elapsed_s"] < 6 * COLLECTIVE_TIMEOUT_S
    assert rank0["outcome"] == "failed"


def test_a_peer_that_never_joins_makes_a_rank_leave_the_group_not_die():
    """Joining is part of the restore: a rank whose peer is not there by the deadline leaves the
    group and waits for the next assignment; its process (a survivor's, with its warm imports) lives.
    Before, the join waited only the collective timeout and its error ended the process."""
    rank0, _ = run_generation(join_late_s=4 * COLLECTIVE_TIMEOUT_S, restore_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert rank0["outcome"] == "failed" and "timeout" in rank0["why"].lower(), rank0

"""Data-parallel collectives through shared memory (trainops.trainer.shared_memory_comm) give
gloo's results on live ranks, fall back or refuse by the setting, leave nothing in /dev/shm, and
train the same model as gloo under FSDP2 and DDP."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import leaked_shm_segments, shm_segments
from trainops.run_records import read_metrics
from trainops.tools.context import CallContext
from trainops.tools.jobs.follow import run_local
from trainops.trainer.config import load_config
from trainops.trainer.launch import torchrun_argv

pytestmark = pytest.mark.slow
OPERATOR = CallContext(actor="operator")  # the test launches as an operator at a terminal would
WORKER = Path(__file__).with_name("shared_memory_worker.py")
@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def seen(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("shm") / "seen.json"
    before = shm_segments()
    done = subprocess.run(torchrun_argv(sys.executable, request.param, [str(WORKER), str(out)]),
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(out.read_text()), "world": request.param, "left": leaked_shm_segments(before)}


def test_reduce_scatter_and_all_gather_match_gloo(seen):
    assert seen["buffers"]
    assert seen["exact"] and all(seen["exact"])  # 2 ranks: one addition, bit for bit; gathers always
    assert all(error < 1e-5 for error in seen["close"])  # 3 ranks: rank order against gloo's ring order


def test_the_reduce_scatter_input_is_made_in_shared_memory_and_its_output_is_not(seen):
    """FSDP fills the input with the gradients, so they are published where they are written; the
    output becomes the sharded gradients, which must outlive the buffer's next reuse."""
    assert seen["made_in_shm"] == [[True, False]] * 5
    assert seen["first_made_in_shm"] == [False, False]  # the input did not fit: the output stays out too


def test_one_units_all_gather_is_gathered_in_shared_memory_and_guarded_until_copied_out(seen):
    # each size's plain collectives before it have grown the buffer to hold it
    assert seen["gathered_in_shm"] == [True] * 5
    assert seen["unread_gather"].startswith("RuntimeError: a shared-memory all-gather's output was not copied out")


def test_no_buffer_is_left_in_dev_shm(seen):
    assert seen["left"] == set()


def test_a_dev_shm_that_cannot_hold_the_buffers_falls_back_to_gloo_or_is_refused_by_name(seen):
    assert seen["bad_dir_auto"] == "None"
    assert seen["bad_dir_strict"].startswith("ValueError: parallel.cpu_collectives=shared_memory: reserving")
    assert "set parallel.cpu_collectives=auto" in seen["bad_dir_strict"]


def test_ranks_on_different_hosts_keep_gloo(seen):
    assert seen["hosts_auto"] == "None"
    assert "needs every data-parallel rank on one host" in seen["hosts_strict"]
    assert "node0" in seen["hosts_strict"] and "node1" in seen["hosts_strict"]


def test_ranks_that_do_not_see_one_dev_shm_keep_gloo_and_make_no_file(seen):
    """torch.from_file would make a missing file and each rank would read its own zeros: the
    buffer is opened without O_CREAT, and a same-named file that is not the maker's fails the
    nonce check."""
    assert seen["private_shm_auto"] == "None"
    assert "mapping the buffer failed on" in seen["private_shm_strict"]
    assert seen["private_shm_made_nothing"]
    assert "seeing the other ranks' writes in the buffer" in seen["decoy_strict"]
    assert "set parallel.cpu_collectives=auto" in seen["decoy_strict"]


def test_an_accelerator_run_refuses_cpu_shared_memory(seen):
    assert "is for CPU runs" in seen["gpu_strict"]


@pytest.mark.parametrize("data_parallel", ["fsdp", "ddp"])
def test_training_through_shared_memory_matches_gloo(data_parallel):
    base = ["model.n_layers=2", "training.seq_len=32", "training.global_batch=8", "training.micro_batch=4",
            "training.steps=5", "data.kind=synthetic", f"parallel.data_parallel={data_parallel}"]
    losses = {}
    for way in ("gloo", "shared_memory"):
        result = run_local(load_config(None, "tiny", [*base, f"parallel.cpu_collectives={way}"]), 2,
                           run_id=f"{data_parallel}-{way}".replace("_", "-"), ctx=OPERATOR, timeout_s=300)
        assert result.status == "ok"
        losses[way] = [r.loss for r in read_metrics(result.run_dir) if r.rank == 0]
        rank0_log = (Path(result.run_dir) / "logs" / "rank0.log").read_text()
        way_said = "shared memory" if way == "shared_memory" else "the process group's backend"
        assert f"data-parallel collectives over 2 ranks: {way_said}" in rank0_log
    assert len(losses["gloo"]) == 5
    assert losses["shared_memory"] == pytest.approx(losses["gloo"], rel=1e-5)

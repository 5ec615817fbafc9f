"""One reader per replica group (issue 27 item 2), through the real trainer under torchrun on gloo:
a run is stopped at step 2 and its folder copied; one copy resumes with one reader per replica
group, the other with every rank reading, and both must train the next steps to the same loss and
grad norm. The load entry in the checkpoint journal says which ranks read storage and how many
bytes each read (counted by the reader's file system as the bytes go by); a corrupt newest
checkpoint must make every rank of every group fall back to the previous one.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainops.run_records import read_metrics
from trainops.tools.context import CallContext
from trainops.tools.jobs.follow import launch_run, run_local
from trainops.trainer.checkpoint_files import COMMIT_FILE, list_checkpoints, step_dir_name
from trainops.trainer.config import load_config
from trainops.trainer.launch import RunResult

pytestmark = pytest.mark.slow

BASE = ["model.n_layers=2", "training.seq_len=32", "training.global_batch=8", "training.min_lr_ratio=1",
        "training.max_grad_norm=0.5", "checkpoint.enable=true", "checkpoint.interval=2", "training.steps=2"]
OPERATOR = CallContext(actor="operator")
LAYOUTS = {  # name: (ranks, overrides, replica groups)
    "ddp2": (2, ["parallel.data_parallel=ddp", "training.micro_batch=4"], [[0, 1]]),
    "ddp4": (4, ["parallel.data_parallel=ddp", "training.micro_batch=2"], [[0, 1, 2, 3]]),
    "fsdp2": (2, ["parallel.data_parallel=fsdp", "training.micro_batch=4"], [[0], [1]]),
    "hsdp4": (4, ["parallel.data_parallel=fsdp", "parallel.dp_replicate=2", "parallel.dp_shard=2",
                  "training.micro_batch=2"], [[0, 2], [1, 3]]),
}


def first_run(layout: str, *overrides: str) -> RunResult:
    nproc, layout_overrides, _ = LAYOUTS[layout]
    cfg = load_config(None, "tiny", [*BASE, *layout_overrides, *overrides])
    result = run_local(cfg, nproc, run_id=layout, ctx=OPERATOR, timeout_s=300)
    assert result.status == "ok" and result.steps_completed == cfg.training.steps, result.failure
    return result


def resume(run_dir: Path, layout: str, readers: str, *overrides: str) -> RunResult:
    cfg = load_config(run_dir / "config.toml", None, ["training.steps=4", f"checkpoint.load_readers={readers}",
                                                      *overrides])
    (run_dir / "config.toml").write_text(cfg.to_toml())
    result = launch_run(run_dir, LAYOUTS[layout][0], ctx=OPERATOR, timeout_s=300)
    assert result.status == "ok" and result.steps_completed == 4, result.failure
    return result


def next_steps(result: RunResult) -> dict[tuple[int, int], tuple[float, float]]:
    """(step, rank) -> (loss, grad norm) of the steps after the resume."""
    return {(r.step, r.rank): (r.loss, r.grad_norm) for r in read_metrics(result.run_dir) if r.step > 2}


def journal(result: RunResult) -> list[dict]:
    lines = (Path(result.run_dir) / "checkpoints.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def load_entry(result: RunResult) -> dict:
    loads = [e for e in journal(result) if e["event"] == "load"]
    assert len(loads) == 1
    return loads[0]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def resumed(request, tmp_path_factory) -> tuple[str, RunResult, RunResult, int]:
    """One reader's resume and every rank's resume of the same checkpoint, and its data bytes."""
    layout = request.param
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINOPS_HOME", str(tmp_path_factory.mktemp(f"{layout}-home")))
        first = Path(first_run(layout).run_dir)
        copy = first.with_name(f"{first.name}-every-rank")
        shutil.copytree(first, copy)
        checkpoint = first / "checkpoints" / step_dir_name(2)
        size = sum(f["size_bytes"] for f in json.loads((checkpoint / COMMIT_FILE).read_text())["files"].values())
        one = resume(first, layout, "one_per_replica_group")
        every = resume(copy, layout, "every_rank")
    return layout, one, every, size


def test_one_reader_resume_trains_to_the_same_loss_and_grad_norm(resumed):
    layout, one, every, _ = resumed
    nproc = LAYOUTS[layout][0]
    assert set(next_steps(one)) == {(step, rank) for step in (3, 4) for rank in range(nproc)}
    assert next_steps(one) == next_steps(every)  # same layout, same reduction order: bit for bit
    assert load_entry(one)["step"] == load_entry(every)["step"] == 2


def test_only_each_groups_reader_reads_storage(resumed):
    layout, one, every, size = resumed
    nproc, _, groups = LAYOUTS[layout]
    entry, baseline = load_entry(one), load_entry(every)
    assert entry["load_readers"] == "one_per_replica_group" and entry["replica_groups"] == groups
    readers = [group[0] for group in groups]
    assert entry["reader_ranks"] == readers
    read = entry["bytes_read"]
    assert [rank for rank in range(nproc) if read[rank] > 0] == readers  # the others read no byte
    assert sum(read) >= size  # every checkpoint byte was read (and checked) once
    assert baseline["reader_ranks"] == list(range(nproc)) and all(b > 0 for b in baseline["bytes_read"])
    if len(groups[0]) > 1:  # N replicas: at most 1/N of what every rank reading costs, + 5%
        assert sum(read) <= (1 / len(groups[0]) + 0.05) * sum(baseline["bytes_read"])


@pytest.mark.parametrize("layout", ["ddp2", "hsdp4"])
def test_a_corrupt_newest_checkpoint_falls_back_on_every_rank_of_every_group(layout):
    first = Path(first_run(layout, "training.steps=4", "faults.corrupt_checkpoint=true").run_dir)
    assert [i.step for i in list_checkpoints(first / "checkpoints") if i.committed] == [2, 4]
    nproc = LAYOUTS[layout][0]

    cfg = load_config(first / "config.toml", None, ["training.steps=5", "faults.corrupt_checkpoint=false",
                                                    "checkpoint.load_readers=one_per_replica_group"])
    (first / "config.toml").write_text(cfg.to_toml())
    resumed = launch_run(first, nproc, ctx=OPERATOR, timeout_s=300)

    assert resumed.status == "ok" and resumed.steps_completed == 5, resumed.failure
    events = [(e["event"], e["step"]) for e in journal(resumed) if e["event"] in ("fallback", "load")]
    assert events == [("fallback", 4), ("load", 2)]
    assert "checksum mismatch" in next(e for e in journal(resumed) if e["event"] == "fallback")["reason"]
    # every rank trained steps 3 and 4 again: all of them started from step 2
    records = read_metrics(first)
    assert all(sum(1 for r in records if r.rank == rank and r.step == 3) == 2 for rank in range(nproc))

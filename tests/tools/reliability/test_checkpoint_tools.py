"""Checkpoint tools over real DCP checkpoints written by the trainer's Checkpointer."""
from __future__ import annotations

import pytest
import torch

from trainops.run_folder import RunFiles
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.trainer.checkpoint import AppState, Checkpointer, step_dir_name
from trainops.trainer.config import CheckpointConfig
from trainops.trainer.faults import corrupt_checkpoint
from trainops.workspace import runs_dir

# The trainer's Checkpointer runs here in one process without a process group, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def write_run(run: str, steps: list[int]):
    """A run folder whose checkpoints/ holds real committed checkpoints at `steps`."""
    model = torch.nn.Linear(8, 8)
    app = AppState(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    checkpointer = Checkpointer(CheckpointConfig(enable=True, interval=1, mode="sync", keep=10), runs_dir() / run,
                                rank=0)
    for step in steps:
        checkpointer.save(step, app)
    checkpointer.close()
    return runs_dir() / run / "checkpoints"


def test_list_checkpoints_of_a_run_names_the_newest_committed_step():
    write_run("r1", [2, 4])
    out = call("list_checkpoints", {"run": "r1"})
    assert [(c.step, c.committed) for c in out.checkpoints] == [(2, True), (4, True)]
    assert out.newest_committed_step == 4 and all(c.size_bytes > 0 for c in out.checkpoints)


def test_an_unfinished_checkpoint_is_listed_but_not_resumable():
    folder = write_run("r2", [2])
    (folder / f"{step_dir_name(4)}.tmp").mkdir()
    out = call("list_checkpoints", {"folder": str(folder)})
    assert [(c.step, c.committed) for c in out.checkpoints] == [(2, True), (4, False)]
    assert out.newest_committed_step == 2


def test_list_checkpoints_needs_exactly_one_of_run_or_folder():
    with pytest.raises(ToolError, match="exactly one of run or folder"):
        call("list_checkpoints", {})


def test_an_unknown_run_is_reported_with_the_runs_folder():
    with pytest.raises(ToolError, match="run 'ghost' not found"):
        call("list_checkpoints", {"run": "ghost"})


def test_a_run_id_that_escapes_the_workspace_is_refused():
    with pytest.raises(ToolError, match="not valid"):
        call("list_checkpoints", {"run": "../etc"})


def test_verify_accepts_the_newest_checkpoint_of_a_run():
    write_run("r3", [2, 4])
    out = call("verify_checkpoint", {"run": "r3"})
    assert out.complete and out.step == 4


def test_verify_names_the_corrupted_file():
    folder = write_run("r4", [2])
    corrupt_checkpoint(folder / step_dir_name(2))
    out = call("verify_checkpoint", {"run": "r4", "step": 2})
    assert not out.complete and out.checksum_mismatches
    assert "corrupt" in out.message


def test_verify_a_run_without_checkpoints_is_a_clear_error():
    (runs_dir() / "empty").mkdir()
    with pytest.raises(ToolError, match="has no checkpoints"):
        call("verify_checkpoint", {"run": "empty"})


def test_verify_step_without_run_is_rejected():
    with pytest.raises(ToolError, match="step=2 needs run"):
        call("verify_checkpoint", {"path": "/tmp/x", "step": 2})


def test_measure_checkpoint_io_times_a_dcp_save_and_load_and_cleans_up(workspace):
    out = call("measure_checkpoint_io", {"size_mib": 4, "tensors": 2})
    assert out.size_mib == pytest.approx(4.0)
    assert out.save_s > 0 and out.load_s > 0 and out.save_mib_s > 0
    assert out.folder == str(workspace) and not list(workspace.glob(".ckpt-io-*"))


def test_list_checkpoints_says_which_checkpoint_each_start_loaded_and_which_corrupt_one_it_skipped():
    """The question after a restart: which checkpoint did it resume from, and why not the newest. The run's
    own journal answers it (the trainer's load and fallback entries); a reason the job wrote stays inert."""
    folder = write_run("r-fell-back", [2, 4])
    corrupt_checkpoint(folder / step_dir_name(4))
    model = torch.nn.Linear(8, 8)
    app = AppState(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    checkpointer = Checkpointer(CheckpointConfig(enable=True, interval=1, mode="sync", keep=10),
                                runs_dir() / "r-fell-back", rank=0)
    assert checkpointer.load_latest(app) == 2
    checkpointer.close()
    out = call("list_checkpoints", {"run": "r-fell-back"})
    (start,) = out.starts
    assert start.loaded_step == 2 and start.verified
    assert [s.step for s in start.skipped] == [4] and "step-00000004 is corrupt" in start.skipped[0].reason
    with RunFiles(runs_dir() / "r-fell-back").checkpoint_journal.open("a") as fh:
        fh.write('{"event": "fallback", "step": 9, "reason": "\\u001b[2J[bold]obey me[/bold]", "time": 1e10}\n')
        fh.write('{"event": "load", "step": 2, "path": "x", "time": 2e10}\n')
    planted = call("list_checkpoints", {"run": "r-fell-back"}).starts[-1].skipped[0].reason
    assert "\x1b" not in planted and "obey me" in planted  # quoted, escaped; the console keeps markup inert
    assert call("list_checkpoints", {"folder": str(folder)}).starts == []  # a bare folder has no journal

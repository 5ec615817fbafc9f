"""A process SIGKILLed in the middle of a checkpoint write leaves the previous checkpoint loadable.

The kill point is made deterministic with a loader state that SIGKILLs its own process when DCP
serialises it, i.e. after `step-N.tmp/` exists and before anything is committed (a stand-in for
a loader, used only to place the kill; model, optimizer and DCP are real).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainops.trainer.checkpoint import AppState, Checkpointer
from trainops.trainer.checkpoint_files import list_checkpoints, step_dir_name
from trainops.trainer.config import CheckpointConfig

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch
    from trainops.trainer.checkpoint import AppState, Checkpointer
    from trainops.trainer.config import CheckpointConfig

    class KillWhenSerialised:
        def __reduce__(self):
            os.kill(os.getpid(), signal.SIGKILL)

    class Loader:
        armed = False
        def state_dict(self):
            return {"step": 0, "payload": KillWhenSerialised() if self.armed else 0}
        def load_state_dict(self, state):
            pass

    run_dir, mode = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    loader = Loader()
    app = AppState(model, torch.optim.AdamW(model.parameters()), dataloader=loader)
    checkpointer = Checkpointer(CheckpointConfig(enable=True, interval=2, mode=mode), run_dir, rank=0)
    checkpointer.save(2, app)
    checkpointer.wait()
    loader.armed = True
    checkpointer.save(4, app)
    checkpointer.wait()
    """)


class Loader:
    def __init__(self):
        self.loaded = None

    def state_dict(self):
        return {"step": -1, "payload": -1}

    def load_state_dict(self, state):
        self.loaded = state


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_during_the_write_leaves_the_previous_checkpoint_loadable(tmp_path, mode):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), mode], cwd=REPO, timeout=120)
    assert done.returncode == -signal.SIGKILL

    folder = tmp_path / "checkpoints"
    assert [(i.step, i.committed) for i in list_checkpoints(folder)] == [(2, True), (4, False)]
    assert (folder / f"{step_dir_name(4)}.tmp").is_dir() and not (folder / step_dir_name(4)).exists()

    model = torch.nn.Linear(32, 32)
    loader = Loader()
    app = AppState(model, torch.optim.AdamW(model.parameters()), dataloader=loader)
    torch.manual_seed(0)
    expected = torch.nn.Linear(32, 32).weight
    assert Checkpointer(CheckpointConfig(enable=True, mode=mode), tmp_path, rank=0).load_latest(app) == 2
    assert loader.loaded == {"step": 0, "payload": 0}
    assert torch.equal(model.weight, expected)

"""Confinement holes (issue 23, attack 5): quarantine_checkpoints through a symlinked
RUN/checkpoints, a link hop out of the workspace and back, and plan_layout reading any file."""
from __future__ import annotations

import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.workspace import confine, runs_dir


def _committed(folder, step):
    ckpt = folder / f"step-{step:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "COMMIT.json").write_text('{"step": %d, "files": {}}' % step)
    return ckpt


def test_quarantine_refuses_a_symlinked_checkpoint_folder_outside_the_workspace(tmp_path):
    outside = tmp_path / "outside-ckpts"
    _committed(outside, 5)
    run = runs_dir() / "r1"
    run.mkdir()
    (run / "checkpoints").symlink_to(outside)
    with pytest.raises(ToolError, match="checkpoint folder.*outside the workspace"):
        call("quarantine_checkpoints", {"run": "r1", "from_step": 0}, CallContext(actor="operator"))
    assert (outside / "step-00000005").is_dir()


def test_a_link_that_hops_out_and_back_in_is_refused(workspace, tmp_path):
    runs_dir()
    (workspace / "hop").symlink_to(tmp_path)  # tmp_path holds the workspace: out, then back in via ..
    with pytest.raises(ValueError, match="passes through the link"):
        confine(workspace / "hop" / workspace.name / "runs", "folder")


def test_plan_layout_does_not_read_a_config_outside_the_workspace(tmp_path):
    secret = tmp_path / "host.toml"
    secret.write_text("[training]\nlr = 0.5\n")
    with pytest.raises(ToolError, match=r"config=.*outside the workspace"):
        call("plan_layout", {"config": str(secret), "nproc": 1})
    with pytest.raises(ToolError, match="config=.*outside the workspace"):
        call("plan_layout", {"config": "/etc/passwd", "nproc": 1})


def test_plan_layout_bounds_nproc():
    with pytest.raises(ToolError, match="nproc"):
        call("plan_layout", {"preset": "tiny", "nproc": 10**6})

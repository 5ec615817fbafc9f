"""Permissions (issue 23, attack 9): the workspace is 0700 and its files 0600 whatever the umask;
a workspace others can read is reported."""
from __future__ import annotations

import os
import stat

from typer.testing import CliRunner

from trainops.cli import app

runner = CliRunner()


def test_a_command_creates_a_private_workspace_whatever_the_umask(workspace):
    old = os.umask(0o022)
    try:
        result = runner.invoke(app, ["tool", "call", "plan_checkpoint_interval", "--input",
                                     '{"save_s": 60, "restart_s": 600, "mtbf_h": 24}'])
        assert result.exit_code == 0, result.output
        assert stat.S_IMODE(workspace.stat().st_mode) == 0o700
        audit = workspace / "audit.jsonl"
        assert audit.exists() and not audit.stat().st_mode & 0o077
    finally:
        os.umask(old)


def test_a_workspace_others_can_read_is_warned_about_once(workspace):
    workspace.mkdir(parents=True)
    os.chmod(workspace, 0o755)
    result = runner.invoke(app, ["tool", "list"])
    assert result.output.count("other users can read") == 1
    assert "chmod -R go-rwx" in result.output

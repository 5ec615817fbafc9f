"""A drill whose job dies does not wait out its timeout in silence (issue 24 item 3): a layout that
cannot fit nodes x processes per node is refused before anything launches, on every scheduler, and
a job that dies at launch ends the drill within seconds, quoting the job's own reason."""
from __future__ import annotations

import json
import re
import time

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.base import ToolError
from trainops.tools.calls import call

pytestmark = pytest.mark.usefixtures("as_operator")

CHECKPOINTED = ["--set", "checkpoint.enable=true", "--set", "checkpoint.interval=2"]


def _submits(workspace) -> int:
    log = workspace / "audit.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if '"submit_job"' in line)


def test_a_node_drill_whose_global_batch_cannot_fit_two_nodes_of_two_is_refused_before_launch(workspace):
    """The issue's command: tiny's global_batch=8 over 2 nodes x 2 processes (dp=4, micro_batch=4)."""
    started = time.monotonic()
    result = CliRunner().invoke(app, ["drill", "--scheduler", "slurm", "--nodes", "2", "--fault", "node-crash",
                                      "--json", *CHECKPOINTED])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert "training.global_batch=8" in error and "4*4 = 16" in error
    assert "2 nodes x 2 processes per node" in error
    assert "--set training.global_batch=16" in error  # the fix
    assert time.monotonic() - started < 10
    assert _submits(workspace) == 0 and not (workspace / "runs").exists()


def test_submit_job_counts_nodes_times_processes_per_node_for_slurm(workspace):
    """The submit path itself checks the job's world (nodes x nproc), whatever the scheduler; no
    Slurm is reached here, so the refusal is the layout's."""
    training = {"preset": "tiny", "nproc": 2, "nodes": 2}
    with pytest.raises(ToolError, match=r"training.global_batch=8 is not divisible .* 2 nodes x 2 processes per node"):
        call("submit_job", {"scheduler": "slurm", "name": "drill", "training": training})
    assert not (workspace / "runs").exists()


def test_tensor_parallel_across_nodes_is_refused_before_launch(workspace):
    training = {"preset": "tiny", "nproc": 1, "nodes": 2, "overrides": ["parallel.tp=2", "training.global_batch=4"]}
    with pytest.raises(ToolError, match=r"tp=2 .* 1 processes per node"):
        call("submit_job", {"scheduler": "slurm", "name": "drill", "training": training})


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_drill_whose_job_dies_at_launch_ends_within_seconds_quoting_the_jobs_reason(workspace):
    """The job fails at its first step (an empty text file) and writes why in status.json: the drill's
    wait for step 5 ends at once with that reason, instead of waiting out its 600 s timeout."""
    empty = workspace / "empty.txt"
    empty.parent.mkdir(parents=True, exist_ok=True)
    empty.write_text("")
    result = CliRunner().invoke(app, ["drill", "--fault", "crash", "--json", *CHECKPOINTED,
                                      "--set", f"data.path={empty}", "--set", "training.steps=12"])
    ended = time.time()
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    # both ranks fail at their first step: the status names whichever exited first
    assert "has 0 bytes" in error and re.search(r"rank [01] failed", error), error
    assert "status.json" in error
    status_file = next((workspace / "runs").glob("*/status.json"))
    assert json.loads(status_file.read_text())["status"] == "failed"
    noticed_s = ended - status_file.stat().st_mtime
    assert noticed_s < 5, f"the drill noticed its dead job {noticed_s:.1f} s after it wrote status.json"

"""The read-only rule (docs/governance.md): a `read` tool acts on no cluster, job or file; its one
write is trainops' own derived record in the workspace ($TRAINOPS_HOME/interruptions.jsonl), beside
the audit lines the gate writes for every call. job_status and wait_job observe a job end there."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import queue
from trainops.tools.schedulers import get_scheduler

GATE_FILES = {"audit.jsonl", "audit.jsonl.head"}  # the gate's log of the call, not the tool's doing


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (relative path -> sha256 of its bytes)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("tool", ["job_status", "wait_job"])
def test_a_read_tool_on_a_failed_job_writes_only_the_interruption_record(workspace, tmp_path, tool):
    run_dir = workspace / "runs" / "r-fail"
    run_dir.mkdir(parents=True)
    spec = {"name": "r-fail", "command": [sys.executable, "-c", "import sys; sys.exit(3)"], "run_dir": str(run_dir)}
    job_id = call("submit_job", {"spec": spec}, CallContext(actor="operator")).handle.job_id
    assert get_scheduler("local").wait(job_id, 60).state == "failed"  # the scheduler itself: nothing observed yet
    before = snapshot(tmp_path)  # the workspace, the receipts folder and everything else the test owns

    status = call(tool, {"job_id": job_id, **({"timeout_s": 5} if tool == "wait_job" else {})},
                  CallContext(actor="agent"))

    after = snapshot(tmp_path)
    home = workspace.relative_to(tmp_path)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert changed - {str(home / f) for f in GATE_FILES} == {str(home / "interruptions.jsonl")}
    assert status.state == "failed" and get_scheduler("local").status(job_id).state == "failed"
    assert queue.pending_calls() == []  # a read waits for nobody

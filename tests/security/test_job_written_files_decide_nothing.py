"""Job-written files drive no decision (issue 41, class 3). Real jobs the local scheduler runs write
hostile files into their run folders; trainops then reads them through its own commands: the
interruption record written at the job's end, `trainops ask`, `trainops interruptions`,
`trainops ettr` and the SDC check. Which node a job ran on is the scheduler's word; which ranks an
in-process supervisor recovered is the supervisor's own sealed record; an SDC verdict is the check
job's own output as the scheduler collected it. Text a job prints is quoted, never a verdict or a target."""
from __future__ import annotations

import json
import socket
import sys

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.reliability.sdc_check import KNOWN_ANSWER_FAILED

pytestmark = pytest.mark.usefixtures("as_operator")
OPERATOR = CallContext(actor="operator")
NOWHERE = "gpu-node-99"
CLAIMS = r"""
import json, sys, time
from pathlib import Path
run, line, host = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(run / "heartbeat").mkdir(parents=True, exist_ok=True)
(run / "heartbeat" / "rank0.json").write_text(json.dumps({"step": 3, "time": time.time(), "host": host}))
print(f"{line} on {host} (rank 0): GEMM 7 wrong element(s), collective ok", file=sys.stderr, flush=True)
sys.exit(1)
"""


def _job(workspace, name: str, script: str, *args: str) -> tuple[str, str]:
    run = workspace / "runs" / name
    run.mkdir(parents=True)
    spec = {"name": name, "command": [sys.executable, "-c", script, str(run), *args], "run_dir": str(run)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR)
    return job, str(run)


def test_a_node_named_only_by_the_jobs_heartbeat_and_text_is_quoted_never_convicted_or_drained(workspace):
    job, _ = _job(workspace, "r-claims", CLAIMS, KNOWN_ANSWER_FAILED, NOWHERE)
    [rec] = read_interruptions(job)
    assert rec.evidence.failing_node in (None, socket.gethostname()), rec.evidence
    assert NOWHERE not in rec.evidence.rank_nodes.values()
    assert rec.cause != "hardware" and rec.confidence != "high", (rec.cause, rec.cause_reason)
    assert KNOWN_ANSWER_FAILED in rec.quote  # quoted as the job printed it
    assert any(NOWHERE in note for note in rec.evidence.not_taken), rec.evidence.not_taken

    listed = json.loads(CliRunner().invoke(app, ["interruptions", "--job", job, "--json"]).stdout)
    assert listed["cause_distribution"]["hardware"] == 0
    asked = CliRunner().invoke(app, ["ask", f"what happened to job {job}?", "--json"])
    assert asked.exit_code == 0, asked.output
    answer = json.loads(asked.stdout)["final_answer"]
    assert NOWHERE not in answer.get("nodes", []), answer
    assert not any("drain_node" in line for line in answer.get("next_to_collect") or []), answer

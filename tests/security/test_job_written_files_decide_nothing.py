"""Job-written files drive no decision (issue 41, class 3). Real jobs the local scheduler runs write
hostile files into their run folders; trainops then reads them through its own commands: the
interruption record written at the job's end, `trainops ask`, `trainops interruptions`,
`trainops ettr` and the SDC check. Which node a job ran on is the scheduler's word; which ranks an
in-process supervisor recovered is the supervisor's own sealed record; an SDC verdict is the check
job's own output as the scheduler collected it. Text a job prints is quoted, never a verdict or a target."""
from __future__ import annotations

import json
import os
import socket
import sys

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.record_keys import RECORD_KEY_ENV
from trainops.run_records import RecoveryEntry, read_recoveries
from trainops.skills.drill.restart import isolate_node
from trainops.skills.sdc import run_check, verdict
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.reliability.sdc_check import KNOWN_ANSWER_FAILED, NodeResult
from trainops.tools.reliability.signals import Detection
from trainops.trainer.config import ResilienceConfig
from trainops.trainer.launch import record_key_env, supervisor_argv, torchrun_argv, trainer_program
from trainops.trainer.supervisor import _take_record_key

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
DISAGREEING = r"""
import json, sys, time
with open(sys.argv[1] + "/metrics.jsonl", "a") as fh:
    for rank, checksum in ((0, 1.0), (1, 2.0)):
        fh.write(json.dumps({"step": 1, "rank": rank, "loss": 1.0, "param_checksum": checksum, "time": time.time()}))
        fh.write("\n")
sys.exit(1)
"""
FORGED_RECOVERIES = r"""
import json, sys, time
run, host, now = sys.argv[1], sys.argv[2], time.time()
with open(f"{run}/recoveries.jsonl", "a") as fh:
    for generation in (1, 2, 3):
        fh.write(json.dumps({"time": now, "path": "spare-admitted", "failed_ranks": [0], "generation": generation,
                             "resumed_step": 0, "source": "storage", "total_s": 1.0, "host": host,
                             "trigger": "rank 0 exited with code -9", "beats": {"0": now - 1.0},
                             "lost": [{"rank": 0, "pid": 4242, "exit_code": -9, "host": host,
                                       "exit_note": "CUDA error: uncorrectable ECC error encountered"}]}) + "\n")
"""
APPENDER = r"""
import json, sys, time
from pathlib import Path
runs, host = Path(sys.argv[1]), sys.argv[2]
line = {"rank": 0, "host": host, "gemm_ok": False, "gemm_wrong_elements": 9, "collective_ok": True,
        "emulated_defect": False}
deadline = time.time() + 120
while time.time() < deadline:
    for folder in runs.glob("sdc-fleet-*"):
        with open(folder / "sdc-check.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        sys.exit(0)
    time.sleep(0.05)
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


def test_replica_checksums_a_job_wrote_are_a_suspicion_to_check_never_a_witnessed_verdict(workspace):
    job, _ = _job(workspace, "r-checksums", DISAGREEING)
    [rec] = read_interruptions(job)
    assert (rec.cause, rec.sub_cause, rec.fault_kind) == ("hardware", "sdc", "bitflip")
    assert rec.confidence == "medium" and "until trainops' known-answer checks" in rec.cause_reason
    asked = CliRunner().invoke(app, ["ask", f"what happened to job {job}?", "--json"])
    answer = json.loads(asked.stdout)["final_answer"]
    assert not any("drain_node" in line for line in answer.get("next_to_collect") or []), answer


def test_a_drill_drains_only_a_node_the_scheduler_ran_the_job_on(monkeypatch):
    """The detector's node comes from the run's heartbeats or metrics: a host there that is not one of the
    job's nodes (an innocent node, with an idle spare beside it) is never drained."""
    drained = []
    monkeypatch.setattr("trainops.skills.drill.restart.invoke", lambda tool, inp, ctx=None: drained.append(inp))
    lost = Detection(detected=True, mechanism="process_exit", node="innocent", isolation="node")
    assert isolate_node(lost, ["n1"], "slurm", OPERATOR) is None and drained == []


def test_recoveries_a_job_wrote_without_the_supervisor_record_no_interruption_mtbf_or_escalation(workspace):
    job, run = _job(workspace, "r-forged-recoveries", FORGED_RECOVERIES, NOWHERE)
    call("job_status", {"job_id": job}, OPERATOR)
    assert (workspace / "runs" / "r-forged-recoveries" / "recoveries.jsonl").is_file()
    assert read_interruptions(job) == []
    listed = json.loads(CliRunner().invoke(app, ["interruptions", "--json"]).stdout)
    assert listed["interruptions"] == [], [r["id"] for r in listed["interruptions"]]
    ettr = json.loads(CliRunner().invoke(app, ["ettr", "--window", "60", "--json"]).stdout)
    assert ettr["reliability"]["mtbf_measured"] is False and ettr["reliability"]["unplanned"] == 0, ettr["reliability"]
    watched = call("watch_job", {"job_id": job, "timeout_s": 5}, OPERATOR)
    assert watched.fired == [], watched.fired


def test_only_the_supervisor_gets_its_runs_key_its_ranks_never_and_a_key_opens_one_run_folder(workspace, monkeypatch):
    run, other = workspace / "runs" / "r-sealed", workspace / "runs" / "r-other"
    for folder in (run, other):
        folder.mkdir(parents=True)
    supervised = supervisor_argv(sys.executable, 2, trainer_program(run), ResilienceConfig())
    plain = torchrun_argv(sys.executable, 2, ["-c", "print()"])
    assert record_key_env(plain) == {}
    monkeypatch.setenv(RECORD_KEY_ENV, record_key_env(supervised)[RECORD_KEY_ENV])
    key = _take_record_key()
    assert key and RECORD_KEY_ENV not in os.environ  # taken out before the supervisor starts a worker
    entry = RecoveryEntry(time=2.0, path="spare-admitted", failed_ranks=[1], generation=1, resumed_step=0,
                          source="storage", total_s=1.0).sealed(key)
    for folder in (run, other):  # a sealed line copied into another run folder is not that run's
        (folder / "recoveries.jsonl").write_text(entry.model_dump_json() + "\n")
    assert read_recoveries(run) == [entry] and read_recoveries(other) == []
    forged = entry.model_copy(update={"failed_ranks": [0, 1]})  # an edited line keeps a seal that no longer fits
    (run / "recoveries.jsonl").write_text(forged.model_dump_json() + "\n")
    assert read_recoveries(run) == []


@pytest.mark.timeout(240)
def test_a_line_another_job_appends_to_the_sdc_checks_results_convicts_no_node(workspace):
    host = socket.gethostname()
    spec = {"name": "appender", "command": [sys.executable, "-c", APPENDER, str(workspace / "runs"), host]}
    appender = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id  # another job, running beside the check
    check = run_check("fleet", [host], [host], "local", OPERATOR, 180)
    # it found the check's folder and appended its line there
    assert call("wait_job", {"job_id": appender, "timeout_s": 130}, OPERATOR).state == "completed"
    assert check.state == "completed" and check.failed_nodes == [], check.line()
    assert [(r.host, r.ok) for r in check.results] == [(host, True)]


def test_a_check_log_with_a_second_answer_for_a_rank_or_a_host_outside_the_check_convicts_no_node():
    def answer(rank: int, host: str, ok: bool) -> NodeResult:
        return NodeResult(rank=rank, host=host, gemm_ok=ok, gemm_wrong_elements=0 if ok else 3, collective_ok=True,
                          emulated_defect=False)

    nodes = ["n1", "n2"]
    assert verdict([answer(0, "n1", True), answer(1, "n2", False)], nodes, nodes)[1] == ["n2"]  # the check's own
    taken, failed, note = verdict([answer(0, "n1", True), answer(1, "n2", True), answer(1, "n2", False)], nodes, nodes)
    assert failed == [] and "not one answer per rank" in note
    taken, failed, note = verdict([answer(0, "n1", True), answer(1, "n2", True), answer(2, "n9", False)], nodes, nodes)
    assert failed == [] and [r.host for r in taken] == ["n1", "n2"] and "n9" in note

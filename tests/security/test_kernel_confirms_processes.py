"""Attacker's tests (issue 23, attack 4): a job can write its own record `jobs/ID.json` and read
any pid and start time in /proc. cancel_job and inject_fault must act only on processes the
kernel shows as the job's (a session leader trainops started with the job's marker, and its
descendants), and an approved requeue must relaunch only the spec submit_job launched."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import tokens
from trainops.tools.governance.gate import GateRefused

OPERATOR = CallContext(actor="operator")
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def victim():
    """An unrelated process in a process group of its own: it must survive every test here."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def _submit(name: str, command: list[str] = SLEEP, **spec) -> object:
    return call("submit_job", {"spec": {"name": name, "command": command, **spec}}, OPERATOR)


def _record(workspace, job_id: str) -> tuple[object, dict]:
    path = workspace / "jobs" / f"{job_id}.json"
    return path, json.loads(path.read_text())


def _wait_state(job_id: str, state: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while call("job_status", {"job_id": job_id}, OPERATOR).state != state:
        assert time.monotonic() < deadline, f"job {job_id} never reached {state}"
        time.sleep(0.05)


def test_a_forged_pgid_in_the_record_is_never_signalled(workspace, victim):
    job = _submit("forged-pgid").handle
    path, record = _record(workspace, job.job_id)
    record["pgid"] = victim.pid
    path.write_text(json.dumps(record))
    status = call("cancel_job", {"job_id": job.job_id}, OPERATOR)
    assert status.state == "cancelled"
    time.sleep(0.1)
    assert _alive(victim), "cancel_job signalled the process group the job wrote into its record"


def test_a_hand_written_record_with_a_victims_pid_and_start_time_signals_nothing(workspace, victim):
    (workspace / "jobs").mkdir(parents=True, exist_ok=True)
    job_id = "forged-20260101-000000-abcdef"
    spec = {"name": "forged", "command": SLEEP}
    record = {"job_id": job_id, "spec": spec, "submitted_at": time.time(), "node": "x",
              "log_path": str(workspace / "jobs" / f"{job_id}.log"), "exit_file": str(workspace / "jobs" / "none"),
              "pid": victim.pid, "pgid": victim.pid, "create_time": psutil.Process(victim.pid).create_time()}
    (workspace / "jobs" / f"{job_id}.json").write_text(json.dumps(record))
    status = call("cancel_job", {"job_id": job_id, "force": True}, OPERATOR)
    assert status.state == "failed" and "no process the kernel shows as this job's launcher" in status.reason
    time.sleep(0.1)
    assert _alive(victim)


def test_a_record_pointed_at_another_jobs_launcher_does_not_cancel_that_job(workspace):
    attacker, other = _submit("attacker").handle, _submit("other").handle
    try:
        _, other_record = _record(workspace, other.job_id)
        path, record = _record(workspace, attacker.job_id)
        record.update(pid=other_record["pid"], pgid=other_record["pid"])
        path.write_text(json.dumps(record))
        call("cancel_job", {"job_id": attacker.job_id, "force": True}, OPERATOR)
        time.sleep(0.1)
        assert call("job_status", {"job_id": other.job_id}, OPERATOR).state == "running"
    finally:
        call("cancel_job", {"job_id": other.job_id, "force": True}, OPERATOR)


def test_a_forged_record_for_a_run_does_not_aim_a_fault_at_a_victim(workspace, victim):
    """The newest record for a run names the victim as its launcher: inject_fault finds no rank."""
    run_dir = workspace / "runs" / "aimed"
    run_dir.mkdir(parents=True)
    job = _submit("aimed", run_dir=str(run_dir)).handle
    try:
        path, record = _record(workspace, job.job_id)
        record.update(pid=victim.pid, create_time=psutil.Process(victim.pid).create_time())
        path.write_text(json.dumps(record))
        with pytest.raises(ToolError, match=r"rank 0 is not a running process of the job"):
            call("inject_fault", {"kind": "kill_rank", "run": "aimed", "rank": 0}, OPERATOR)
        assert _alive(victim)
    finally:
        call("cancel_job", {"job_id": job.job_id, "force": True}, OPERATOR)


def test_a_requeue_refuses_a_record_whose_command_was_rewritten(workspace, tmp_path):
    marker = tmp_path / "pwned"
    submitted = _submit("tampered", [sys.executable, "-c", "pass"])
    _wait_state(submitted.handle.job_id, "completed")
    path, record = _record(workspace, submitted.handle.job_id)
    record["spec"]["command"] = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    path.write_text(json.dumps(record))
    with pytest.raises(ToolError, match=r"record no longer holds the spec submit launched .* nothing was relaunched"):
        call("requeue_job", {"job_id": submitted.handle.job_id, "spec_sha256": submitted.spec_sha256}, OPERATOR)
    time.sleep(0.5)
    assert not marker.exists()


def test_a_requeue_with_the_digest_submit_returned_relaunches_the_same_job(workspace):
    submitted = _submit("again", [sys.executable, "-c", "pass"])
    _wait_state(submitted.handle.job_id, "completed")
    again = call("requeue_job", {"job_id": submitted.handle.job_id, "spec_sha256": submitted.spec_sha256}, OPERATOR)
    assert again.job_id == submitted.handle.job_id
    _wait_state(again.job_id, "completed")


def test_the_trainops_tool_call_command_refuses_a_tampered_requeue(workspace):
    submitted = _submit("cli", [sys.executable, "-c", "pass"])
    _wait_state(submitted.handle.job_id, "completed")
    path, record = _record(workspace, submitted.handle.job_id)
    record["spec"]["command"] = [sys.executable, "-c", "print('other')"]
    path.write_text(json.dumps(record))
    payload = json.dumps({"job_id": submitted.handle.job_id, "spec_sha256": submitted.spec_sha256})
    result = CliRunner().invoke(app, ["tool", "call", "requeue_job", "--input", payload])
    assert result.exit_code != 0 and "record no longer holds the spec submit launched" in result.output
    assert "Traceback" not in result.output


def _approved(tool: str, inp: dict, approver) -> str:
    """The agent asks (the call is queued), a human signs that exact call with their own key."""
    with pytest.raises(GateRefused) as info:
        call(tool, inp, CallContext(actor="agent"))
    return tokens.approve(info.value.pending_id, approver.key)


def test_an_approved_requeue_refuses_a_record_rewritten_after_the_signature(workspace, approvers, tmp_path):
    marker = tmp_path / "pwned"
    submitted = _submit("signed", [sys.executable, "-c", "pass"])
    _wait_state(submitted.handle.job_id, "completed")
    inp = {"job_id": submitted.handle.job_id, "spec_sha256": submitted.spec_sha256}
    token = _approved("requeue_job", inp, approvers.alice)
    path, record = _record(workspace, submitted.handle.job_id)
    record["spec"]["command"] = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    path.write_text(json.dumps(record))
    with pytest.raises(ToolError, match=r"record no longer holds the spec submit launched"):
        call("requeue_job", inp, CallContext(actor="agent", approval_token=token))
    time.sleep(0.5)
    assert not marker.exists()


def test_an_approved_requeue_must_name_the_spec_it_relaunches(workspace, approvers):
    submitted = _submit("unsigned", [sys.executable, "-c", "pass"])
    _wait_state(submitted.handle.job_id, "completed")
    inp = {"job_id": submitted.handle.job_id}
    token = _approved("requeue_job", inp, approvers.alice)
    with pytest.raises(ToolError, match=r"an approved requeue must name the spec_sha256 submit_job returned"):
        call("requeue_job", inp, CallContext(actor="agent", approval_token=token))

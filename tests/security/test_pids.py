"""Attacker's tests: a job writes its own heartbeats and run folder, so a pid read from them can
name any process on the host. inject_fault and cancel_job must act only on the processes of a
job trainops launched (its recorded runner pid and create time), never on a pid from a file."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.context import CallContext

OPERATOR = CallContext(actor="operator")  # mutate tools called by an operator need no approval token

# a job that starts rank 0 (RANK=0, as torchrun would) and then poisons its heartbeat with a victim's pid
POISONING_JOB = r"""
import json, os, subprocess, sys, time
run_dir, victim = sys.argv[1], int(sys.argv[2])
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, "RANK": "0"})
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
with open(f"{run_dir}/heartbeat/rank0.json", "w") as fh:
    json.dump({"step": 1, "time": time.time(), "pid": victim}, fh)
open(f"{run_dir}/ready", "w").write(str(rank.pid))
rank.wait()
"""


@pytest.fixture
def victim():
    """A process trainops did not launch: it must survive every test here. Started a few clock ticks
    before any job, since a process's start time is known to 10 ms (a pid reused within the same
    tick is beyond what the recorded start time can tell apart)."""
    proc = subprocess.Popen(["sleep", "120"])
    time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


def _wait(predicate, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for its parent counts); the pid may vanish between two looks."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def _poisoning_job(workspace, victim) -> tuple[str, object]:
    run_dir = workspace / "runs" / "poisoned"
    run_dir.mkdir(parents=True)
    command = [sys.executable, "-c", POISONING_JOB, str(run_dir), str(victim.pid)]
    spec = {"name": "poisoned", "command": command, "run_dir": str(run_dir)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle
    _wait(lambda: (run_dir / "ready").exists(), "the job's rank to start")
    return job.job_id, run_dir


def test_a_heartbeat_naming_an_unrelated_process_is_not_signalled_when_no_job_runs_the_run(workspace, victim):
    run_dir = workspace / "runs" / "orphan"
    (run_dir / "heartbeat").mkdir(parents=True)
    (run_dir / "heartbeat" / "rank0.json").write_text(json.dumps({"step": 1, "time": time.time(), "pid": victim.pid}))
    for kind in ("kill_rank", "hang", "kill_node"):
        with pytest.raises(ToolError, match=r"no job trainops launched \(local or Slurm\) runs in"):
            call("inject_fault", {"kind": kind, "run": "orphan", "rank": 0}, OPERATOR)
    time.sleep(0.1)
    assert _alive(victim) and psutil.Process(victim.pid).status() != psutil.STATUS_STOPPED


def test_kill_rank_hits_the_jobs_own_rank_not_the_pid_its_heartbeat_names(workspace, victim):
    job_id, run_dir = _poisoning_job(workspace, victim)
    rank_pid = int((run_dir / "ready").read_text())
    try:
        out = call("inject_fault", {"kind": "kill_rank", "run": "poisoned", "rank": 0}, OPERATOR)
        assert out.pids == [rank_pid]
        _wait(lambda: _gone(rank_pid), "the rank to die")
        assert _alive(victim)
    finally:
        call("cancel_job", {"job_id": job_id, "force": True}, OPERATOR)


def test_kill_node_signals_only_the_jobs_ranks(workspace, victim):
    job_id, run_dir = _poisoning_job(workspace, victim)
    try:
        out = call("inject_fault", {"kind": "kill_node", "run": str(run_dir)}, OPERATOR)
        assert out.pids == [int((run_dir / "ready").read_text())] and victim.pid not in out.pids
        time.sleep(0.1)
        assert _alive(victim)
    finally:
        call("cancel_job", {"job_id": job_id, "force": True}, OPERATOR)


def test_a_rank_that_does_not_run_is_refused_not_looked_up_in_the_heartbeat(workspace, victim):
    job_id, _ = _poisoning_job(workspace, victim)
    try:
        with pytest.raises(ToolError, match=r"rank 3 is not a running process of the job .* \(ranks: 0\)"):
            call("inject_fault", {"kind": "hang", "run": "poisoned", "rank": 3}, OPERATOR)
        assert psutil.Process(victim.pid).status() != psutil.STATUS_STOPPED
    finally:
        call("cancel_job", {"job_id": job_id, "force": True}, OPERATOR)


def test_cancel_refuses_a_recycled_pid(workspace, victim):
    """The job record names the victim's pid, as if the runner had exited and the pid been reused:
    the victim is not the job's launcher as the kernel shows it, so it is not signalled; the real
    launcher is (the record is only an index: a job cannot dodge a cancel by rewriting it)."""
    spec = {"name": "short", "command": [sys.executable, "-c", "import time; time.sleep(60)"]}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle
    record_path = workspace / "jobs" / f"{job.job_id}.json"
    record = json.loads(record_path.read_text())
    runner = psutil.Process(record["pid"])
    try:
        record.update(pid=victim.pid, pgid=victim.pid)
        record_path.write_text(json.dumps(record))
        status = call("cancel_job", {"job_id": job.job_id, "force": True}, OPERATOR)
        assert status.state == "cancelled"
        _wait(lambda: _gone(runner.pid), "the job's real launcher to stop")
        assert _alive(victim)
    finally:
        for proc in [runner, *runner.children(recursive=True)]:
            proc.kill()


def test_inject_fault_refuses_a_run_folder_outside_the_workspace(tmp_path, victim):
    run_dir = tmp_path / "elsewhere"
    (run_dir / "heartbeat").mkdir(parents=True)
    (run_dir / "heartbeat" / "rank0.json").write_text(json.dumps({"step": 1, "time": time.time(), "pid": victim.pid}))
    with pytest.raises(ToolError, match=r"run='.*elsewhere' resolves to .* outside the workspace"):
        call("inject_fault", {"kind": "kill_rank", "run": str(run_dir), "rank": 0}, OPERATOR)
    assert _alive(victim)


@pytest.mark.parametrize("tool", ["cancel_job", "requeue_job"])
def test_a_slurm_job_trainops_did_not_launch_is_not_touched(tool):
    refused = rf"{tool}: refused \(invalid_input, R-SEC-3\): job '4242' was not launched by trainops in this workspace"
    with pytest.raises(ToolError, match=refused):
        call(tool, {"job_id": "4242", "scheduler": "slurm"}, OPERATOR)

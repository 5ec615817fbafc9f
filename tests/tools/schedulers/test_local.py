"""The local scheduler: detached jobs tracked in the workspace, found again by id."""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.schedulers import JobSpec, SchedulerError, get_scheduler
from trainops.tools.schedulers import local as local_scheduler


def _spec(code: str, **kw) -> JobSpec:
    return JobSpec(name="t", command=[sys.executable, "-c", code], **kw)


def test_a_job_runs_to_completion_and_its_log_is_readable():
    sched = get_scheduler("local")
    handle = sched.submit(_spec("print('hello from the job')"))
    status = sched.wait(handle.job_id, timeout_s=30)
    assert status.state == "completed" and status.exit_code == 0
    assert "hello from the job" in sched.logs(handle.job_id)


def test_a_runner_that_ends_between_the_two_looks_is_read_as_its_recorded_end(monkeypatch):
    """status() reads the exit file, then asks the kernel whether the runner still runs: a runner that
    writes its exit file and exits between those two looks (a busy host) is the job it recorded, not one
    that died without recording."""
    sched = get_scheduler("local")
    handle = sched.submit(_spec("print('done')"))
    sched.wait(handle.job_id, timeout_s=30)
    exit_file = Path(sched._load(handle.job_id)["exit_file"])
    recorded = exit_file.read_text()
    exit_file.unlink()

    def runner_finishes_now(record):
        exit_file.write_text(recorded)  # written just after the first look; the runner has exited
        return False

    monkeypatch.setattr(local_scheduler, "_launcher_runs", runner_finishes_now)
    assert (sched.status(handle.job_id).state, sched.status(handle.job_id).exit_code) == ("completed", 0)


def test_a_failing_command_reports_failed_with_its_exit_code():
    sched = get_scheduler("local")
    handle = sched.submit(_spec("import sys; sys.exit(3)"))
    status = sched.wait(handle.job_id, timeout_s=30)
    assert (status.state, status.exit_code) == ("failed", 3)


def test_a_job_outlives_the_call_and_a_fresh_scheduler_finds_it_running():
    handle = get_scheduler("local").submit(_spec("import time; time.sleep(30)"))
    try:
        assert get_scheduler("local").status(handle.job_id).state == "running"
    finally:
        get_scheduler("local").cancel(handle.job_id)


def test_cancel_stops_the_whole_process_group():
    sched = get_scheduler("local")
    handle = sched.submit(_spec("import time; time.sleep(60)"))
    started = time.monotonic()
    status = sched.cancel(handle.job_id)
    assert status.state == "cancelled"
    assert time.monotonic() - started < 10
    assert sched.status(handle.job_id).state == "cancelled"


def _graceful_job(tmp_path):
    """A job that writes `ready`, then on SIGTERM writes `terminated` before it exits."""
    code = (f"import pathlib, signal, sys, time; d = pathlib.Path({str(tmp_path)!r}); "
            "signal.signal(signal.SIGTERM, lambda *_: (d.joinpath('terminated').write_text('x'), sys.exit(0))); "
            "d.joinpath('ready').write_text('x'); time.sleep(60)")
    sched = get_scheduler("local")
    handle = sched.submit(_spec(code))
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline, sched.logs(handle.job_id)
        time.sleep(0.05)
    return sched, handle


@pytest.mark.parametrize("force", [False, True])
def test_cancel_gives_a_grace_period_unless_forced(tmp_path, force):
    sched, handle = _graceful_job(tmp_path)
    assert sched.cancel(handle.job_id, force=force).state == "cancelled"
    assert (tmp_path / "terminated").exists() is not force


@pytest.mark.slow
@pytest.mark.parametrize("force", [False, True])
def test_cancel_leaves_no_torchrun_worker_behind(tmp_path, force):
    """torchrun starts each worker in a session of its own: killing the job's process group alone
    would orphan them, and orphaned ranks train on."""
    script = tmp_path / "worker.py"
    script.write_text("import os, pathlib, sys, time\n"  # written whole, then renamed: the test polls for it
                      f"part = pathlib.Path({str(tmp_path)!r}, 'part' + os.environ['RANK'])\n"
                      "part.write_text(str(os.getpid()))\n"
                      f"part.rename(pathlib.Path({str(tmp_path)!r}, 'pid' + os.environ['RANK']))\n"
                      "time.sleep(120)\n")
    sched = get_scheduler("local")
    handle = sched.submit(JobSpec(name="t", command=[str(script)], launcher="torchrun", procs_per_node=2))
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"pid{rank}").exists() for rank in (0, 1)):
        assert time.monotonic() < deadline, sched.logs(handle.job_id)
        time.sleep(0.1)
    workers = [int((tmp_path / f"pid{rank}").read_text()) for rank in (0, 1)]
    assert sched.cancel(handle.job_id, force=force).state == "cancelled"
    assert [pid for pid in workers if _running(pid)] == []


def _running(pid: int) -> bool:
    """Not exited (a zombie counts as exited); the pid may vanish between two looks."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_requeue_runs_the_same_spec_again_under_the_same_id(tmp_path):
    marker = tmp_path / "count"
    code = (f"import pathlib; p = pathlib.Path({str(marker)!r}); p.write_text(p.read_text() + 'x' if p.exists() else "
            "'x')")
    sched = get_scheduler("local")
    handle = sched.submit(_spec(code))
    sched.wait(handle.job_id, timeout_s=30)
    again = sched.requeue(handle.job_id)
    assert again.job_id == handle.job_id
    assert sched.wait(handle.job_id, timeout_s=30).state == "completed"
    assert marker.read_text() == "xx"


def test_a_drained_node_refuses_submits_until_resumed():
    sched = get_scheduler("local")
    host = socket.gethostname()
    assert sched.drain(host, "fault drill").state == "drained"
    with pytest.raises(SchedulerError, match="drained"):
        sched.submit(_spec("pass"))
    assert sched.resume(host).state == "idle"
    assert sched.wait(sched.submit(_spec("pass")).job_id, timeout_s=30).state == "completed"


def test_an_unknown_job_id_names_the_backend_and_the_id():
    with pytest.raises(SchedulerError, match=r"local scheduler: unknown job id 'nope-1'"):
        get_scheduler("local").status("nope-1")


def test_a_malformed_spec_names_the_field_and_the_fix():
    with pytest.raises(ValidationError, match="procs_per_node must be at least 1"):
        JobSpec(name="ok", command=["true"], procs_per_node=0)
    with pytest.raises(ValidationError, match="name 'Bad_Name' is not valid"):
        JobSpec(name="Bad_Name", command=["true"])
    with pytest.raises(ValidationError, match="needs launcher='torchrun'"):
        JobSpec(name="ok", command=["true"], procs_per_node=2)


def test_submit_job_with_a_malformed_spec_names_the_field_through_the_tool():
    with pytest.raises(ToolError, match=r"submit_job: invalid input: .*spec\.procs_per_node.*must be at least 1"):
        call("submit_job", {"spec": {"name": "ok", "command": ["true"], "procs_per_node": 0}})

"""The local scheduler honours JobSpec.time_limit_min (issue 44 item 4): a job past its limit is
stopped as Slurm stops one (SIGTERM, then SIGKILL after a kill wait) and its end is recorded as a
time limit, a planned end, as Slurm's TIMEOUT is; a job inside its limit is left alone."""
from __future__ import annotations

import sys
import time

import pytest

from trainops.tools.calls import call
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.schedulers import JobSpec, get_scheduler
from trainops.tools.schedulers.local import KILL_WAIT_S, _timed_out
from trainops.tools.schedulers.processes import local_launchers

IGNORES_SIGTERM = ("import signal, sys, time\n"
                   "signal.signal(signal.SIGTERM, lambda *a: print('got SIGTERM, carrying on', flush=True))\n"
                   "print('working', flush=True)\n"
                   "while True: time.sleep(0.2)\n")


@pytest.mark.slow
@pytest.mark.usefixtures("as_operator")
def test_a_job_past_its_time_limit_is_stopped_and_recorded_as_a_time_limit(workspace):
    sched = get_scheduler("local")
    started = time.monotonic()
    spec = {"name": "limited", "command": [sys.executable, "-c", IGNORES_SIGTERM], "time_limit_min": 1}
    handle = call("submit_job", {"spec": spec}).handle
    status = call("wait_job", {"job_id": handle.job_id, "timeout_s": 60 + KILL_WAIT_S + 30})
    ran_s = time.monotonic() - started
    assert status.state == "failed" and status.reason.startswith("TIMEOUT:"), status
    assert status.exit_code == -9 and 60 <= ran_s < 60 + KILL_WAIT_S + 20, (status, ran_s)  # SIGTERM ignored
    assert "got SIGTERM" in sched.logs(handle.job_id)
    deadline = time.monotonic() + 5  # the runner exits just after it writes the exit file
    while local_launchers(handle.job_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not local_launchers(handle.job_id)
    record = read_interruptions(handle.job_id)[-1]
    assert (record.cause, record.sub_cause, record.confidence) == ("planned", "time-limit", "high"), record
    assert record.requeue_helps is True


def test_a_job_inside_its_time_limit_ends_as_it_ends(workspace):
    sched = get_scheduler("local")
    handle = sched.submit(JobSpec(name="quick", command=[sys.executable, "-c", "print('done')"], time_limit_min=1))
    status = sched.wait(handle.job_id, timeout_s=30)
    assert status.state == "completed" and "TIMEOUT" not in status.reason


def test_a_timed_out_mark_the_job_wrote_before_its_limit_is_not_a_time_limit():
    record = {"spec": {"time_limit_min": 5}, "started_at": 1000.0}
    assert _timed_out(record, {"timed_out": True, "ended_at": 1000.0 + 5 * 60}) == 5
    assert _timed_out(record, {"timed_out": True, "ended_at": 1000.0 + 30}) is None  # forged early
    assert _timed_out({"spec": {}, "started_at": 1000.0}, {"timed_out": True, "ended_at": 9e9}) is None

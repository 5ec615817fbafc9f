"""What a drill (S5) waits for, read from the run folder as the job writes it: a step and a
committed checkpoint before a fault goes in, a checkpoint write that has just committed, the
trainer's record of a launch-time fault firing, the restarted job's first step. Each wait also
watches the job (`JobWatch`), so it ends at once, with the job's own reason, when the job ends
first, instead of waiting out its timeout."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from trainops.run_records import FaultRecord, read_faults, read_heartbeat, read_metrics
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.context import CallContext
from trainops.tools.jobs.follow import JobWatch
from trainops.trainer.checkpoint_files import list_checkpoints


def heartbeat_step(run_dir: str, rank: int = 0) -> int:
    """The last step `rank` beat at; -1 before its first."""
    beat = read_heartbeat(run_dir, rank)
    return beat.step if beat else -1


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, job: JobWatch) -> float:
    """When `predicate` first holds; ends at once, with the job's own reason, when the job ends first."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return time.time()
        if (ended := job.ended()) is not None and not predicate():
            raise ToolError("drill", f"{ended}, while the drill waited for {what}; read {job.run_dir}/logs")
        time.sleep(0.05)
    raise ToolError("drill", f"timed out after {timeout_s:.0f} s waiting for {what}")


def between_writes(run_dir: str, timeout_s: float = 10.0) -> None:
    """Wait (briefly) for a checkpoint write to have just committed, with none in flight, so the
    corrupted checkpoint is the newest one when the restart looks (a later commit would hide it)."""
    def newest() -> tuple[int, bool] | None:
        try:
            found = list_checkpoints(Path(run_dir) / "checkpoints")
        except OSError:  # a folder renamed as it was listed: a write just committed
            return None
        return (found[-1].step, found[-1].committed) if found else None

    before, deadline = newest(), time.time() + timeout_s
    while time.time() < deadline:
        now = newest()
        if now is not None and now[1] and (before is None or now[0] > before[0]):
            return
        time.sleep(0.005)


def fault_fired(run_dir: str, kind: str) -> FaultRecord | None:
    """The trainer's record of a launch-time fault firing (it carries a step; tool records do not)."""
    return next((fault for fault in read_faults(run_dir) if fault.kind == kind and fault.step is not None), None)


def first_step_after(run_dir: str, since: float) -> float | None:
    return next((record.time for record in read_metrics(run_dir) if record.rank == 0 and record.time > since), None)


def wait_for_restart(run_dir: str, since: float, job_id: str, req: JobRequest, ctx: CallContext | None) -> float:
    """The time of the first step after `since`; fails at once, naming the job's own reason (its new
    status.json, else the scheduler's), when the restarted job ends without taking one."""
    job = JobWatch(job_id, req.scheduler, run_dir, ctx, since=since)
    deadline = time.time() + req.timeout_s
    while time.time() < deadline:
        if (first := first_step_after(run_dir, since)) is not None:
            return first
        if (ended := job.ended()) is not None and (first := first_step_after(run_dir, since)) is None:
            raise ToolError("requeue_job", f"the restarted {ended} before its first step; read {run_dir}/logs and "
                                           "the scheduler's log")
        time.sleep(0.05)
    raise ToolError("drill", f"timed out after {req.timeout_s:.0f} s waiting for the first step after restart in "
                             f"{run_dir}")

"""Launch a job through `submit_job` and follow it to its end: the one launch-and-follow path of
`trainops train`, the skills and the benchmarks.

`follow` waits for a submitted job through `wait_job` (on a thread, so that meanwhile the caller
can be shown the job's log lines and rank 0's steps), cancels it through `cancel_job` past its
timeout or on Ctrl-C, and returns its final status. `launch_run` and `run_local` train a trainer
run folder that way on the local scheduler and summarise it. Every step is a tool call, so a
launch passes the governance gate and lands in the audit log as its caller.
"""
from __future__ import annotations

import contextvars
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainops.run_folder import RunFiles, complete_lines
from trainops.run_records import RunResult, metrics_since, read_status
from trainops.terminal_text import safe_console
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext
from trainops.tools.jobs import jobs
from trainops.tools.jobs.trainer_job import trainer_job
from trainops.tools.reliability.interruptions import observe
from trainops.tools.schedulers.base import JobHandle, JobStatus
from trainops.trainer.config import load_config
from trainops.trainer.launch import loaded_checkpoint, prepare_run, summarize

if TYPE_CHECKING:
    from trainops.trainer.config import JobConfig

POLL_S = 0.2
WAIT_SLICE_S = 3600.0  # one wait_job call; the waiter asks again until the job ends
STATE_POLL_S = 1.0  # how often a wait asks the scheduler for the job's state (status.json is read every poll)
SCHEDULER_GRACE_S = 10.0  # after status.json, how long the scheduler may take to report the job's end


def ended_launch(run_dir: str | Path | None, since: float) -> RunResult | None:
    """The outcome (status.json) of a launch of the run that ended after `since`; an older file is a
    previous launch's (a requeued run keeps its folder)."""
    if not run_dir:
        return None
    path = RunFiles(run_dir).status
    try:
        if path.stat().st_mtime < since:
            return None
    except OSError:
        return None
    return read_status(run_dir)


def why_ended(job_id: str, status: JobStatus | None, result: RunResult | None) -> str:
    """The job's end in its own words: status.json's failure first, then the scheduler's reason."""
    if result is not None:
        what = "finished" if result.status == "ok" else f"failed (exit code {result.exit_code})"
        why = f": {result.failure}" if result.failure else ""
        return f"job {job_id} {what}{why} (its status.json in {result.run_dir})"
    assert status is not None
    return f"job {job_id} ended {status.state} (exit code {status.exit_code}; {status.reason or 'no reason given'})"


class JobWatch:
    """What every wait on a job (a drill's, an SOP step's) also watches: the job itself. `ended()`
    reads the run's status.json at every call and asks the scheduler (job_status) at most every
    STATE_POLL_S, and says why the job ended, or None while it runs; so a wait for a step, a fault or
    a restart ends at once with the job's own reason instead of waiting out its timeout."""
    def __init__(self, job_id: str, scheduler: str, run_dir: str | Path | None, ctx: CallContext | None = None,
                 since: float | None = None):
        self.job_id, self.scheduler, self.run_dir, self.ctx = job_id, scheduler, run_dir, ctx
        self.since = time.time() if since is None else since
        self.next_state = 0.0

    def ended(self) -> str | None:
        result = ended_launch(self.run_dir, self.since)
        if result is not None:
            return why_ended(self.job_id, None, result)
        if time.monotonic() < self.next_state:
            return None
        self.next_state = time.monotonic() + STATE_POLL_S
        status = invoke(jobs.job_status, jobs.JobRef(job_id=self.job_id, scheduler=self.scheduler), self.ctx)
        if not status.finished:
            return None
        return why_ended(self.job_id, status, ended_launch(self.run_dir, self.since))


def follow(handle: JobHandle, ctx: CallContext | None = None, *, timeout_s: float | None = None,
           show_progress: bool = False) -> JobStatus:
    """The job's final status, once it has ended. With `show_progress`, its log lines are printed
    as they come, above a bar of rank 0's completed steps (for a trainer run). Past `timeout_s` the
    job is cancelled, every rank with it; so is it when the caller presses Ctrl-C."""
    outcome: list[JobStatus | Exception] = []
    started = time.time()
    waiter = threading.Thread(target=contextvars.copy_context().run, args=(_wait, handle, ctx, outcome), daemon=True)
    waiter.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    watch = _Watch(handle) if show_progress else None
    try:
        while waiter.is_alive():
            waiter.join(POLL_S)
            if deadline is not None and time.monotonic() > deadline:
                deadline = None
                invoke(jobs.cancel_job, jobs.CancelJobInput(job_id=handle.job_id, scheduler=handle.backend), ctx)
            if watch is not None:
                watch.update()
            ended = ended_launch(handle.run_dir, started)
            if ended is not None and waiter.is_alive():
                # the launch is over (status.json): the scheduler only has to notice; past a grace, stop waiting
                waiter.join(SCHEDULER_GRACE_S)
                if waiter.is_alive():
                    invoke(jobs.cancel_job, jobs.CancelJobInput(job_id=handle.job_id, scheduler=handle.backend,
                                                                force=True), ctx)
                    status = _with_reason(JobStatus(job_id=handle.job_id, backend=handle.backend,
                                                    state="completed" if ended.status == "ok" else "failed",
                                                    exit_code=ended.exit_code, run_dir=handle.run_dir), ended)
                    observe(status, handle.backend)  # the job end seen here, not through job_status
                    return status
    except KeyboardInterrupt:
        invoke(jobs.cancel_job, jobs.CancelJobInput(job_id=handle.job_id, scheduler=handle.backend), ctx)
        raise
    finally:
        if watch is not None:
            watch.close()
    if isinstance(outcome[0], Exception):  # the tool's error, already in the audit log
        raise outcome[0]
    return _with_reason(outcome[0], ended_launch(handle.run_dir, started))


def _with_reason(status: JobStatus, ended: RunResult | None) -> JobStatus:
    """A failed job's status carries the run's own failure line (status.json), not only the scheduler's."""
    if status.state != "failed" or ended is None or not ended.failure or ended.failure in status.reason:
        return status
    reason = f"{ended.failure}; {status.reason}" if status.reason else ended.failure
    return status.model_copy(update={"reason": reason})


def _wait(handle: JobHandle, ctx: CallContext | None, outcome: list) -> None:
    try:
        while True:
            status = invoke(jobs.wait_job, jobs.WaitJobInput(job_id=handle.job_id, scheduler=handle.backend,
                                                             timeout_s=WAIT_SLICE_S), ctx)
            if status.finished:
                outcome.append(status)
                return
    except Exception as exc:  # handed to the caller's thread, which raises it
        outcome.append(exc)


def launch_run(run_dir: str | Path, nproc: int, *, ctx: CallContext | None = None, show_progress: bool = False,
               timeout_s: float | None = None) -> RunResult:
    """Train a prepared run folder on `nproc` local ranks and summarise it. Launching the same
    folder again resumes from its newest good checkpoint (with `[checkpoint] enable`), which is how
    a requeue continues a run; `resumed_from` says which checkpoint this launch loaded."""
    started = time.time()
    launch = jobs.SubmitJobInput(scheduler="local", spec=trainer_job(run_dir, nproc))
    handle = invoke(jobs.submit_job, launch, ctx).handle
    status = follow(handle, ctx, timeout_s=timeout_s, show_progress=show_progress)
    # no exit code: the job's runner itself was killed (power loss, kill -9)
    result = summarize(run_dir, status.exit_code if status.exit_code is not None else -9)
    return result.model_copy(update={"resumed_from": loaded_checkpoint(run_dir, started)})


def run_local(cfg: JobConfig, nproc: int, run_id: str | None = None, *, ctx: CallContext | None = None,
              show_progress: bool = False, timeout_s: float | None = None) -> RunResult:
    """Train `cfg` in a new run folder (named `run_id`, or a fresh id) on `nproc` local ranks."""
    return launch_run(prepare_run(cfg, run_id=run_id), nproc, ctx=ctx, show_progress=show_progress,
                      timeout_s=timeout_s)


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines appended to the job's log since byte `offset` (the newest, within the read caps;
    none from a FIFO the job put in its place), and the new offset."""
    read = complete_lines(path, offset)
    return [line.decode(errors="replace") for line in read.lines], read.offset


class _Watch:
    """A followed job on the screen: its new log lines above a transient bar of rank 0's steps."""
    def __init__(self, handle: JobHandle):
        self.log, self.log_offset = (Path(handle.log_path) if handle.log_path else None), 0
        self.run_dir, self.metrics_offset, self.step = handle.run_dir, 0, 0
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=safe_console(), transient=True)
        self.bar.start()
        self.task = self.bar.add_task("training", total=_total_steps(self.run_dir))

    def update(self) -> None:
        if self.log is not None:
            lines, self.log_offset = _new_lines(self.log, self.log_offset)
            for line in lines:  # a job's own log: its escape sequences print as text (safe_console)
                self.bar.console.print(line, highlight=False, markup=False, soft_wrap=True)
        if self.run_dir:
            records, self.metrics_offset, _ = metrics_since(self.run_dir, self.metrics_offset)
            self.step = max([self.step, *(r.step for r in records if r.rank == 0)])
            self.bar.update(self.task, completed=self.step)

    def close(self) -> None:
        self.update()  # the lines written as the job ended
        self.bar.stop()


def _total_steps(run_dir: str | None) -> int | None:
    """The steps a trainer run is configured for; None (an open-ended bar) for any other job."""
    if not run_dir or not RunFiles(run_dir).config.is_file():
        return None
    return load_config(RunFiles(run_dir).config).training.steps

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

from trainops.run_folder import RunFiles, RunResult, metrics_since
from trainops.tools.base import CallContext
from trainops.tools.calls import call
from trainops.tools.schedulers.base import JobHandle, JobStatus
from trainops.tools.trainer_job import trainer_job

if TYPE_CHECKING:
    from trainops.trainer.config import JobConfig

POLL_S = 0.2
WAIT_SLICE_S = 3600.0  # one wait_job call; the waiter asks again until the job ends


def follow(handle: JobHandle, ctx: CallContext | None = None, *, timeout_s: float | None = None,
           show_progress: bool = False) -> JobStatus:
    """The job's final status, once it has ended. With `show_progress`, its log lines are printed
    as they come, above a bar of rank 0's completed steps (for a trainer run). Past `timeout_s` the
    job is cancelled, every rank with it; so is it when the caller presses Ctrl-C."""
    outcome: list[JobStatus | Exception] = []
    waiter = threading.Thread(target=contextvars.copy_context().run, args=(_wait, handle, ctx, outcome), daemon=True)
    waiter.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    watch = _Watch(handle) if show_progress else None
    try:
        while waiter.is_alive():
            waiter.join(POLL_S)
            if deadline is not None and time.monotonic() > deadline:
                deadline = None
                call("cancel_job", {"job_id": handle.job_id, "scheduler": handle.backend}, ctx)
            if watch is not None:
                watch.update()
    except KeyboardInterrupt:
        call("cancel_job", {"job_id": handle.job_id, "scheduler": handle.backend}, ctx)
        raise
    finally:
        if watch is not None:
            watch.close()
    if isinstance(outcome[0], Exception):  # the tool's error, already in the audit log
        raise outcome[0]
    return outcome[0]


def _wait(handle: JobHandle, ctx: CallContext | None, outcome: list) -> None:
    try:
        while True:
            status = call("wait_job", {"job_id": handle.job_id, "scheduler": handle.backend,
                                       "timeout_s": WAIT_SLICE_S}, ctx)
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
    from trainops.trainer.launch import loaded_checkpoint, summarize

    started = time.time()
    handle = call("submit_job", {"scheduler": "local", "spec": trainer_job(run_dir, nproc)}, ctx).handle
    status = follow(handle, ctx, timeout_s=timeout_s, show_progress=show_progress)
    # no exit code: the job's runner itself was killed (power loss, kill -9)
    result = summarize(run_dir, status.exit_code if status.exit_code is not None else -9)
    return result.model_copy(update={"resumed_from": loaded_checkpoint(run_dir, started)})


def run_local(cfg: JobConfig, nproc: int, run_id: str | None = None, *, ctx: CallContext | None = None,
              show_progress: bool = False, timeout_s: float | None = None) -> RunResult:
    """Train `cfg` in a new run folder (named `run_id`, or a fresh id) on `nproc` local ranks."""
    from trainops.trainer.launch import prepare_run

    return launch_run(prepare_run(cfg, run_id=run_id), nproc, ctx=ctx, show_progress=show_progress,
                      timeout_s=timeout_s)


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines appended to `path` since byte `offset`, and the new offset."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:  # not written yet
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    return complete.decode(errors="replace").splitlines(), offset + len(complete)


class _Watch:
    """A followed job on the screen: its new log lines above a transient bar of rank 0's steps."""

    def __init__(self, handle: JobHandle):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from trainops.terminal_text import safe_console

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
            records, self.metrics_offset = metrics_since(self.run_dir, self.metrics_offset)
            self.step = max([self.step, *(r.step for r in records if r.rank == 0)])
            self.bar.update(self.task, completed=self.step)

    def close(self) -> None:
        self.update()  # the lines written as the job ended
        self.bar.stop()


def _total_steps(run_dir: str | None) -> int | None:
    """The steps a trainer run is configured for; None (an open-ended bar) for any other job."""
    from trainops.trainer.config import load_config

    if not run_dir or not RunFiles(run_dir).config.is_file():
        return None
    return load_config(RunFiles(run_dir).config).training.steps

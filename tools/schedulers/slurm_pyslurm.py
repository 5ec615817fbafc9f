"""Slurm through pyslurm's bindings to libslurm (pyslurm 22.5.x for Slurm 22.05).

Chosen by `select_transport()` only after a child process has imported pyslurm successfully
for the active slurm.conf: importing it with no reachable configuration exits the process.
Submission runs in a child process too, because `submit_batch_job` rewrites `os.environ` and
calls `sys.exit` on some errors.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from trainops.tools.schedulers.base import SchedulerError
from trainops.tools.schedulers.slurm_transport import KIND, SlurmJob, SlurmNode, controller_address, partition_names

# sbatch flag -> pyslurm job option (pyslurm takes sbatch's names, with its own spellings)
_OPTIONS = {"job-name": "job_name", "nodes": "min_nodes", "cpus-per-task": "cpus_per_task", "output": "output",
            "time": "time_limit", "partition": "partition", "exclude": "exc_nodes", "chdir": "work_dir",
            "account": "account", "no-kill": "no_kill"}
_INTEGER_OPTIONS = {"min_nodes", "cpus_per_task", "time_limit"}
_OPEN_MODE_APPEND = 1  # slurm.h OPEN_MODE_APPEND
_FIRST_SPECIAL_STEP = 0xFFFFFFF0  # batch, extern, interactive steps have ids from here up
_INVALID_JOB_ID = 2017  # ESLURM_INVALID_JOB_ID
_SUBMIT = ("import json, sys, pyslurm\n"
           "print(pyslurm.job().submit_batch_job(json.loads(sys.argv[1])))\n")


_SUBMIT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "SLURM_CONF", "LD_LIBRARY_PATH")


def _submit_environment() -> dict[str, str]:
    """What the submitting child may see: submit_batch_job hands its whole environment to slurmctld,
    which keeps it with the job, so the operator's shell (tokens, keys) stays out of it. The
    job's own environment is set by its script (tools/schedulers/job_env.py)."""
    return {key: os.environ[key] for key in _SUBMIT_ENV if key in os.environ}


class PyslurmTransport:
    name = "pyslurm"

    def __init__(self) -> None:
        self._conf: str | None = None

    def _slurm(self):
        """The pyslurm module, initialised for the current SLURM_CONF (re-initialised when it changes)."""
        import pyslurm

        conf = os.environ.get("SLURM_CONF")
        if conf != self._conf:
            pyslurm.slurm_fini()
            pyslurm.slurm_init(conf)
            self._conf = conf
        return pyslurm

    def submit(self, script: Path, options: list[tuple[str, str]]) -> str:
        # "script": pyslurm reads the file once, here, and slurmctld keeps that text, as sbatch does; a
        # wrap of `bash FILE` would re-read the file (which the job can write) on every run and requeue.
        job_opts: dict[str, object] = {"script": str(script), "ntasks_per_node": 1, "requeue": 1,
                                       "open_mode": _OPEN_MODE_APPEND}
        for flag, value in options:
            key = _OPTIONS[flag]
            job_opts[key] = int(value) if key in _INTEGER_OPTIONS else value
        done = subprocess.run([sys.executable, "-c", _SUBMIT, json.dumps(job_opts)], capture_output=True, text=True,
                              timeout=60, env=_submit_environment())
        job_id = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode != 0 or not job_id.isdigit():
            detail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise SchedulerError(KIND, f"pyslurm submit_batch_job failed: {detail}; check the job options or set "
                                       "TRAINOPS_SLURM_TRANSPORT=cli to compare with sbatch")
        return job_id

    def job(self, job_id: str) -> SlurmJob | None:
        try:
            found = self._slurm().job().find_id(int(job_id))
        except ValueError as exc:
            if _errno(exc) == _INVALID_JOB_ID:  # unknown, or purged after MinJobAge
                return None
            raise _scheduler_error(exc, f"job {job_id}") from None
        return _job(found[0]) if found else None

    def jobs(self) -> list[SlurmJob]:
        return [_job(job) for job in _checked("list jobs", lambda: self._slurm().job().get()).values()]

    def hostnames(self, nodelist: str) -> list[str]:
        if not nodelist:
            return []
        hosts = self._slurm().hostlist()
        hosts.create(nodelist)
        return [h.decode() if isinstance(h, bytes) else h for h in hosts.get_list()]

    def steps(self, job_id: str) -> list[str]:
        steps = _checked(f"steps of job {job_id}", lambda: self._slurm().jobstep(int(job_id)).get()).get(int(job_id),
                                                                                                         {})
        return [f"{job_id}.{step}" for step in steps if int(step) < _FIRST_SPECIAL_STEP]

    def kill_steps_and_batch(self, job_id: str) -> None:
        slurm = self._slurm()
        for step in self.steps(job_id):
            _ignore_finished(slurm.slurm_kill_job_step, int(job_id), int(step.partition(".")[2]), signal.SIGKILL)
        _ignore_finished(slurm.slurm_kill_job, int(job_id), signal.SIGKILL, 1)  # 1 = the batch shell only

    def cancel(self, job_id: str) -> None:
        _ignore_finished(self._slurm().slurm_kill_job, int(job_id), signal.SIGKILL, 0)

    def requeue(self, job_id: str) -> None:
        code = self._slurm().slurm_requeue(int(job_id), 0)
        if code:
            raise SchedulerError(KIND, f"pyslurm slurm_requeue({job_id}) failed with Slurm error {code}; "
                                       "is the job still known to slurmctld?")

    def nodes(self) -> list[SlurmNode]:
        found = []
        for name, node in _checked("list nodes", lambda: self._slurm().node().get()).items():
            raw = str(node.get("state", "UNKNOWN"))
            base, *extra = raw.split("+")
            flags = tuple(f.upper() for f in extra) + (("NOT_RESPONDING",) if base.endswith("*") else ())
            found.append(SlurmNode(name=name, state=base.rstrip("*").lower(), flags=flags, cpus=node.get("cpus"),
                                   reason=node.get("reason") or "", partitions=partition_names(node.get("partitions"))))
        return found

    def update_node(self, node: str, state: str, reason: str) -> None:
        slurm = self._slurm()
        states = {"DRAIN": slurm.NODE_STATE_DRAIN, "RESUME": slurm.NODE_RESUME}
        code = _checked(f"set node {node} State={state}", lambda: slurm.node().update(
            {"node_names": node, "node_state": states[state], **({"reason": reason} if reason else {})}))
        if code:
            raise SchedulerError(KIND, f"pyslurm node update {node} State={state} failed with Slurm error {code}")


def _job(job: dict) -> SlurmJob:
    code, _, sig = str(job.get("exit_code") or "0:0").partition(":")
    state = str(job.get("job_state", "UNKNOWN"))
    running = state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")
    return SlurmJob(job_id=str(job["job_id"]), name=job.get("name") or "", state=state, exit_code=int(code or 0),
                    exit_signal=int(sig or 0), nodelist=job.get("nodes") or "",
                    reason=job.get("state_reason") or "None", started_at=job.get("start_time") or None,
                    ended_at=None if running else (job.get("end_time") or None), stdout=job.get("std_out") or "",
                    submitted_at=job.get("submit_time") or None)


def _errno(exc: ValueError) -> int | None:
    return exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], int) else None


def _scheduler_error(exc: ValueError, what: str) -> SchedulerError:
    message = exc.args[0] if exc.args else str(exc)
    return SchedulerError(KIND, f"pyslurm could not {what}: {message}; is slurmctld running at "
                                f"{controller_address()}? check with `scontrol ping`")


def _checked(what: str, fn):
    """pyslurm reports every Slurm error as ValueError(message, errno): name the controller instead."""
    try:
        return fn()
    except ValueError as exc:
        raise _scheduler_error(exc, what) from None


def _ignore_finished(fn, *args) -> None:
    """Signalling a job or step that has just ended is not an error for a cancel."""
    try:
        fn(*args)
    except ValueError:
        pass

"""The embedded scheduler: jobs are detached sessions on this machine, indexed by
`$TRAINOPS_HOME/jobs/<id>.json`, so a job outlives the CLI call that started it. The job can
rewrite that record: which processes are the job's is asked of the kernel (processes.py), the node
it ran on is this host (never a name in the record), and a requeue relaunches the spec only while
it still has the digest submit recorded and returned."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from trainops.run_folder import launch_mark, read_regular
from trainops.tools.schedulers.base import (
    TERMINAL_STATES,
    JobHandle,
    JobSpec,
    JobStatus,
    NodeInfo,
    PollingWait,
    SchedulerError,
    rank_log,
    read_confined,
    spec_ranks,
    tail_text,
)
from trainops.tools.schedulers.job_env import LAUNCHER_MARKER, job_environment
from trainops.tools.schedulers.processes import local_launchers, local_tree, spec_sha256, stop_processes
from trainops.trainer.launch import record_key_env, torchrun_argv
from trainops.workspace import check_id, home, jobs_dir

KIND = "local"
CANCEL_GRACE_S = 5.0
LAUNCH_VISIBLE_S = 10.0
"""The longest a launch waits for the kernel to show its launcher (milliseconds, even on a loaded host)."""
KILL_WAIT_S = 10.0
"""A job past its time limit gets SIGTERM, then SIGKILL this long after (Slurm's KillWait; a shorter one here)."""


def _jobs() -> Path:
    return jobs_dir()


def _nodes_file() -> Path:
    return home() / "local_nodes.json"


def pid_alive(pid: int, create_time: float | None = None) -> bool:
    """True while `pid` runs (a zombie, or a pid now used by a process created at another time
    than `create_time`, counts as gone)."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and (create_time is None or proc.create_time() == create_time)
    except psutil.NoSuchProcess:
        return False


def _digest(spec: JobSpec) -> str:
    return spec_sha256(spec)


def _launcher_runs(record: dict) -> bool:
    """Whether the job's launcher runs, as the kernel says (processes.local_launchers); a launcher
    this process started and that has exited is reaped first."""
    if isinstance(record.get("pid"), int):
        pid_alive(record["pid"])
    return bool(local_launchers(record["job_id"], record))


def _await_launcher(proc: subprocess.Popen, job_id: str, exit_file: Path) -> None:
    """Return once the kernel shows the new launcher as this job's, or it has ended. Popen returns as
    exec closes the launcher's old descriptors, a moment before the kernel sets up its new environment:
    in that window /proc/PID/environ is empty, the marker unseen, and a status read then took the job
    for a runner that died without an exit code (seen as 'failed', None on a loaded host)."""
    deadline = time.monotonic() + LAUNCH_VISIBLE_S
    while time.monotonic() < deadline and proc.poll() is None and not exit_file.exists():
        if local_launchers(job_id, {"pid": proc.pid}):
            return
        time.sleep(0.005)


def _read_json(path: Path):
    """A JSON file of this scheduler's, read only when it is a regular file of bounded size (a job can
    put a named pipe or garbage there); None when missing or unreadable."""
    data = read_regular(path)
    try:
        return None if data is None else json.loads(data)
    except ValueError:
        return None


def _exit_info(record: dict) -> dict | None:
    """What the job's runner recorded at its end; None while it runs, or for what the runner does not write."""
    exit_info = _read_json(Path(record["exit_file"]))
    return exit_info if isinstance(exit_info, dict) and isinstance(exit_info.get("exit_code"), int) else None


def _timed_out(record: dict, exit_info: dict) -> int | None:
    """The spec's time limit (minutes) when the runner stopped the job at it: the runner says so and the
    job ran at least that long (the exit file is the job's to write too; an early 'timed out' is not one)."""
    limit = record["spec"].get("time_limit_min")
    ran_s = (exit_info.get("ended_at") or 0) - (record.get("started_at") or float("inf"))
    return limit if exit_info.get("timed_out") is True and limit and ran_s >= limit * 60 else None


class LocalScheduler(PollingWait):
    kind = KIND
    poll_s = 0.1

    def _record_path(self, job_id: str) -> Path:
        try:
            check_id("job", job_id)
        except ValueError as exc:
            raise SchedulerError(KIND, str(exc)) from None
        return _jobs() / f"{job_id}.json"

    def _load(self, job_id: str) -> dict:
        path = self._record_path(job_id)
        if not path.exists():
            known = sorted(p.stem for p in _jobs().glob("*.json"))[-5:]
            hint = f"recent jobs: {', '.join(known)}" if known else "no jobs submitted in this workspace yet"
            raise SchedulerError(KIND, f"unknown job id {job_id!r} in {_jobs()}; {hint} (list them with list_jobs)")
        record = _read_json(path)
        if not isinstance(record, dict):
            raise SchedulerError(KIND, f"job record {path} is not a JSON object trainops wrote; "
                                       "cancel the job by hand and remove the record")
        return record

    def _save(self, record: dict) -> None:
        path = self._record_path(record["job_id"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, path)

    def _launch(self, record: dict) -> dict:
        spec = JobSpec.model_validate(record["spec"])
        if spec.nodes != 1:
            raise SchedulerError(KIND,
                                 f"nodes={spec.nodes}: the local scheduler has one node ({socket.gethostname()}); use "
                                 "nodes=1 or scheduler='slurm'")
        if spec.launcher == "torchrun":  # trainops builds the command: the supervisor's, with its run's key
            command = torchrun_argv(sys.executable, spec.procs_per_node, spec.command)
            keyed = record_key_env(command)
        else:  # the spec's own command, whatever it names, gets no key
            command, keyed = list(spec.command), {}
        exit_file = _jobs() / f"{record['job_id']}.exit"
        exit_file.unlink(missing_ok=True)
        env = {"OMP_NUM_THREADS": "1", **job_environment(spec, KIND), LAUNCHER_MARKER: record["job_id"],
               **keyed}
        log = open(record["log_path"], "ab")
        log.write(launch_mark("job", f"{time.time():.3f}").encode())
        log.flush()
        limit = ["--time-limit-s", str(spec.time_limit_min * 60), "--kill-wait-s", str(KILL_WAIT_S)] \
            if spec.time_limit_min else []
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trainops.tools.schedulers.local_runner", *limit, str(exit_file),
                 *([spec.run_dir] if spec.run_dir else []), "--", *command],
                cwd=spec.workdir or None, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as exc:
            raise SchedulerError(KIND,
                                 f"cannot start {command[0]!r} in {spec.workdir or os.getcwd()}: {exc}; check the "
                                 "command and workdir") from None
        finally:
            log.close()
        _await_launcher(proc, record["job_id"], exit_file)
        record.update(pid=proc.pid, started_at=time.time(), command=command, exit_file=str(exit_file),
                      cancelled=False, spec_sha256=_digest(spec))
        record["attempts"] = record.get("attempts", 0) + 1
        self._save(record)
        return record

    def _handle(self, record: dict) -> JobHandle:
        return JobHandle(job_id=record["job_id"], backend=KIND, name=record["spec"]["name"],
                         submitted_at=record["submitted_at"], run_dir=record["spec"].get("run_dir"),
                         log_path=record["log_path"])

    def submit(self, spec: JobSpec) -> JobHandle:
        host = socket.gethostname()
        drained = self._drained()
        if host in drained:
            raise SchedulerError(KIND,
                                 f"node {host} is drained ({drained[host]}); resume it with resume_node before "
                                 "submitting")
        if host in spec.exclude_nodes:
            raise SchedulerError(KIND,
                                 f"exclude_nodes contains {host}, the only local node; remove it or use "
                                 "scheduler='slurm'")
        job_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        record = {"job_id": job_id, "spec": spec.model_dump(), "submitted_at": time.time(),
                  "log_path": str(_jobs() / f"{job_id}.log")}
        return self._handle(self._launch(record))

    def status(self, job_id: str) -> JobStatus:
        record = self._load(job_id)
        exit_info = _exit_info(record)
        alive = exit_info is None and _launcher_runs(record)
        if exit_info is None and not alive:  # the runner may have written it and exited between the two looks
            exit_info = _exit_info(record)
        if record.get("cancelled"):
            state, code = "cancelled", exit_info["exit_code"] if exit_info else None
        elif exit_info is not None:
            code = exit_info["exit_code"]
            state = "completed" if code == 0 else "failed"
        elif alive:
            state, code = "running", None
        else:
            state, code = "failed", None
        reason = ("" if state != "failed" or code is not None
                  else "the job's runner died without recording an exit code (killed); no process the kernel shows "
                       "as this job's launcher runs, so nothing of the pid its record names is signalled")
        if code is not None and code < 0:
            reason = f"killed by signal {signal.Signals(-code).name}"
        if state == "failed" and exit_info and (limit := _timed_out(record, exit_info)):
            reason = (f"TIMEOUT: ran past its time limit of {limit} min; the local scheduler sent SIGTERM, then "
                      f"SIGKILL after {KILL_WAIT_S:.0f} s" + (f" ({reason})" if reason else ""))
        return JobStatus(job_id=job_id, backend=KIND, name=record["spec"]["name"], state=state, exit_code=code,
                         nodes=[socket.gethostname()], reason=reason, submitted_at=record.get("submitted_at"),
                         started_at=record.get("started_at"),
                         ended_at=exit_info["ended_at"] if exit_info else record.get("cancelled_at"),
                         run_dir=record["spec"].get("run_dir"), ranks=spec_ranks(record["spec"]))

    def logs(self, job_id: str, tail: int = 100, rank: int | None = None) -> str:
        record = self._load(job_id)
        if rank is not None:
            return tail_text(rank_log(record["spec"].get("run_dir"), rank, KIND, job_id), tail)
        path = Path(record["log_path"])
        return tail_text(read_confined(path, "job log", KIND) if path.exists() else "", tail)

    def cancel(self, job_id: str, force: bool = False) -> JobStatus:
        record = self._load(job_id)
        if self.status(job_id).state not in TERMINAL_STATES:
            record.update(cancelled=True, cancelled_at=time.time())
            self._save(record)
            self._kill_group(record, grace_s=0.0 if force else CANCEL_GRACE_S)
        return self.status(job_id)

    def _kill_group(self, record: dict, grace_s: float = CANCEL_GRACE_S) -> None:
        """SIGTERM, up to `grace_s` for a clean exit, then SIGKILL of the job's whole process tree
        (processes.stop_processes says why the tree); grace 0 goes straight to SIGKILL. The tree
        and the process group are the kernel's (processes.local_tree), never the record's pid or pgid."""
        launchers = local_launchers(record["job_id"])
        stop_processes(local_tree(record["job_id"]), launchers[0].pid if launchers else None, grace_s)

    def requeue(self, job_id: str, spec_sha256: str | None = None) -> JobHandle:
        """Stop the job if it still runs and start it again with the same spec and id; a trainer
        resumes from its newest checkpoint in the same run folder. With `spec_sha256` (what an
        approval signed), the spec read here must have that digest: the job can rewrite its record."""
        record = self._load(job_id)
        if spec_sha256 is not None and _digest(JobSpec.model_validate(record["spec"])) != spec_sha256:
            raise SchedulerError(KIND, f"job {job_id}'s record no longer holds the spec submit launched (its sha256 "
                                       f"is not {spec_sha256}, the one the requeue was asked and approved for): "
                                       "someone rewrote jobs/" f"{job_id}.json; nothing was relaunched; submit the "
                                       "job again with submit_job")
        if self.status(job_id).state not in TERMINAL_STATES:
            self._kill_group(record)
        record.pop("cancelled_at", None)
        return self._handle(self._launch(record))

    def list_jobs(self) -> list[JobStatus]:
        """Every job this workspace recorded; a record that is not trainops' (garbled, hand-made) is left
        out here and named by job_status."""
        found = []
        for path in sorted(_jobs().glob("*.json")):
            try:
                found.append(self.status(path.stem))
            except SchedulerError:
                continue
        return found

    def _drained(self) -> dict[str, str]:
        drained = _read_json(_nodes_file())
        return drained if isinstance(drained, dict) else {}

    def list_nodes(self) -> list[NodeInfo]:
        host = socket.gethostname()
        drained = self._drained()
        if host in drained:
            state, reason = "drained", drained[host]
        else:
            busy = any(s.state == "running" for s in self.list_jobs())
            state, reason = ("allocated" if busy else "idle"), ""
        return [NodeInfo(name=host, state=state, cpus=os.cpu_count(), reason=reason)]

    def _check_node(self, node: str) -> str:
        host = socket.gethostname()
        if node not in (host, "localhost"):
            raise SchedulerError(KIND, f"unknown node {node!r}: the local scheduler has one node, {host!r}")
        return host

    def drain(self, node: str, reason: str) -> NodeInfo:
        host = self._check_node(node)
        drained = self._drained()
        drained[host] = reason or "drained by trainops"
        _nodes_file().write_text(json.dumps(drained))
        return self.list_nodes()[0]

    def resume(self, node: str) -> NodeInfo:
        host = self._check_node(node)
        drained = self._drained()
        drained.pop(host, None)
        _nodes_file().write_text(json.dumps(drained))
        return self.list_nodes()[0]

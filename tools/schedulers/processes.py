"""Which processes belong to a job trainops launched, and which of them is rank R.

Tools that signal processes (`inject_fault`, `cancel_job`) act only on what the kernel says
trainops launched, never on a pid, pgid or start time read from a file: the job runs as the same
user and can write its record `jobs/ID.json`, its heartbeats and its run folder, and read any
pid and start time in /proc. A record is only an index.

- Local: the local scheduler starts each job's launcher (local_runner) as the leader of a new
  session, with LAUNCHER_MARKER=<job id> in the environment it execs it with. A launcher of job X
  is a live session leader (sid == pid, so its process group is its pid) whose environment, as
  /proc/PID/environ shows it, names X; the job's processes are it and its descendants by the
  kernel's parent chain. What a job can forge: a decoy process of its own carrying some job's
  marker (then that decoy is signalled too: it is the job's own). What it cannot: give a process
  it did not start (an unrelated `sleep`, another job's launcher, a recycled pid) that marker,
  change another process's environment or parent short of ptrace (which would let it signal the
  process itself), or move a process into the launcher's session. A secret marker would add
  nothing: whatever trainops reads to compare, a same-uid job can read too.
- Slurm: a job's processes descend from a root-owned `slurmstepd` whose title names that Slurm
  job id; cancels and requeues go to Slurm by job id (scancel/scontrol), never to a pid.

A rank is found by the RANK variable torchrun gives each worker; `stop_processes` stops a tree.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import psutil

from trainops.run_records import read_worker_events
from trainops.tools.schedulers.base import JobSpec, SchedulerError, SchedulerKind
from trainops.tools.schedulers.job_env import LAUNCHER_MARKER
from trainops.trainer.launch import WARM_LAUNCHER, rank_in_name
from trainops.workspace import jobs_dir

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)
KILL_CONFIRM_S = 15.0
"""How long a stop waits for the kernel to confirm SIGKILLed processes gone: it returns as soon as they
are, and on a loaded host a killed rank has been seen still running 2 s after its SIGKILL."""


def _is_launcher(proc: psutil.Process, job_id: str) -> bool:
    try:
        return (os.getsid(proc.pid) == proc.pid and proc.status() != psutil.STATUS_ZOMBIE
                and proc.environ().get(LAUNCHER_MARKER) == job_id)
    except (*_GONE, psutil.AccessDenied, ProcessLookupError, PermissionError):
        return False


def local_launchers(job_id: str, record: dict | None = None) -> list[psutil.Process]:
    """The live launchers of local job `job_id`, as the kernel shows them. The record's pid is
    looked at first (one launcher runs per job); without a thorough look (`record` None) every
    session leader is, so a record pointed elsewhere cannot hide the real launcher."""
    if record is not None:
        try:
            proc = psutil.Process(int(record.get("pid")))
        except (*_GONE, TypeError, ValueError):
            proc = None
        if proc is not None and _is_launcher(proc, job_id):
            return [proc]
    return [proc for proc in psutil.process_iter() if _is_launcher(proc, job_id)]


def local_tree(job_id: str) -> list[psutil.Process]:
    """Every launcher of local job `job_id` and every process below it (the kernel's parent
    chain); empty once none runs."""
    tree: list[psutil.Process] = []
    for root in local_launchers(job_id):
        try:
            tree += [root, *root.children(recursive=True)]
        except _GONE:
            continue
    return tree


def stop_processes(tree: list[psutil.Process], pgid: int | None, grace_s: float) -> None:
    """SIGTERM the process group `pgid`, a confirmed launcher's (torchrun passes it on to its
    ranks for a clean exit; None: no group), up to
    `grace_s`, then SIGKILL every process of `tree`, taken before the first signal: torchrun
    starts each rank in a session of its own, so signalling the group alone orphans the ranks
    (seen: orphaned ranks trained on after a drill, and SIGSTOPped ones were leaked). Grace 0
    goes straight to SIGKILL."""
    if not tree:
        return
    if grace_s > 0 and pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        _wait_gone(tree, grace_s)
    alive = [proc for proc in tree if _running(proc)]
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    _wait_gone(alive, KILL_CONFIRM_S)  # so a restart never overlaps the old processes


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie: orphaned ranks' zombies wait on whoever adopts them (here a PID 1
    that reaps slowly), and psutil.wait_procs would wait its whole timeout for them."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_running(proc) for proc in procs):
        time.sleep(0.01)


def _slurm_stepd_job(proc: psutil.Process) -> str | None:
    """The Slurm job id of the nearest root-owned `slurmstepd` above `proc`, read from the title
    slurmstepd gives itself ('slurmstepd: [123.0]'); None when no slurmstepd is above it."""
    for parent in proc.parents():
        if parent.name() == "slurmstepd" and parent.uids().real == 0:
            title = " ".join(parent.cmdline())
            return title.partition("[")[2].partition(".")[0] or None
    return None


def _slurm_tree(job_id: str) -> list[psutil.Process]:
    """The job's processes: those a root-owned slurmstepd of Slurm job `job_id` started (the
    SLURM_JOB_ID a process carries is only a quick filter: any process can set it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("SLURM_JOB_ID") == job_id and _slurm_stepd_job(proc) == job_id:
                found.append(proc)
        except (*_GONE, psutil.AccessDenied):
            continue
    return found


def _records(scheduler: SchedulerKind) -> list[tuple[str, dict]]:
    """(job id, record) of every job trainops submitted to `scheduler` in this workspace."""
    found = []
    for path in sorted(jobs_dir().glob("*.json")):
        is_slurm = path.stem.startswith("slurm-")
        if is_slurm != (scheduler == "slurm"):
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        job_id = (record.get("handle") or {}).get("job_id") or path.stem.removeprefix("slurm-")
        found.append((str(job_id), record))
    return found


def job_of_run(run_dir: Path) -> tuple[SchedulerKind, str]:
    """The scheduler and id of the newest job trainops launched (locally or on Slurm) for this run
    folder. Kubernetes pods are out of reach: their processes cannot be signalled from here."""
    target = run_dir.resolve()
    matches = []
    for scheduler in ("local", "slurm"):
        for job_id, record in _records(scheduler):
            run = (record.get("spec") or {}).get("run_dir")
            if run and Path(run).resolve() == target:
                submitted = record.get("submitted_at") or record.get("handle", {}).get("submitted_at", 0)
                matches.append((submitted, scheduler, job_id))
    if not matches:
        raise SchedulerError("local", f"no job trainops launched (local or Slurm) runs in {run_dir}; only processes "
                                      "of a job submitted with submit_job can be signalled (Kubernetes: use kubectl)")
    _, scheduler, job_id = max(matches)
    return scheduler, job_id


def job_processes(job_id: str, scheduler: SchedulerKind) -> list[psutil.Process]:
    """Every live process of a job trainops launched on `scheduler` (empty when none runs)."""
    records = dict(_records(scheduler))
    if job_id not in records:
        raise SchedulerError(scheduler, f"job {job_id!r} was not launched by trainops in this workspace; "
                                        "only its own jobs' processes can be signalled")
    return local_tree(job_id) if scheduler == "local" else _slurm_tree(job_id)


def spec_sha256(spec: JobSpec) -> str:
    """The digest of a spec as launched (canonical JSON): submit returns it, a requeue checks it."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def launched_spec(job_id: str, scheduler: SchedulerKind) -> JobSpec | None:
    """The spec trainops recorded when it launched the job (None for a scheduler that keeps no
    record here, such as Kubernetes)."""
    record = dict(_records(scheduler)).get(job_id) if scheduler != "kubernetes" else None
    return JobSpec.model_validate(record["spec"]) if record else None


def _env(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (*_GONE, psutil.AccessDenied):
        return {}


def node_of(proc: psutil.Process) -> str:
    """The node a job process runs on: Slurm's SLURMD_NODENAME, else this host."""
    return _env(proc).get("SLURMD_NODENAME", socket.gethostname())


def _supervised_rank(proc: psutil.Process, env: dict[str, str]) -> str:
    """The rank an in-process-restart worker holds now (its environment, fixed at its start, names
    none: the supervisor assigns ranks later, a spare's included), as the supervisor's RUN/workers.jsonl
    says for this pid; "" for a spare or a process that is not such a worker."""
    if "TRAINOPS_INPROCESS_WORKER" not in env:
        return ""

    try:
        argv = proc.cmdline()
    except (*_GONE, psutil.AccessDenied):
        return ""
    if "--run-dir" not in argv[:-1]:
        return ""
    given = [e.rank for e in read_worker_events(argv[argv.index("--run-dir") + 1])
             if e.pid == proc.pid and e.event in ("assigned", "admitted") and e.rank is not None]
    return str(given[-1]) if given else ""


def _forked_rank(proc: psutil.Process) -> str:
    """The rank a rank forked by the warm launcher (trainer/warm_launch.py) wrote into its kernel
    name, for a process running the launcher's command line; "" otherwise."""
    try:
        argv, name = proc.cmdline(), proc.name()
    except (*_GONE, psutil.AccessDenied):
        return ""
    rank = rank_in_name(name) if argv[1:3] == ["-m", WARM_LAUNCHER] else None
    return "" if rank is None else str(rank)


def _rank_of(proc: psutil.Process, env: dict[str, str]) -> str:
    return env.get("RANK", "") or _forked_rank(proc) or _supervised_rank(proc, env)


def rank_processes(procs: list[psutil.Process]) -> dict[int, psutil.Process]:
    """rank -> the topmost process of `procs` that torchrun started as that rank (its children
    inherit RANK too)."""
    envs = {proc.pid: _env(proc) for proc in procs}
    held = {proc.pid: _rank_of(proc, envs[proc.pid]) for proc in procs}
    ranks: dict[int, psutil.Process] = {}
    for proc in procs:
        if not (rank := held[proc.pid]).isdigit():
            continue
        try:
            parent = proc.ppid()
        except _GONE:
            continue
        if held.get(parent) != rank:
            ranks.setdefault(int(rank), proc)
    return dict(sorted(ranks.items()))

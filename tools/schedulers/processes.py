"""Which processes belong to a job trainops launched, and which of them is rank R.

Tools that signal processes (`inject_fault`, `cancel_job`) act only on these: a local job's
process tree below the runner pid trainops recorded at launch, checked against the create time
recorded with it (a recycled pid is someone else's process), or a Slurm job's processes as the
kernel shows them (descendants of a root-owned `slurmstepd` carrying the job's SLURM_JOB_ID).
Never a pid read from a heartbeat, a log or any other file the job itself can write. A rank is
found by the RANK variable torchrun gives each worker; `stop_processes` stops such a tree.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import psutil

from trainops.tools.schedulers.base import JobSpec, SchedulerError, SchedulerKind

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)


def local_tree(record: dict) -> list[psutil.Process]:
    """The local job's runner and every process below it; empty once the runner is gone or its
    pid now belongs to a process started at another time."""
    try:
        root = psutil.Process(record["pid"])
        if root.create_time() != record.get("create_time") or root.status() == psutil.STATUS_ZOMBIE:
            return []
        return [root, *root.children(recursive=True)]
    except _GONE:
        return []


def stop_processes(tree: list[psutil.Process], pgid: int, grace_s: float) -> None:
    """SIGTERM the process group (torchrun passes it on to its ranks for a clean exit), up to
    `grace_s`, then SIGKILL every process of `tree`, taken before the first signal: torchrun
    starts each rank in a session of its own, so signalling the group alone orphans the ranks
    (seen: orphaned ranks trained on after a drill, and SIGSTOPped ones were leaked). Grace 0
    goes straight to SIGKILL."""
    if not tree:
        return
    if grace_s > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        _wait_gone(tree, grace_s)
    alive = [proc for proc in tree if _running(proc)]
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    _wait_gone(alive, 2.0)  # so a restart never overlaps the old processes


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


def _slurm_tree(job_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("SLURM_JOB_ID") != job_id:
                continue
            if any(parent.name() == "slurmstepd" and parent.uids().real == 0 for parent in proc.parents()):
                found.append(proc)
        except (*_GONE, psutil.AccessDenied):
            continue
    return found


def _records(scheduler: SchedulerKind) -> list[tuple[str, dict]]:
    """(job id, record) of every job trainops submitted to `scheduler` in this workspace."""
    from trainops.workspace import jobs_dir

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
    return local_tree(records[job_id]) if scheduler == "local" else _slurm_tree(job_id)


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


def rank_processes(procs: list[psutil.Process]) -> dict[int, psutil.Process]:
    """rank -> the topmost process of `procs` that torchrun started as that rank (its children
    inherit RANK too)."""
    envs = {proc.pid: _env(proc) for proc in procs}
    ranks: dict[int, psutil.Process] = {}
    for proc in procs:
        rank = envs[proc.pid].get("RANK", "")
        if not rank.isdigit():
            continue
        try:
            parent = proc.ppid()
        except _GONE:
            continue
        if envs.get(parent, {}).get("RANK") != rank:
            ranks.setdefault(int(rank), proc)
    return dict(sorted(ranks.items()))

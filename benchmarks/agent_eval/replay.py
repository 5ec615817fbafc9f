"""The replay backends of the agent benchmark: a recorded scenario's scheduler snapshot (job states,
node states), its frozen job and rank logs, metrics and heartbeats served so that a tool answers as
it did when the scenario was recorded, the clock stopped at the recording. Mutations (submit,
cancel, requeue, drain, resume) are never executed: each is appended to the replay's
`mutations.jsonl` with the gate's decision that let it reach the backend.

`replaying(home)` puts them in for a block through the product's one seam for it,
`trainops.tools.backends.backends`: every `get_scheduler(kind)` and `get_monitor(kind)` then hands
out a replay backend, whatever kind a tool asks for, as the live one would have answered it. The
recorder (recorder.py) writes the snapshot with `capture`."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel, Field

from trainops.tools.backends import backends
from trainops.tools.monitoring.base import Sample, Series
from trainops.tools.monitoring.embedded import EmbeddedMonitor
from trainops.tools.schedulers.base import (
    JobHandle,
    JobSpec,
    JobStatus,
    NodeInfo,
    Scheduler,
    SchedulerError,
    rank_log,
    read_confined,
    tail_text,
)

SNAPSHOT_FILE = "scheduler.json"
MUTATIONS_FILE = "mutations.jsonl"


class SchedulerSnapshot(BaseModel):
    """What the live scheduler answered when the scenario was recorded."""

    kind: str = Field(description="The live backend the snapshot came from (local, slurm, kubernetes).")
    recorded_at: float = Field(description="Unix seconds of the capture; the replay's clock for metrics.")
    jobs: list[JobStatus] = Field(default_factory=list, description="list_jobs() as it answered.")
    nodes: list[NodeInfo] = Field(default_factory=list, description="list_nodes() as it answered.")
    job_logs: dict[str, str] = Field(default_factory=dict,
                                     description="job id -> its combined log, relative to the workspace.")


def capture(kind: str, live: Scheduler, home: Path) -> SchedulerSnapshot:
    """Ask the live backend (`kind`, from get_scheduler) for every job and node state, now."""
    recorded_at = time.time()
    jobs = [live.status(job.job_id) for job in live.list_jobs()]
    logs: dict[str, str] = {}
    for job in jobs:
        record = home / "jobs" / f"{job.job_id}.json"
        if record.is_file():
            log_path = json.loads(record.read_text()).get("log_path")
            if log_path and Path(log_path).resolve().is_relative_to(home.resolve()):
                logs[job.job_id] = str(Path(log_path).resolve().relative_to(home.resolve()))
    return SchedulerSnapshot(kind=kind, recorded_at=recorded_at, jobs=jobs, nodes=live.list_nodes(), job_logs=logs)


class Replay:
    """An active replay: the materialized workspace (`home`) and its scheduler snapshot."""

    def __init__(self, home: Path, snapshot: SchedulerSnapshot):
        self.home = home
        self.snapshot = snapshot

    @property
    def mutations_path(self) -> Path:
        return self.home / MUTATIONS_FILE

    def mutations(self) -> list[dict]:
        if not self.mutations_path.is_file():
            return []
        return [json.loads(line) for line in self.mutations_path.read_text().splitlines() if line.strip()]

    def scheduler(self, kind: str) -> ReplayScheduler:
        return ReplayScheduler(self, kind)

    def monitor(self, kind: str) -> ReplayMonitor:
        return ReplayMonitor(self.home, self.snapshot.recorded_at, kind)


@contextmanager
def replaying(home: Path) -> Iterator[Replay]:
    """Serve the scenario materialized at `home` (its scheduler.json) from every backend until exit."""
    snapshot = SchedulerSnapshot.model_validate_json((home / SNAPSHOT_FILE).read_text())
    replay = Replay(home, snapshot)
    with backends(scheduler=replay.scheduler, monitor=replay.monitor):
        yield replay


def _gate_decision(home: Path) -> dict:
    """The gate's decision that let this mutation through, from the replay's audit log: the newest
    "gate" entry (a rule applied, and a human's approval covered the call) or "intent" (the gate
    let it run with no approval rule: the call's intent is written just before it acts)."""
    audit = home / "audit.jsonl"
    lines = audit.read_text().splitlines() if audit.is_file() else []
    for line in reversed(lines):
        entry = json.loads(line)
        if entry.get("kind") == "gate" and entry.get("decision") == "allowed":
            return {"decision": "allowed", "rule_id": entry.get("rule_id"), "approver": entry.get("approver"),
                    "tool": entry.get("tool"), "actor": entry.get("actor")}
        if entry.get("kind") == "intent":
            return {"decision": "allowed", "rule_id": None, "approver": None, "tool": entry.get("tool"),
                    "actor": entry.get("actor")}
    return {"decision": "none: no gate entry before this mutation"}


class ReplayScheduler:
    """A Scheduler whose reads come from the snapshot and whose writes are only written down."""

    def __init__(self, replay: Replay, kind: str):
        self.replay = replay
        self.kind = kind

    def _job(self, job_id: str) -> JobStatus:
        for job in self.replay.snapshot.jobs:
            if job.job_id == job_id:
                return job
        known = ", ".join(j.job_id for j in self.replay.snapshot.jobs) or "none"
        raise SchedulerError(self.kind, f"no job {job_id!r} on this cluster; known jobs: {known}")

    def _node(self, node: str) -> NodeInfo:
        for info in self.replay.snapshot.nodes:
            if info.name == node:
                return info
        known = ", ".join(n.name for n in self.replay.snapshot.nodes) or "none"
        raise SchedulerError(self.kind, f"no node {node!r}; known nodes: {known}")

    def _mutate(self, verb: str, **args) -> None:
        entry = {"verb": verb, "args": args, "time": time.time(),
                 "gate": _gate_decision(self.replay.home)}
        with self.replay.mutations_path.open("a") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")

    def submit(self, spec: JobSpec) -> JobHandle:
        self._mutate("submit", name=spec.name, tenant=spec.tenant)
        return JobHandle(job_id=f"replay-{spec.name}", backend=self.replay.snapshot.kind, name=spec.name,
                         submitted_at=self.replay.snapshot.recorded_at, run_dir=spec.run_dir)

    def status(self, job_id: str) -> JobStatus:
        return self._job(job_id)

    def wait(self, job_id: str, timeout_s: float) -> JobStatus:
        return self._job(job_id)

    def logs(self, job_id: str, tail: int = 100, rank: int | None = None) -> str:
        job = self._job(job_id)
        if rank is not None:
            return tail_text(rank_log(job.run_dir, rank, self.replay.snapshot.kind, job_id), tail)
        relative = self.replay.snapshot.job_logs.get(job_id)
        path = self.replay.home / relative if relative else None
        return tail_text(read_confined(path, "job log", self.kind) if path and path.exists() else "", tail)

    def cancel(self, job_id: str, force: bool = False) -> JobStatus:
        job = self._job(job_id)
        self._mutate("cancel", job_id=job_id, force=force)
        return job

    def requeue(self, job_id: str) -> JobHandle:
        job = self._job(job_id)
        self._mutate("requeue", job_id=job_id)
        return JobHandle(job_id=job.job_id, backend=job.backend, name=job.name,
                         submitted_at=self.replay.snapshot.recorded_at, run_dir=job.run_dir)

    def list_jobs(self) -> list[JobStatus]:
        return list(self.replay.snapshot.jobs)

    def list_nodes(self) -> list[NodeInfo]:
        return list(self.replay.snapshot.nodes)

    def drain(self, node: str, reason: str) -> NodeInfo:
        info = self._node(node)
        self._mutate("drain", node=node, reason=reason)
        return info

    def resume(self, node: str) -> NodeInfo:
        info = self._node(node)
        self._mutate("resume", node=node)
        return info


class ReplayMonitor(EmbeddedMonitor):
    """EmbeddedMonitor over the frozen run folder, its `now` the snapshot's recorded_at. Whatever kind a
    tool asks for (embedded or prometheus), the values are the run folder's, which is what both
    exported."""

    def __init__(self, home: Path, recorded_at: float, kind: str):
        self.home = home
        self.recorded_at = recorded_at
        self.kind = kind

    def _run_dir(self, run: Path | str) -> Path:
        """A Prometheus-style run label names the run folder of the same id."""
        path = Path(run)
        return path if path.is_absolute() else self.home / "runs" / str(run)

    def now(self) -> float:
        """The recording's instant: a window or a heartbeat's age reads as it did when recorded (two clock
        reads, one here and one in the embedded window, let a loaded host drop a sample at its edge)."""
        return self.recorded_at

    def series(self, metric: str, run: Path | str, rank: int | None = None, window_s: float = 300.0) -> list[Series]:
        return super().series(metric, self._run_dir(run), rank, window_s)

    def instant(self, metric: str, run: Path | str, rank: int | None = None) -> list[Sample]:
        return super().instant(metric, self._run_dir(run), rank)

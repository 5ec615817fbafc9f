"""The scheduler contract: a framework-agnostic `JobSpec` in, a `JobHandle` out, and the same
status/logs/cancel/requeue/drain verbs on every backend, so a drill reads the same on a
laptop, on Slurm and on Kubernetes. The backends import this module; choosing one by name is
the package's `trainops.tools.schedulers.get_scheduler`, above them."""
from __future__ import annotations

import re
import time
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, field_validator, model_validator

from trainops.run_folder import RunFiles, bounded_text
from trainops.tools.ids import NodeName, SafeId
from trainops.trainer.config import JobConfig, LoadedConfig, load_config
from trainops.workspace import check_id, confine

SchedulerKind = Literal["local", "slurm", "kubernetes"]
JobState = Literal["pending", "running", "completed", "failed", "cancelled", "unknown"]
NodeState = Literal["idle", "allocated", "mixed", "drained", "draining", "down", "unknown"]
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SchedulerError(Exception):
    """A backend failed: the message names the backend, the address or command, and what to do."""
    def __init__(self, backend: str, message: str):
        super().__init__(f"{backend} scheduler: {message}")
        self.backend = backend


class TrainingJob(BaseModel):
    """What to train: the one request model from the CLI and the skills through the tools to the
    framework adapters, which turn it into the JobSpec a scheduler runs. The skills' JobRequest and
    the adapters' FrameworkJob extend it with what only they need."""
    config: str | None = Field(None, description="Path to a job config (TOML for trainops/torchtitan, the "
                                                 "framework's own file otherwise); None uses the preset alone.")
    preset: str | None = Field(None, description="Model preset (tiny, small, llama3-1b, ...) when no config is given.")
    overrides: list[str] = Field(default_factory=list,
                                 description="section.key=value overrides, e.g. training.steps=20.")
    nproc: int = Field(1, ge=1, le=1024, description="Processes (ranks) per node.")
    nodes: int = Field(1, ge=1, le=65536, description="Number of nodes.")
    partition: SafeId | None = Field(None, description="Slurm partition the job runs in; None: the cluster's "
                                                       "default. Carried into the JobSpec the scheduler gets.")
    job_config: LoadedConfig = Field(None, exclude=True,
                                     description="The trainer config of this request, loaded once by the command "
                                                 "that made it (JobRequest.loaded); None: loaded where it is needed.")

    def trainer_config(self) -> JobConfig:
        """The embedded trainer's config for this request: the one its command loaded, else loaded now
        from config, preset and overrides."""
        if self.job_config is not None:
            return self.job_config
        return load_config(self.config, self.preset, self.overrides)


class JobSpec(BaseModel):
    """What to run and where, independent of the scheduler that runs it."""
    name: str = Field(description="Job name: lower-case letters, digits and '-' (it becomes a Slurm job name and a "
                                  "Kubernetes object name).")
    command: list[str] = Field(description="The program and its arguments. With launcher='torchrun' this is what "
                                           "torchrun runs (a script or '-m module' and its arguments).")
    launcher: Literal["plain", "torchrun"] = Field("plain",
                                                   description="'plain' runs the command once; 'torchrun' starts "
                                                               "procs_per_node processes on each node with rendezvous "
                                                               "set up by the backend.")
    nodes: int = Field(1, description="Number of nodes.")
    procs_per_node: int = Field(1, description="Processes (ranks) per node.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the job.")
    time_limit_min: int | None = Field(None, description="Wall-clock limit in minutes; None means the backend default.")
    partition: SafeId | None = Field(None,
                                     description="Slurm partition (or Kubernetes namespace); None means the default.")
    exclude_nodes: list[NodeName] = Field(default_factory=list,
                                          description="Nodes the job must not run on (isolation after a fault).")
    workdir: str | None = Field(None, description="Working directory for the job; None means the current directory.")
    run_dir: str | None = Field(None,
                                description="The training run folder, if the job is a trainer run (per-rank logs, "
                                            "heartbeats, metrics).")
    image: str | None = Field(None, description="Container image with the trainer installed (kubernetes only).")
    rdzv_port: int = Field(29500, description="TCP port of the torchrun c10d rendezvous on the first node.")
    tenant: SafeId | None = Field(None,
                                  description="Tenant the job runs for: its folders must lie in that tenant's root "
                                              "(R-SEC-3).")

    @field_validator("tenant")
    @classmethod
    def _tenant_ok(cls, v: str | None) -> str | None:
        return v if v is None else check_id("tenant", v)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"name {v!r} is not valid: use 1-63 lower-case letters, digits or '-', starting and "
                             "ending with a letter or digit (e.g. 'llama-baseline')")
        return v

    @field_validator("command")
    @classmethod
    def _command_ok(cls, v: list[str]) -> list[str]:
        if not v or not v[0].strip():
            raise ValueError(f"command {v!r} is empty: give the program and its arguments as a list, e.g. ['python', "
                             "'train.py']")
        return v

    @field_validator("nodes", "procs_per_node")
    @classmethod
    def _positive(cls, v: int, info) -> int:
        if v < 1:
            raise ValueError(f"{info.field_name} must be at least 1 (got {v}); use 1 for a single node or process")
        return v

    @field_validator("time_limit_min")
    @classmethod
    def _limit_ok(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"time_limit_min must be at least 1 minute (got {v}); leave it empty for the backend "
                             "default")
        return v

    @field_validator("env")
    @classmethod
    def _env_ok(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _ENV_KEY.match(key):
                raise ValueError(f"env key {key!r} is not a valid variable name: use letters, digits and '_', not "
                                 "starting with a digit")
        return v

    @field_validator("rdzv_port")
    @classmethod
    def _port_ok(cls, v: int) -> int:
        if not 1024 <= v <= 65535:
            raise ValueError(f"rdzv_port {v} is out of range: use an unprivileged port between 1024 and 65535")
        return v

    @model_validator(mode="after")
    def _plain_single(self) -> "JobSpec":
        if self.launcher == "plain" and self.procs_per_node > 1:
            raise ValueError(f"procs_per_node={self.procs_per_node} needs launcher='torchrun' (a plain command runs "
                             "once); set launcher='torchrun' or procs_per_node=1")
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


class JobHandle(BaseModel):
    """What a submit returns: enough to find the job again from a later CLI call."""
    job_id: str = Field(description="The backend's job id.")
    backend: SchedulerKind
    name: str
    submitted_at: float = Field(description="Submission wall time (Unix seconds).")
    run_dir: str | None = None
    log_path: str | None = Field(None, description="Where the job's combined stdout/stderr goes.")


class JobStatus(BaseModel):
    job_id: str
    backend: SchedulerKind
    name: str = ""
    state: JobState
    exit_code: int | None = None
    nodes: list[str] = Field(default_factory=list)
    reason: str = Field("", description="The backend's reason for the state (pending reason, failure reason).")
    submitted_at: float | None = Field(None, description="When the scheduler took the job (Unix seconds): "
                                                         "submitted_at -> started_at is its queue wait.")
    started_at: float | None = None
    ended_at: float | None = None
    run_dir: str | None = None
    requeued: bool = Field(False, description="This launch ended in a requeue: the job ran again under its id "
                                              "(a scheduler's accounting of an earlier launch).")
    ranks: int | None = Field(None, description="The ranks the launcher starts (nodes x procs_per_node of a torchrun "
                                                "spec); None where the job starts its own (a plain command).")

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


def partition_problem(partition: str | None, scheduler: str) -> str | None:
    """Why a partition cannot be asked of `scheduler` (only Slurm has partitions), naming the fix; None when it can."""
    if partition is not None and scheduler != "slurm":
        return (f"partition={partition!r} needs scheduler='slurm' (got {scheduler!r}): only Slurm has partitions; "
                "use scheduler='slurm' or omit partition")
    return None


def spec_ranks(spec: dict | None) -> int | None:
    """The ranks a recorded spec's launcher starts: nodes x procs_per_node under torchrun, each bounded as
    JobSpec bounds it (the record is a file; a value out of bounds says nothing); None for a plain command."""
    if not isinstance(spec, dict) or spec.get("launcher") != "torchrun":
        return None
    nodes, procs = spec.get("nodes"), spec.get("procs_per_node")
    if type(nodes) is not int or type(procs) is not int or not (1 <= nodes <= 65536 and 1 <= procs <= 1024):
        return None
    return nodes * procs


class NodeInfo(BaseModel):
    name: str
    state: NodeState
    cpus: int | None = None
    reason: str = ""
    partitions: list[str] = Field(default_factory=list,
                                  description="The Slurm partitions the node is in; empty where there are none.")


@runtime_checkable
class Scheduler(Protocol):
    kind: str

    def submit(self, spec: JobSpec) -> JobHandle: ...
    def status(self, job_id: str) -> JobStatus: ...
    def wait(self, job_id: str, timeout_s: float) -> JobStatus: ...
    def logs(self, job_id: str, tail: int = 100, rank: int | None = None) -> str: ...
    def cancel(self, job_id: str, force: bool = False) -> JobStatus: ...
    def requeue(self, job_id: str) -> JobHandle: ...
    def list_jobs(self) -> list[JobStatus]: ...
    def list_nodes(self) -> list[NodeInfo]: ...
    def drain(self, node: str, reason: str) -> NodeInfo: ...
    def resume(self, node: str) -> NodeInfo: ...


class PollingWait:
    """`wait` for a backend whose only view of a job is `status`: poll it until the job is
    terminal or the deadline passes; `poll_s` is the backend's polite polling interval."""
    poll_s: float = 0.5

    def wait(self, job_id: str, timeout_s: float, poll_s: float | None = None) -> JobStatus:
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status(job_id)
            if st.finished or time.monotonic() >= deadline:
                return st
            time.sleep(self.poll_s if poll_s is None else poll_s)


def tail_text(text: str, lines: int) -> str:
    """The last `lines` lines of `text` (all of it when lines <= 0)."""
    if lines <= 0:
        return text
    return "\n".join(text.splitlines()[-lines:])


def rank_log(run_dir: str | None, rank: int, backend: str, job_id: str) -> str:
    """A rank's own log from the run folder (the trainer writes logs/rank{R}.log). The job can
    replace that file with a link, so it is read only where it resolves inside the workspace."""
    if not run_dir:
        raise SchedulerError(backend,
                             f"job {job_id} has no run_dir, so it has no per-rank logs; ask for the job log "
                             "(rank=None)")
    path = RunFiles(run_dir).rank_log(rank)
    if not path.exists():
        raise SchedulerError(backend,
                             f"no log for rank {rank} of job {job_id} at {path}; check the rank number "
                             "(0..world_size-1) or that the job has started")
    return read_confined(path, f"rank {rank} log", backend)


def read_confined(path, field: str, backend: str) -> str:
    """The text of a log a job could have replaced with a link, a named pipe or a device: read when it
    resolves inside the workspace and is a regular file, as its newest MAX_TEXT_BYTES (bounded_text)."""
    try:
        confined = confine(path, field)
    except ValueError as exc:
        raise SchedulerError(backend, str(exc)) from None
    text = bounded_text(confined)
    if text is None:
        raise SchedulerError(backend, f"{field} at {confined} is not a regular file (a named pipe, device or folder "
                                      "was put in its place); it was not read")
    return text

"""Job and metrics tools: submit, watch, stop and requeue training jobs on any scheduler, and
read their metrics. The same tools serve the CLI, the skills and the agent.

Before a job launches or relaunches, its folders and data file are confined to the workspace
(and, for a tenant's job, to the tenant's root): tools/changes/tenancy.py check_job_paths. A trainer run's
folder and command are prepared by tools/jobs/trainer_job.py, which the trainer's framework adapter
uses too."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainops.run_records import MetricsRecord, metrics_since
from trainops.tools.base import InputCheck, ToolError, tool
from trainops.tools.changes.tenancy import check_job_paths, check_launch_versions
from trainops.tools.context import active_call
from trainops.tools.frameworks import get_adapter
from trainops.tools.ids import JobId, NodeName, RunRef, TenantId
from trainops.tools.jobs.trainer_job import training_spec
from trainops.tools.monitoring import get_monitor
from trainops.tools.monitoring.base import MonitorError, MonitorKind, Sample, Series
from trainops.tools.reliability.interruptions import observe
from trainops.tools.schedulers import get_scheduler
from trainops.tools.schedulers.base import (
    JobHandle,
    JobSpec,
    JobStatus,
    NodeInfo,
    SchedulerError,
    SchedulerKind,
    TrainingJob,
)
from trainops.tools.schedulers.processes import launched_spec, spec_sha256
from trainops.workspace import run_folder


def _scheduler(tool_name: str, kind: str):
    try:
        return get_scheduler(kind)
    except SchedulerError as exc:
        raise ToolError(tool_name, str(exc)) from None


def _run(tool_name: str, fn, *args):
    """Backend errors become ToolErrors that keep the backend's message (what, where, what to do)."""
    try:
        return fn(*args)
    except (SchedulerError, MonitorError) as exc:
        raise ToolError(tool_name, str(exc)) from None


def _confined_run(tool_name: str, run: str) -> Path:
    """A run id or run folder inside the workspace (trainops.workspace.run_folder)."""
    try:
        return run_folder(run)
    except ValueError as exc:
        raise ToolError(tool_name, str(exc)) from None


class SubmitJobInput(BaseModel):
    scheduler: SchedulerKind = "local"
    tenant: TenantId | None = Field(None,
                                    description="Tenant the job runs for: a training run's folder goes under the "
                                                "tenant's root, and every folder and data file of the job must lie "
                                                "there (or, for data, in a shared data root) (R-SEC-3).")
    spec: JobSpec | None = Field(None, description="A framework-agnostic job to run as is.")
    training: TrainingJob | None = Field(None,
                                             description="Or: a trainer run; trainops prepares the run folder and the "
                                                         "command.")
    name: str = Field("train", description="Job name for a training request.")
    exclude_nodes: list[NodeName] = Field(default_factory=list, description="Nodes a training request must avoid.")

    @model_validator(mode="after")
    def _one_of(self) -> "SubmitJobInput":
        if (self.spec is None) == (self.training is None):
            raise ValueError("give exactly one of spec (a JobSpec) or training (config/preset/overrides/nproc)")
        return self


class SubmitJobOutput(BaseModel):
    handle: JobHandle
    spec: JobSpec
    spec_sha256: str = Field(description="Digest of the spec as launched: a requeue_job that an approval covers "
                                         "names it, and relaunches nothing else.")


@tool("submit_job", risk="mutate", tags=("jobs",))
def submit_job(inp: SubmitJobInput) -> SubmitJobOutput:
    """Submit a job to a scheduler (local, slurm or kubernetes) and return its handle (job id,
    run folder, log path). Give either a JobSpec or a training request (config/preset/overrides/nproc).
    Every folder and data file of the job must lie in the workspace, and for a tenant's job in its root."""
    try:
        if inp.training is not None:
            spec = training_spec(inp.training, inp.name, inp.exclude_nodes, inp.tenant)
        else:
            if None not in (inp.tenant, inp.spec.tenant) and inp.tenant != inp.spec.tenant:
                raise ValueError(f"tenant={inp.tenant!r} but spec.tenant={inp.spec.tenant!r}: give the tenant once")
            spec = inp.spec if inp.tenant is None else inp.spec.model_copy(update={"tenant": inp.tenant})
            check_job_paths(spec, adapter_of=get_adapter)
        check_launch_versions(spec)  # the compatibility matrix and the tenant's framework pin
    except (ValueError, OSError) as exc:
        raise ToolError("submit_job", f"cannot prepare the job: {exc}") from None

    handle = _run("submit_job", _scheduler("submit_job", inp.scheduler).submit, spec)
    return SubmitJobOutput(handle=handle, spec=spec, spec_sha256=spec_sha256(spec))


class JobRef(BaseModel):
    job_id: JobId = Field(description="The job id a submit returned.")
    scheduler: SchedulerKind = "local"


@tool("job_status", risk="read", tags=("jobs",))
def job_status(inp: JobRef) -> JobStatus:
    """The state of a job (pending, running, completed, failed, cancelled, unknown), its exit code and nodes."""
    return _observed(_scheduler("job_status", inp.scheduler), "job_status", "status", inp.job_id)


def _observed(scheduler, tool_name: str, verb: str, *args) -> JobStatus:
    """A job-status read; a job end that is not a clean finish goes to the interruption record."""
    status = _run(tool_name, getattr(scheduler, verb), *args)
    observe(status, scheduler)
    return status


class WaitJobInput(JobRef):
    model_config = ConfigDict(allow_inf_nan=False)

    timeout_s: float = Field(600.0, gt=0, le=86400,
                             description="Give up waiting after this many seconds, at most a day (the job keeps "
                                         "running).")


@tool("wait_job", risk="read", tags=("jobs",))
def wait_job(inp: WaitJobInput) -> JobStatus:
    """Wait until a job finishes or the timeout passes; returns its state either way."""
    return _observed(_scheduler("wait_job", inp.scheduler), "wait_job", "wait", inp.job_id, inp.timeout_s)


class JobLogsInput(JobRef):
    tail: int = Field(100, ge=0, le=100_000, description="Last N lines (0 = all).")
    rank: int | None = Field(None, ge=0, le=1_048_575,
                             description="A rank's own log from the run folder; None = the job's combined log.")


class JobLogsOutput(BaseModel):
    job_id: str
    rank: int | None
    text: str


@tool("job_logs", risk="read", tags=("jobs",))
def job_logs(inp: JobLogsInput) -> JobLogsOutput:
    """The tail of a job's log, or of one rank's log."""
    text = _run("job_logs", _scheduler("job_logs", inp.scheduler).logs, inp.job_id, inp.tail, inp.rank)
    return JobLogsOutput(job_id=inp.job_id, rank=inp.rank, text=text)


class CancelJobInput(JobRef):
    force: bool = Field(False, description=(
        "Kill every process at once, with no grace period for a clean exit. For a job already detected "
        "as failed: its survivors are blocked in a collective and would only spend the grace period timing out."))


def _launched_spec(tool_name: str, ref: JobRef) -> JobSpec | None:
    """The spec trainops recorded when it launched the job (None on Kubernetes, whose job labels
    the scheduler checks); a job it did not launch is refused by `_launched_here` first."""
    return _run(tool_name, launched_spec, ref.job_id, ref.scheduler)


def _launched_here(ref: JobRef) -> str | None:
    """Before the gate queues a stop or a relaunch for a human to sign: the job must have a launch
    record in this workspace (another user's Slurm job, a mistyped id), or the call could never run."""
    if ref.scheduler == "kubernetes":
        return None
    try:
        known = launched_spec(ref.job_id, ref.scheduler) is not None
    except (OSError, ValueError) as exc:
        return f"job_id={ref.job_id!r}: its launch record cannot be read ({exc}); check the workspace's jobs folder"
    if known:
        return None
    tool_hint = "use scancel/scontrol yourself" if ref.scheduler == "slurm" else "list yours with list_jobs"
    return (f"job {ref.job_id!r} was not launched by trainops in this workspace (no record in its jobs folder); "
            f"trainops acts only on its own jobs: {tool_hint}")


_OWN_JOB = InputCheck("R-SEC-3", _launched_here)


@tool("cancel_job", risk="mutate", tags=("jobs",), checks=(_OWN_JOB,))
def cancel_job(inp: CancelJobInput) -> JobStatus:
    """Cancel a job trainops launched (all its processes); `force` skips the grace period."""
    _launched_spec("cancel_job", inp)
    return _observed(_scheduler("cancel_job", inp.scheduler), "cancel_job", "cancel", inp.job_id, inp.force)


class RequeueJobInput(JobRef):
    spec_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                                    description="The spec_sha256 submit_job returned for this job: the requeue "
                                                "relaunches only that spec. Needed when the call runs under an "
                                                "approval, so the signature covers what is relaunched.")


@tool("requeue_job", risk="mutate", tags=("jobs",), checks=(_OWN_JOB,))
def requeue_job(inp: RequeueJobInput) -> JobHandle:
    """Requeue a job with the same spec; a trainer run resumes from its newest checkpoint. Its
    folders are checked again first: the job itself can have rewritten its run's config. The job
    can rewrite its record too, so an approved requeue names the spec_sha256 submit_job returned
    and the scheduler relaunches only a record that still has it."""
    spec = _launched_spec("requeue_job", inp)
    if spec is not None:
        try:
            check_job_paths(spec, adapter_of=get_adapter)
            check_launch_versions(spec)
        except ValueError as exc:
            raise ToolError("requeue_job", f"refusing to relaunch job {inp.job_id}: {exc}") from None
    active = active_call()
    if spec is not None and inp.spec_sha256 is None and active is not None and active.approved_call:
        raise ToolError("requeue_job", f"refusing to relaunch job {inp.job_id}: an approved requeue must name the "
                                       "spec_sha256 submit_job returned for it, so the approval covers the command "
                                       "it relaunches; queue the call again with spec_sha256")
    scheduler = _scheduler("requeue_job", inp.scheduler)
    if inp.scheduler == "kubernetes":
        return _run("requeue_job", scheduler.requeue, inp.job_id)
    return _run("requeue_job", scheduler.requeue, inp.job_id, inp.spec_sha256)


class SchedulerRef(BaseModel):
    scheduler: SchedulerKind = "local"


class JobList(BaseModel):
    jobs: list[JobStatus]


@tool("list_jobs", risk="read", tags=("jobs",))
def list_jobs(inp: SchedulerRef) -> JobList:
    """All jobs the scheduler knows, with their states."""
    return JobList(jobs=_run("list_jobs", _scheduler("list_jobs", inp.scheduler).list_jobs))


class NodeList(BaseModel):
    nodes: list[NodeInfo]


@tool("list_nodes", risk="read", tags=("jobs", "nodes"))
def list_nodes(inp: SchedulerRef) -> NodeList:
    """The scheduler's nodes and their states (idle nodes are the hot-spare pool)."""
    return NodeList(nodes=_run("list_nodes", _scheduler("list_nodes", inp.scheduler).list_nodes))


class DrainNodeInput(SchedulerRef):
    node: NodeName = Field(description="Node name as the scheduler knows it.")
    reason: str = Field("drained by trainops", min_length=1, description="Why (kept by the scheduler).")


@tool("drain_node", risk="mutate", tags=("nodes",))
def drain_node(inp: DrainNodeInput) -> NodeInfo:
    """Drain a node: no new jobs start there (isolation after a fault)."""
    return _run("drain_node", _scheduler("drain_node", inp.scheduler).drain, inp.node, inp.reason)


class ResumeNodeInput(SchedulerRef):
    node: NodeName = Field(description="Node name as the scheduler knows it.")


@tool("resume_node", risk="mutate", tags=("nodes",))
def resume_node(inp: ResumeNodeInput) -> NodeInfo:
    """Return a drained node to service."""
    return _run("resume_node", _scheduler("resume_node", inp.scheduler).resume, inp.node)


class QueryMetricsInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    run: RunRef = Field(description="Run id (folder under $TRAINOPS_HOME/runs) or run folder path; the `run` label in "
                                 "Prometheus.")
    metric: str = Field(description="Record name: loss, grad_norm, step_time_s, tokens_per_s, mfu_pct, peak_mem_gib, "
                                    "data_wait_s, heartbeat_age_s, ...")
    rank: int | None = Field(None, ge=0, description="One rank, or None for all.")
    mode: Literal["instant", "series"] = "instant"
    window_s: float = Field(300.0, gt=0, le=30 * 86400, description="Series window in seconds (at most 30 days).")
    monitor: MonitorKind = "embedded"
    url: str | None = Field(None,
                            description="One of the Prometheus URLs the user configured ([monitoring] prometheus_urls, "
                                        "$TRAINOPS_PROMETHEUS_URL); omit for the first. Any other URL is refused.")
    per_node: Literal["max", "min", "sum", "avg"] | None = Field(
        None, description="instant mode: also fold the ranks' latest values per node this way (max step time "
                          "finds a slow node; sum tokens/s a node's throughput).")


class QueryMetricsOutput(BaseModel):
    instant: list[Sample] = Field(default_factory=list)
    series: list[Series] = Field(default_factory=list)
    nodes: dict[str, float] = Field(default_factory=dict, description="With per_node: node -> folded value.")


def fold_per_node(samples: list[Sample], how: str) -> dict[str, float]:
    """Node -> the ranks' values on it folded by `how`; samples whose node is unknown are left out."""
    by_node: dict[str, list[float]] = {}
    for sample in samples:
        if sample.node is not None and sample.rank is not None:
            by_node.setdefault(sample.node, []).append(sample.value)
    fold = {"max": max, "min": min, "sum": sum, "avg": statistics.fmean}[how]
    return {node: fold(values) for node, values in sorted(by_node.items())}


@tool("query_metrics", risk="read", tags=("metrics",))
def query_metrics(inp: QueryMetricsInput) -> QueryMetricsOutput:
    """A metric of a run, per rank: the latest value or a series over a window."""
    # the embedded monitor reads the run folder, resolved and confined here; Prometheus asks by the run label
    run = _confined_run("query_metrics", inp.run) if inp.monitor == "embedded" else inp.run
    mon = _run("query_metrics", get_monitor, inp.monitor, inp.url)
    if inp.mode == "instant":
        samples = _run("query_metrics", mon.instant, inp.metric, run, inp.rank)
        return QueryMetricsOutput(instant=samples, nodes=fold_per_node(samples, inp.per_node) if inp.per_node else {})
    return QueryMetricsOutput(series=_run("query_metrics", mon.series, inp.metric, run, inp.rank, inp.window_s))


class SummarizeRunInput(BaseModel):
    run: RunRef = Field(description="Run id or run folder path.")
    skip_steps: int = Field(2, ge=0, le=1_000_000,
                            description="Warm-up steps left out (compile, allocator, first collectives).")


class RunSummary(BaseModel):
    run: str
    ranks: int
    steps_measured: int = Field(description="Steps after the warm-up that every statistic uses.")
    step_time_median_s: float | None
    step_time_rank_spread_pct: float | None = Field(description="Median over steps of (slowest - fastest rank) / "
                                                                "median rank step time.")
    tokens_per_s_median: float | None = Field(description="Median over steps of the sum over ranks.")
    mfu_pct_median: float | None = Field(description="Median over steps of the mean over ranks.")
    data_wait_share_pct: float | None = Field(description="Share of step time spent waiting for data.")
    final_loss: float | None
    peak_source: str | None = Field(None,
                                    description="Where the MFU peak came from (vendor table or measured GEMM), as the "
                                                "trainer labelled it.")
    not_read: str = Field("", description="What of metrics.jsonl was left unread (its older part, past the read "
                                          "caps): the statistics are of the newest records; empty when all was read.")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_records(run: str, records: list[MetricsRecord], skip_steps: int, not_read: str = "") -> RunSummary:
    by_step: dict[int, list[MetricsRecord]] = {}
    for rec in records:
        by_step.setdefault(rec.step, []).append(rec)
    steps = sorted(by_step)
    measured = [s for s in steps if s > (steps[0] + skip_steps - 1 if steps else 0)] or steps
    step_times, spreads, tps, mfu = [], [], [], []
    wait_s = total_s = 0.0
    for s in measured:
        recs = by_step[s]
        times = [r.step_time_s for r in recs if r.step_time_s is not None]
        if times:
            step_times.append(max(times))
            mid = statistics.median(times)
            if len(times) > 1 and mid > 0:
                spreads.append(100.0 * (max(times) - min(times)) / mid)
            total_s += sum(times)
        tps.append(sum(r.tokens_per_s or 0.0 for r in recs))
        mfus = [r.mfu_pct for r in recs if r.mfu_pct is not None]
        if mfus:
            mfu.append(statistics.fmean(mfus))
        wait_s += sum(r.data_wait_s or 0.0 for r in recs)
    last = by_step[steps[-1]] if steps else []
    losses = [r.loss for r in last if r.loss is not None]
    return RunSummary(
        run=run, ranks=len({r.rank for r in records}), steps_measured=len(measured),
        step_time_median_s=_median(step_times), step_time_rank_spread_pct=_median(spreads),
        tokens_per_s_median=_median(tps) if measured else None, mfu_pct_median=_median(mfu),
        data_wait_share_pct=100.0 * wait_s / total_s if total_s > 0 else None,
        final_loss=losses[0] if losses else None,
        peak_source=next((r.peak_source for r in records if r.peak_source), None), not_read=not_read,
    )


@tool("summarize_run", risk="read", tags=("metrics",))
def summarize_run(inp: SummarizeRunInput) -> RunSummary:
    """Median step time, per-rank step-time spread, tokens/s, MFU (warm-up steps excluded),
    data-wait share and final loss of a run, from its metrics.jsonl."""
    run_dir = _confined_run("summarize_run", inp.run)
    records, _, not_read = metrics_since(run_dir)
    if not records:
        raise ToolError("summarize_run",
                        f"{run_dir / 'metrics.jsonl'} has no records yet; wait for the run to take a step")
    return summarize_records(inp.run, records, inp.skip_steps, not_read)

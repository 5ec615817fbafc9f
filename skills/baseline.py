"""S2: the baseline. The same config run N times; the spread across repeats is the noise band
that every ablation gain must beat."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, Field

from trainops.run_folder import RunFiles
from trainops.skills import bottleneck, environment, labels
from trainops.skills.evidence.model import BaselineSummary, EvidenceRow, PackEnvironment
from trainops.skills.request import JobRequest
from trainops.skills.stats import spread
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke, validating
from trainops.tools.context import CallContext, skill_context
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkJob, ParseContext, ingest_log
from trainops.tools.jobs import jobs
from trainops.tools.jobs.follow import follow
from trainops.tools.jobs.jobs import RunSummary
from trainops.tools.schedulers.base import TrainingJob

Progress = Callable[[str], None]


class RepeatResult(BaseModel):
    """One measured run: its job, its folder and summarize_run's statistics, typed until rendered."""
    job_id: str
    run_dir: str
    summary: RunSummary
    started: float
    ended: float
    world_size: int | None = Field(None, description="ranks the run was launched with (nodes x processes per node)")


def run_once(req: JobRequest, name: str, ctx: CallContext | None = None) -> RepeatResult:
    """Submit one run, follow it to its end (trainops.tools.jobs.follow), summarise it; a failed run is
    an error, not a data point."""
    started = time.time()
    sub = submit(req, name, ctx)
    job_id, run_dir = sub.handle.job_id, sub.handle.run_dir
    status = follow(sub.handle, ctx, timeout_s=req.timeout_s)  # past its timeout the run is cancelled
    if status.state != "completed":
        raise ToolError("submit_job", f"run {name} ({run_dir}) ended {status.state} (exit code {status.exit_code}, "
                        f"{status.reason or 'no reason given'}); read {run_dir}/logs/rank0.log")
    if not RunFiles(run_dir).metrics.exists():  # torchtitan, Megatron-LM: their step lines are the metrics
        log = invoke(jobs.job_logs, jobs.JobLogsInput(job_id=job_id, scheduler=req.scheduler, tail=0), ctx)
        ingest_log(get_adapter(req.framework), log.text, run_dir, ParseContext(world_size=req.nproc))
    summary = invoke(jobs.summarize_run, jobs.SummarizeRunInput(run=run_dir, skip_steps=req.warmup_steps), ctx)
    return RepeatResult(job_id=job_id, run_dir=run_dir, summary=summary, started=started, ended=time.time(),
                        world_size=req.nproc * req.nodes)


def submit(req: JobRequest, name: str, ctx: CallContext | None = None) -> jobs.SubmitJobOutput:
    """submit_job for the request: a trainer run, or the framework adapter's JobSpec (validated before launch)."""
    job = req.model_dump(include=set(TrainingJob.model_fields))
    job["preset"] = None if req.config else req.preset
    job["job_config"] = req.job_config  # the config its command loaded, passed on typed (not in the dump)
    if req.framework == "trainops":
        with validating(jobs.submit_job):  # the scheduler as the caller named it
            inp = jobs.SubmitJobInput(scheduler=req.scheduler, name=name, training=TrainingJob.model_validate(job))
    else:
        spec = get_adapter(req.framework).build_job(FrameworkJob(name=name, **job))
        with validating(jobs.submit_job):
            inp = jobs.SubmitJobInput(scheduler=req.scheduler, spec=spec)
    return invoke(jobs.submit_job, inp, ctx)


def repeat(req: JobRequest, name: str, repeats: int, ctx: CallContext | None = None,
           progress: Progress | None = None) -> list[RepeatResult]:
    results = []
    for i in range(repeats):
        if progress:
            progress(f"{name} repeat {i + 1}/{repeats}")
        results.append(run_once(req, f"{name}-{i + 1}", ctx))
    return results


def declared(req: JobRequest, env: PackEnvironment | None, ctx: CallContext | None = None) -> PackEnvironment:
    """The environment a figure is labelled with: the one given, else declared now (declare_environment);
    a declaration that fails refuses the figure with its reason."""
    return env if env is not None else environment.declare(req.scheduler, ctx, framework=req.framework)[0]


def summarize(req: JobRequest, results: list[RepeatResult], profiled: RepeatResult | None = None,
              env: PackEnvironment | None = None) -> BaselineSummary:
    """Medians and spreads over repeats, warm-up excluded (summarize_run dropped it per run); the
    communication share from the profiled run when there is one, else from any repeat's trace.
    Labels come from the runs' own config.toml and the environment declaration (skills.labels)."""
    job = labels.label_runs(results, req, declared(req, env))

    def measured(metric: str, readings: list[float | None]) -> list[float]:
        found = [value for value in readings if value is not None]
        if not found:
            raise ToolError("summarize_run", f"no repeat reported {metric}; check the runs' metrics.jsonl")
        return found

    summaries = [r.summary for r in results]
    waits = [s.data_wait_share_pct for s in summaries if s.data_wait_share_pct is not None]
    share, method = comm_share([profiled] if profiled else results)
    return BaselineSummary(
        model=job.model, parallel_layout=job.parallel_layout, precision=job.precision, labels=job,
        repeats=len(results), warmup_steps_excluded=req.warmup_steps,
        step_time_s=spread(measured("step_time_median_s", [s.step_time_median_s for s in summaries])),
        tokens_per_s=spread(measured("tokens_per_s_median", [s.tokens_per_s_median for s in summaries])),
        mfu_pct=spread(measured("mfu_pct_median", [s.mfu_pct_median for s in summaries])),
        peak_source=next((s.peak_source for s in summaries if s.peak_source), "unlabelled"),
        data_wait_share_pct=sum(waits) / len(waits) if waits else 0.0,
        comm_share_pct=share, comm_share_method=method, run_dirs=[r.run_dir for r in results],
        exposed_comm_share_pct=exposed_comm_share([profiled] if profiled else results),
        bottleneck=bottleneck.split(req.scheduler, req.warmup_steps, results, profiled))


PROFILE_STEPS = 2
"""Steps the extra profiled run traces, right after the warm-up (the profiler slows the steps it
records, so the repeats whose timings make the noise band are never profiled)."""


def _profiled(results: list[RepeatResult]) -> tuple[str, list[bottleneck.TraceComm]] | None:
    """The first run that left torch.profiler traces with step ranges, and its ranks' readings."""
    for result in results:
        traces = sorted(Path(result.run_dir).glob("profile/rank*.json"))
        readings = [r for r in (bottleneck.trace_exposed_comm(t) for t in traces) if r is not None]
        if sum(r.step_us for r in readings) > 0:
            return Path(result.run_dir).name, readings
    return None


def comm_share(results: list[RepeatResult]) -> tuple[float | None, str]:
    """Communication time: share of profiled step time spent in collectives, overlapped with compute
    or not, from the torch.profiler traces a run left behind (`RUN/profile/rank{R}.json`, written for
    `[metrics] profile_steps`), summed over its ranks. None when no run was profiled."""
    found = _profiled(results)
    if found is None:
        return None, "not measured: no run left a torch.profiler trace (RUN/profile/*.json)"
    run, readings = found
    share = 100.0 * sum(r.comm_us for r in readings) / sum(r.step_us for r in readings)
    return share, (f"torch.profiler traces of {run} ({len(readings)} rank(s)): collective ranges "
                   f"({', '.join(bottleneck.COMM_NAMES)}) inside the profiled steps, over their step time; "
                   "exposed communication: the part of them while no compute ran (GPU kernels, or CPU ops on the "
                   "step's thread)")


def exposed_comm_share(results: list[RepeatResult]) -> float | None:
    """Exposed communication: the share of profiled step time with a collective in progress and no
    compute, from the same traces as `comm_share`, so it never exceeds it."""
    found = _profiled(results)
    if found is None:
        return None
    return 100.0 * sum(r.exposed_us for r in found[1]) / sum(r.step_us for r in found[1])


def profile_run(req: JobRequest, ctx: CallContext | None = None) -> RepeatResult | None:
    """One extra short run that profiles PROFILE_STEPS steps right after the warm-up; None for
    other frameworks' jobs, which do not take the trainer's `[metrics] profile_steps`."""
    if req.framework != "trainops":
        return None
    start = req.warmup_steps + 1
    profiled = req.with_overrides([f"metrics.profile_steps={start},{PROFILE_STEPS}",
                                   f"training.steps={start + PROFILE_STEPS - 1}"])
    return run_once(profiled, "baseline-profile", ctx)


def stamped(req: JobRequest, env: PackEnvironment) -> JobRequest:
    """The request with the declared framework and torch versions its evidence rows carry."""
    if req.framework_version != "undeclared":
        return req
    return req.model_copy(update={"framework_version": f"{env.framework} {env.framework_version}, torch "
                                                      f"{env.torch_version}"})


def measure(req: JobRequest, repeats: int = 3, ctx: CallContext | None = None, progress: Progress | None = None,
            env: PackEnvironment | None = None) -> tuple[BaselineSummary, list[RepeatResult], list[EvidenceRow]]:
    """Run the baseline `repeats` times, then one short profiled run, and summarise them; the
    environment is declared first when not given (no figure without a declaration, R-ENV-1)."""
    ctx = skill_context("baseline", ctx)
    env = declared(req, env, ctx)
    req = stamped(req, env)
    results = repeat(req, "baseline", repeats, ctx, progress)
    labels.label_runs(results, req, env)  # a wrong MFU or label is refused before the profiled run
    if progress:
        progress("baseline profiled run (communication share)")
    profiled = profile_run(req, ctx)
    summary = summarize(req, results, profiled, env)
    evidence = [EvidenceRow(tool="submit_job+summarize_run", version=req.framework_version, command=command_line(req),
                            log_path=f"{r.run_dir}/metrics.jsonl",
                            value=f"MFU {r.summary.mfu_pct_median:.3f}%, "
                                  f"step {r.summary.step_time_median_s:.4f} s",
                            window_start=r.started, window_end=r.ended) for r in results]
    return summary, results, evidence


def command_line(req: JobRequest) -> str:
    """The command that runs this job again: `trainops train` for the embedded trainer; for
    another framework one `trainops baseline` run (its preset is the adapter's model.preset)."""
    sets = " ".join(f"--set {o}" for o in req.overrides)
    if req.framework != "trainops":
        target = req.config or f"--set model.preset={req.preset}"
        return f"trainops baseline --framework {req.framework} {target} --repeats 1 --nproc {req.nproc} {sets}".strip()
    target = req.config or f"--preset {req.preset}"
    if req.nodes > 1:  # `trainops train` runs here; a multi-node run is rerun through the SOP command
        parts = ["trainops baseline", req.config, f"--scheduler {req.scheduler} --nodes {req.nodes}",
                 f"--nproc {req.nproc} --repeats 1", sets]
        return " ".join(part for part in parts if part)
    return f"trainops train {target} --nproc {req.nproc} {sets}".strip()

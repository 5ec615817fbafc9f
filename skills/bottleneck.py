"""The baseline's bottleneck split: compute, exposed communication, data loading, scheduling
fragmentation and process start-up, each a share of wall time (the scheduler's submit -> end of
each repeat).

Scheduling fragmentation is the scheduler-side wait alone: queue wait (submitted -> started).
Process start-up is the job's own time on its nodes, read from the scheduler's times against the
trainer's: started -> first step begins, last step ends -> job ended. Inside the steps, data
loading is the trainer's measured `data_wait_s`; communication is the step-time fraction the
profiled trace shows as EXPOSED (a collective in progress while nothing computes, MegaScale's
measure of what overlap failed to hide), applied to the repeats' step time; compute is the rest
of the step time. The remainder is host work between steps (the metrics record, checkpoint
saves)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from trainops.run_folder import RunFiles
from trainops.run_records import MetricsRecord, read_metrics
from trainops.settings import read_toml
from trainops.skills.evidence.bottleneck import BottleneckSplit, RankTiming, TimeShare
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke, validating
from trainops.tools.jobs import jobs


class RepeatResult(Protocol):
    """What the split reads of a baseline repeat (trainops.skills.baseline.RepeatResult)."""
    job_id: str
    run_dir: str

COMM_NAMES = ("gloo:", "nccl:", "ncclKernel", "ncclDevKernel", "c10d::", "record_param_comms",
              "FSDP::all_gather", "FSDP::post_backward_reduce")
"""Trace ranges that are collectives: gloo's and NCCL's own ranges, NCCL kernels, c10d's ops, and
FSDP2's all-gather and reduce-scatter ranges (on the CPU the trainer's shared-memory collectives
run inside those, on the step's own thread)."""
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


class TraceComm(BaseModel):
    """One rank's trace, inside its `train_step#N` ranges, in microseconds."""
    step_us: float
    comm_us: float
    exposed_us: float

    @property
    def exposed_share_pct(self) -> float:
        return 100.0 * self.exposed_us / self.step_us if self.step_us else 0.0


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(i for i in intervals if i[1] > i[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def _clip(intervals: list[tuple[float, float]], windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return _union([(max(lo, w_lo), min(hi, w_hi)) for lo, hi in intervals for w_lo, w_hi in windows])


def _minus(intervals: list[tuple[float, float]], holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """`intervals` less every part covered by `holes` (both merged)."""
    out = []
    for lo, hi in intervals:
        for h_lo, h_hi in holes:
            if h_hi <= lo or h_lo >= hi:
                continue
            if h_lo > lo:
                out.append((lo, h_lo))
            lo = max(lo, h_hi)
        if hi > lo:
            out.append((lo, hi))
    return out


def exposed_comm(events: list[dict]) -> TraceComm | None:
    """Collective time a rank's step waited for: the union of collective ranges inside the steps,
    less every moment compute ran. Compute is the device's non-collective kernels when the trace
    has any (GPU), else the CPU ops on the step's thread that do not touch one of its collective
    ranges (an op inside a collective, such as the copy of a shared-memory all-gather, is part
    of it). None when the trace has no `train_step#N` range."""
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in spans
             if str(e.get("name", "")).startswith("train_step#")]
    if not steps:
        return None
    step_threads = {e.get("tid") for e in spans if str(e.get("name", "")).startswith("train_step#")}

    def interval(e: dict) -> tuple[float, float]:
        return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))

    def is_comm(e: dict) -> bool:
        return str(e.get("name", "")).startswith(COMM_NAMES)

    device = [e for e in spans if e.get("cat") in DEVICE_CATEGORIES]
    if device:
        comm = [interval(e) for e in device if is_comm(e)]
        compute = [interval(e) for e in device if not is_comm(e)]
    else:
        comm = [interval(e) for e in spans if is_comm(e)]
        own = _union([interval(e) for e in spans if is_comm(e) and e.get("tid") in step_threads])
        compute = [(lo, hi) for lo, hi in (interval(e) for e in spans if e.get("cat") == "cpu_op"
                                            and e.get("tid") in step_threads and not is_comm(e))
                   if not any(c_lo < hi and lo < c_hi for c_lo, c_hi in own)]
    in_steps = _clip(comm, steps)
    exposed = _minus(in_steps, _clip(compute, steps))
    return TraceComm(step_us=_length(_union(steps)), comm_us=_length(in_steps), exposed_us=_length(exposed))


def trace_exposed_comm(trace: Path) -> TraceComm | None:
    """`exposed_comm` of one Chrome trace file (RUN/profile/rank{R}.json)."""
    return exposed_comm(json.loads(trace.read_text()).get("traceEvents", []))


def _traces(run_dir: str) -> dict[int, TraceComm]:
    found = {}
    for trace in sorted(Path(run_dir).glob("profile/rank*.json")):
        reading = trace_exposed_comm(trace) if trace.stem[4:].isdigit() else None
        if reading is not None:
            found[int(trace.stem[4:])] = reading
    return found


def _degrees(run_dir: str, world: int) -> dict[str, int]:
    """dp, cp, tp, pp (and the two dp dims) of the run's config.toml; one dp dim of `world` when the run
    has no trainer config (another framework's job)."""
    path = RunFiles(run_dir).config
    par = (read_toml(path) if path.exists() else {}).get("parallel", {})
    tp, pp, cp, rep = (int(par.get(k, 1)) for k in ("tp", "pp", "cp", "dp_replicate"))
    shard = int(par.get("dp_shard", -1))
    if shard == -1:
        shard = max(1, world // max(1, tp * pp * cp * rep))
    if rep * shard * cp * tp * pp != world:
        rep, shard, cp, tp, pp = 1, world, 1, 1, 1
    return {"pp": pp, "dp_replicate": rep, "dp_shard": shard, "cp": cp, "tp": tp}


def rank_timings(run_dir: str, warmup_steps: int, traces: dict[int, TraceComm]) -> tuple[dict[str, int],
                                                                                       list[RankTiming]]:
    """Each rank's median step time placed at its mesh coordinates (row-major over pp, dp_replicate,
    dp_shard, cp, tp, as the trainer's mesh is built), with its trace's exposed share."""
    by_rank: dict[int, list[float]] = {}
    for rec in read_metrics(run_dir):
        if rec.step > warmup_steps and rec.step_time_s is not None:
            by_rank.setdefault(rec.rank, []).append(rec.step_time_s)
    world = max(by_rank, default=-1) + 1
    d = _degrees(run_dir, world)
    timings = []
    for rank, times in sorted(by_rank.items()):
        dp_size = d["dp_replicate"] * d["dp_shard"] * d["cp"]
        tp, rest = rank % d["tp"], rank // d["tp"]
        dp, pp = rest % dp_size, rest // dp_size
        trace = traces.get(rank)
        timings.append(RankTiming(rank=rank, dp=dp, tp=tp, pp=pp, step_time_median_s=statistics.median(times),
                                  exposed_comm_share_pct=trace.exposed_share_pct if trace else None))
    return {"dp": d["dp_replicate"] * d["dp_shard"] * d["cp"], "tp": d["tp"], "pp": d["pp"]}, timings


class _RepeatTimes(BaseModel):
    """One repeat: the scheduler's times and the trainer's step sums (mean over ranks), seconds."""
    wall_s: float
    queue_s: float
    idle_s: float
    step_s: float
    data_s: float


def _repeat_times(result: RepeatResult, scheduler: str) -> _RepeatTimes | None:
    """None for a run with no scheduler job to ask (`trainops evidence build RUNDIR`), one the
    scheduler no longer knows (another workspace, purged from Slurm), or one without step times."""
    try:
        with validating(jobs.job_status):
            ref = jobs.JobRef(job_id=result.job_id, scheduler=scheduler)
        status = invoke(jobs.job_status, ref) if result.job_id else None
    except ToolError:
        return None
    records: list[MetricsRecord] = [r for r in read_metrics(result.run_dir) if r.step_time_s is not None]
    if (status is None or status.submitted_at is None or status.started_at is None or status.ended_at is None
            or not records):
        return None
    ranks = {r.rank for r in records}
    first = min(r.time - r.step_time_s for r in records)
    last = max(r.time for r in records)
    return _RepeatTimes(wall_s=status.ended_at - status.submitted_at, queue_s=status.started_at - status.submitted_at,
                        idle_s=max(0.0, first - status.started_at) + max(0.0, status.ended_at - last),
                        step_s=sum(r.step_time_s for r in records) / len(ranks),
                        data_s=sum(r.data_wait_s or 0.0 for r in records) / len(ranks))


def _share(seconds: float | None, wall_s: float, method: str) -> TimeShare:
    share = None if seconds is None else min(100.0, max(0.0, 100.0 * seconds / wall_s))
    return TimeShare(seconds=None if seconds is None else max(0.0, seconds), share_pct=share, method=method)


def split(scheduler: str, warmup_steps: int, results: list[RepeatResult],
          profiled: RepeatResult | None = None) -> BottleneckSplit | None:
    """The five shares over the repeats' wall time; communication from the profiled run's traces
    (else any repeat's), the per-rank views from the last repeat. None when a repeat has no
    scheduler times (`_repeat_times`): without them wall time and fragmentation are unknown."""
    times = [_repeat_times(r, scheduler) for r in results]
    if not times or None in times:
        return None
    wall = sum(t.wall_s for t in times)
    queue, idle = sum(t.queue_s for t in times), sum(t.idle_s for t in times)
    step, data = sum(t.step_s for t in times), sum(t.data_s for t in times)
    traced = next(((r, tr) for r in ([profiled] if profiled else []) + results if (tr := _traces(r.run_dir))), None)
    if traced:
        run, traces = traced
        fraction = sum(t.exposed_us for t in traces.values()) / sum(t.step_us for t in traces.values())
        comm = fraction * step
        comm_method = (f"torch.profiler traces of {Path(run.run_dir).name} ({len(traces)} rank(s)): collective "
                       f"ranges ({', '.join(COMM_NAMES)}) inside the steps while no compute ran (GPU kernels, or "
                       f"CPU ops on the step's thread): the figure exposed communication, times the repeats' step "
                       "time")
    else:
        comm, comm_method = None, "not measured: no run left a torch.profiler trace (counted in compute)"
    compute = step - data - (comm or 0.0)
    per_rank = "mean over ranks of metrics.jsonl"
    remainder = wall - queue - idle - step
    degrees, ranks = rank_timings(results[-1].run_dir, warmup_steps, traced[1] if traced else {})
    return BottleneckSplit(
        wall_time_s=wall, queue_wait_s=max(0.0, queue), idle_allocated_s=idle, layout=degrees,
        ranks_run=results[-1].run_dir, ranks=ranks,
        compute=_share(compute, wall, f"step_time_s less data_wait_s less exposed communication ({per_rank})"),
        communication=_share(comm, wall, comm_method),
        data_loading=_share(data, wall, f"data_wait_s, the step's wait for its batch ({per_rank})"),
        scheduling=_share(max(0.0, queue), wall, f"{scheduler} scheduler job times (job_status): queue wait "
                                                 f"submitted -> started, {max(0.0, queue):.2f} s"),
        startup=_share(idle, wall, f"{scheduler} scheduler job times against the first and last step in "
                                   f"metrics.jsonl: started -> first step begins and last step -> ended, {idle:.2f} s "
                                   "(process launch, imports, model build, shut-down)"),
        remainder=_share(remainder, wall, "wall time less the five: host work between steps (metrics record, "
                                          "checkpoint saves), measured as what is left"))

"""The rollout ladder (issue 26): an ablation arm climbs from its smallest valid rung to the target
(processes 1 -> 2 -> 4 ... -> the target's processes per node, then nodes), each rung judged against
the baseline's noise band at that rung. Where the gain is gone the ladder stops, the job config
reverts to the baseline value, a verification run at that rung must match the baseline within its
band, and a human gets the stop (R-ESC-2) with where it happened and a topology hint for why."""
from __future__ import annotations

import os

from pydantic import BaseModel, Field

from trainops.run_records import read_faults
from trainops.skills import labels
from trainops.skills.baseline import RepeatResult
from trainops.skills.escalate import hand_to_human
from trainops.skills.evidence.model import AblationRow, LadderStop
from trainops.skills.knobs import Knob
from trainops.skills.request import JobRequest
from trainops.skills.stats import compare, spread
from trainops.tools.context import CallContext
from trainops.tools.governance.escalation import Escalation, human_item


def processes(n: int) -> str:
    return f"{n} process{'' if n == 1 else 'es'}"


class Rung(BaseModel):
    """One step of the ladder: processes per node on some nodes."""
    nproc: int = Field(ge=1, description="processes per node")
    nodes: int = Field(1, ge=1, description="nodes, each running nproc processes")

    @property
    def world(self) -> int:
        return self.nproc * self.nodes

    @property
    def label(self) -> str:
        return processes(self.nproc) if self.nodes == 1 else f"{self.nodes} nodes x {processes(self.nproc)}"


def _doubling(start: int, stop: int) -> list[int]:
    """start, 2*start, 4*start ... below stop, then stop itself."""
    steps, n = [], start
    while n < stop:
        steps.append(n)
        n *= 2
    return [*steps, stop]


def ladder(req: JobRequest) -> list[Rung]:
    """Every rung up to the target: processes on one node first, then nodes at the target's processes."""
    rungs = [Rung(nproc=n) for n in _doubling(1, req.nproc)]
    if req.nodes > 1:
        rungs += [Rung(nproc=req.nproc, nodes=n) for n in _doubling(2, req.nodes)]
    return rungs


def valid_rungs(knob: Knob, req: JobRequest) -> list[Rung]:
    """The rungs where the knob means something (its `min_procs` ranks or more); refused when none is."""
    rungs = [r for r in ladder(req) if r.world >= knob.min_procs]
    if not rungs:
        raise ValueError(f"knob {knob.name}: needs {processes(knob.min_procs)}, the target runs "
                         f"{processes(req.nproc * req.nodes)}; raise --nproc to {knob.min_procs} or more")
    return rungs


def start_note(knob: Knob, rungs: list[Rung]) -> str:
    """What the ladder skipped below its first rung, and why; empty when it starts at one process."""
    if knob.min_procs <= 1:
        return ""
    first = rungs[0]
    where = "which is the target itself: no smaller scale can be tried first" if len(rungs) == 1 else \
        f"then climbs to {rungs[-1].label}"
    return (f"{knob.name} cannot run at small scale: it needs {processes(knob.min_procs)} or more; the ladder starts "
            f"at its smallest valid rung, {first.label}, {where}")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def topology_hint(rung: Rung, previous: Rung | None, runs: list[RepeatResult], hardware: str = "cpu") -> str:
    """Why a gain may be gone at this rung, from what changed in the topology and what the rung's
    runs recorded: a straggler in their faults.jsonl, more ranks than CPU cores, the first
    collectives, the first inter-node link."""
    hints = []
    slow = {(f.rank, (f.model_extra or {}).get("slow_ms"))
            for run in runs for f in read_faults(run.run_dir) if f.kind == "slow"}
    hints += [f"a straggler: rank {rank} runs {ms} ms slower every step (its run's faults.jsonl), so every rank "
              "waits for it at the gradient collective" for rank, ms in sorted(slow, key=str)]
    cpus = _cpus()
    if hardware.startswith("cpu") and rung.nproc > cpus:
        hints.append(f"{rung.label} on a {cpus}-core host: ranks oversubscribe the CPUs")
    if previous is not None and rung.nodes > previous.nodes:
        hints.append("across nodes: the inter-node link now carries the collectives")
    elif previous is not None and previous.world == 1 and rung.world > 1:
        hints.append("the first rung with collectives: gradient communication now takes part of every step")
    return "; ".join(hints) or f"within one node at {rung.label}: contention among ranks (memory bandwidth, " \
                                "collectives)"


def job_rates(runs: list[RepeatResult]) -> list[float]:
    """Steps per second of each run as the job ran them: one over the median of each step's slowest
    rank. A synchronous job runs at its slowest rank, and a step's model FLOPs do not change with the
    knob, so the change in this rate is the change in the job's MFU; the mean of per-rank MFU is not
    (a straggler that waits before its step reports its own short step time, not the job's)."""
    rates = []
    for run in runs:
        if not run.summary.step_time_median_s:
            raise ValueError(f"{run.run_dir}: summarize_run found no step time; check its metrics.jsonl")
        rates.append(1.0 / run.summary.step_time_median_s)
    return rates


def verification(knob: Knob, value: str, baseline_value: str, base: list[RepeatResult],
                 verify: list[RepeatResult]) -> tuple[float, float, bool]:
    """(MFU change %, band %, matches) of the reverted config's runs against the rung's baseline; a
    reverted run that still carries the arm's value is an error, not a verification."""
    section, key = knob.overrides[0].split(".", 1)
    for run in verify:
        ran = labels.run_config(run.run_dir).get(section, {}).get(key)
        ran = str(ran).lower() if isinstance(ran, bool) else str(ran)
        if ran != baseline_value:
            raise ValueError(f"{run.run_dir}: the reverted config runs {knob.overrides[0]}={ran}, not the baseline "
                             f"value {baseline_value}; the rollback of {knob.name}={value} did not take")
    change, band, verdict = compare(spread(job_rates(base)), spread(job_rates(verify)))
    return change, band, verdict == "within-noise"


def hand_over(row: AblationRow, stop: LadderStop, ctx: CallContext | None = None) -> str:
    """The stop as a pending human item (R-ESC-2, stop_rollout_and_roll_back); returns its line."""
    matched = "matched" if stop.verification_matches else "did NOT match"
    detail = (f"the gain of {row.knob}={row.value} is gone at {stop.rung} ({row.mfu_change_pct:+.1f}% against a "
              f"band of {row.noise_band_pct:.1f}%); probable cause: {stop.topology_hint}; reverted to "
              f"{row.knob}={stop.reverted_to}, whose verification run {matched} the baseline "
              f"({stop.verification_change_pct:+.1f}% against {stop.verification_band_pct:.1f}%)")
    esc = Escalation(rule_id="R-ESC-2", action="stop_rollout_and_roll_back", detail=detail)
    return human_item(esc, hand_to_human(esc, f"rollout {row.knob}={row.value}", ctx))

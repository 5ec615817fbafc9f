"""Planning tools: how often to checkpoint, how much training time failures cost, whether a
parallel layout fits.

The checkpoint interval follows Young (1974) and Daly (2006, "A higher order estimate of the
optimum checkpoint interval for restart dumps"). The effective-training-time estimate is a
seeded discrete-event simulation, so it reaches cluster sizes this machine cannot hold and
gives the same answer for the same seed.
"""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainops.run_records import RecoveryPath, read_journal
from trainops.tools.base import ToolError, tool
from trainops.tools.planning.layout_mapping import MoeShape, TopologyPlan, expert_parallel, map_layout
from trainops.tools.reliability.drill_records import measured_path_restart, newest_node_drill_restart
from trainops.trainer.config import load_config
from trainops.trainer.layout import plan_dry_run
from trainops.workspace import confine, run_folder

# --- checkpoint interval -------------------------------------------------------------------


# Planning inputs come from people and models alike: every number is finite and bounded, so a
# read-only tool can neither overflow nor simulate for hours.
WEEK_S = 7 * 86400
MONTH_S = 30 * 86400
MAX_SIMULATED_FAILURES = 1_000_000
MAX_RATIO_TO_MTBF = 500  # e^(x/MTBF) overflows a float near 709
RestartFrom = Literal["given", "newest_node_drill", "measured_path"]
MAX_CHECKPOINT_BYTES = 2**50  # a PiB: past any job's checkpoint, so a typo in units is refused
CHECKPOINT_TOO_SLOW = 0.10
"""The one line between "checkpoint as planned" and "make checkpoints two-phase async", for the
planner and R-ESC-4 alike: sync saves at the Young/Daly optimum cost about sqrt(2C/M) of wall time
(Young 1974, first order). The seed says only "write time approaching the MTBF"; at 10% of the run
lost to saving (e.g. a 600 s save at a 24 h MTBF costs 11.8%) a snapshot-to-host save pays for its
memory, as MegaScale's two-phase checkpoint did."""
RESTART_FROM_DOC = ("Where the restart time comes from: 'given' (restart_s), 'newest_node_drill' (measured in the "
                    "newest multi-node drill record of the workspace: detection + isolation + requeue + load), or "
                    "'measured_path' (the median of the workspace's measured recoveries by recovery_path: drill "
                    "records and the trainer's RUN/recoveries.jsonl).")
RECOVERY_PATH_DOC = ("With restart_from='measured_path': the recovery path the job will use (in-process or "
                     "spare-admitted: a lost rank under in-process restart (on by default where the host has a "
                     "GPU per rank), or a lost node when the job also holds spare_nodes; requeue: a lost node "
                     "without spare nodes, the leader's node, or in-process restart off), whose measured restart "
                     "is taken.")


def _path_goes_with_measured(restart_from: str, recovery_path: str | None) -> None:
    if (recovery_path is None) == (restart_from == "measured_path"):
        raise ValueError("recovery_path: give it exactly when restart_from='measured_path' (the path whose measured "
                         "restart the plan takes: in-process, spare-admitted or requeue)")


class CheckpointIntervalInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    save_s: float = Field(gt=0, le=WEEK_S,
                          description="Measured time to write one checkpoint (training stalls this long), seconds.")
    restart_s: float | None = Field(None, ge=0, le=WEEK_S,
                                    description="Time from a failure to training again (detection, restart, load), "
                                                "seconds; omit with restart_from='newest_node_drill'.")
    restart_from: RestartFrom = Field("given", description=RESTART_FROM_DOC)
    recovery_path: RecoveryPath | None = Field(None, description=RECOVERY_PATH_DOC)
    mtbf_h: float = Field(gt=0, le=1e6, description="Mean time between failures of the whole job, hours.")
    checkpoint_bytes: int | None = Field(None, gt=0, le=MAX_CHECKPOINT_BYTES,
                                         description="Bytes one checkpoint writes; with write_bandwidth_mib_s gives "
                                                     "the write-bandwidth occupancy. Omit with `run`.")
    write_bandwidth_mib_s: float | None = Field(None, gt=0, le=1e9,
                                                description="Measured checkpoint write bandwidth, MiB/s (trainops env "
                                                            "measures it); omit with `run`.")
    run: str | None = Field(None, description="A run whose checkpoint journal gives both: the median bytes per save "
                                              "and the bandwidth its saves reached (bytes over write time).")

    @model_validator(mode="after")
    def _occupancy_inputs(self) -> CheckpointIntervalInput:
        given = (self.checkpoint_bytes is not None, self.write_bandwidth_mib_s is not None)
        if self.run is not None and any(given):
            raise ValueError("run: measures checkpoint_bytes and write_bandwidth_mib_s from its journal; pass the run "
                             "or the two numbers, not both")
        if given[0] != given[1]:
            raise ValueError("checkpoint_bytes and write_bandwidth_mib_s: give both (the occupancy is bytes per "
                             "interval over bandwidth) or neither")
        return self

    @model_validator(mode="after")
    def _not_beyond_the_mtbf(self) -> CheckpointIntervalInput:
        if (self.restart_s is None) == (self.restart_from == "given"):
            raise ValueError("restart_s: give it (seconds from a failure to training again) or set "
                             "restart_from='newest_node_drill' or 'measured_path' to take the measured one, not both "
                             "or neither")
        _path_goes_with_measured(self.restart_from, self.recovery_path)
        mtbf_s = self.mtbf_h * 3600
        if max(self.save_s, self.restart_s or 0) > MAX_RATIO_TO_MTBF * mtbf_s:
            raise ValueError(f"save_s={self.save_s:g} / restart_s={self.restart_s:g} is more than {MAX_RATIO_TO_MTBF} "
                             f"times mtbf_h={self.mtbf_h:g} h: no work would ever be kept; check the units (mtbf_h is "
                             "hours)")
        return self


class WriteOccupancy(BaseModel):
    """The checkpoint plan's load on storage: one checkpoint per Daly interval."""
    checkpoint_bytes: int = Field(description="Bytes one checkpoint writes.")
    write_bandwidth_mib_s: float = Field(description="Write bandwidth the occupancy is measured against, MiB/s.")
    basis: str = Field(description="Where bytes and bandwidth come from.")
    write_s: float = Field(description="checkpoint_bytes / write_bandwidth: seconds the storage is busy per "
                                       "checkpoint.")
    interval_s: float = Field(description="The planned interval (Daly), seconds.")
    demand_mib_s: float = Field(description="checkpoint_bytes / interval_s: the average write rate the plan demands.")
    occupancy_fraction: float = Field(description="write_s / interval_s (= demand over bandwidth): the share of the "
                                                  "storage's write bandwidth the checkpoints occupy.")


class CheckpointIntervalOutput(BaseModel):
    young_interval_min: float = Field(description="Young's first-order optimum sqrt(2*C*M), minutes.")
    daly_interval_min: float = Field(description="Daly's higher-order optimum, minutes (equals MTBF when C >= 2M).")
    expected_waste_fraction: float = Field(
        description="Daly's expected fraction of wall time not spent on new work at the Daly interval (checkpoint, "
                    "rework, restart)."
    )
    save_to_mtbf_ratio: float = Field(description="Checkpoint write time over MTBF.")
    escalation: Literal["none", "two_phase_async"] = Field(description="Whether the write cost calls for async "
                                                                       "checkpoints.")
    recommendation: str = Field(description="One sentence a person can act on.")
    restart_s: float = Field(description="The restart time used, seconds.")
    restart_source: str = Field(description="Where restart_s came from.")
    restart_path: RecoveryPath | None = Field(None, description="The recovery path restart_s was measured on; None: "
                                                                "given, or not told apart.")
    write_occupancy: WriteOccupancy | None = Field(None, description="How much of the checkpoint storage's write "
                                                                     "bandwidth the plan takes; None without bytes "
                                                                     "and bandwidth.")


def checkpoint_overhead(save_s: float, mtbf_s: float) -> float:
    """Share of wall time lost to sync checkpoints at the Young/Daly optimum, first order."""
    return math.sqrt(2 * save_s / mtbf_s)


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Daly's eq. (37): sqrt(2dM)[1 + 1/3 sqrt(d/2M) + 1/9 (d/2M)] - d, for d < 2M; else M."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def daly_waste_fraction(interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """1 - solve/wall from Daly's expected wall time M e^(R/M) (e^((t+d)/M) - 1) / t per unit of work."""
    wall_per_work = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + save_s) / mtbf_s) / interval_s
    return 1 - 1 / wall_per_work


@tool("plan_checkpoint_interval", risk="read", tags=("planning", "checkpoint"))
def plan_checkpoint_interval(inp: CheckpointIntervalInput) -> CheckpointIntervalOutput:
    """Optimal checkpoint interval from the measured checkpoint write time, the restart time and
    the job's MTBF, by Young's and Daly's formulas, with the expected fraction of time wasted and
    a recommendation (two-phase async checkpoints when the write time nears the MTBF)."""
    source = "given by the caller"
    if inp.restart_from == "newest_node_drill":
        measured = newest_node_drill_restart("plan_checkpoint_interval")
        inp = inp.model_copy(update={"restart_s": measured.total_s})
        source = measured.source
    elif inp.restart_from == "measured_path":
        measured = measured_path_restart(inp.recovery_path, "plan_checkpoint_interval")
        inp = inp.model_copy(update={"restart_s": measured.total_s})
        source = measured.source
    mtbf_s = inp.mtbf_h * 3600
    young = young_interval_s(inp.save_s, mtbf_s)
    daly = daly_interval_s(inp.save_s, mtbf_s)
    waste = daly_waste_fraction(daly, inp.save_s, inp.restart_s, mtbf_s)
    ratio = inp.save_s / mtbf_s
    overhead = checkpoint_overhead(inp.save_s, mtbf_s)
    if overhead >= CHECKPOINT_TOO_SLOW:
        escalation = "two_phase_async"
        advice = (
            f"sync checkpoints ({inp.save_s:g} s each) cost {overhead:.1%} of wall time at a {inp.mtbf_h:g} h MTBF "
            f"(at or above {CHECKPOINT_TOO_SLOW:.0%}, R-ESC-4): switch to two-phase "
            "async checkpoints (snapshot to host memory, persist in the background) so the stall is the snapshot, "
            f"then re-plan with the snapshot time; meanwhile checkpoint every {daly / 60:.1f} min"
        )
    else:
        escalation = "none"
        advice = f"checkpoint every {daly / 60:.1f} min (Daly); expected waste {waste:.1%}"
    occupancy = write_occupancy(inp, daly)
    if occupancy is not None:
        advice += (f"; checkpoints occupy {occupancy.occupancy_fraction:.2%} of the write bandwidth "
                   f"({occupancy.write_s:.3g} s of writing per {daly / 60:.1f} min)")
    return CheckpointIntervalOutput(
        young_interval_min=young / 60,
        daly_interval_min=daly / 60,
        expected_waste_fraction=waste,
        save_to_mtbf_ratio=ratio,
        escalation=escalation,
        recommendation=advice,
        restart_s=inp.restart_s,
        restart_source=source,
        restart_path=inp.recovery_path,
        write_occupancy=occupancy,
    )


def write_occupancy(inp: CheckpointIntervalInput, interval_s: float) -> WriteOccupancy | None:
    """Bytes per interval over the write bandwidth, given or measured from the run's journal."""
    if inp.run is not None:
        size, bandwidth, basis = journal_write_rate(inp.run)
    elif inp.checkpoint_bytes is not None and inp.write_bandwidth_mib_s is not None:
        size, bandwidth, basis = inp.checkpoint_bytes, inp.write_bandwidth_mib_s, "given by the caller"
    else:
        return None
    write_s = size / (bandwidth * 2**20)
    return WriteOccupancy(checkpoint_bytes=size, write_bandwidth_mib_s=bandwidth, basis=basis, write_s=write_s,
                          interval_s=interval_s, demand_mib_s=size / 2**20 / interval_s,
                          occupancy_fraction=write_s / interval_s)


def journal_write_rate(run: str) -> tuple[int, float, str]:
    """Median bytes per save and the bandwidth the saves reached (their bytes over their write time),
    from the run's checkpoint journal."""
    try:
        folder = run_folder(run, "run")
    except ValueError as exc:
        raise ToolError("plan_checkpoint_interval", str(exc)) from None
    saves = [s for s in read_journal(folder).saves if s.size_bytes > 0 and s.write_s > 0]
    if not saves:
        raise ToolError("plan_checkpoint_interval", f"run: {folder.name} journals no checkpoint with its size and "
                                                    "write time (checkpoints.jsonl); pass checkpoint_bytes and "
                                                    "write_bandwidth_mib_s instead")
    size = int(statistics.median(s.size_bytes for s in saves))
    bandwidth = sum(s.size_bytes for s in saves) / sum(s.write_s for s in saves) / 2**20
    return size, bandwidth, f"measured: {len(saves)} save(s) in {folder.name}/checkpoints.jsonl"


# --- effective training time ---------------------------------------------------------------

# "The Llama 3 Herd of Models" (Meta, 2024), as restated in the seed 004: 419 unexpected
# interruptions in a 54-day snapshot on 16,384 H100s; GPU-related 58.7% of them (faulty GPU
# 148, HBM3 72, SDC 6), network switch/cable 35, CPU 2. `gpu_other` is the rest of the GPU-related
# share and `other` everything the seed does not break down (software, host, storage, ...).
LLAMA3_CAUSE_COUNTS: dict[str, int] = {
    "gpu_fault": 148,
    "gpu_hbm3": 72,
    "gpu_sdc": 6,
    "gpu_other": round(0.587 * 419) - 148 - 72 - 6,
    "network_switch_cable": 35,
    "cpu": 2,
    "other": 419 - round(0.587 * 419) - 35 - 2,
}
HARDWARE_CAUSES = frozenset({"gpu_fault", "gpu_hbm3", "gpu_sdc", "gpu_other", "network_switch_cable", "cpu"})


class FailureProfile(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    name: str = Field(description="Where the numbers come from.")
    interruptions: int = Field(gt=0, le=10**7, description="Unexpected interruptions observed.")
    reference_days: float = Field(gt=0, le=36500, description="Length of the observation window, days.")
    reference_gpus: int = Field(gt=0, le=10**7,
                                description="GPUs in the observed job; the rate scales linearly with GPU count.")
    cause_counts: dict[str, int] = Field(description="Interruptions by cause; they must add up to `interruptions`.")

    @model_validator(mode="after")
    def _counts_add_up(self) -> FailureProfile:
        total = sum(self.cause_counts.values())
        if total != self.interruptions:
            raise ValueError(
                f"cause_counts add up to {total}, not interruptions={self.interruptions}: make them add up"
            )
        return self


PROFILES: dict[str, FailureProfile] = {
    "llama3": FailureProfile(
        name="Llama 3 405B, 54-day snapshot on 16,384 H100 (Meta 2024, via seed 004)",
        interruptions=419,
        reference_days=54,
        reference_gpus=16384,
        cause_counts=LLAMA3_CAUSE_COUNTS,
    )
}


class EttrInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    gpus: int = Field(16384, gt=0, le=10**7, description="GPUs in the simulated job.")
    days: float = Field(54, gt=0, le=3650, description="Simulated wall-clock length, days.")
    profile: Literal["llama3"] | FailureProfile = Field(
        "llama3", description="Named failure profile, or a custom one (interruptions, window, reference GPUs, causes)."
    )
    detection_latency_s: float = Field(120, ge=0, le=MONTH_S,
                                       description="Failure to detection, seconds (assumed, not from the profile).")
    detection_latency_s_by_cause: dict[str, float] = Field(
        default_factory=dict,
        description="Per-cause detection latency overrides, seconds (e.g. silent data corruption is found late: "
                    "{'gpu_sdc': 3600}).",
    )
    restart_s: float = Field(600, ge=0, le=WEEK_S,
                             description="Detection to training again: restart, rendezvous, checkpoint load, seconds.")
    restart_from: RestartFrom = Field("given", description=RESTART_FROM_DOC + " With the drill, detection_latency_s "
                                                                              "and restart_s are both its figures.")
    recovery_path: RecoveryPath | None = Field(None, description=RECOVERY_PATH_DOC)
    hot_spares: bool = Field(True,
                             description="A healthy spare node replaces a failed one at once; without, hardware causes "
                                         "wait node_replacement_s.")
    node_replacement_s: float = Field(1800, ge=0, le=MONTH_S,
                                      description="Time to provision a replacement node when there is no hot spare, "
                                                  "seconds.")
    checkpoint_save_s: float = Field(60, gt=0, le=WEEK_S,
                                     description="Time for a checkpoint to become durable, seconds.")
    checkpoint_mode: Literal["sync", "async"] = Field(
        "async", description="sync: training stalls for the whole save; async: it stalls only for async_stall_s."
    )
    async_stall_s: float = Field(5, ge=0, description="Training stall of an async checkpoint (the snapshot), seconds.")
    checkpoint_interval_min: float | None = Field(
        None, gt=0, le=MONTH_S / 60,
        description="Compute time between checkpoints, minutes; default: Daly's optimum for the stall and MTBF."
    )
    seed: int = Field(0, description="Random seed: the same inputs and seed give the same result.")

    @model_validator(mode="after")
    def _override_causes_exist(self) -> EttrInput:
        _path_goes_with_measured(self.restart_from, self.recovery_path)
        causes = _resolve_profile(self.profile).cause_counts
        unknown = sorted(set(self.detection_latency_s_by_cause) - set(causes))
        if unknown:
            raise ValueError(
                f"detection_latency_s_by_cause has unknown cause(s) {unknown}: use causes of the profile, "
                f"{sorted(causes)}"
            )
        if any(not 0 <= v <= MONTH_S for v in self.detection_latency_s_by_cause.values()):
            raise ValueError(f"detection_latency_s_by_cause={self.detection_latency_s_by_cause} has a latency outside "
                             f"0..{MONTH_S} s: use seconds within a month")
        profile = _resolve_profile(self.profile)
        failures = profile.interruptions / profile.reference_days / profile.reference_gpus * self.gpus * self.days
        if failures > MAX_SIMULATED_FAILURES:
            raise ValueError(f"the simulation would draw about {failures:.3g} failures (gpus={self.gpus}, "
                             f"days={self.days:g}, profile {profile.name!r}); at most {MAX_SIMULATED_FAILURES:,}: "
                             "lower gpus or days")
        return self

    @field_validator("async_stall_s")
    @classmethod
    def _stall_not_longer_than_save(cls, value: float, info) -> float:
        save = info.data.get("checkpoint_save_s")
        if save is not None and value > save:
            raise ValueError(f"async_stall_s={value} exceeds checkpoint_save_s={save}: the snapshot is part of the "
                             "save")
        return value


class EttrOutput(BaseModel):
    profile: str = Field(description="The failure profile used.")
    job_mtbf_h: float = Field(description="Mean time between failures at this GPU count, hours.")
    checkpoint_interval_min: float = Field(description="Compute time between checkpoints used, minutes.")
    failures: int = Field(description="Failures in the simulated window.")
    failures_by_cause: dict[str, int]
    wall_h: float = Field(description="Simulated wall time, hours.")
    productive_h: float = Field(description="Time spent on work that was kept, hours.")
    ettr: float = Field(description="Effective training time ratio: productive_h / wall_h.")
    lost_h_by_cause: dict[str, float] = Field(
        description="Hours lost: checkpoint_stall, and per failure cause detection + restart + replacement + rework."
    )
    lost_h_by_phase: dict[str, float] = Field(description="Hours lost by phase: checkpoint_stall, rework, detection, "
                                                          "restart, replacement.")
    restart_source: str = Field("given by the caller",
                                description="Where detection_latency_s and restart_s came from.")
    restart_path: RecoveryPath | None = Field(None, description="The recovery path they were measured on.")


def _resolve_profile(profile: str | FailureProfile) -> FailureProfile:
    return PROFILES[profile] if isinstance(profile, str) else profile


def simulate_ettr(inp: EttrInput) -> EttrOutput:
    """Poisson failures; after each, work since the last durable checkpoint is redone."""
    profile = _resolve_profile(inp.profile)
    rate_per_s = profile.interruptions / (profile.reference_days * 86400) * inp.gpus / profile.reference_gpus
    mtbf_s = 1 / rate_per_s
    stall_s = inp.checkpoint_save_s if inp.checkpoint_mode == "sync" else inp.async_stall_s
    interval_s = (
        inp.checkpoint_interval_min * 60
        if inp.checkpoint_interval_min is not None
        else max(daly_interval_s(max(stall_s, 1e-3), mtbf_s), 1.0)
    )
    period_s = interval_s + stall_s
    causes, weights = zip(*sorted(profile.cause_counts.items()), strict=True)
    rng = random.Random(inp.seed)
    end_s = inp.days * 86400
    phase = dict.fromkeys(("checkpoint_stall", "rework", "detection", "restart", "replacement"), 0.0)
    by_cause: dict[str, float] = {"checkpoint_stall": 0.0}
    counts: dict[str, int] = {}
    productive_s = 0.0
    t = 0.0
    while t < end_s:
        fail_at = t + rng.expovariate(rate_per_s)
        stop = min(fail_at, end_s)
        span = stop - t
        full_periods = math.floor(span / period_s)
        work_s = full_periods * interval_s + min(span - full_periods * period_s, interval_s)
        phase["checkpoint_stall"] += span - work_s
        by_cause["checkpoint_stall"] += span - work_s
        if fail_at >= end_s:
            productive_s += work_s
            break
        durable = max(0, math.floor((span - inp.checkpoint_save_s + stall_s) / period_s))
        kept_s = min(durable * interval_s, work_s)
        productive_s += kept_s
        cause = rng.choices(causes, weights)[0]
        counts[cause] = counts.get(cause, 0) + 1
        replace_s = 0.0 if inp.hot_spares or cause not in HARDWARE_CAUSES else inp.node_replacement_s
        phase["rework"] += work_s - kept_s
        lost_s, t = work_s - kept_s, fail_at
        detect_s = inp.detection_latency_s_by_cause.get(cause, inp.detection_latency_s)
        for name, seconds in (("detection", detect_s), ("restart", inp.restart_s), ("replacement", replace_s)):
            seconds = min(seconds, end_s - t)  # the window may end while the job is down
            phase[name] += seconds
            lost_s += seconds
            t += seconds
        by_cause[cause] = by_cause.get(cause, 0.0) + lost_s
    wall_s = end_s
    return EttrOutput(
        profile=profile.name,
        job_mtbf_h=mtbf_s / 3600,
        checkpoint_interval_min=interval_s / 60,
        failures=sum(counts.values()),
        failures_by_cause=dict(sorted(counts.items())),
        wall_h=wall_s / 3600,
        productive_h=productive_s / 3600,
        ettr=productive_s / wall_s,
        lost_h_by_cause={k: v / 3600 for k, v in sorted(by_cause.items())},
        lost_h_by_phase={k: v / 3600 for k, v in phase.items()},
    )


@tool("plan_effective_training_time", risk="read", tags=("planning", "reliability"))
def plan_effective_training_time(inp: EttrInput) -> EttrOutput:
    """Estimate the effective training time ratio (ETTR) of a job of `gpus` GPUs over `days`
    days under a failure profile (default: Llama 3's 419 interruptions in 54 days on 16,384
    GPUs, scaled linearly by GPU count), given detection latency, restart time, hot spares and
    the checkpoint policy. Deterministic for a seed; reports hours lost by cause and phase.
    With restart_from='newest_node_drill' the detection and restart times are the newest
    multi-node drill's measured ones, and the output says which drill."""
    if inp.restart_from == "given":
        return simulate_ettr(inp)

    measured = (newest_node_drill_restart("plan_effective_training_time") if inp.restart_from == "newest_node_drill"
                else measured_path_restart(inp.recovery_path, "plan_effective_training_time"))
    inp = inp.model_copy(update={"detection_latency_s": measured.detection_s, "restart_s": measured.recovery_s})
    return simulate_ettr(inp).model_copy(update={"restart_source": measured.source,
                                                 "restart_path": inp.recovery_path})


# --- parallel layout -----------------------------------------------------------------------


MAX_NPROC = 65536  # a read tool the agent calls freely: the rank grid it builds stays under a second


class LayoutInput(BaseModel):
    config: str | None = Field(None, description="Path to a job config TOML; omit to use a preset.")
    preset: str | None = Field(None, description="Model preset when no config is given (tiny, small, llama3-8b, ...).")
    overrides: list[str] = Field(default_factory=list, description="section.key=value overrides, e.g. parallel.tp=2.")
    nproc: int = Field(gt=0, le=MAX_NPROC, description=f"Number of processes (world size) to plan for, at most "
                                                      f"{MAX_NPROC}.")
    nodes: int = Field(1, ge=1, le=MAX_NPROC, description="Nodes the world spreads over, nproc/nodes ranks each (the "
                                                          "declared topology, not this host).")
    scale_up_domain: int | None = Field(None, ge=1, le=MAX_NPROC,
                                        description="Accelerators sharing one scale-up domain (NVLink/NVSwitch), as "
                                                    "the environment declaration states it; omit on CPU hosts (the "
                                                    "node is the domain).")
    moe: MoeShape | None = Field(None, description="Mixture-of-experts shape (experts, top_k, ep, moe_layers) for the "
                                                   "expert-parallel bandwidth estimate.")
    inter_node_gbit_s: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False,
                                            description="Declared or measured inter-node bandwidth, Gbit/s (for an "
                                                        "expert-parallel group across nodes).")
    intra_node_gbit_s: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False,
                                            description="Declared scale-up bandwidth inside a node, Gbit/s.")

    @model_validator(mode="after")
    def _nodes_divide(self) -> LayoutInput:
        if self.nproc % self.nodes:
            raise ValueError(f"nodes={self.nodes} does not divide nproc={self.nproc}: every node runs nproc/nodes "
                             "ranks; pass the world size (nodes x processes per node)")
        return self


class LayoutOutput(BaseModel):
    valid: bool = Field(description="Whether the layout fits the world size and the model.")
    error: str | None = Field(None, description="Why the layout is invalid, with the numbers.")
    plan: dict[str, Any] = Field(default_factory=dict,
                                 description="The trainer's dry-run plan (mesh, degrees, memory, ...).")
    topology: TopologyPlan | None = Field(None, description="Where each dimension's groups land on the declared "
                                                            "topology, the cross-domain verdict, and the "
                                                            "expert-parallel estimate.")


def _plain(obj: Any) -> dict[str, Any]:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, dict):
        return obj
    return {"plan": str(obj)}


@tool("plan_layout", risk="read", tags=("planning", "parallel"))
def plan_layout(inp: LayoutInput) -> LayoutOutput:
    """Validate a parallel layout (dp_replicate x dp_shard x cp x tp x pp) for a job config and a
    world size without starting any process: the trainer's dry run, then where each dimension's
    groups land on the declared topology (nodes, scale-up domain) with the verdict on tensor
    parallel crossing a domain, and, for a MoE shape, the expert all-to-all bytes per step against
    the declared bandwidth. An impossible layout comes back as valid=false with the reason."""
    try:
        # the config is a path the model chose: confined like every other path a tool reads, so no
        # file outside the workspace (its existence, its TOML) reaches the model
        config = confine(inp.config, "config", reading=True, must_exist=True) if inp.config else None
    except ValueError as exc:
        raise ToolError("plan_layout", str(exc)) from None
    try:
        cfg = load_config(config, inp.preset, inp.overrides)
    except (OSError, ValueError) as exc:
        raise ToolError("plan_layout", f"cannot load config {inp.config or inp.preset!r}: {exc}") from None
    try:
        plan = plan_dry_run(cfg, inp.nproc)
    except ValueError as exc:
        return LayoutOutput(valid=False, error=str(exc))
    layout = plan.layout
    topology = map_layout(dict(zip(plan.mesh_dim_names, plan.mesh_shape, strict=True)), inp.nproc, inp.nodes,
                          inp.scale_up_domain)
    if inp.moe is not None:
        args = cfg.model_args()
        try:
            topology.expert_parallel = expert_parallel(inp.moe, layout, args.dim, args.n_layers, topology.domain_ranks,
                                                       topology.ranks_per_node, inp.inter_node_gbit_s,
                                                       inp.intra_node_gbit_s)
        except ValueError as exc:
            return LayoutOutput(valid=False, error=str(exc), plan=_plain(plan), topology=topology)
    return LayoutOutput(valid=topology.tp_inside_domain, error=None if topology.tp_inside_domain else topology.verdict,
                        plan=_plain(plan), topology=topology)

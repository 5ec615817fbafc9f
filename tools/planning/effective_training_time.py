"""How much training time failures cost: a seeded discrete-event simulation of a job under a
failure profile (default: Llama 3's), so it reaches cluster sizes this machine cannot hold and
gives the same answer for the same seed."""
from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainops.run_records import RecoveryPath
from trainops.tools.base import tool
from trainops.tools.planning.checkpoint_interval import daly_interval_s
from trainops.tools.planning.inputs import (
    MONTH_S,
    RECOVERY_PATH_DOC,
    RESTART_FROM_DOC,
    WEEK_S,
    RestartFrom,
    measured_restart,
    path_goes_with_measured,
)

MAX_SIMULATED_FAILURES = 1_000_000

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
        path_goes_with_measured(self.restart_from, self.recovery_path)
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

    measured = measured_restart(inp.restart_from, inp.recovery_path, "plan_effective_training_time")
    inp = inp.model_copy(update={"detection_latency_s": measured.detection_s, "restart_s": measured.recovery_s})
    return simulate_ettr(inp).model_copy(update={"restart_source": measured.source,
                                                 "restart_path": inp.recovery_path})

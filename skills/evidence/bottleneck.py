"""The baseline's bottleneck split (the seed's classes: compute, communication, data loading,
scheduling fragmentation; and process start-up, which is the job's own time, not the scheduler's),
each a share of the jobs' wall time with how it was measured.
A contract module: it imports nothing above it; trainops.skills.bottleneck computes it."""
from __future__ import annotations

from pydantic import BaseModel, Field


class TimeShare(BaseModel):
    """One class of time: seconds summed over the baseline's repeats, their share of the repeats'
    wall time, and the method that measured them."""

    seconds: float | None = Field(ge=0, description="seconds over all repeats; None when not measurable")
    share_pct: float | None = Field(ge=0, le=100, description="seconds over the repeats' wall time, percent")
    method: str = Field(description="how the seconds were measured, or why they were not")


class RankTiming(BaseModel):
    """One rank of the run the per-rank views are drawn from, placed in its layout."""

    rank: int = Field(ge=0)
    dp: int = Field(ge=0, description="data-parallel coordinate (dp_replicate x dp_shard x cp, flattened)")
    tp: int = Field(ge=0, description="tensor-parallel coordinate")
    pp: int = Field(ge=0, description="pipeline stage coordinate")
    step_time_median_s: float = Field(ge=0, description="median step time of this rank, warm-up excluded")
    exposed_comm_share_pct: float | None = Field(
        default=None, ge=0, le=100, description="exposed communication over step time in this rank's trace")


class BottleneckSplit(BaseModel):
    """Where the baseline's wall time went: submit -> end of every repeat, from the scheduler."""

    wall_time_s: float = Field(gt=0, description="scheduler submit -> job end, summed over the repeats")
    compute: TimeShare
    communication: TimeShare = Field(description="exposed communication: collectives not overlapped by compute")
    data_loading: TimeShare
    scheduling: TimeShare = Field(description="scheduling fragmentation: the scheduler-side wait, submitted -> "
                                              "started (queue wait), from the scheduler's times")
    startup: TimeShare = Field(description="process start-up and shut-down: started -> first step begins (launcher, "
                                           "imports, model build) and last step -> job end, on the job's own nodes")
    remainder: TimeShare = Field(description="what the five leave: host work between steps (metrics, "
                                             "checkpoint saves)")
    queue_wait_s: float = Field(ge=0, description="scheduler submit -> start, summed over the repeats")
    idle_allocated_s: float = Field(ge=0, description="start -> first step plus last step -> end, summed")
    layout: dict[str, int] = Field(description="degrees of the per-rank views: dp, tp, pp")
    ranks_run: str = Field(description="run folder the per-rank step times and the layout view are from")
    ranks: list[RankTiming] = Field(default_factory=list)

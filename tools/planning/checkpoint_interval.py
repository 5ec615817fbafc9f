"""How often to checkpoint: Young (1974) and Daly (2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps") from the measured write time, the restart time and the
job's MTBF, with the load the plan puts on the checkpoint storage."""
from __future__ import annotations

import math
import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainops.run_records import RecoveryPath, read_journal
from trainops.tools.base import ToolError, tool
from trainops.tools.ids import RunRef
from trainops.tools.planning.inputs import (
    RECOVERY_PATH_DOC,
    RESTART_FROM_DOC,
    WEEK_S,
    RestartFrom,
    measured_restart,
    path_goes_with_measured,
)
from trainops.workspace import run_folder

MAX_RATIO_TO_MTBF = 500  # e^(x/MTBF) overflows a float near 709
MAX_CHECKPOINT_BYTES = 2**50  # a PiB: past any job's checkpoint, so a typo in units is refused
CHECKPOINT_TOO_SLOW = 0.10
"""The one line between "checkpoint as planned" and "make checkpoints two-phase async", for the
planner and R-ESC-4 alike: sync saves at the Young/Daly optimum cost about sqrt(2C/M) of wall time
(Young 1974, first order). The seed says only "write time approaching the MTBF"; at 10% of the run
lost to saving (e.g. a 600 s save at a 24 h MTBF costs 11.8%) a snapshot-to-host save pays for its
memory, as MegaScale's two-phase checkpoint did."""


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
    run: RunRef | None = Field(None, description="A run whose checkpoint journal gives both: the median bytes per save "
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
        path_goes_with_measured(self.restart_from, self.recovery_path)
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
    if inp.restart_from != "given":
        measured = measured_restart(inp.restart_from, inp.recovery_path, "plan_checkpoint_interval")
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
        advice = f"checkpoint every {daly / 60:.1f} min (Daly); expected waste {waste:.2%}"  # as the report rounds it
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

"""Planning steps (checkpoint interval, effective training time, layout) through the tools."""
from __future__ import annotations

import statistics

from pydantic import BaseModel

from trainops.run_folder import read_journal
from trainops.skills.evidence.model import CheckpointPlan, DrillResult
from trainops.tools.base import CallContext
from trainops.tools.calls import call


def plan_checkpoint(save_s: float, restart_s: float, mtbf_h: float, ctx: CallContext | None = None) -> BaseModel:
    """Young/Daly interval from the measured write cost and the failure rate."""
    return call("plan_checkpoint_interval", {"save_s": save_s, "restart_s": restart_s, "mtbf_h": mtbf_h}, ctx)


def plan_from_drill(drill: DrillResult, mtbf_h: float, mtbf_basis: str,
                    ctx: CallContext | None = None) -> CheckpointPlan:
    """The interval for this job: save cost from the drill run's checkpoint journal, restart cost
    from the drill's measured recovery, MTBF as declared."""
    saves = read_journal(drill.run_dir).saves
    stall = statistics.median(s.stall_s for s in saves)
    write_s = statistics.median(s.write_s for s in saves)
    out = plan_checkpoint(max(stall, 1e-3), drill.recovery_time_s, mtbf_h, ctx)
    return CheckpointPlan(save_stall_s=stall, write_s=write_s, restart_s=drill.recovery_time_s, mtbf_h=mtbf_h,
                          mtbf_basis=mtbf_basis, young_interval_min=out.young_interval_min,
                          daly_interval_min=out.daly_interval_min, expected_waste_pct=100 * out.expected_waste_fraction,
                          recommendation=out.recommendation)


def plan_ettr(params: dict, ctx: CallContext | None = None) -> BaseModel:
    """Effective training time for a checkpoint policy and failure profile."""
    return call("plan_effective_training_time", params, ctx)


def plan_layout(params: dict, ctx: CallContext | None = None) -> BaseModel:
    """Dry-run the parallel layout: degrees divide the world, TP stays inside the scale-up domain."""
    return call("plan_layout", params, ctx)

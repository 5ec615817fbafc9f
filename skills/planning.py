"""Planning steps (checkpoint interval, effective training time, layout) through the tools."""
from __future__ import annotations

import statistics
import time

from trainops.run_records import read_journal
from trainops.skills.evidence.model import CheckpointPlan, DrillResult, PackEnvironment, ReliabilitySummary
from trainops.skills.evidence.published import LayoutPlan
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke, validating
from trainops.tools.context import CallContext
from trainops.tools.planning import checkpoint_interval, effective_training_time, layout
from trainops.tools.reliability.watch import record_view


def plan_checkpoint(save_s: float, restart_s: float, mtbf_h: float, ctx: CallContext | None = None,
                    run: str | None = None) -> checkpoint_interval.CheckpointIntervalOutput:
    """Young/Daly interval from the measured write cost and the failure rate; with `run`, the
    write-bandwidth occupancy from that run's checkpoint journal too."""
    with validating(checkpoint_interval.plan_checkpoint_interval):  # measured costs, the declared MTBF
        inp = checkpoint_interval.CheckpointIntervalInput(save_s=save_s, restart_s=restart_s, mtbf_h=mtbf_h,
                                                          run=run or None)
    return invoke(checkpoint_interval.plan_checkpoint_interval, inp, ctx)


def plan_from_drill(drill: DrillResult, mtbf_h: float, mtbf_basis: str,
                    ctx: CallContext | None = None, mtbf_level: str | None = None) -> CheckpointPlan:
    """The interval for this job: save cost from the drill run's checkpoint journal, restart cost
    from the drill's measured recovery by the path the job took there (the job's own settings, so
    the path it will take), the MTBF S2 states (with its source as the basis)."""
    saves = read_journal(drill.run_dir).saves
    stall = statistics.median(s.stall_s for s in saves)
    write_s = statistics.median(s.write_s for s in saves)
    measured = any(s.size_bytes > 0 and s.write_s > 0 for s in saves)
    out = plan_checkpoint(max(stall, 1e-3), drill.recovery_time_s, mtbf_h, ctx, run=drill.run_dir if measured else None)
    occupancy = out.write_occupancy
    path = drill.recovery_path or "unknown path"
    return CheckpointPlan(save_stall_s=stall, write_s=write_s, restart_s=drill.recovery_time_s, mtbf_h=mtbf_h,
                          restart_path=path, restart_source=f"measured: the {drill.fault} drill's {path} recovery "
                          f"(detection to its first step after restart) in {drill.drill_record}",
                          mtbf_basis=mtbf_basis, mtbf_level=mtbf_level, young_interval_min=out.young_interval_min,
                          daly_interval_min=out.daly_interval_min, expected_waste_pct=100 * out.expected_waste_fraction,
                          recommendation=out.recommendation,
                          checkpoint_bytes=occupancy.checkpoint_bytes if occupancy else None,
                          write_bandwidth_mib_s=occupancy.write_bandwidth_mib_s if occupancy else None,
                          write_occupancy_pct=100 * occupancy.occupancy_fraction if occupancy else None)


def reliability_summary(declared_mtbf_h: float | None, ettr_window_s: float) -> ReliabilitySummary:
    """S2's reliability block from the interruption record as it stands: the interruption rate,
    the MTBF (measured; while the record is too short, the operator's declared one, or without one
    the assumed default, labelled so), the
    recovery time and the ETTR readings the escalation rules read (tools/watch.record_view)."""
    now = time.time()
    view = record_view(ettr_window_s, declared_mtbf_h, until=now)
    return ReliabilitySummary(as_of=now, **view.stats.model_dump(), ettr_window_s=ettr_window_s,
                              ettr_pct=view.ettr_pct)


def plan_ettr(params: dict, ctx: CallContext | None = None) -> effective_training_time.EttrOutput:
    """Effective training time for a checkpoint policy and failure profile."""
    with validating(effective_training_time.plan_effective_training_time):
        inp = effective_training_time.EttrInput.model_validate(params)
    return invoke(effective_training_time.plan_effective_training_time, inp, ctx)


def plan_layout(params: dict, ctx: CallContext | None = None) -> layout.LayoutOutput:
    """Dry-run the parallel layout: degrees divide the world, TP stays inside the scale-up domain."""
    with validating(layout.plan_layout):
        inp = layout.LayoutInput.model_validate(params)
    return invoke(layout.plan_layout, inp, ctx)


def layout_plan(req: JobRequest, env: PackEnvironment, moe: dict | None = None,
                ctx: CallContext | None = None) -> LayoutPlan:
    """The parallel-strategy plan for the job as requested, on the declared topology: the scale-up
    domain from the environment declaration, the nodes from the request (its nodes x processes per
    node), never this host's devices. A layout the planner cannot read is a plan with its error."""
    world = req.nproc * req.nodes
    source = (f"environment declaration: {env.hardware}, scale-up domain "
              f"{env.scale_up_domain if env.scale_up_domain else 'none declared (the node is the domain)'}; "
              f"the job: {req.nodes} node(s) x {req.nproc} process(es)")
    params = {"config": req.config, "preset": None if req.config else req.preset, "overrides": req.overrides,
              "nproc": world, "nodes": req.nodes, "scale_up_domain": env.scale_up_domain,
              "inter_node_gbit_s": env.inter_node_gbit_s, "job_config": req.job_config, **({"moe": moe} if moe else {})}
    try:
        out = plan_layout(params, ctx)
    except ToolError as exc:
        return LayoutPlan(world_size=world, nodes=req.nodes, valid=False, error=exc.message, topology_source=source)
    plan = out.plan or {}
    mesh = dict(zip(plan.get("mesh_dim_names", []), plan.get("mesh_shape", []), strict=True))
    return LayoutPlan(world_size=world, nodes=req.nodes, mesh=mesh, valid=out.valid, error=out.error,
                      topology=out.topology, topology_source=source)

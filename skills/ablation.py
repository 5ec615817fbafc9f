"""S3/S4: single-variable ablations, small scale first, then target scale, each judged against
the run-to-run noise band of its own scale. `ablate` is the whole step, for `trainops ablate` and
the SOP alike: check the arms, measure the baselines at both scales, run the plan."""
from __future__ import annotations

from trainops.skills import labels
from trainops.skills.baseline import Progress, RepeatResult, command_line, declared, repeat, stamped
from trainops.skills.evidence.model import AblationRow, EvidenceRow, PackEnvironment
from trainops.skills.knobs import Knob, overrides_for, parse_arm, plan_order
from trainops.skills.request import JobRequest
from trainops.skills.stats import compare, spread
from trainops.tools.base import CallContext, skill_context


def check_single_variable(baseline_run: str, arm_run: str, name: str) -> None:
    """Governance's AblationArm compares the two configs actually run: exactly one setting differs."""
    from trainops.tools.governance.claims import AblationArm

    AblationArm(name=name, baseline_config=labels.run_config(baseline_run), arm_config=labels.run_config(arm_run))


def _setting(run_dir: str, dotted: str) -> str:
    section, key = dotted.split(".", 1)
    value = labels.run_config(run_dir).get(section, {}).get(key)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _row(knob: Knob, value: str, base: list[RepeatResult], arm: list[RepeatResult], nproc: int,
         kind: str, req: JobRequest, env: PackEnvironment) -> AblationRow:
    labels.label_runs(base, req, env)  # the baseline's MFU is checked as the arm's is
    job = labels.label_runs(arm, req, env)
    base_mfu = spread([r.summary.mfu_pct_median for r in base])
    arm_mfu = spread([r.summary.mfu_pct_median for r in arm])
    change, band, verdict = compare(base_mfu, arm_mfu)
    median_run = sorted(arm, key=lambda r: r.summary.mfu_pct_median)[len(arm) // 2]
    return AblationRow(knob=knob.name, value=value, baseline_value=_setting(base[0].run_dir, knob.overrides[0]),
                       category=knob.category, scale=f"{nproc} procs", scale_kind=kind, mfu_change_pct=change,
                       noise_band_pct=band, beyond_noise=verdict != "within-noise", verdict=verdict,
                       source_run=median_run.run_dir, labels=job)


def run_arm(req: JobRequest, spec: str, baselines: dict[int, list[RepeatResult]], repeats: int,
            ctx: CallContext | None = None, progress: Progress | None = None,
            env: PackEnvironment | None = None) -> tuple[list[AblationRow], list[EvidenceRow]]:
    """One knob at every scale in `baselines` (ascending process count: small, then target), each
    scale at the target's per-rank batch (weak_scaled). A small-scale gain that is not a gain at
    target scale is flagged as vanished."""
    env = declared(req, env, ctx)
    req = stamped(req, env)
    knob, value = parse_arm([spec], req.framework)
    scales = sorted(baselines)
    rows, evidence, arms = [], [], {}
    for nproc in scales:
        if nproc < knob.min_procs:
            continue
        arm_req = weak_scaled(req, nproc).with_overrides(overrides_for(knob, value))
        if req.framework != "trainops":  # the framework's own flag prerequisites, before launch
            from trainops.tools.frameworks import get_adapter

            get_adapter(req.framework).validate({knob.name: value}, overrides=req.overrides, world_size=nproc)
        arm = arms[nproc] = repeat(arm_req, f"arm-{knob.name.replace('_', '-')}-{nproc}p", repeats, ctx, progress)
        check_single_variable(baselines[nproc][0].run_dir, arm[0].run_dir, f"{knob.name}={value}")
        kind = "target" if nproc == scales[-1] else "small"
        rows.append(_row(knob, value, baselines[nproc], arm, nproc, kind, req, env))
        evidence += [EvidenceRow(tool="submit_job+summarize_run", version=req.framework_version,
                                 command=command_line(arm_req), log_path=f"{r.run_dir}/metrics.jsonl",
                                 value=f"MFU {r.summary.mfu_pct_median:.3f}%", window_start=r.started,
                                 window_end=r.ended) for r in arm]
    if len(rows) == 2:
        rows[-1] = judge_scale(knob, rows, arms, req)
    return rows, evidence


def _tokens_per_s(results: list[RepeatResult]) -> float:
    return spread([r.summary.tokens_per_s_median for r in results]).median


def weak_scaled(req: JobRequest, nproc: int) -> JobRequest:
    """The request at `nproc` processes per node keeping the target's (`req.nproc`) per-rank batch: the
    global batch scales with the world size, so small against target scale is weak scaling (R-EVD-4).
    torchtitan's batch is per rank already (training.local_batch_size)."""
    if nproc == req.nproc or req.framework == "torchtitan":
        return req.with_overrides([], nproc=nproc)
    target = labels.shape_of_request(req, req.nproc * req.nodes).global_batch
    if target is None or (target * nproc) % req.nproc:
        raise ValueError(f"training.global_batch={target} at {req.nproc} processes per node has no whole share "
                         f"for {nproc}: weak scaling keeps the per-rank batch; use a global batch that is a "
                         f"multiple of {req.nproc}")
    return req.with_overrides([f"training.global_batch={target * nproc // req.nproc}"], nproc=nproc)


def _processes(n: int) -> str:
    return f"{n} process{'' if n == 1 else 'es'}"


def scaling_basis(req: JobRequest, arms: dict[int, list[RepeatResult]]) -> tuple[int, int, str]:
    """(small world, target world, basis) from the global batches the two scales' runs ran with: weak
    scaling when the global batch grew with the world size; a fixed one is strong scaling, refused
    as a cross-scale comparison (R-EVD-4), and so is any other ratio."""
    (_, small), (_, target) = sorted(arms.items())
    worlds = [runs[0].world_size or runs[0].summary.ranks for runs in (small, target)]
    shapes = [labels.shape_of_run(runs[0].run_dir, req, world)
              for runs, world in zip((small, target), worlds, strict=True)]
    (ws, wt), (gs, gt) = worlds, [shape.global_batch for shape in shapes]
    if gs is not None and gt is not None and gt * ws == gs * wt:
        per_rank = f" ({gt // shapes[1].dp} per data-parallel rank)" if shapes[1].dp else ""
        return ws, wt, f"weak scaling: global batch {gs} at {_processes(ws)} -> {gt} at {_processes(wt)}{per_rank}"
    kind = "strong scaling (the global batch stayed fixed)" if gs == gt else "neither weak nor strong scaling"
    raise ValueError(f"{small[0].run_dir} and {target[0].run_dir}: global batch {gs} at {_processes(ws)} and {gt} at "
                     f"{_processes(wt)} is {kind}; comparisons across scales use weak-scaling efficiency (R-EVD-4): "
                     "run the small scale at the target's per-rank batch (skills.ablation.weak_scaled)")


def judge_scale(knob: Knob, rows: list[AblationRow], arms: dict[int, list[RepeatResult]],
                req: JobRequest | None = None) -> AblationRow:
    """Small against target scale through governance's ScaleResult (R-ABL-2/3, R-EVD-4): compared by
    weak-scaling efficiency (per-rank tokens/s, the global batch grown with the world size); a
    small-scale gain whose target gain is at or below zero vanished."""
    from trainops.tools.governance.claims import ScaleResult

    small_n, target_n, basis = scaling_basis(req or JobRequest(), arms)
    (_, small), (_, target) = sorted(arms.items())
    efficiency = 100.0 * (_tokens_per_s(target) / target_n) / (_tokens_per_s(small) / small_n)
    vanished = rows[0].verdict == "gain" and rows[1].mfu_change_pct <= 0
    ScaleResult(knob=knob.overrides[0], small_world_size=small_n, small_gain_pct=rows[0].mfu_change_pct,
                target_world_size=target_n, target_gain_pct=rows[1].mfu_change_pct,
                weak_scaling_efficiency_pct=efficiency, rollout="stop" if rows[1].mfu_change_pct <= 0 else "continue")
    return rows[1].model_copy(update={"vanished_at_scale": vanished, "weak_scaling_efficiency_pct": efficiency,
                                      "scaling_basis": basis})


def check_arms(req: JobRequest, specs: list[str]) -> None:
    """Refuse a bad arm before anything launches: one variable as NAME=VALUE, a knob and value the
    framework takes, and (for another framework) its own flag prerequisites at the target scale."""
    for spec in specs:
        knob, value = parse_arm(spec.split(","), req.framework)
        if req.framework != "trainops":
            from trainops.tools.frameworks import get_adapter

            get_adapter(req.framework).validate({knob.name: value}, overrides=req.overrides, world_size=req.nproc)


def scale_baselines(req: JobRequest, repeats: int, ctx: CallContext | None = None, progress: Progress | None = None,
                    measured: list[RepeatResult] | None = None) -> dict[int, list[RepeatResult]]:
    """Baseline repeats at small scale (one process, the target's per-rank batch) and at target scale
    (`req.nproc`), the noise bands the arms are judged against; `measured` are target-scale repeats
    already run (the SOP's S2)."""
    baselines = {req.nproc: measured} if measured else {}
    for nproc in sorted({1, req.nproc} - set(baselines)):
        baselines[nproc] = repeat(weak_scaled(req, nproc), f"baseline-{nproc}p", repeats, ctx, progress)
    return baselines


def ablate(req: JobRequest, specs: list[str], repeats: int, ctx: CallContext | None = None,
           progress: Progress | None = None, measured: list[RepeatResult] | None = None,
           env: PackEnvironment | None = None) -> tuple[list[AblationRow], list[EvidenceRow]]:
    """S3/S4: check the arms (before anything is declared or written), declare the environment
    (unless given), measure the baselines at both scales (reusing `measured`), then run every arm
    at each scale, highest expected gain first."""
    ctx = skill_context("ablation", ctx)
    check_arms(req, specs)
    env = declared(req, env, ctx)
    req = stamped(req, env)
    baselines = scale_baselines(req, repeats, ctx, progress, measured)
    return run_plan(req, specs, baselines, repeats, ctx, progress, env)


def run_plan(req: JobRequest, specs: list[str], baselines: dict[int, list[RepeatResult]], repeats: int,
             ctx: CallContext | None = None, progress: Progress | None = None,
             env: PackEnvironment | None = None) -> tuple[list[AblationRow], list[EvidenceRow]]:
    """Every arm, highest expected gain first (communication overlap, kernels, data pipeline, batch)."""
    ctx = skill_context("ablation", ctx)
    env = declared(req, env, ctx)
    parsed = {parse_arm([s], req.framework)[0].name: s for s in specs}
    ordered = plan_order([parse_arm([s], req.framework)[0] for s in specs])
    rows, evidence = [], []
    for knob in ordered:
        r, e = run_arm(req, parsed[knob.name], baselines, repeats, ctx, progress, env)
        rows += r
        evidence += e
    return rows, evidence

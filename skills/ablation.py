"""S3/S4: single-variable ablations up the rollout ladder (skills.rollout): one process, then each
rung to the target, each judged against the run-to-run noise band of its own rung. `ablate` is the
whole step, for `trainops ablate` and the SOP alike: check the arms, run the plan, measuring each
rung's baseline when the ladder first reaches it."""
from __future__ import annotations

from typing import Callable, NamedTuple

from trainops.skills import labels, rollout
from trainops.skills.ablation_design import ranked_specs
from trainops.skills.baseline import Progress, RepeatResult, command_line, declared, repeat, stamped
from trainops.skills.evidence.model import AblationRow, BaselineSummary, EvidenceRow, LadderStop, PackEnvironment
from trainops.skills.knobs import Knob, overrides_for, parse_arm, plan_order
from trainops.skills.request import JobRequest
from trainops.skills.rollout import Rung, processes
from trainops.skills.stats import compare, spread
from trainops.tools.context import CallContext, skill_context
from trainops.tools.frameworks import get_adapter
from trainops.tools.governance.claims import AblationArm, ScaleResult


def check_single_variable(baseline_run: str, arm_run: str, name: str) -> None:
    """Governance's AblationArm compares the two configs actually run: exactly one setting differs."""
    AblationArm(name=name, baseline_config=labels.run_config(baseline_run), arm_config=labels.run_config(arm_run))


def _setting(run_dir: str, dotted: str) -> str:
    section, key = dotted.split(".", 1)
    value = labels.run_config(run_dir).get(section, {}).get(key)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _row(knob: Knob, value: str, base: list[RepeatResult], arm: list[RepeatResult], rung: Rung,
         kind: str, req: JobRequest, env: PackEnvironment) -> AblationRow:
    labels.label_runs(base, req, env)  # the baseline's MFU is checked as the arm's is
    job = labels.label_runs(arm, req, env)
    change, band, verdict = compare(spread(rollout.job_rates(base)), spread(rollout.job_rates(arm)))
    median_run = sorted(arm, key=lambda r: r.summary.mfu_pct_median)[len(arm) // 2]
    return AblationRow(knob=knob.name, value=value, baseline_value=_setting(base[0].run_dir, knob.overrides[0]),
                       category=knob.category, scale=rung.label, scale_kind=kind, mfu_change_pct=change,
                       noise_band_pct=band, beyond_noise=verdict != "within-noise", verdict=verdict,
                       source_run=median_run.run_dir, baseline_run=base[0].run_dir, labels=job,
                       world_size=rung.world)


class RungResult(NamedTuple):
    """One arm at one rung: the arm's rows so far (this rung's last), its evidence and runs, and
    whether the ladder ends here."""
    rows: list[AblationRow]
    evidence: list[EvidenceRow]
    runs: list[RepeatResult]
    stopped: bool


def run_arm(req: JobRequest, spec: str, baselines: dict[int, list[RepeatResult]], repeats: int,
            ctx: CallContext | None = None, progress: Progress | None = None, env: PackEnvironment | None = None,
            measure: Callable[[Rung], list[RepeatResult]] | None = None) -> tuple[list[AblationRow], list[EvidenceRow]]:
    """One knob up the rollout ladder (skills.rollout): from its smallest valid rung to the target,
    each rung at the target's per-rank batch (weak_scaled) against the baseline at that rung
    (`baselines`, by world size; `measure` adds a missing one, else only the rungs given are climbed).
    The first rung where a gain is gone stops the climb and rolls back."""
    env = declared(req, env, ctx)
    req = stamped(req, env)
    knob, _ = parse_arm([spec], req.framework)
    rungs = [r for r in rollout.valid_rungs(knob, req) if measure or r.world in baselines]
    rows, evidence, arms = [], [], {}
    for rung in rungs:
        if rung.world not in baselines:
            baselines[rung.world] = measure(rung)
        step = climb_rung(req, spec, rung, baselines[rung.world], rows, arms, repeats, ctx, progress, env)
        rows, evidence, arms[rung.world] = step.rows, evidence + step.evidence, step.runs
        if step.stopped:
            break
    return rows, evidence


def climb_rung(req: JobRequest, spec: str, rung: Rung, base: list[RepeatResult], below: list[AblationRow],
               arms_below: dict[int, list[RepeatResult]], repeats: int, ctx: CallContext | None,
               progress: Progress | None, env: PackEnvironment) -> RungResult:
    """The arm `spec` at `rung` against that rung's baseline `base`, after the rungs `below` (their
    rows, and their arm runs by world size in `arms_below`) all gained. The first rung notes what
    the ladder skipped; a rung without a gain ends the ladder (rolled back after a gain below); the
    target rung after a small one is judged by weak-scaling efficiency (judge_scale)."""
    knob, value = parse_arm([spec], req.framework)
    valid = rollout.valid_rungs(knob, req)
    say = progress or (lambda _msg: None)
    note = rollout.start_note(knob, valid) if not below else ""
    if note:
        say(note)
    rung_req = weak_scaled(req, rung.nproc, rung.nodes)
    arm_req = rung_req.with_overrides(overrides_for(knob, value))
    if req.framework != "trainops":  # the framework's own flag prerequisites, before launch
        get_adapter(req.framework).validate({knob.name: value}, overrides=req.overrides, world_size=rung.world)
    say(f"ladder {knob.name}={value}: rung {valid.index(rung) + 1}/{len(valid)}, {rung.label}")
    arm = repeat(arm_req, f"arm-{knob.name.replace('_', '-')}-{rung.world}p", repeats, ctx, progress)
    check_single_variable(base[0].run_dir, arm[0].run_dir, f"{knob.name}={value}")
    kind = "target" if rung.world == req.nproc * req.nodes else "small"
    row = _row(knob, value, base, arm, rung, kind, req, env)
    if note:
        row = row.model_copy(update={"ladder_note": note})
    evidence = [EvidenceRow(tool="submit_job+summarize_run", version=req.framework_version,
                            command=command_line(arm_req), log_path=f"{r.run_dir}/metrics.jsonl",
                            value=f"MFU {r.summary.mfu_pct_median:.3f}%", window_start=r.started,
                            window_end=r.ended) for r in arm]
    say(f"ladder {knob.name}={value} at {rung.label}: {row.mfu_change_pct:+.1f}% against "
        f"±{row.noise_band_pct:.1f}%: {row.verdict}")
    if row.verdict != "gain":
        previous = next((r for r in reversed(valid) if r.world < rung.world and r.world in arms_below), None)
        stopped = _stopped(knob, value, row, below, rung, previous, rung_req, base, arm, ctx, progress, env)
        return RungResult([*below, stopped], evidence, arm, True)
    if below and kind == "target":
        runs = {**arms_below, rung.world: arm}
        row = judge_scale(knob, [below[0], row], {w: runs[w] for w in (min(runs), max(runs))}, req)
    return RungResult([*below, row], evidence, arm, False)


def _stopped(knob: Knob, value: str, row: AblationRow, below: list[AblationRow], rung: Rung, previous: Rung | None,
             rung_req: JobRequest, base: list[RepeatResult], arm: list[RepeatResult],
             ctx: CallContext | None, progress: Progress | None, env: PackEnvironment) -> AblationRow:
    """The rung where the gain is gone: with no gain below it, nothing was rolled out and the ladder
    just ends; after a gain, roll back: one run of the baseline value at this rung, which must match
    the baseline's repeats within the rung's band, and the stop handed to a human."""
    say = progress or (lambda _msg: None)
    if not below:
        reason = f"no gain at the first rung ({rung.label}): nothing to roll out, the ladder ends here"
        say(f"ladder {knob.name}={value}: {reason}")
        return row
    hint = rollout.topology_hint(rung, previous, [*base, *arm], env.hardware)
    say(f"ladder {knob.name}={value}: gain gone at {rung.label} ({hint}); reverting to {row.baseline_value} and "
        "verifying")
    verify = repeat(rung_req, f"verify-{knob.name.replace('_', '-')}-{rung.world}p", 1, ctx, progress)
    change, band, matches = rollout.verification(knob, value, row.baseline_value, base, verify)
    stop = LadderStop(rung=rung.label, topology_hint=hint, reverted_to=row.baseline_value,
                      reason=f"gain gone at {rung.label}: {row.mfu_change_pct:+.1f}% is inside its noise band of "
                             f"±{row.noise_band_pct:.1f}% after {below[-1].mfu_change_pct:+.1f}% at "
                             f"{below[-1].scale}" if row.verdict == "within-noise" else
                             f"gain gone at {rung.label}: a regression of {row.mfu_change_pct:+.1f}% beyond its band "
                             f"of ±{row.noise_band_pct:.1f}% after {below[-1].mfu_change_pct:+.1f}% at "
                             f"{below[-1].scale}",
                      verification_runs=[r.run_dir for r in verify], verification_change_pct=change,
                      verification_band_pct=band, verification_matches=matches)
    stopped = row.model_copy(update={"vanished_at_scale": True})
    stop = stop.model_copy(update={"human_item": rollout.hand_over(stopped, stop, ctx)})
    say(f"ladder {knob.name}={value}: reverted; verification {'matches' if matches else 'does NOT match'} the "
        f"baseline ({change:+.1f}% against ±{band:.1f}%); handed to a human")
    return stopped.model_copy(update={"stop": stop})


def _tokens_per_s(results: list[RepeatResult]) -> float:
    return spread([r.summary.tokens_per_s_median for r in results]).median


def weak_scaled(req: JobRequest, nproc: int, nodes: int = 1) -> JobRequest:
    """The request at `nproc` processes on `nodes` nodes keeping the target's per-rank batch: the global
    batch scales with the world size, so one rung against another is weak scaling (R-EVD-4).
    torchtitan's batch is per rank already (training.local_batch_size)."""
    target_world, world = req.nproc * req.nodes, nproc * nodes
    at_rung = req.model_copy(update={"nodes": nodes})
    if world == target_world or req.framework == "torchtitan":
        return at_rung.with_overrides([], nproc=nproc)
    target = labels.shape_of_request(req, target_world).global_batch
    if target is None or (target * world) % target_world:
        raise ValueError(f"training.global_batch={target} at {processes(target_world)} has no whole share for "
                         f"{processes(world)}: weak scaling keeps the per-rank batch; use a global batch that is a "
                         f"multiple of {target_world}")
    return at_rung.with_overrides([f"training.global_batch={target * world // target_world}"], nproc=nproc)


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
        return ws, wt, f"weak scaling: global batch {gs} at {processes(ws)} -> {gt} at {processes(wt)}{per_rank}"
    kind = "strong scaling (the global batch stayed fixed)" if gs == gt else "neither weak nor strong scaling"
    raise ValueError(f"{small[0].run_dir} and {target[0].run_dir}: global batch {gs} at {processes(ws)} and {gt} at "
                     f"{processes(wt)} is {kind}; comparisons across scales use weak-scaling efficiency (R-EVD-4): "
                     "run the small scale at the target's per-rank batch (skills.ablation.weak_scaled)")


def judge_scale(knob: Knob, rows: list[AblationRow], arms: dict[int, list[RepeatResult]],
                req: JobRequest | None = None) -> AblationRow:
    """Small against target scale through governance's ScaleResult (R-ABL-2/3, R-EVD-4): compared by
    weak-scaling efficiency (per-rank tokens/s, the global batch grown with the world size); a
    small-scale gain whose target gain is at or below zero vanished."""
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
        rollout.valid_rungs(knob, req)
        if req.framework != "trainops":
            get_adapter(req.framework).validate({knob.name: value}, overrides=req.overrides, world_size=req.nproc)


def baseline_at(req: JobRequest, repeats: int, ctx: CallContext | None = None,
                progress: Progress | None = None) -> Callable[[Rung], list[RepeatResult]]:
    """Baseline repeats at a rung (the target's per-rank batch), measured when the ladder first
    reaches it, so no rung above a stop is ever run."""
    return lambda rung: repeat(weak_scaled(req, rung.nproc, rung.nodes), f"baseline-{rung.world}p", repeats, ctx,
                               progress)


def ablate(req: JobRequest, specs: list[str], repeats: int, ctx: CallContext | None = None,
           progress: Progress | None = None, measured: list[RepeatResult] | None = None,
           env: PackEnvironment | None = None, summary: BaselineSummary | None = None
           ) -> tuple[list[AblationRow], list[EvidenceRow]]:
    """S3/S4: check the arms (before anything is declared or written), declare the environment
    (unless given), measure the baselines at both scales (reusing `measured`), then run every arm
    at each scale, highest expected gain first (from `summary`, S2's split, when given)."""
    ctx = skill_context("ablation", ctx)
    check_arms(req, specs)
    env = declared(req, env, ctx)
    req = stamped(req, env)
    baselines = {req.nproc * req.nodes: measured} if measured else {}
    measure = baseline_at(req, repeats, ctx, progress)
    return run_plan(req, specs, baselines, repeats, ctx, progress, env, measure, summary)


def run_plan(req: JobRequest, specs: list[str], baselines: dict[int, list[RepeatResult]], repeats: int,
             ctx: CallContext | None = None, progress: Progress | None = None, env: PackEnvironment | None = None,
             measure: Callable[[Rung], list[RepeatResult]] | None = None, summary: BaselineSummary | None = None
             ) -> tuple[list[AblationRow], list[EvidenceRow]]:
    """Every arm, highest expected gain first: ranked by the design from S2's measured split
    (skills.ablation_design) when `summary` is at hand; before any baseline, in category order
    (communication overlap, kernels, data pipeline, batch)."""
    ctx = skill_context("ablation", ctx)
    env = declared(req, env, ctx)
    if summary:
        ordered = ranked_specs(summary, specs, req.framework)
    else:
        parsed = {parse_arm([s], req.framework)[0].name: s for s in specs}
        ordered = [parsed[k.name] for k in plan_order([parse_arm([s], req.framework)[0] for s in specs])]
    rows, evidence = [], []
    for spec in ordered:
        r, e = run_arm(req, spec, baselines, repeats, ctx, progress, env, measure)
        rows += r
        evidence += e
    return rows, evidence

"""The whole SOP, S1 to S6: declare, baseline, ablate (small then target scale), drill, and
write an evidence pack that waits for a human."""
from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, Field

from trainops.run_folder import RunFiles
from trainops.run_records import read_drill_record
from trainops.skills import ablation, ablation_design, baseline, environment, escalate, planning
from trainops.skills.baseline import Progress
from trainops.skills.drill import drill
from trainops.skills.evidence import pack as evidence_pack
from trainops.skills.evidence import references
from trainops.skills.evidence.design import DesignedArm
from trainops.skills.evidence.model import BaselineSummary, DrillResult, PackEnvironment
from trainops.skills.evidence.view import DECISION_COMMANDS, SIGNING_NOTE
from trainops.skills.request import JobRequest
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext, skill_context
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkName, SopPlan
from trainops.tools.jobs import jobs
from trainops.tools.planning.layout_mapping import MoeShape
from trainops.trainer.config import ConfigError, load_config
from trainops.workspace import confine


class SopSettings(BaseModel):
    """How much of the SOP to run; `quick` trades repeats and arms for time. Arms, drills and the
    small job default to the framework adapter's `sop_plan` (trainops.tools.frameworks)."""
    config: str | None = Field(None,
                               description="job config (TOML; for megatron the pretrain_gpt.py path); None uses the "
                                           "embedded defaults")
    quick: bool = Field(False, description="fewer repeats, one arm, one drill (~2 minutes on 2 CPU cores)")
    scheduler: str = Field("local", description="local, slurm or kubernetes")
    knobs: list[str] = Field(default_factory=list,
                             description="arms NAME=VALUE; empty uses the framework's default plan")
    faults: list[str] = Field(default_factory=list, description="drill kinds; empty uses the framework's default set")
    mtbf_h: float | None = Field(None, gt=0, description="declared job MTBF, hours: used only while the "
                                 "interruption record is too short to measure one; None: the assumed default, "
                                 "labelled so")
    ettr_window_s: float = Field(3600.0, gt=0, le=30 * 86400,
                                 description="width of one effective-training-time window (seconds) for S2 and "
                                             "R-ESC-1")
    framework: FrameworkName = Field("trainops",
                                     description="whose job: trainops (embedded trainer), deepspeed, torchtitan or "
                                                 "megatron")
    moe: MoeShape | None = Field(None, description="a mixture-of-experts shape to budget expert parallelism for in "
                                                   "the parallel-strategy plan (on paper)")

    def _plan(self) -> SopPlan:
        return get_adapter(self.framework).sop_plan

    def repeats(self) -> int:
        return 2 if self.quick else 3

    def candidates(self) -> list[str]:
        """The arms S3 ranks: the user's, else the framework's default plan."""
        return self.knobs or list(self._plan().arms)

    def plan(self, design: list[DesignedArm]) -> list[str]:
        """The arms S4 runs in the design's order; the quick SOP keeps the first-ranked default arm."""
        arms = [arm.arm for arm in design]
        return arms if self.knobs or not self.quick else arms[:1]

    def drills(self) -> list[str]:
        faults = list(self._plan().faults)
        return self.faults or (faults[:1] if self.quick else faults)

    def drill_overrides(self) -> list[str]:
        """Checkpoint often and stop at step 12, so a fault at step 5 has a checkpoint to return to."""
        return [*self._plan().drill, f"{self._plan().steps_key}=12"]

    def request(self) -> JobRequest:
        steps = 10 if self.quick else 20
        plan = self._plan()
        return JobRequest(config=self.config, preset=None if self.config else "tiny", scheduler=self.scheduler,
                          framework=self.framework,
                          overrides=[] if self.config else [f"{plan.steps_key}={steps}", *plan.job])


class Headline(BaseModel):
    """The figures the SOP ends on, read from the pack it wrote (the report's own values)."""
    mfu_pct: float | None = Field(description="baseline MFU, median over the repeats, percent")
    step_time_s: float | None = Field(description="baseline step time, median over the repeats, seconds")
    step_time_spread_pct: float | None = Field(description="(high - low) / median of the repeats' step time, percent")
    recovery_time_s: float | None = Field(description="the first drill's detection -> first step after restart, s")
    recovery_fault: str = Field("", description="the fault that drill injected")
    expected_waste_pct: float | None = Field(description="expected share of wall time lost at the Daly interval")

    def lines(self) -> list[str]:
        def show(value: float | None, text: str) -> str:
            return "not measured" if value is None else text
        return [f"MFU {show(self.mfu_pct, f'{self.mfu_pct:.2f}%')} (baseline median); step time "
                f"{show(self.step_time_s, f'{self.step_time_s:.3f} s')}"
                + ("" if self.step_time_spread_pct is None else f", spread {self.step_time_spread_pct:.1f}%"),
                f"recovery {show(self.recovery_time_s, f'{self.recovery_time_s:.1f} s')}"
                + (f" ({self.recovery_fault} drill)" if self.recovery_fault else "")
                + f"; expected waste {show(self.expected_waste_pct, f'{self.expected_waste_pct:.2f}%')} "
                  "(checkpoints at the Daly interval)"]


class SopResult(BaseModel):
    pack_dir: str
    verdict: str
    blockers: list[str]
    elapsed_s: float
    pack_id: str = Field(description="the pack a human approves or rejects")
    report_html: str = Field(description="the report to read before deciding")
    approve_command: str = Field(description="the command that approves the pack with the approver's SSH key")
    signing_note: str = Field(SIGNING_NOTE, description="which key that command signs with")
    headline: Headline


def headline(pack) -> Headline:
    """The SOP's closing figures, from the pack as written."""
    base, plan = pack.baseline, pack.checkpoint_plan
    drills = pack.fault_tolerance.drills if pack.fault_tolerance else []
    return Headline(mfu_pct=base.mfu_pct.median if base else None,
                    step_time_s=base.step_time_s.median if base else None,
                    step_time_spread_pct=base.step_time_s.spread_pct if base else None,
                    recovery_time_s=drills[0].recovery_time_s if drills else None,
                    recovery_fault=drills[0].fault if drills else "",
                    expected_waste_pct=plan.expected_waste_pct if plan else None)


def reference_notes(env: PackEnvironment | None, world: int, model: str) -> list[str]:
    """Published results to read our numbers against, with source and scale difference, worded for
    the hardware the run used (SOP step 7)."""
    return references.headline_notes(env, world, model)


def run(settings: SopSettings, ctx: CallContext | None = None, progress: Progress | None = None) -> SopResult:
    """S1..S6 in order; any refusal or failed run stops the SOP with its message."""
    say = progress or (lambda _msg: None)
    started = time.time()
    ctx = skill_context("training-efficiency-ablation-and-fault-sop", ctx)
    req = settings.request().loaded()  # the one load of the job's config; every step passes it on
    say("S1 environment declaration")
    env, env_row = environment.declare(settings.scheduler, ctx, framework=settings.framework)
    req = req.model_copy(update={"framework_version": f"{env.framework} {env.framework_version}, torch "
                                                      f"{env.torch_version}"})
    say("S1 parallel-strategy plan on the declared topology")
    layout = planning.layout_plan(req, env, settings.moe.model_dump() if settings.moe else None, ctx)
    say("S2 baseline")
    summary, base_runs, evidence = baseline.measure(req, settings.repeats(), ctx, say)
    reliability = planning.reliability_summary(settings.mtbf_h, settings.ettr_window_s)
    summary = summary.model_copy(update={"reliability": reliability})
    design = design_arms(settings, summary)
    say("S3 ablation design from the baseline's split: " + "; ".join(
        f"{a.rank}. {a.arm} ({a.figure.text})" for a in design))
    say("S4 ablation: small-scale baseline, then each arm")
    rows, arm_evidence = ablation.ablate(req, settings.plan(design), settings.repeats(), ctx, say, measured=base_runs,
                                         summary=summary)
    say("S5 fault drills")
    drill_req = req.with_overrides(settings.drill_overrides())
    results, drill_evidence = drill.run_drills(drill_req, settings.drills(), ctx, say)
    drills = [d for d in results if not isinstance(d, drill.DetectionOnlyResult)]  # the pack's drills recovered
    ckpt_plan = planning.plan_from_drill(drills[0], reliability.mtbf_h, _mtbf_basis(reliability),
                                         ctx, mtbf_level=reliability.mtbf_level) if drills else None
    say("S6 evidence pack")
    world = req.nproc * req.nodes
    pack = evidence_pack.assemble(
        f"sop-{time.strftime('%Y%m%d-%H%M%S')}", env, summary, references.annotate(rows, env, world, summary.model),
        drills, [env_row, *evidence, *arm_evidence, *drill_evidence],
        rollback=f"keep the baseline configuration ({baseline.command_line(req)}); adopt no arm until a human approves",
        references=reference_notes(env, world, summary.model), checkpoint_plan=ckpt_plan,
        mlperf=references.mlperf(env, world), layout_plan=layout, ablation_design=design)
    pack = escalate.carry_fired(pack, ctx)  # R-ESC-1..4 on every SOP run: a fired rule goes to a human
    folder = evidence_pack.write(pack)
    return SopResult(pack_dir=str(folder), verdict=pack.verdict, blockers=pack.blockers,
                     elapsed_s=time.time() - started, pack_id=pack.pack_id, report_html=str(folder / "report.html"),
                     approve_command=DECISION_COMMANDS["approve"].format(pack_id=pack.pack_id),
                     headline=headline(pack))


def design_arms(settings: SopSettings, summary: BaselineSummary) -> list[DesignedArm]:
    """S3: the candidate arms ranked from S2's measured split (skills.ablation_design)."""
    return ablation_design.design(ablation_design.split_of(summary), settings.candidates(), settings.framework)


def _mtbf_basis(rel) -> str:
    """The checkpoint plan's MTBF basis: S2's figure and where it comes from."""
    if rel.mtbf_measured:
        return f"the interruption record (S2): {rel.mtbf_source}"
    return f"not measured: {rel.mtbf_source}, too few to measure one"


def build_from_runs(run_dirs: list[str], scheduler: str = "local", ctx: CallContext | None = None) -> Path:
    """`trainops evidence build RUNDIR...`: the runs as baseline repeats, plus any drills they recorded."""
    for run_dir in run_dirs:
        _check_written_by_trainops(run_dir)
    env, env_row = environment.declare(scheduler, ctx)
    results = []
    for run_dir in run_dirs:
        summary = invoke(jobs.summarize_run, jobs.SummarizeRunInput(run=run_dir), ctx)
        stamp = Path(run_dir).stat().st_mtime
        results.append(baseline.RepeatResult(job_id="", run_dir=str(Path(run_dir).resolve()), summary=summary,
                                             started=stamp, ended=stamp))
    config = RunFiles(run_dirs[0]).config
    req = JobRequest(config=str(config) if config.exists() else None, nproc=max(r.summary.ranks for r in results))
    records = [read_drill_record(r) for r in run_dirs]
    drills = [DrillResult.model_validate(record.model_dump()) for record in records if record is not None]
    summary = baseline.summarize(req, results).model_copy(
        update={"reliability": planning.reliability_summary(None, escalate.ETTR_WINDOW_S)})
    pack = evidence_pack.assemble(f"runs-{time.strftime('%Y%m%d-%H%M%S')}", env, summary, [], drills, [env_row],
                                  references=reference_notes(env, req.nproc, summary.model),
                                  mlperf=references.mlperf(env, req.nproc))
    return evidence_pack.write(escalate.carry_fired(pack, ctx))


def _check_written_by_trainops(run_dir: str) -> None:
    """Evidence rests on runs trainops launched: a folder outside the workspace (and the configured
    roots), or without the config.toml trainops writes (hand-made metrics), is refused, so a pack
    cannot certify numbers nobody measured."""
    config = RunFiles(confine(run_dir, "RUNDIR", reading=True, must_exist=True)).config
    if not config.is_file():
        raise ValueError(f"RUNDIR {run_dir!r} has no config.toml: trainops did not launch this run, and metrics "
                         "without the job that produced them are not evidence; pass a run folder trainops wrote "
                         "($TRAINOPS_HOME/runs/RUN, from `trainops train` or `trainops baseline`)")
    try:
        load_config(config)
    except ConfigError as exc:
        raise ValueError(f"RUNDIR {run_dir!r}: its config.toml is not a trainops job config ({exc})") from None

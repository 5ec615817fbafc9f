"""The SOP's steps as typed tools (issue 40): S1 `sop_declare`, S2 `sop_baseline`, S3 `sop_design`,
S4 `sop_arm`, S5 `sop_drill` (S6 `sop_pack` is skills.sop_pack). Each step reads and extends one SOP session
(skills.sop_session) and returns its figures and the runs it launched; `trainops sop`, `trainops
tool call` and the agent call the same tools through the same gate.

The order is a rule on every path: each tool declares, as gate input checks, what must have run
before it (`needs`), so a step called out of order is refused before anything launches or any
approval is asked for, naming the step to run first: no step before S1 (R-ENV-1), one knob per
arm (R-ABL-1), no design (S3) without S2's baseline and no arm without the baseline of its own rung
(R-ABL-1), no rung above the smallest before the one below it gained (R-ABL-2).

Called by the agent, `sop_declare` waits for a human; each later step names that approval to the
gate (`approval_from`, skills.sop_approval), so the steps of a human-approved declaration run under
it, inside the declared plan only.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Callable, Iterator

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from trainops.skills import ablation, ablation_design, baseline, environment, planning, rollout
from trainops.skills.ablation_design import MeasuredSplit
from trainops.skills.baseline import Progress
from trainops.skills.drill import drill
from trainops.skills.evidence.design import DesignedArm
from trainops.skills.evidence.model import AblationRow, BaselineSummary, DrillResult, PackEnvironment
from trainops.skills.evidence.published import LayoutPlan
from trainops.skills.knobs import KnobError, parse_arm
from trainops.skills.rollout import Rung
from trainops.skills.sop_approval import approval_of_declaration, declaration_approval
from trainops.skills.sop_session import ArmRung, SopSession, SopSettings, load, save, start
from trainops.tools.base import InputCheck, ToolError, tool
from trainops.tools.context import skill_context

SKILL = "training-efficiency-ablation-and-fault-sop"
STEP_INPUT = ConfigDict(extra="forbid")  # a step takes its named fields only: no figures ride along
SessionId = Field(min_length=1, max_length=128, description="The SOP session sop_declare (S1) started.")
_PROGRESS: ContextVar[Progress | None] = ContextVar("sop_progress", default=None)


def one_line(text: str) -> str:
    """A reason kept in the session and shown in the pack: one line of printable text, so what a model
    or a person wrote cannot start a line of its own there."""
    if not text.isprintable():
        raise ValueError("one line of printable text: no line break, control or bidi character")
    return text


Reason = Annotated[str, Field(min_length=3, max_length=300), AfterValidator(one_line)]


@contextmanager
def reporting(progress: Progress | None) -> Iterator[None]:
    """Progress lines of the steps run inside this block go to `progress` (`trainops sop`'s bar)."""
    reset = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(reset)


def say(message: str) -> None:
    (_PROGRESS.get() or (lambda _msg: None))(message)


def session_of(tool_name: str, session_id: str) -> SopSession:
    try:
        return load(session_id)
    except ValueError as exc:
        raise ToolError(tool_name, str(exc)) from None


def declared_first(inp) -> str | None:
    """R-ENV-1: every step after S1 reads a session whose environment is declared."""
    try:
        session = load(inp.session)
    except ValueError as exc:
        return str(exc)
    if session.environment is None:
        return ("no SOP step before S1: the session has no environment declaration, and no figure is taken without "
                "one; run sop_declare first")
    return None


def _arm_rung(inp) -> tuple[SopSession, str, list[Rung], Rung] | None:
    """The session, the arm, its valid rungs and the rung asked for; None where another check refuses."""
    try:
        session = load(inp.session)
        req = session.settings.request()
        knob, value = parse_arm([inp.arm], req.framework)
        rungs = rollout.valid_rungs(knob, req)
    except ValueError:
        return None
    rung = next((r for r in rungs if r.world == (inp.world or rungs[0].world)), None)
    return None if rung is None or session.environment is None else (session, f"{knob.name}={value}", rungs, rung)


def _one_variable(inp) -> str | None:
    """R-ABL-1: an arm changes exactly one setting."""
    specs = [part for part in inp.arm.split(",") if part.strip()]
    return str(KnobError(f"arm: changes exactly one variable, got {len(specs)} ({', '.join(specs)}); call sop_arm "
                         "once per knob")) if len(specs) != 1 else None


def _small_rung_first(inp) -> str | None:
    """R-ABL-2: a rung above the arm's smallest only after every rung below it gained."""
    found = _arm_rung(inp)
    if found is None:
        return None
    session, arm, rungs, rung = found
    ran = {a.world: a for a in session.rungs_of(arm)}
    if rung.world in ran:
        return f"{arm} already ran at {rung.label} in session {session.session_id}; climb to the next rung or try " \
               "another arm"
    for below in (r for r in rungs if r.world < rung.world):
        if below.world not in ran:
            return (f"{arm} at {rung.label} before its smaller rung: run sop_arm with arm={arm} world={below.world} "
                    f"({below.label}) first; the target scale comes after the small one passed")
        if ran[below.world].stopped:
            return (f"{arm} stopped at {below.label} ({ran[below.world].row.verdict}): its ladder ends there, no "
                    "larger rung runs")
    return None


def _rung_baseline(inp) -> str | None:
    """R-ABL-1: an arm is measured against the baseline of its own rung, recorded in the session."""
    found = _arm_rung(inp)
    if found is None:
        return None
    session, arm, _, rung = found
    if rung.world not in session.baselines:
        return (f"no baseline at {rung.label} in session {session.session_id}: run sop_baseline with world="
                f"{rung.world} first; {arm} is compared with the baseline of its own rung")
    return None


def _target_baseline(inp) -> str | None:
    """R-ABL-1: S3 designs the arms against the baseline they are measured from: S2 at the target scale."""
    try:
        session = load(inp.session)
    except ValueError:
        return None
    if session.summary is None and session.environment is not None:
        return (f"no baseline at the target scale in session {session.session_id}: run sop_baseline first (S2); S3 "
                "ranks the arms from its measured split, and every arm is measured against a baseline")
    return None


class SopDeclareInput(SopSettings):
    model_config = STEP_INPUT

    @field_validator("config")
    @classmethod
    def _config_exists(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            raise ValueError(f"config={value!r} is not a file: pass a job config TOML path, or omit config for the "
                             "embedded tiny defaults")
        return value


class SopDeclareOutput(BaseModel):
    session_id: str = Field(description="Pass it to every later step.")
    environment: PackEnvironment
    layout: LayoutPlan = Field(description="The parallel-strategy plan on the declared topology.")
    next_step: str


@tool("sop_declare", risk="mutate", tags=("sop",))
def sop_declare(inp: SopDeclareInput) -> SopDeclareOutput:
    """S1 of the SOP: start an SOP session for a job and declare its environment (hardware, versions,
    scheduler, measured checkpoint bandwidth; on Slurm the partition and its nodes, the all-reduce
    bandwidth measured between nodes, the idle spares beyond the job's nodes and the shadow partition;
    the monitor, checked to answer) and parallel-strategy plan. Every later step names the session it
    returns. Writes the session record; launches no training job (on several nodes, one short 2-node
    all-reduce job measures the interconnect)."""
    ctx = skill_context(SKILL)
    settings = SopSettings.model_validate(inp.model_dump())
    req = settings.request().loaded()
    try:
        monitor = environment.check_monitor(settings.monitor)
    except ValueError as exc:
        raise ToolError("sop_declare", str(exc)) from None
    say("S1 environment declaration" + (f" on {settings.nodes} nodes: measuring the interconnect between them"
                                        if settings.nodes > 1 else ""))
    env, row = environment.declare(settings.scheduler, ctx, framework=settings.framework,
                                   partition=settings.partition, job_nodes=settings.nodes, monitor=monitor)
    say("S1 parallel-strategy plan on the declared topology")
    layout = planning.layout_plan(req, env, settings.moe.model_dump() if settings.moe else None, ctx)
    session = start(settings).model_copy(update={
        "environment": env, "environment_row": row, "layout": layout,
        "approved_call": approval_of_declaration(inp.model_dump(mode="json")),
        "framework_version": f"{env.framework} {env.framework_version}, torch {env.torch_version}"})
    cluster = "".join(f"; {k} {v}" for k, v in env.placement_rows())
    shape = "valid" if layout.valid else f"invalid: {layout.error}"
    figures = [("hardware", env.hardware), ("framework", f"{env.framework} {env.framework_version}"),
               ("hot spares", ", ".join(env.hot_spare_nodes) or "none"), *env.placement_rows(), ("layout", shape)]
    session = save(session.logged("S1", "sop_declare", f"{env.hardware}, {env.framework} {env.framework_version}; "
                                  f"hot spares {', '.join(env.hot_spare_nodes) or 'none'}{cluster}; layout {shape}",
                                  figures=figures))
    return SopDeclareOutput(session_id=session.session_id, environment=env, layout=layout,
                            next_step=f"sop_baseline session={session.session_id} (S2)")


class SopBaselineInput(BaseModel):
    model_config = STEP_INPUT

    session: str = SessionId
    repeats: int | None = Field(None, ge=1, le=10, description="Runs of the same config; None: the session's (2 "
                                                               "quick, else 3).")
    world: int | None = Field(None, ge=1, le=1 << 20,
                              description="Ranks of the ladder rung to measure (an arm's smaller rung); None: the "
                                          "target scale, which is S2 itself (a profiled run and the bottleneck "
                                          "split).")


class SopBaselineOutput(BaseModel):
    session_id: str
    world: int
    runs: list[str] = Field(description="Run ids of the repeats.")
    summary: BaselineSummary | None = Field(description="At the target scale: medians and spreads over the repeats "
                                                        "and the bottleneck split (compute, data wait, exposed "
                                                        "communication).")
    next_step: str


@tool("sop_baseline", risk="mutate", tags=("sop",), checks=(InputCheck("R-ENV-1", declared_first),),
      approval_from=declaration_approval)
def sop_baseline(inp: SopBaselineInput) -> SopBaselineOutput:
    """S2 of the SOP: run the session's job `repeats` times at the target scale (plus one short
    profiled run) and summarise MFU, step time, their noise band and the bottleneck split; with
    `world`, the baseline of a smaller ladder rung an arm climbs from. Needs S1. Launches jobs."""
    ctx = skill_context(SKILL)
    session = session_of("sop_baseline", inp.session)
    req, repeats = session.request(), inp.repeats or session.settings.repeats()
    rungs = {r.world: r for r in rollout.ladder(req)}
    world = inp.world or session.target_world()
    if world not in rungs:
        raise ToolError("sop_baseline", f"world={world} is not a rung of this job's ladder; use one of "
                                        f"{', '.join(str(w) for w in rungs)}")
    summary = None
    if world == session.target_world():
        say("S2 baseline")
        summary, results, evidence = baseline.measure(req, repeats, ctx, _PROGRESS.get(), env=session.environment)
        summary = summary.model_copy(update={"reliability": planning.reliability_summary(
            session.settings.mtbf_h, session.settings.ettr_window_s)})
        session = session.model_copy(update={"summary": summary, "baseline_evidence": evidence})
        found = (f"MFU {summary.mfu_pct.median:.3f}%, step {summary.step_time_s.median:.4f} s "
                 f"(spread {summary.step_time_s.spread_pct:.1f}%) over {len(results)} repeats")
        exposed = summary.exposed_comm_share_pct
        figures = [("MFU median", f"{summary.mfu_pct.median:.3f}%"),
                   ("MFU spread", f"{summary.mfu_pct.spread_pct:.1f}%"),
                   ("step time median", f"{summary.step_time_s.median:.4f} s"),
                   ("step time spread", f"{summary.step_time_s.spread_pct:.1f}%"),
                   ("tokens/s median", f"{summary.tokens_per_s.median:.0f}"),
                   ("data wait share", f"{summary.data_wait_share_pct:.1f}%"),
                   ("exposed communication share", "not measured" if exposed is None else f"{exposed:.1f}%")]
    else:
        say(f"S4 baseline at the rung of {rungs[world].label}")
        results = ablation.baseline_at(req, repeats, ctx, _PROGRESS.get())(rungs[world])
        found = f"{len(results)} repeats at {rungs[world].label}"
        figures = []
    runs = [r.run_dir for r in results]
    figures = [("rung", rungs[world].label), ("repeats", str(len(results))), *figures]
    session = save(session.model_copy(update={"baselines": {**session.baselines, world: results}})
                   .logged("S2", "sop_baseline", found, runs, figures))
    return SopBaselineOutput(session_id=session.session_id, world=world, runs=[Path(r).name for r in runs],
                             summary=summary, next_step="sop_design (S3), then sop_arm (S4)")


def design_arms(settings: SopSettings, summary: BaselineSummary, knobs: list[str] = (),
                memory_bound: bool = False) -> list[DesignedArm]:
    """S3: the candidate arms (`knobs`, else the session's) ranked from S2's measured split."""
    return ablation_design.design(ablation_design.split_of(summary), list(knobs) or settings.candidates(),
                                  settings.framework, memory_bound)


class SopDesignInput(BaseModel):
    model_config = STEP_INPUT

    session: str = SessionId
    knobs: list[str] = Field(default_factory=list, max_length=32,
                             description="Candidate arms NAME=VALUE; empty: the session's (its knobs, else the "
                                         "framework's default SOP arms).")
    memory_bound: bool = Field(False, description="Memory is the problem: arms that trade speed for memory first.")


class SopDesignOutput(BaseModel):
    session_id: str
    split: MeasuredSplit = Field(description="S2's step-time figures the ranking reads.")
    arms: list[DesignedArm] = Field(description="The arms by expected gain, highest first, each with its figure, "
                                                "bound and reason.")
    next_step: str


@tool("sop_design", risk="mutate", tags=("sop", "ablation"),
      checks=(InputCheck("R-ENV-1", declared_first), InputCheck("R-ABL-1", _target_baseline)),
      approval_from=declaration_approval)
def sop_design(inp: SopDesignInput) -> SopDesignOutput:
    """S3 of the SOP: rank candidate arms by expected gain from the session's own S2 split (exposed
    communication, data loading, compute against MFU), each with the figure it acts on, the most it
    could save and why; records the design in the session. Needs S2. Launches nothing."""
    session = session_of("sop_design", inp.session)
    if session.summary is None:
        raise ToolError("sop_design", f"session {session.session_id} has no baseline at the target scale: run "
                                      "sop_baseline first (S3 ranks the arms from S2's measured split)")
    split = ablation_design.split_of(session.summary)
    try:
        arms = design_arms(session.settings, session.summary, inp.knobs, inp.memory_bound)
    except KnobError as exc:
        raise ToolError("sop_design", str(exc)) from None
    say("S3 ablation design from the baseline's split: " + "; ".join(
        f"{a.rank}. {a.arm} ({a.figure.text})" for a in arms))
    session = save(session.model_copy(update={"design": arms}).logged(
        "S3", "sop_design", "; ".join(f"{a.rank}. {a.arm}" for a in arms),
        figures=[(f"{a.rank}. {a.arm}", a.figure.text) for a in arms]))
    return SopDesignOutput(session_id=session.session_id, split=split, arms=arms,
                           next_step=f"sop_arm arm={arms[0].arm} (S4), its smallest rung first")


class SopArmInput(BaseModel):
    model_config = STEP_INPUT

    session: str = SessionId
    arm: str = Field(min_length=3, max_length=200, description="ONE knob as NAME=VALUE (framework_knobs lists them).")
    world: int | None = Field(None, ge=1, le=1 << 20,
                              description="Ranks of the ladder rung; None: the arm's smallest valid rung. A larger "
                                          "rung runs only after every rung below it gained.")
    repeats: int | None = Field(None, ge=1, le=10, description="Runs of the arm; None: the session's.")
    reason: Reason | None = Field(None, description="Why this arm, in one line: the pack shows it beside the choice.")


class SopArmOutput(BaseModel):
    session_id: str
    row: AblationRow = Field(description="MFU change against the rung's baseline, its noise band and verdict.")
    runs: list[str] = Field(description="Run ids of the arm's repeats.")
    stopped: bool = Field(description="The arm's ladder ends here (no gain; after a gain, reverted and verified).")
    next_step: str


@tool("sop_arm", risk="mutate", tags=("sop", "ablation"),
      checks=(InputCheck("R-ABL-1", _one_variable), InputCheck("R-ENV-1", declared_first),
              InputCheck("R-ABL-2", _small_rung_first), InputCheck("R-ABL-1", _rung_baseline)),
      approval_from=declaration_approval)
def sop_arm(inp: SopArmInput) -> SopArmOutput:
    """S4 of the SOP: one single-variable arm at one rung of its rollout ladder, against the baseline of
    that rung: the smallest valid rung first, a larger one only after the one below gained; where the
    gain is gone the ladder stops, reverts and verifies. Needs S1 and the rung's baseline. Launches jobs."""
    ctx = skill_context(SKILL)
    session = session_of("sop_arm", inp.session)
    req = session.request()
    try:
        knob, value = parse_arm([inp.arm], req.framework)
        rungs = rollout.valid_rungs(knob, req)
    except ValueError as exc:
        raise ToolError("sop_arm", str(exc)) from None
    arm = f"{knob.name}={value}"
    rung = next((r for r in rungs if r.world == (inp.world or rungs[0].world)), None)
    if rung is None:
        raise ToolError("sop_arm", f"world={inp.world} is not a rung of {arm}'s ladder; use one of "
                                   f"{', '.join(str(r.world) for r in rungs)}")
    done = session.rungs_of(arm)
    step = ablation.climb_rung(req, arm, rung, session.baselines[rung.world], [a.row for a in done],
                               {a.world: a.runs for a in done}, inp.repeats or session.settings.repeats(), ctx,
                               _PROGRESS.get(), session.environment)
    record = ArmRung(arm=arm, world=rung.world, row=step.rows[-1], runs=step.runs, evidence=step.evidence,
                     stopped=step.stopped)
    row = record.row
    session = save(session.model_copy(update={"arms": [*session.arms, record]}).logged(
        "S4", "sop_arm", f"{arm} at {rung.label}: {row.mfu_change_pct:+.1f}% against ±{row.noise_band_pct:.1f}%, "
                         f"{row.verdict}", [r.run_dir for r in step.runs],
        [("arm", arm), ("rung", rung.label), ("MFU change", f"{row.mfu_change_pct:+.1f}%"),
         ("noise band", f"±{row.noise_band_pct:.1f}%"), ("verdict", row.verdict),
         ("ladder", "ends here" if step.stopped else "climbs on")], inp.reason))
    above = [r for r in rungs if r.world > rung.world]
    following = "another arm, or sop_drill (S5)" if step.stopped or not above else (
        f"sop_baseline world={above[0].world} (if not measured), then sop_arm arm={arm} world={above[0].world}")
    return SopArmOutput(session_id=session.session_id, row=row, runs=[Path(r.run_dir).name for r in step.runs],
                        stopped=step.stopped, next_step=following)


class SopDrillInput(BaseModel):
    model_config = STEP_INPUT

    session: str = SessionId
    fault: str = Field(min_length=1, max_length=40, description="The fault to inject (crash, hang, nan, bitflip, "
                                                                "straggler, ...).")
    reason: Reason | None = Field(None, description="Why this drill, in one line: the pack shows it beside the "
                                                    "choice.")


class SopDrillOutput(BaseModel):
    session_id: str
    recovered: DrillResult | None = Field(description="Detection latency, isolation granularity, recovery time.")
    detection_only: drill.DetectionOnlyResult | None = Field(description="A drill stopped after detection.")
    next_step: str


@tool("sop_drill", risk="mutate", tags=("sop", "drill"), checks=(InputCheck("R-ENV-1", declared_first),),
      approval_from=declaration_approval)
def sop_drill(inp: SopDrillInput) -> SopDrillOutput:
    """S5 of the SOP: one fault drill on the session's job: inject, then measure detection latency,
    isolation granularity and recovery time from a checkpoint. Needs S1. Launches a job and injects
    the fault into it."""
    ctx = skill_context(SKILL)
    session = session_of("sop_drill", inp.session)
    req = session.request().with_overrides(session.settings.drill_overrides())
    say(f"S5 fault drill: {inp.fault}")
    try:
        result, row = drill.drill(req, inp.fault, ctx=ctx, progress=_PROGRESS.get())
    except drill.DrillRefused as exc:
        raise ToolError("sop_drill", str(exc)) from None
    recovered = result if isinstance(result, DrillResult) else None
    found = (f"{inp.fault}: detected in {result.detection_latency_s:.1f} s, isolated to "
             f"{result.isolation_granularity}" + (f", recovered in {recovered.recovery_time_s:.1f} s"
                                                  if recovered else ", detection only"))
    figures = [("fault", inp.fault), ("detection latency", f"{result.detection_latency_s:.1f} s"),
               ("isolation granularity", str(result.isolation_granularity)),
               ("recovery time", f"{recovered.recovery_time_s:.1f} s" if recovered else "detection only")]
    session = save(session.model_copy(update={
        "drills": [*session.drills, *([recovered] if recovered else [])],
        "drill_evidence": [*session.drill_evidence, row], "drilled": [*session.drilled, inp.fault]})
        .logged("S5", "sop_drill", found, [result.run_dir], figures, inp.reason))
    return SopDrillOutput(session_id=session.session_id, recovered=recovered,
                          detection_only=None if recovered else result,
                          next_step="another drill, or sop_pack (S6)")


STEP_TOOLS: tuple[Callable, ...] = (sop_declare, sop_baseline, sop_design, sop_arm, sop_drill)

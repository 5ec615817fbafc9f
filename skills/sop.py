"""The whole SOP, S1 to S6, as the offline plan walks it: each step a tool call (skills.sop_steps,
skills.sop_pack) on one SOP session: declare, baseline, design, ablate (small then target scale),
drill, and the evidence pack that waits for a human. `build_from_runs` packs recorded runs."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from trainops.run_folder import RunFiles
from trainops.run_records import read_drill_record
from trainops.skills import (
    ablation,
    baseline,
    environment,
    escalate,
    planning,
    rollout,
    sop_pack,
    sop_session,
    sop_steps,
)
from trainops.skills.baseline import Progress
from trainops.skills.evidence import pack as evidence_pack
from trainops.skills.evidence import references
from trainops.skills.evidence.model import DrillResult
from trainops.skills.knobs import parse_arm
from trainops.skills.request import JobRequest
from trainops.skills.sop_pack import SopResult, reference_notes
from trainops.skills.sop_session import SopSession, SopSettings
from trainops.skills.sop_steps import SKILL
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext, skill_context
from trainops.tools.jobs import jobs
from trainops.trainer.config import ConfigError, load_config
from trainops.workspace import confine


def run(settings: SopSettings, ctx: CallContext | None = None, progress: Progress | None = None,
        resume: str | None = None) -> SopResult:
    """S1..S6 in order, each step a tool call through the gate on one SOP session (skills.sop_steps),
    the next call chosen by the offline plan (`next_step`) from what the session recorded; `resume`
    continues that session from its last finished step, under the settings it was declared with.
    Any refusal or failed run stops the SOP with its message; the session keeps what finished."""
    ctx = skill_context(SKILL, ctx)
    with sop_steps.reporting(progress):
        if resume is None:
            req = settings.request().loaded()
            ablation.check_arms(req, settings.knobs)  # a bad arm is refused before anything is declared or launched
            resume = invoke(sop_steps.sop_declare, sop_steps.SopDeclareInput(**settings.model_dump()),
                            ctx).session_id
        try:
            session = sop_session.load(resume)
        except ValueError as exc:
            raise ToolError("sop", str(exc)) from None
        if session.pack is not None:
            raise ToolError("sop", f"session {resume} is finished: its pack is {session.pack}")
        while (step := next_step(session)) is not None:
            out = invoke(*step, ctx)
            session = sop_session.load(resume)
        return out


def next_step(session: SopSession) -> tuple[Callable, BaseModel] | None:
    """The offline plan: the next step call for this session, None once its pack is written. S2 at
    the target, S3, then each arm S3 ranked (the quick SOP: the first) up its ladder, each rung's
    baseline first, until its ladder stops or reaches the target; each drill; the pack. A steer
    (skills.sop_steer) adds or skips an arm or drill, skips S4 or S5, or stops early: the pack then."""
    sid, settings, stop = session.session_id, session.settings, session.stops_after() or "S5"
    pack = None if session.pack else (sop_pack.sop_pack, sop_pack.SopPackInput(session=sid))
    if stop == "S1":
        return pack
    if session.summary is None:
        return sop_steps.sop_baseline, sop_steps.SopBaselineInput(session=sid)
    if stop == "S2":
        return pack
    if not session.design:
        return sop_steps.sop_design, sop_steps.SopDesignInput(session=sid)
    req = settings.request()
    for arm in session.arms_to_run() if stop >= "S4" else []:
        done = {a.world: a for a in session.rungs_of(arm)}
        for rung in rollout.valid_rungs(parse_arm([arm], req.framework)[0], req):
            if rung.world in done and done[rung.world].stopped:
                break
            if rung.world in done:
                continue
            if rung.world not in session.baselines:
                return sop_steps.sop_baseline, sop_steps.SopBaselineInput(session=sid, world=rung.world)
            return sop_steps.sop_arm, sop_steps.SopArmInput(session=sid, arm=arm, world=rung.world)
    fault = next((f for f in session.drills_to_run() if f not in session.drilled), None) if stop >= "S5" else None
    if fault is not None:
        return sop_steps.sop_drill, sop_steps.SopDrillInput(session=sid, fault=fault)
    return pack


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
                                  references=reference_notes(env, req.nproc, summary.model, summary),
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

"""The agent's own tools, which sit above the tools layer (skills may call tools, tools may not call
skills): `respond_to_sdc` runs the SDC response and `sdc_case` reads the case it wrote,
`ablation_design` ranks a recorded baseline's candidate arms (S3), the SOP's step tools
(skills.sop_steps, skills.sop_pack: `sop_declare`, `sop_baseline`, `sop_design`, `sop_arm`, `sop_drill`,
`sop_pack`) and `sop_steer` (skills.sop_steer: a change to the plan between steps),
`list_pending_approvals` reads the agent's own thread store next to governance's queue, and
`load_skill` hands the model a skill's full text (it sees only names and descriptions before).
`AGENT_TOOLS` lists them; `agent_registry()` is the one registry the CLI and the agent both use:
every trainops tool plus these."""
from __future__ import annotations

import json
from functools import cache

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainops.agents.prompt import load_skills
from trainops.run_folder import read_regular
from trainops.skills import sdc
from trainops.skills.ablation_design import MeasuredSplit, design, split_of_runs
from trainops.skills.evidence.design import DesignedArm
from trainops.skills.knobs import KnobError
from trainops.skills.sdc import CASE_FILE, SdcCase, Suspect
from trainops.skills.sop_pack import sop_pack
from trainops.skills.sop_steer import sop_steer
from trainops.skills.sop_steps import STEP_TOOLS
from trainops.tools.base import InputCheck, ToolError, tool
from trainops.tools.calls import invoke
from trainops.tools.catalog import build_registry
from trainops.tools.context import skill_context
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkName
from trainops.tools.governance.approvals import list_items
from trainops.tools.ids import JobId, NodeName, RunRef
from trainops.tools.jobs import jobs
from trainops.tools.registry import Registry
from trainops.tools.reliability.evidence import inert
from trainops.tools.schedulers.base import SchedulerKind
from trainops.workspace import run_folder


class PendingInput(BaseModel):
    include_decided: bool = Field(False, description="Also list items already approved or rejected.")


class PendingItem(BaseModel):
    kind: str = Field(description="call (a gated tool call), pack (an evidence pack) or thread (an agent thread "
                                  "paused for a decision)")
    id: str
    status: str
    detail: str


class PendingOutput(BaseModel):
    items: list[PendingItem]
    count_pending: int


@tool("list_pending_approvals", risk="read", tags=("governance", "agent"))
def list_pending_approvals(inp: PendingInput) -> PendingOutput:
    """List what waits for a human decision: gated tool calls, evidence packs and agent threads paused
    at an approval."""
    from trainops.agents.threads import list_threads

    items = [PendingItem(kind=i.kind, id=i.id, status=i.status, detail=i.detail) for i in list_items()
             if inp.include_decided or i.status == "pending"]
    items += [PendingItem(kind="thread", id=t.thread_id, status="pending",
                          detail=f"{', '.join(t.waiting_tools) or 'a call'} waits for a decision; "
                                 f"resume with `trainops chat --thread {t.thread_id}`")
              for t in list_threads() if t.pending_approvals]
    return PendingOutput(items=items, count_pending=sum(1 for i in items if i.status == "pending"))


class RespondToSdcInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    run: RunRef | None = Field(None, description="The suspect run: its id under $TRAINOPS_HOME/runs or its folder; its "
                                              "job must already be stopped.")
    job_id: JobId | None = Field(None, description="Or the suspect job (the id a submit returned): its run folder "
                                                   "comes from the scheduler, and a job still running is stopped "
                                                   "first.")
    rank: int | None = Field(None, ge=0, le=1_048_575, description="The suspect rank, with step; omit both to read "
                                                                   "them from the run's replica checksums.")
    step: int | None = Field(None, ge=0, description="The step the corruption was first seen at: checkpoints from "
                                                     "it on are quarantined.")
    node: NodeName | None = Field(None,
                                  description="The suspect node, if known (the rank's heartbeat host wins).")
    scheduler: SchedulerKind = "local"
    timeout_s: float = Field(300.0, gt=0, le=3600, description="Wait at most this long for each check job.")

    @model_validator(mode="after")
    def _one_subject(self) -> "RespondToSdcInput":
        if (self.run is None) == (self.job_id is None):
            raise ValueError("give exactly one of run (the suspect run's id or folder) or job_id (its job)")
        if (self.rank is None) != (self.step is None):
            raise ValueError("rank and step go together: name both, or neither to read the suspect from the run's "
                             "replica checksums")
        return self


def _run_inside(inp: RespondToSdcInput) -> str | None:
    """A run folder outside the workspace is refused before any approval is asked for (R-SEC-3)."""
    try:
        run_folder(inp.run) if inp.run is not None else None
    except ValueError as exc:
        return str(exc)
    return None


def _stopped_run(inp: RespondToSdcInput) -> str:
    """The suspect's run folder (confined); a job named by id is looked up and, while it runs,
    stopped: its nodes are what the known-answer checks test."""
    if inp.job_id is not None:
        ctx = skill_context("sdc-response")
        status = invoke(jobs.job_status, jobs.JobRef(job_id=inp.job_id, scheduler=inp.scheduler), ctx)
        if status.state == "unknown" or not status.run_dir:
            raise ToolError("respond_to_sdc", f"job_id: the {inp.scheduler} scheduler knows no job {inp.job_id!r} "
                                              "with a run folder; pass the id submit_job returned, or run")
        if not status.finished:
            invoke(jobs.cancel_job, jobs.CancelJobInput(job_id=inp.job_id, scheduler=inp.scheduler, force=True), ctx)
    try:
        return str(run_folder(inp.run if inp.run is not None else status.run_dir))
    except ValueError as exc:
        raise ToolError("respond_to_sdc", str(exc)) from None


@tool("respond_to_sdc", risk="mutate", tags=("sdc", "escalation", "agent"),
      checks=(InputCheck("R-SEC-3", _run_inside),))
def respond_to_sdc(inp: RespondToSdcInput) -> SdcCase:
    """Respond to a suspected silent data corruption (R-ESC-3) in a run: quarantine its checkpoints
    from the suspect step on, run the known-answer GEMM and collective check through the scheduler
    on every node of the partition and on the suspect node beside a known-good one, drain the node
    that fails (gated drain_node) and hand the case with both results to a human (a pending
    acknowledge_escalation). The suspect comes from the run's replica checksums unless rank and step
    are given. Returns the case (also written to RUN/sdc-case.json)."""
    run_dir = _stopped_run(inp)
    suspect = (sdc.suspect_in(run_dir) if inp.rank is None else
               Suspect(rank=inp.rank, node=inp.node, step=inp.step, evidence=f"named by the caller: rank {inp.rank} "
                                                                              f"at step {inp.step}"))
    if suspect is None:
        raise ToolError("respond_to_sdc", f"run: the replica checksums in {run_dir}/metrics.jsonl all agree, so no "
                                          "suspect is named; pass rank and step to respond to one you suspect")
    return sdc.respond(run_dir, suspect, inp.scheduler, timeout_s=inp.timeout_s)


class SdcCaseInput(BaseModel):
    run: RunRef = Field(max_length=200, description="Run id under $TRAINOPS_HOME/runs (or its folder) "
                                                               "whose suspected silent data corruption was answered.")


def _inert_strings(value):
    """Every string of a job-writable JSON document escaped (control and bidi characters) and bounded."""
    if isinstance(value, str):
        return inert(value, 2000)
    if isinstance(value, list):
        return [_inert_strings(v) for v in value]
    if isinstance(value, dict):
        return {k: _inert_strings(v) for k, v in value.items()}
    return value


@tool("sdc_case", risk="read", tags=("sdc", "agent"))
def sdc_case(inp: SdcCaseInput) -> SdcCase:
    """Read a run's silent-data-corruption case as respond_to_sdc handed it to a human: the suspect, each
    known-answer check job (fleet, colocated) with every node's answer and the nodes that failed, and
    what was quarantined and drained. Which node computed wrong results is the checks' answer."""
    try:
        run_dir = run_folder(inp.run)
    except ValueError as exc:
        raise ToolError("sdc_case", str(exc)) from None
    raw = read_regular(run_dir / CASE_FILE)
    if raw is None:
        raise ToolError("sdc_case", f"run: {run_dir.name} has no {CASE_FILE}: no SDC response ran for it "
                                    "(respond_to_sdc runs one, gated)")
    if problem := sdc.case_problem(run_dir, raw):
        raise ToolError("sdc_case", f"run: {run_dir.name}/{CASE_FILE} is not the case respond_to_sdc wrote: {problem}; "
                                    "run respond_to_sdc again")
    try:
        return SdcCase.model_validate(_inert_strings(json.loads(raw)))
    except (ValueError, ValidationError) as exc:
        raise ToolError("sdc_case", f"run: {run_dir.name}/{CASE_FILE} is not a case respond_to_sdc wrote "
                                    f"({str(exc).splitlines()[0]}); run respond_to_sdc again") from None


class AblationDesignInput(BaseModel):
    runs: list[RunRef] = Field(min_length=1, max_length=16, description="The baseline's runs, one per repeat: run ids "
                                                                        "under $TRAINOPS_HOME/runs (or their folders).")
    framework: FrameworkName = Field("trainops", description="Whose knobs: trainops, deepspeed, torchtitan or "
                                                             "megatron.")
    knobs: list[str] = Field(default_factory=list, max_length=32, description="Candidate arms NAME=VALUE; empty: the "
                                                                              "framework's default SOP arms.")
    memory_bound: bool = Field(False, description="Memory is the problem (an out-of-memory end, peak memory at the "
                                                  "device's): arms that trade speed for memory rank first, not last.")


class AblationDesignOutput(BaseModel):
    split: MeasuredSplit = Field(description="The baseline's step-time figures the ranking reads.")
    arms: list[DesignedArm] = Field(description="The arms by expected gain, highest first.")


@tool("ablation_design", risk="read", tags=("sop", "ablation", "agent"))
def ablation_design(inp: AblationDesignInput) -> AblationDesignOutput:
    """S3: rank candidate ablation arms by expected gain from a recorded baseline's measured split
    (exposed communication, data loading, compute against MFU), each with the figure it acts on, the
    most step time it could save (Amdahl) and why. Reads the runs; launches nothing."""
    try:
        run_dirs = [str(run_folder(run)) for run in inp.runs]
        specs = inp.knobs or list(get_adapter(inp.framework).sop_plan.arms)
        split = split_of_runs(run_dirs)
        return AblationDesignOutput(split=split, arms=design(split, specs, inp.framework, inp.memory_bound))
    except (ValueError, KnobError) as exc:
        raise ToolError("ablation_design", str(exc)) from None


class LoadSkillInput(BaseModel):
    name: str = Field(min_length=1, max_length=100, description="A skill's name, as the system prompt lists it.")


class LoadSkillOutput(BaseModel):
    name: str
    description: str
    body: str = Field(description="The skill's steps and rules (SKILL.md without its front matter).")


@tool("load_skill", risk="read", tags=("skills", "agent"))
def load_skill(inp: LoadSkillInput) -> LoadSkillOutput:
    """Load one skill's full text (steps, tool table, rules) by its name. Call it first for a request a
    listed skill covers; its text then stays in your instructions for the rest of the conversation."""
    skills = {s.name: s for s in load_skills()}
    if inp.name not in skills:
        raise ToolError("load_skill", f"name: no skill {inp.name!r}; the skills are {', '.join(sorted(skills))}")
    skill = skills[inp.name]
    return LoadSkillOutput(name=skill.name, description=skill.description, body=skill.body)


AGENT_TOOLS = (*STEP_TOOLS, sop_pack, sop_steer, respond_to_sdc, sdc_case, ablation_design, list_pending_approvals,
               load_skill)


@cache
def agent_registry() -> Registry:
    """Every trainops tool and the agent's own: what `trainops tool` and the agent graph serve."""
    return build_registry(extra=AGENT_TOOLS)

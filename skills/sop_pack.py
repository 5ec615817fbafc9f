"""S6 of the SOP as a tool: `sop_pack` writes the evidence pack from one SOP session's own records
(skills.sop_session): the declaration, S2's summary, the arms' rows, the drills and the evidence
rows the steps recorded. Its input is the session id and nothing else, so no figure a caller types
reaches a pack; a step that did not run is a blocker of the pack's verdict ("partial"). The pack also
lists each step's call with its audit line, and who chose each arm, drill and rollout stop
(skills.sop_trail): a step the audit log does not hold as the session records it is a blocker too."""
from __future__ import annotations

import time

from pydantic import BaseModel, Field

from trainops.skills import escalate, planning, sop_trail
from trainops.skills.baseline import command_line
from trainops.skills.evidence import pack as evidence_pack
from trainops.skills.evidence import references
from trainops.skills.evidence.model import BaselineSummary, PackEnvironment
from trainops.skills.evidence.view import DECISION_COMMANDS, SIGNING_NOTE
from trainops.skills.sop_approval import declaration_approval
from trainops.skills.sop_session import save
from trainops.skills.sop_steps import SKILL, STEP_INPUT, SessionId, declared_first, say, session_of
from trainops.tools.base import InputCheck, tool
from trainops.tools.context import skill_context


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
    session_id: str = Field("", description="the SOP session the pack was built from")


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


def reference_notes(env: PackEnvironment | None, world: int, model: str,
                    summary: BaselineSummary | None = None) -> list[str]:
    """Published results to read our numbers against (S2's median MFU, the record's interruption rate),
    with source, evidence level and scale difference, worded for the hardware the run used (SOP step 7)."""
    rel = summary.reliability if summary else None
    return references.headline_notes(env, world, model, mfu_pct=summary.mfu_pct.median if summary else None,
                                     interruptions_per_day=rel.interruption_rate_per_day if rel else None)


def _mtbf_basis(rel) -> str:
    """The checkpoint plan's MTBF basis: S2's figure and where it comes from."""
    if rel.mtbf_measured:
        return f"the interruption record (S2): {rel.mtbf_source}"
    return f"not measured: {rel.mtbf_source}, too few to measure one"


class SopPackInput(BaseModel):
    model_config = STEP_INPUT

    session: str = SessionId


@tool("sop_pack", risk="mutate", tags=("sop", "evidence"), checks=(InputCheck("R-ENV-1", declared_first),),
      approval_from=declaration_approval)
def sop_pack(inp: SopPackInput) -> SopResult:
    """S6 of the SOP: write the evidence pack from the session's own records (never figures passed in):
    the declaration, the baseline and its split, the arms' rows, the drills, the checkpoint plan. A step
    not run is a blocker: the verdict is then partial. Needs S1. Returns the pack a human approves."""
    ctx = skill_context(SKILL)
    session = session_of("sop_pack", inp.session)
    say("S6 evidence pack")
    req, env, summary = session.request(), session.environment, session.summary
    world = req.nproc * req.nodes
    rel = summary.reliability if summary else None
    plan = planning.plan_from_drill(session.drills[0], rel.mtbf_h, _mtbf_basis(rel), ctx, mtbf_level=rel.mtbf_level) \
        if session.drills and rel else None
    arm_rows = [a.row for a in session.arms]
    model = summary.model if summary else req.preset or "unknown"
    annotated = references.annotate(arm_rows, env, world, model) if summary else arm_rows
    trail = sop_trail.for_pack(session)  # each step against the audit line of its call; S6 is this call
    pack = evidence_pack.assemble(
        f"sop-{time.strftime('%Y%m%d-%H%M%S')}", env, summary, annotated, session.drills,
        [session.environment_row, *session.baseline_evidence, *(e for a in session.arms for e in a.evidence),
         *session.drill_evidence],
        rollback=f"keep the baseline configuration ({command_line(req)}); adopt no arm until a human approves",
        references=reference_notes(env, world, model, summary), checkpoint_plan=plan,
        mlperf=references.mlperf(env, world),
        layout_plan=session.layout, ablation_design=session.design or None, sop_steps=trail,
        choices=sop_trail.choices(session, trail))
    pack = escalate.carry_fired(pack, ctx)  # R-ESC-1..4 on every SOP run: a fired rule goes to a human
    folder = evidence_pack.write(pack)
    save(session.model_copy(update={"pack": pack.pack_id}).logged(
        "S6", "sop_pack", f"pack {pack.pack_id}: {pack.verdict}",
        figures=[("verdict", pack.verdict), ("blockers", "; ".join(pack.blockers) or "none"), ("pack", pack.pack_id)]))
    return SopResult(pack_dir=str(folder), verdict=pack.verdict, blockers=pack.blockers,
                     elapsed_s=time.time() - session.created, pack_id=pack.pack_id,
                     report_html=str(folder / "report.html"),
                     approve_command=DECISION_COMMANDS["approve"].format(pack_id=pack.pack_id),
                     headline=headline(pack), session_id=session.session_id)

"""The report's SOP trail: each step call with its audit line, and each choice with who made it and
why (issue 40 item 3). Built like every other section (skills.evidence.view): run- and
session-derived text goes into cells the templates escape, never into prose."""
from __future__ import annotations

import time

from trainops.skills.evidence.model import EvidencePack
from trainops.skills.evidence.view import Cell, Figure, ReportView, Section, Table, build, md_text

WHO = {"planner": "offline planner", "model": "model", "human": "human steer", "unrecorded": "not on record"}


def _seq(seq: int | None) -> Cell:
    return Cell("none" if seq is None else str(seq), "number" if seq is not None else "bad")


def section(pack: EvidencePack) -> Section | None:
    """The steps S1..S6 and the choices; None for a pack built without an SOP session."""
    if not pack.sop_steps and not pack.choices:
        return None
    steps = Table(["step", "tool", "recorded", "called by", "audit entry", "outcome entry", "result", "check"], [
        [Cell(s.step), Cell(s.tool, "code"), Cell(time.strftime("%H:%M:%S UTC", time.gmtime(s.at))),
         Cell(s.called_by or "no audit entry", "code" if s.called_by else "bad"), _seq(s.audit_seq),
         Cell("written after the pack" if s.step == "S6" and s.outcome_seq is None else
              "none" if s.outcome_seq is None else str(s.outcome_seq)),
         Cell(s.result), Cell("audited" if s.audited else f"NOT AUDITED: {s.note}", "text" if s.audited else "bad")]
        for s in pack.sop_steps], beneath=(6,))
    chosen = Table(["choice", "what", "order", "chosen by", "caller", "call's audit entry", "reason"], [
        [Cell(c.kind), Cell(c.subject, "code"), Cell("not run" if c.order is None and c.kind == "arm" else
                                                     "" if c.order is None else str(c.order)),
         Cell(WHO[c.chosen_by]), Cell(c.caller or "no audit entry", "code" if c.caller else "bad"),
         _seq(c.audit_seq), Cell(c.reason)]
        for c in pack.choices], beneath=(6,))
    notes = [s for s in pack.sop_steps if s.step == "S6" and s.note]
    return Section("trail", "SOP trail: each step's call and who chose what",
                   paragraphs=["Each step as the SOP session recorded it, checked against the audit log's entry of "
                               "the call that ran it (`trainops audit verify` checks the chain). A step whose call "
                               "the log does not hold as recorded is a blocker."],
                   tables=[t for t in (steps, chosen) if t.rows],
                   bullets=[f"S6: {md_text(notes[0].note)}."] if notes and notes[0].audited else [])


def report_view(pack: EvidencePack, figures: list[Figure] = ()) -> ReportView:
    """The report's view (skills.evidence.view.build) with the SOP trail after the evidence section."""
    view = build(pack, figures)
    trail = section(pack)
    if trail is not None:
        keys = [s.key for s in view.sections]
        view.sections.insert(keys.index("s6") + 1 if "s6" in keys else len(keys), trail)
    return view

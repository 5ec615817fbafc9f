"""The SOP's trail for the pack (issue 40 item 3): each step the session records, checked against
the audit line of the call that ran it, and each choice with who made it and why.

The session is a tripwire, not proof (skills.sop_session): anything that can append to the audit
log can bind a session it wrote by hand. So each step is believed only as far as the audit log
holds its call: an intent entry of the same tool, by the same caller, on the same session, in the
step's order, with the session record written during that call and an outcome that says the call
finished. A step that fails any of these is listed with what was wrong, and the pack is not a pass
(skills.evidence.pack.decide). S6 is the call building the pack: its intent is in the log, its
outcome is written after the pack, and the row says so.
"""
from __future__ import annotations

import time
from typing import Any

from trainops.skills.evidence.steps import ChosenBy, PackChoice, PackStep
from trainops.skills.sop_session import SESSION_KIND, SopSession, Steer, StepLog
from trainops.tools.context import effective_context
from trainops.tools.governance import audit
from trainops.tools.governance.gate import open_intent


def chooser(actor: str) -> ChosenBy:
    """Who chose, from the caller the audit log names: a skill is the offline plan walking the SOP
    (for whoever ran it), the agent is the model, the operator is a human's steer."""
    if not actor:
        return "unrecorded"
    if actor.startswith("skill:"):
        return "planner"
    return "model" if actor == "agent" else "human"


def _declarer(actor: str) -> ChosenBy:
    """Who named an arm or drill in the declaration: the principal the S1 call ran for."""
    return "model" if actor.endswith("agent") else "human"


class _Log:
    """The audit entries the trail reads, indexed once."""

    def __init__(self, session_id: str, entries: list[dict[str, Any]]):
        self.intents = {e.get("hash"): e for e in entries if e.get("kind") == "intent"}
        self.outcomes = {e.get("intent"): e for e in entries if e.get("kind") == "tool_call" and e.get("intent")}
        self.bound = {(e.get("call"), e.get("step")) for e in entries
                      if e.get("kind") == SESSION_KIND and e.get("record") == session_id}


def _problems(log: StepLog, entry: dict[str, Any] | None, session_id: str, after_seq: int) -> list[str]:
    if not log.call:
        return ["the session names no audited call for it: it was recorded outside the gate"]
    if entry is None:
        return [f"the audit log has no call {log.call[:12]}: the step's record was not written by an audited call"]
    problems = []
    if entry.get("tool") != log.tool:
        problems.append(f"audit entry {entry.get('seq')} is a call of {entry.get('tool')}, not {log.tool}")
    if entry.get("actor") != log.by:
        problems.append(f"the session says {log.by!r} called it, audit entry {entry.get('seq')} says "
                        f"{entry.get('actor')!r}")
    called_on = (entry.get("input") or {}).get("session")
    if log.step != "S1" and called_on != session_id:
        problems.append(f"audit entry {entry.get('seq')} is a call on session {called_on!r}")
    if int(entry.get("seq") or 0) <= after_seq:
        problems.append(f"out of order: its call (entry {entry.get('seq')}) comes before the step recorded ahead "
                        f"of it (entry {after_seq})")
    return problems


def _row(log: StepLog, entry: dict[str, Any] | None, problems: list[str], outcome_seq: int | None,
         note: str = "") -> PackStep:
    return PackStep(step=log.step, tool=log.tool, at=log.at, result=log.result, runs=log.runs,
                    called_by=str(entry.get("actor", "")) if entry else "",
                    audit_seq=entry.get("seq") if entry else None,
                    audit_hash=str(entry.get("hash", "")) if entry else "",
                    outcome_seq=outcome_seq, audited=not problems, note="; ".join(problems) or note)


def steps(session: SopSession, entries: list[dict[str, Any]], current_call: str | None) -> list[PackStep]:
    """Each step the session records, then S6 (`current_call`: this pack's own call), each against
    the audit log's `entries`."""
    index, rows, after_seq = _Log(session.session_id, entries), [], 0
    for log in (s for s in session.steps if s.step != "S6"):
        entry = index.intents.get(log.call) if log.call else None
        problems = _problems(log, entry, session.session_id, after_seq)
        outcome = index.outcomes.get(log.call) if entry else None
        if entry and (log.call, log.step) not in index.bound:
            problems.append(f"no session record was written during call {entry.get('seq')}")
        if entry and outcome is None:
            problems.append(f"call {entry.get('seq')} has no outcome entry: it did not finish")
        elif outcome is not None and not outcome.get("ok"):
            problems.append(f"call {entry.get('seq')} ended in an error (outcome entry {outcome.get('seq')})")
        rows.append(_row(log, entry, problems, outcome.get("seq") if outcome else None))
        after_seq = max(after_seq, int(entry.get("seq") or 0)) if entry else after_seq
    own = StepLog(step="S6", tool="sop_pack", at=time.time(), result="this pack", by=effective_context(None).label,
                  call=current_call or "")
    entry = index.intents.get(current_call) if current_call else None
    rows.append(_row(own, entry, _problems(own, entry, session.session_id, after_seq), None,
                     note="this call: the pack is built inside it, so its outcome entry is written after the pack"))
    return rows


def for_pack(session: SopSession) -> list[PackStep]:
    """The steps of `session` against the workspace's audit log, S6 being the call now running."""
    return steps(session, audit.read(), open_intent())


def _steer(session: SopSession, change: str, value: str) -> Steer | None:
    return next((s for s in session.steers if (s.change, s.value) == (change, value)), None)


def _steered(steer: Steer) -> tuple[ChosenBy, str]:
    """Who chose by a steer, and the reason it gave: a human's own, or one a human approved, is the
    human's; the agent's steer without an approval is the model's."""
    return ("human" if steer.by_a_human else "model"), f"a steer by {steer.by} added it: {steer.reason}"


def _given(caller: str, tool: str, reason: str) -> str:
    """What a caller's own call says of its choice: the reason it gave with it, if any."""
    return f"{caller} called {tool} with it, " + (f"giving the reason: {reason}" if reason else "giving no reason")


def _arm_reason(arm: str, session: SopSession, chosen_by: ChosenBy, caller: str, reason: str) -> str:
    design = {a.arm: a for a in session.design}
    ranked = (f"S3 ranked it {design[arm].rank} of {len(design)}: {design[arm].reason}" if arm in design
              else "not among S3's ranked arms")
    if caller.startswith("skill:") and arm in session.settings.knobs:
        return f"named in the declaration (knobs={', '.join(session.settings.knobs)}); its place in the order: {ranked}"
    if chosen_by == "planner":
        return ranked
    if chosen_by == "unrecorded":
        return f"no audited sop_arm call ran it; {ranked}"
    return f"{_given(caller, 'sop_arm', reason)}; {ranked}"


def _drill_reason(fault: str, session: SopSession, chosen_by: ChosenBy, caller: str, reason: str) -> str:
    if chosen_by == "unrecorded":
        return "no audited sop_drill call ran it"
    if chosen_by != "planner":
        return _given(caller, "sop_drill", reason)
    if fault in session.settings.faults:
        return f"named in the declaration (faults={', '.join(session.settings.faults)})"
    quick = ", the quick SOP drills its first" if session.settings.quick else ""
    return f"the {session.settings.framework} framework's default drill set{quick}"


def _stop_reason(rung) -> str:
    row = rung.row
    if row.stop is not None:
        return row.stop.reason
    return (f"no gain at the first rung ({row.scale}): {row.verdict}, {row.mfu_change_pct:+.1f}% against "
            f"±{row.noise_band_pct:.1f}%; nothing to roll out, the ladder ends here")


def _padded(items: list, count: int, filler) -> list:
    """`count` items in order, `filler` standing in for the ones missing at the end."""
    return [*items[:count], *[filler] * max(0, count - len(items))]


def _aligned(calls: list[PackStep], count: int) -> list[PackStep]:
    """One step row per arm rung (or drill), in order; a rung the session holds without a step call
    of its own gets an unaudited row, so its choice shows as unrecorded rather than vanishing."""
    missing = PackStep(step="S4", tool="", at=0.0, result="", called_by="", audit_seq=None, audit_hash="",
                       outcome_seq=None, audited=False)
    return _padded(calls, count, missing)


def _reasons(session: SopSession, step: str, count: int) -> list[str]:
    """The reason the caller gave with each S4 (or S5) call the session logged, one per arm rung (or
    drill), in order, aligned as `_aligned` aligns the calls."""
    return _padded([log.reason for log in session.steps if log.step == step], count, "")


def choices(session: SopSession, rows: list[PackStep]) -> list[PackChoice]:
    """Who chose each arm, the order they ran in, each drill and each rollout stop, with the reason:
    from the session's design and the callers the audit log names for the calls that ran them."""
    arm_calls = _aligned([s for s in rows if s.step == "S4"], len(session.arms))
    drill_calls = _aligned([s for s in rows if s.step == "S5"], len(session.drilled))
    design_call = next((s for s in rows if s.step == "S3"), None)
    declare_call = next((s for s in rows if s.step == "S1"), None)
    out, first_call = [], {}
    for rung, call, given in zip(session.arms, arm_calls, _reasons(session, "S4", len(session.arms)), strict=True):
        first_call.setdefault(rung.arm, (call, given))
    for order, (arm, (call, given)) in enumerate(first_call.items(), start=1):
        chosen_by = chooser(call.called_by)
        if chosen_by == "planner" and arm in session.settings.knobs and declare_call:
            chosen_by = _declarer(declare_call.called_by)
        reason = _arm_reason(arm, session, chosen_by, call.called_by, given)
        if (steer := _steer(session, "add_arm", arm)) is not None and call.called_by:
            chosen_by, reason = _steered(steer)
        out.append(PackChoice(kind="arm", subject=arm, order=order, chosen_by=chosen_by, caller=call.called_by,
                              reason=reason, audit_seq=call.audit_seq))
    for designed in (a for a in session.design if a.arm not in first_call):
        why = (" (no sop_arm call ran it)" if designed.arm in session.settings.plan(session.design)
               else " (the quick SOP runs the first-ranked arm only)")
        caller = design_call.called_by if design_call else ""
        out.append(PackChoice(kind="arm", subject=designed.arm, order=None, chosen_by=chooser(caller), caller=caller,
                              reason=f"S3 ranked it {designed.rank} of {len(session.design)}: {designed.reason}; "
                                     f"not run{why}", audit_seq=design_call.audit_seq if design_call else None))
    drill_reasons = _reasons(session, "S5", len(session.drilled))
    for order, (fault, call, given) in enumerate(zip(session.drilled, drill_calls, drill_reasons, strict=True),
                                                 start=1):
        chosen_by = chooser(call.called_by)
        if chosen_by == "planner" and fault in session.settings.faults and declare_call:
            chosen_by = _declarer(declare_call.called_by)
        reason = _drill_reason(fault, session, chooser(call.called_by), call.called_by, given)
        if (steer := _steer(session, "add_drill", fault)) is not None and call.called_by:
            chosen_by, reason = _steered(steer)
        out.append(PackChoice(kind="drill", subject=fault, order=order, chosen_by=chosen_by, caller=call.called_by,
                              reason=reason, audit_seq=call.audit_seq))
    for rung, call in zip(session.arms, arm_calls, strict=True):
        if rung.stopped:
            out.append(PackChoice(kind="stop", subject=f"{rung.arm} at {rung.row.scale}", order=None,
                                  chosen_by="planner" if call.called_by else "unrecorded", caller=call.called_by,
                                  reason=_stop_reason(rung),
                                  audit_seq=call.audit_seq))
    for steer in (s for s in session.steers if s.change not in ("add_arm", "add_drill")):
        out.append(PackChoice(kind="steer", subject=f"{steer.change} {steer.value}", order=None,
                              chosen_by=_steered(steer)[0], caller=steer.by, reason=steer.reason, audit_seq=None))
    return out

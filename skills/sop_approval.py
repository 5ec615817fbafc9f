"""One human approval per SOP, bound to what the human was shown.

An agent's `sop_declare` (S1) waits for a human like any call that changes the world; the approver
sees the declared settings (config, quick, arms, drills). Once that exact declaration ran under a
human's token, the session records the approval's call id (`SopSession.approved_call`), and each
later step on that session names it to the gate (`declaration_approval`, declared with the step
tools as `approval_from`), so the agent walks S2..S6 as its own calls without a token per step. The
claim counts only when: the session is the record trainops wrote (bound to the audit chain), the
call id is the one of a `sop_declare` with exactly the session's settings, the gate finds a human's
token for that call spent in the audit log (tools.governance.gate.inherited_approval), and the step
stays inside the declared plan (its arm among the declared or designed ones, its drill among the
declared drills, the declared repeats, or one a human's steer added). Anything else, a steer
included, waits for its own approval.
"""
from __future__ import annotations

from trainops.skills.sop_session import SopSession, load
from trainops.tools.context import active_call
from trainops.tools.governance.queue import call_id

DECLARE_TOOL = "sop_declare"


def approval_of_declaration(settings_json: dict) -> str | None:
    """Inside `sop_declare`: the call id of the human approval this declaration runs under, when it
    is the approval of this very declaration (not an outer call's, nor another input's)."""
    active = active_call()
    approved = active.approved_call if active is not None else None
    return approved if approved is not None and approved == call_id(DECLARE_TOOL, settings_json) else None


def _within_plan(session: SopSession, inp) -> bool:
    settings = session.settings
    if getattr(inp, "repeats", None) not in (None, settings.repeats()):
        return False
    if getattr(inp, "knobs", None) and not set(inp.knobs) <= set(settings.candidates()):
        return False
    steered = {s.value for s in session.steers if s.by_a_human and s.change in ("add_arm", "add_drill")}
    if hasattr(inp, "arm") and inp.arm not in {a.arm for a in session.design} | set(settings.candidates()) | steered:
        return False
    return not hasattr(inp, "fault") or inp.fault in {*settings.drills(), *steered}


def declaration_approval(inp) -> str | None:
    """The call id of the human approval of the session's declaration that this step runs under, or
    None: the step then needs its own approval (see the module docstring for when it counts)."""
    try:
        session = load(inp.session)
    except ValueError:
        return None
    approved = session.approved_call
    if approved is None or approved != call_id(DECLARE_TOOL, session.settings.model_dump(mode="json")):
        return None
    return approved if _within_plan(session, inp) else None

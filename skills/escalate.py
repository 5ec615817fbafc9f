"""Fired escalation rules handed to a human: each becomes a pending `acknowledge_escalation`
(the approval queue, R-SEC-4) and a line the pack carries in `awaiting_human`."""
from __future__ import annotations

from trainops.tools.base import CallContext
from trainops.tools.calls import call
from trainops.tools.governance.escalation import Escalation, human_item
from trainops.tools.governance.gate import GateRefused


def hand_to_human(esc: Escalation, subject: str, ctx: CallContext | None = None,
                  results: list[str] | None = None) -> str | None:
    """Queue the escalation as a pending approval; returns its id (None: the call ran under a
    token, so a human already took it)."""
    try:
        call("acknowledge_escalation", {**esc.model_dump(), "subject": subject, "results": results or []}, ctx)
    except GateRefused as refused:
        if refused.pending_id is None:
            raise
        return refused.pending_id
    return None


def human_items(escalations: list[Escalation], subject: str, ctx: CallContext | None = None) -> list[str]:
    """Each escalation queued for a human, as the pack's line for it (naming its pending approval)."""
    return [human_item(esc, hand_to_human(esc, subject, ctx)) for esc in escalations]

"""The gate as the agent sees it: check, pend, approve, reject, record. Nothing else.

The agent graph asks the gate what a proposed call needs before it runs anything, queues the
call for a human when the gate says so, and turns a human's decision into a token or a refusal;
it never touches tokens or the audit log itself, and it knows a refusal by its class, `Refused`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel

from trainops.tools.base import CallContext, ToolSpec
from trainops.tools.governance import audit, gate, queue, signing, tokens
from trainops.tools.governance.gate import GateRefused as Refused

__all__ = ["Refused", "check", "pend", "approve", "reject", "record"]


def check(spec: ToolSpec, inp: BaseModel, ctx: CallContext) -> str | None:
    """Raise `Refused` for what the gate refuses outright (forbidden, invalid input, another
    tenant's path); otherwise the AGENTS.md rule under which a human must approve, or None."""
    gate.check_input(spec, inp, ctx)
    return gate.approval_rule(spec, ctx)


def pend(spec: ToolSpec, inp: BaseModel, ctx: CallContext) -> str:
    """Queue the call for a human (`trainops approvals`); the same call always gets the same id."""
    return queue.record_pending(spec.name, inp, ctx.label).id


def approve(spec: ToolSpec, inp: BaseModel, ctx: CallContext, keys: Sequence[Path | None] = (None,)) -> str:
    """Humans approve this exact call by signing it, each with their own key (None: the ssh-agent's),
    the second and later co-signing (a tool may need two approvers): the single-use token that lets
    it through the gate. Raises `signing.SigningError` when a key is not an approver's."""
    pending_id, token = pend(spec, inp, ctx), None
    for key in keys:
        token = tokens.approve(pending_id, key=key, cosign=token)
    if token is None:
        raise ValueError("no approver signed: pass at least one key (None for the ssh-agent's)")
    return token


def reject(pending_id: str, ctx: CallContext, note: str, key: Path | None = None) -> None:
    """A human said no: signed with their key when one is given, else the agent takes the call
    back (saying no needs no signature); either way its tokens are revoked."""
    try:
        if key is not None:
            queue.reject_pending(pending_id, note, key)
        else:
            queue.withdraw(pending_id, ctx.label, note)
    except signing.SigningError:
        raise
    except ValueError:
        pass  # already decided outside the thread (`trainops approve` / `trainops reject`)


def record(spec: ToolSpec, decision: Literal["approved", "edited", "rejected"], approver: str,
           ctx: CallContext, comment: Any = None) -> None:
    """The human's decision on an agent's call, in the audit log."""
    audit.append("approval", subject="agent_call", tool=spec.name, approver=approver, decision=decision,
                 actor=ctx.label, thread_id=ctx.thread_id, comment=comment)

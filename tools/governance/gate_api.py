"""The gate as the agent sees it: check, pend, approve, reject, record, and the queued call a
human is shown (`queued`, `input_sha256`). Nothing else.

The agent graph asks the gate what a proposed call needs before it runs anything, queues the
call for a human when the gate says so, and turns a human's decision into a token or a refusal;
it never touches tokens or the audit log itself, and it knows a refusal by its class, `Refused`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel

from trainops.tools.base import ToolSpec
from trainops.tools.context import CallContext
from trainops.tools.governance import audit, gate, queue, signing, tokens
from trainops.tools.governance.gate import GateRefused as Refused

__all__ = ["Refused", "NotQueued", "SignableCall", "check", "pend", "queued", "input_sha256", "approve", "reject",
           "record"]

NotQueued = queue.NotQueued
SignableCall = queue.SignableCall


def check(spec: ToolSpec, inp: BaseModel, ctx: CallContext) -> str | None:
    """Raise `Refused` for what the gate refuses outright (forbidden, invalid input, another
    tenant's path); otherwise the AGENTS.md rule under which a human must approve, or None (also
    where the call runs under an earlier human approval: an SOP step of an approved declaration)."""
    gate.check_input(spec, inp, ctx)
    rule_id = gate.approval_rule(spec, ctx)
    return None if rule_id and gate.inherited_approval(spec, inp) else rule_id


def pend(spec: ToolSpec, inp: BaseModel, ctx: CallContext) -> str:
    """Queue the call for a human (`trainops approvals`); the same call always gets the same id."""
    return queue.record_pending(spec.name, inp, ctx.label).id


def queued(pending_id: str) -> queue.SignableCall:
    """The queued call as a human is shown it and signs it (its id re-derived from its bytes);
    ValueError when it is edited, NotQueued when it is no longer queued."""
    return queue.signable(pending_id)


def input_sha256(tool: str, args: dict[str, Any]) -> str:
    """The hash an approval of `tool` called with `args` signs (ValueError: not a valid input)."""
    return queue.input_hash(queue.validated(tool, args))


def approve(spec: ToolSpec, inp: BaseModel, ctx: CallContext, keys: Sequence[Path | None] = (None,)) -> str:
    """Humans approve this exact call by signing it, each with their own key (None: the ssh-agent's),
    the second and later co-signing (a tool may need two approvers): the single-use token that lets
    it through the gate. Raises `signing.SigningError` when a key is not an approver's, ValueError
    when the queue does not hold exactly this call."""
    shown, token = queue.signable(pend(spec, inp, ctx)), None
    if shown.input_sha256 != queue.input_hash(inp):
        raise ValueError(f"queued call {shown.call_id} is not this {spec.name} call: nothing was signed")
    for key in keys:
        token = tokens.approve(shown, key=key, cosign=token)
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

"""The action gate. Every tool call passes `before_call` and `after_call` (trainops.tools.base.call).

Order of checks in `before_call`: forbidden actions (R-SEC-2) are refused outright; then
per-tool input checks and the tenant-isolation check on path fields (R-SEC-3); then, for
irreversible and approval-gated tools, a signed single-use token bound to this exact call
(R-SEC-1, R-SEC-4) — a call without one is queued as a pending approval. Every decision
and every call lands in the hash-chained audit log (R-SEC-5).
"""
from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Literal

from pydantic import BaseModel

from trainops.tools.base import ToolError
from trainops.tools.governance import audit, queue, tokens


class GateRefused(ToolError):
    """The gate said no; `reason` is one of tokens.RefusalReason, `rule_id` the AGENTS.md rule."""

    def __init__(self, tool: str, reason: str, message: str, rule_id: str, pending_id: str | None = None):
        super().__init__(tool, f"refused ({reason}, {rule_id}): {message}")
        self.reason = reason
        self.rule_id = rule_id
        self.pending_id = pending_id


@dataclass(frozen=True)
class Check:
    """A per-tool input check: `fn(inp)` returns a refusal message, or None to let the call on."""

    tool: str
    rule_id: str
    kind: Literal["forbidden", "invalid_input"]  # forbidden: refused outright, before any token
    fn: Callable[[BaseModel], str | None]


_CHECKS: list[Check] = []
PATH_FIELD_SUFFIXES = ("_path", "_dir", "folder")


def register_check(tool: str, rule_id: str, kind: Literal["forbidden", "invalid_input"] = "invalid_input"):
    """Decorator: attach an input check to `tool` (used by tool modules for their own rules)."""
    if kind not in ("forbidden", "invalid_input"):
        raise ValueError(f"kind={kind!r} is not valid: use 'forbidden' or 'invalid_input'")

    def add(fn: Callable[[BaseModel], str | None]):
        if not any(c.tool == tool and c.fn is fn for c in _CHECKS):
            _CHECKS.append(Check(tool, rule_id, kind, fn))
        return fn

    return add


def checks_for(tool: str) -> list[Check]:
    return [c for c in _CHECKS if c.tool == tool]


def _refuse(spec, inp, ctx, reason: str, rule_id: str, message: str, pending_id: str | None = None):
    try:
        audit.append("gate", tool=spec.name, risk=spec.risk, actor=ctx.actor, decision="refused", reason=reason,
                     rule_id=rule_id, message=message, input_sha256=tokens.input_hash(inp), pending_id=pending_id)
    except audit.AuditUnavailable as exc:
        message = f"{message}; the refusal itself was not audited: {exc}"
    raise GateRefused(spec.name, reason, message, rule_id, pending_id)


def _tenant_path_problem(inp: BaseModel) -> str | None:
    tenant = getattr(inp, "tenant", None)
    if not isinstance(tenant, str) or not tenant:
        return None
    from trainops.tools.tenancy import check_tenant_path

    for name, value in inp:
        if value is not None and name.endswith(PATH_FIELD_SUFFIXES):
            try:
                check_tenant_path(tenant, str(value))
            except ValueError as exc:
                return f"{name}: {exc}"
    return None


def needs_approval(spec) -> bool:
    return spec.approval_required or spec.risk == "irreversible"


def check_input(spec, inp: BaseModel, ctx) -> None:
    """Forbidden-action, per-tool and tenant-path checks, without the token step: lets the
    agent refuse a call before it asks a human to approve something the gate would refuse."""
    checks = checks_for(spec.name)
    for check in (c for c in checks if c.kind == "forbidden"):
        message = check.fn(inp)
        if message:
            _refuse(spec, inp, ctx, "forbidden", check.rule_id, message)
    for check in (c for c in checks if c.kind == "invalid_input"):
        message = check.fn(inp)
        if message:
            _refuse(spec, inp, ctx, "invalid_input", check.rule_id, message)
    problem = _tenant_path_problem(inp)
    if problem:
        _refuse(spec, inp, ctx, "invalid_input", "R-SEC-3", problem)


def before_call(spec, inp: BaseModel, ctx) -> None:
    check_input(spec, inp, ctx)
    if not needs_approval(spec):
        _write_intent(spec, inp, ctx)
        return
    rule_id = "R-SEC-1" if spec.risk != "irreversible" and "tenant-governance" in spec.tags else "R-SEC-4"
    if not ctx.approval_token:
        item = queue.record_pending(spec.name, inp, ctx.actor)
        _refuse(spec, inp, ctx, "missing_token", rule_id,
                f"{spec.name} needs a human approval; queued as pending approval {item.id} — approve with "
                f"`trainops approve --pending {item.id}` (signed with your SSH key) and pass the token", pending_id=item.id)
    try:
        payload = tokens.consume(ctx.approval_token, spec.name, inp)
    except tokens.TokenRefused as exc:
        _refuse(spec, inp, ctx, exc.reason, rule_id, str(exc))
    audit.append("gate", tool=spec.name, risk=spec.risk, actor=ctx.actor, decision="allowed", rule_id=rule_id,
                 approver=payload.get("approver"), input_sha256=tokens.input_hash(inp))
    _write_intent(spec, inp, ctx)


# The intent ids of the calls now running in this context, innermost last: a tool that calls
# tools (run_sop) nests, and each after_call closes the intent its before_call opened.
_OPEN_INTENTS: ContextVar[tuple[str | None, ...]] = ContextVar("open_intents", default=())


def _write_intent(spec, inp: BaseModel, ctx) -> None:
    """Fail-closed audit (R-SEC-5): a call that changes the world acts only once its intent is
    written; the last step of before_call, so every intent opened is closed by after_call."""
    intent_id = None
    if spec.risk != "read":
        try:
            intent_id = audit.intent(spec.name, spec.risk, ctx.actor, tokens.input_hash(inp),
                                     thread_id=ctx.thread_id, input=inp.model_dump(mode="json"))
        except audit.AuditUnavailable as exc:
            raise GateRefused(spec.name, "audit_unavailable", f"the call was not run: {exc}", "R-SEC-5") from None
    _OPEN_INTENTS.set(_OPEN_INTENTS.get() + (intent_id,))


def after_call(spec, inp: BaseModel, ctx, *, started: float, output: BaseModel | None, error: Exception | None) -> None:
    open_intents = _OPEN_INTENTS.get()
    intent_id = open_intents[-1] if open_intents else None
    _OPEN_INTENTS.set(open_intents[:-1])
    fields = dict(tool=spec.name, risk=spec.risk, actor=ctx.actor, thread_id=ctx.thread_id,
                  input_sha256=tokens.input_hash(inp), elapsed_s=round(time.time() - started, 6),
                  ok=error is None, error=None if error is None else str(error))
    try:
        if intent_id is None:
            audit.append("tool_call", durable=False, **fields)
        else:
            audit.outcome(intent_id, input=inp.model_dump(mode="json"), **fields)
    except audit.AuditUnavailable as exc:
        raise ToolError(spec.name, f"the call ran (intent {intent_id or 'none: a read'}) but its outcome could "
                                   f"not be audited: {exc}") from None

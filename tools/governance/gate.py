"""The action gate. Every tool call passes `before_call` and `after_call` (trainops.tools.calls.run_call),
whichever path it came by: the CLI, a skill, the agent graph, LangChain tools, the Python registry.

Order of checks in `before_call`: the input must read back as itself from its JSON (a model built
without validation is validated here; R-TOOL-1); forbidden actions (R-SEC-2) are refused outright;
then the tool's own input checks (declared with it: `@tool(..., checks=...)`) and tenancy (every
tenant id in full, path fields inside the tenant's root: R-SEC-3) and the change windows (a
policy, quota or upgrade change outside every `[governance] change_windows` window that is not
marked emergency: R-CHG-1); all of it before a call is
queued, so no human is asked to sign a call that cannot run; then, when
`approval_rule` says a human must decide (irreversible and approval-gated tools always; any
`mutate` tool the agent calls, or the operator too where `[governance] operator_needs_approval`),
a signed single-use token bound to this exact call (R-SEC-1, R-SEC-4) — a call without one is
queued as a pending approval. Calls nested inside a human-approved call run under that approval;
so does a call whose tool names the earlier approval its input belongs to (`approval_from`: an SOP
step on a session whose S1 declaration a human approved), once the audit log shows a human's token
for that call was spent. Neither covers an approval-gated or irreversible tool. Every decision and
every call lands in the hash-chained audit log (R-SEC-5).
"""
from __future__ import annotations

import time
from contextvars import ContextVar

from pydantic import BaseModel

from trainops.settings import SettingsError, table
from trainops.tools.base import ToolError
from trainops.tools.changes.tenancy import check_tenant_path, scope_problem, tenant_ids
from trainops.tools.context import active_call
from trainops.tools.governance import audit, queue, tokens, windows
from trainops.tools.ids import tenant_id_problem


class GateRefused(ToolError):
    """The gate said no; `reason` is one of tokens.RefusalReason, `rule_id` the AGENTS.md rule."""
    def __init__(self, tool: str, reason: str, message: str, rule_id: str, pending_id: str | None = None):
        super().__init__(tool, f"refused ({reason}, {rule_id}): {message}")
        self.reason = reason
        self.rule_id = rule_id
        self.pending_id = pending_id


PATH_FIELD_SUFFIXES = ("_path", "_dir", "folder")


def _refuse(spec, inp, ctx, reason: str, rule_id: str, message: str, pending_id: str | None = None):
    try:
        audit.append("gate", tool=spec.name, risk=spec.risk, actor=ctx.label, decision="refused", reason=reason,
                     rule_id=rule_id, message=message, input_sha256=tokens.input_hash(inp), pending_id=pending_id)
    except audit.AuditUnavailable as exc:
        message = f"{message}; the refusal itself was not audited: {exc}"
    raise GateRefused(spec.name, reason, message, rule_id, pending_id)


def _tenant_path_problem(inp: BaseModel) -> str | None:
    for tenant in tenant_ids(inp):
        if problem := tenant_id_problem(tenant):
            return problem
    tenant = getattr(inp, "tenant", None)
    if not isinstance(tenant, str) or not tenant:
        return None
    for name, value in inp:
        if value is not None and name.endswith(PATH_FIELD_SUFFIXES):
            try:
                check_tenant_path(tenant, str(value))
            except ValueError as exc:
                return f"{name}: {exc}"
    return None


def operator_needs_approval() -> bool:
    """`[governance] operator_needs_approval = true` in a settings file the user trusts: on hosts
    where agents have shells, a CLI call may be an agent's, so the operator's calls wait too."""
    values, sources = table("governance", trusted_only=True)
    value = values.get("operator_needs_approval", False)
    if not isinstance(value, bool):
        raise SettingsError(f"operator_needs_approval in {sources.get('operator_needs_approval')} is {value!r}: "
                            "write true or false")
    return value


def approval_rule(spec, ctx) -> str | None:
    """The AGENTS.md rule under which this call needs a human-signed token, or None. The one place
    that decides what waits for a human, for every path a tool is called through: approval-gated
    and irreversible tools always; any tool of risk `mutate` or higher when the agent (or a skill
    run for it) calls it, or an operator on a host that says operators need approval too."""
    if spec.approval_required or spec.risk == "irreversible":
        return "R-SEC-1" if spec.risk != "irreversible" and "tenant-governance" in spec.tags else "R-SEC-4"
    if spec.risk == "read":
        return None
    if ctx.principal == "agent" or operator_needs_approval():
        return "R-SEC-4"
    return None


def needs_approval(spec, ctx) -> bool:
    """Whether this call, by this caller, waits for a human-signed token (ignoring a grant inherited
    from an earlier approval: see `inherited_approval`)."""
    return approval_rule(spec, ctx) is not None


def inherited_approval(spec, inp: BaseModel) -> str | None:
    """The call id of the human approval this call runs under without a token of its own, never for
    an approval-gated or irreversible tool: the approved call it runs inside (a skill's steps), else
    the earlier approval its tool's `approval_from` names for this input, which counts only where the
    audit log shows a human's token for that very call was spent (a claim in a record is not one)."""
    if spec.approval_required or spec.risk == "irreversible":
        return None
    active = active_call()
    if active is not None and active.approved_call is not None:
        return active.approved_call
    claimed = spec.approval_from(inp) if spec.approval_from is not None else None
    if claimed and any(e.get("kind") == "token_spent" and e.get("call_id") == claimed for e in audit.read()):
        return claimed
    return None


def check_input(spec, inp: BaseModel, ctx) -> None:
    """Input validation, forbidden-action, per-tool and tenancy checks, without the token step: the
    gate refuses here, before any call is queued, what could never run once a human signed it."""
    problem = queue.round_trip_problem(spec.name, inp, spec.Input)
    if problem:
        _refuse(spec, inp, ctx, "invalid_input", "R-TOOL-1", problem)
    for check in (c for c in spec.checks if c.kind == "forbidden"):
        message = check.fn(inp)
        if message:
            _refuse(spec, inp, ctx, "forbidden", check.rule_id, message)
    for check in (c for c in spec.checks if c.kind == "invalid_input"):
        message = check.fn(inp)
        if message:
            _refuse(spec, inp, ctx, "invalid_input", check.rule_id, message)
    problem = _tenant_path_problem(inp) or scope_problem(inp)
    if problem:
        _refuse(spec, inp, ctx, "invalid_input", "R-SEC-3", problem)
    if "change-window" in spec.tags:
        problem = windows.refusal(spec.name, tokens.is_emergency(spec.name, inp))
        if problem:
            _refuse(spec, inp, ctx, "outside_change_window", "R-CHG-1", problem)


def before_call(spec, inp: BaseModel, ctx) -> str | None:
    """Input checks, then the token step when `approval_rule` says a human must decide. Returns
    the call id of the human approval this call runs under (its own token's, or an approved outer
    call's), which calls nested inside it inherit; None when no human approved it."""
    _require_audit(spec)
    check_input(spec, inp, ctx)
    rule_id = approval_rule(spec, ctx)
    if rule_id is None:
        _write_intent(spec, inp, ctx)
        return inherited_approval(spec, inp)
    if not ctx.approval_token and (inherited := inherited_approval(spec, inp)):
        audit.append("gate", tool=spec.name, risk=spec.risk, actor=ctx.label, decision="allowed", rule_id=rule_id,
                     under_approved_call=inherited, input_sha256=tokens.input_hash(inp))
        _write_intent(spec, inp, ctx)
        return inherited
    if not ctx.approval_token:
        item = queue.record_pending(spec.name, inp, ctx.label)
        _refuse(spec, inp, ctx, "missing_token", rule_id,
                f"{spec.name} called by {ctx.label} needs a human approval; queued as pending approval {item.id} — "
                f"approve with `trainops approve --pending {item.id}` (signed with your SSH key) and pass the token",
                pending_id=item.id)
    try:
        payload = tokens.consume(ctx.approval_token, spec.name, inp)
    except tokens.TokenRefused as exc:
        _refuse(spec, inp, ctx, exc.reason, rule_id, str(exc))
    audit.append("gate", tool=spec.name, risk=spec.risk, actor=ctx.label, decision="allowed", rule_id=rule_id,
                 approver=payload.get("approver"), input_sha256=tokens.input_hash(inp))
    _write_intent(spec, inp, ctx)
    return tokens.call_id(spec.name, inp)


def _require_audit(spec) -> None:
    """Fail closed before any step that audits (a refusal, the queue, a token): a log that cannot
    take the next entry refuses the call, whoever makes it."""
    try:
        audit.check_appendable()
    except audit.AuditUnavailable as exc:
        raise GateRefused(spec.name, "audit_unavailable", f"the call was not run: {exc}", "R-SEC-5") from None


# The intent ids of the calls now running in this context, innermost last: a tool that calls
# tools (a skill's step) nests, and each after_call closes the intent its before_call opened.
_OPEN_INTENTS: ContextVar[tuple[str | None, ...]] = ContextVar("open_intents", default=())


def open_intent() -> str | None:
    """The intent id (audit entry hash) of the innermost call now running, None outside the gate or
    for a read: what a step records so its result can be matched to the audit line of its call."""
    open_intents = _OPEN_INTENTS.get()
    return open_intents[-1] if open_intents else None


def _write_intent(spec, inp: BaseModel, ctx) -> None:
    """Fail-closed audit (R-SEC-5): a call that changes the world acts only once its intent is
    written; the last step of before_call, so every intent opened is closed by after_call."""
    intent_id = None
    if spec.risk != "read":
        try:
            intent_id = audit.intent(spec.name, spec.risk, ctx.label, tokens.input_hash(inp),
                                     thread_id=ctx.thread_id, input=inp.model_dump(mode="json"))
        except audit.AuditUnavailable as exc:
            raise GateRefused(spec.name, "audit_unavailable", f"the call was not run: {exc}", "R-SEC-5") from None
    _OPEN_INTENTS.set(_OPEN_INTENTS.get() + (intent_id,))


def after_call(spec, inp: BaseModel, ctx, *, started: float, output: BaseModel | None, error: Exception | None) -> None:
    open_intents = _OPEN_INTENTS.get()
    intent_id = open_intents[-1] if open_intents else None
    _OPEN_INTENTS.set(open_intents[:-1])
    fields = dict(tool=spec.name, risk=spec.risk, actor=ctx.label, thread_id=ctx.thread_id,
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

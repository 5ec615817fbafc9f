"""Declaring a tool: one declaration serves Python, the CLI and the agent.

A tool is a typed function: a pydantic `Input`, a pydantic `Output`, a risk class and a
description written for a language model. `@tool` only declares it; `trainops.tools.registry`
lists every tool in one place, and `trainops.tools.calls.run_call` is the one way one runs (through
the governance gate). This module is the contract they share, so it imports nothing of trainops.

Every call carries its actor. A caller that does not say who it is counts as the agent (least
privilege); the CLI runs its commands inside `operator_session()`; a skill acts for whoever ran
it (`ctx.for_skill(name)`), never with more authority. A call made while another tool runs (the
`run_sop` tool running the SOP skill) is held to the stricter of its own actor and the outer one,
and inherits the outer call's human approval, which the gate alone grants.
"""
from __future__ import annotations

import inspect
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Literal, get_type_hints

from pydantic import BaseModel, ValidationError

Risk = Literal["read", "mutate", "irreversible"]
Principal = Literal["operator", "agent"]
CheckKind = Literal["forbidden", "invalid_input"]
ACTOR_PATTERN = re.compile(r"operator|agent|skill:[a-z0-9][a-z0-9-]{0,63}")


class ToolError(Exception):
    """A tool failed in a way the caller should read: names the tool and what to do."""

    def __init__(self, tool: str, message: str):
        super().__init__(f"{tool}: {message}")
        self.tool = tool
        self.message = message


@dataclass(frozen=True)
class InputCheck:
    """A rule the gate applies to a tool's input before the call: `fn(inp)` returns a refusal
    message, or None to let the call on. A `forbidden` check refuses outright, before any token
    step (R-SEC-2); an `invalid_input` one after the forbidden ones."""

    rule_id: str
    fn: Callable[[Any], str | None]
    kind: CheckKind = "invalid_input"

    def __post_init__(self) -> None:
        if self.kind not in ("forbidden", "invalid_input"):
            raise ValueError(f"InputCheck.kind={self.kind!r} is not valid: use 'forbidden' or 'invalid_input'")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    Input: type[BaseModel]
    Output: type[BaseModel]
    risk: Risk
    fn: Callable[[BaseModel], BaseModel]
    approval_required: bool = False
    tags: tuple[str, ...] = ()
    checks: tuple[InputCheck, ...] = ()


@dataclass(frozen=True)
class CallContext:
    """Who is calling and with what authority; filled by the CLI, a skill or the agent.

    `actor` is `operator` (a human at the CLI), `agent`, or `skill:NAME`; a skill also names
    `on_behalf_of`, the principal that ran it, whose authority it has."""

    actor: str = "agent"
    on_behalf_of: Principal | None = None
    approval_token: str | None = None
    thread_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.actor, str) or not ACTOR_PATTERN.fullmatch(self.actor):
            raise ValueError(f"CallContext.actor={self.actor!r} is not valid: use 'operator' (a human at the CLI), "
                             "'agent', or 'skill:NAME' with on_behalf_of='operator'|'agent'")
        is_skill = self.actor.startswith("skill:")
        if is_skill and self.on_behalf_of not in ("operator", "agent"):
            raise ValueError(f"CallContext.on_behalf_of={self.on_behalf_of!r}: a skill acts for someone; "
                             "pass on_behalf_of='operator' or 'agent' (or use ctx.for_skill(name))")
        if not is_skill and self.on_behalf_of is not None:
            raise ValueError(f"CallContext.on_behalf_of={self.on_behalf_of!r} is only for skill actors; "
                             f"{self.actor} acts for itself")

    @property
    def principal(self) -> Principal:
        """Whose authority the call carries: a skill has none of its own."""
        return self.on_behalf_of if self.on_behalf_of else self.actor  # type: ignore[return-value]

    @property
    def label(self) -> str:
        """The actor as the audit log and the pending queue name it."""
        return f"{self.actor} for {self.on_behalf_of}" if self.on_behalf_of else self.actor

    def for_skill(self, name: str) -> CallContext:
        """The context a skill's steps run under: the skill acts for this caller's principal."""
        return CallContext(actor=f"skill:{name}", on_behalf_of=self.principal, thread_id=self.thread_id)


@dataclass(frozen=True)
class ActiveCall:
    """A tool call in progress (or the CLI's operator session): what nested calls inherit."""

    ctx: CallContext
    approved_call: str | None = None  # the call id of a human-approved call this one runs inside


_ACTIVE: ContextVar[ActiveCall | None] = ContextVar("trainops_active_call", default=None)


def active_call() -> ActiveCall | None:
    return _ACTIVE.get()


@contextmanager
def operator_session() -> Iterator[None]:
    """Calls without an explicit context are the operator's: the CLI wraps each command in this."""
    reset = _ACTIVE.set(ActiveCall(CallContext(actor="operator")))
    try:
        yield
    finally:
        _ACTIVE.reset(reset)


@contextmanager
def running(ctx: CallContext, approved_call: str | None) -> Iterator[None]:
    """Mark a call as in progress while its tool runs; used by `trainops.tools.calls.run_call` only."""
    reset = _ACTIVE.set(ActiveCall(replace(ctx, approval_token=None), approved_call))
    try:
        yield
    finally:
        _ACTIVE.reset(reset)


def effective_context(ctx: CallContext | None) -> CallContext:
    """The caller's context held to the stricter of itself and the call it runs inside."""
    active = _ACTIVE.get()
    if ctx is None:
        return active.ctx if active else CallContext()
    if active and active.ctx.principal == "agent" and ctx.principal == "operator":
        if ctx.actor.startswith("skill:"):
            return replace(ctx, on_behalf_of="agent")
        return replace(ctx, actor="agent")
    return ctx


def skill_context(skill: str, ctx: CallContext | None = None) -> CallContext:
    """The context a skill's steps run under: `skill:NAME` for the caller (or, with no caller
    named, for whoever the current session or call belongs to: the agent by default)."""
    return effective_context(ctx).for_skill(skill)


def tool(name: str, *, risk: Risk, approval_required: bool = False, tags: tuple[str, ...] = (),
         checks: tuple[InputCheck, ...] = ()):
    """Declare `fn(inp: Input) -> Output` a tool (its docstring is the model-facing description),
    with the input `checks` the gate applies to it; `fn.tool_spec` carries the declaration for
    `trainops.tools.registry`. Nothing is registered."""

    def declare(fn: Callable[[Any], BaseModel]) -> Callable[[Any], BaseModel]:
        hints = get_type_hints(fn)
        params = list(inspect.signature(fn).parameters)
        if len(params) != 1 or "return" not in hints:
            raise TypeError(f"tool {name}: signature must be fn(inp: Input) -> Output")
        fn.tool_spec = ToolSpec(  # type: ignore[attr-defined]
            name=name,
            description=inspect.cleandoc(fn.__doc__ or "").strip(),
            Input=hints[params[0]],
            Output=hints["return"],
            risk=risk,
            fn=fn,
            approval_required=approval_required or risk == "irreversible",
            tags=tags,
            checks=checks,
        )
        return fn

    return declare


def explain(exc: ValidationError) -> str:
    """One line per invalid field: where, what was wrong, the value seen (or what to add)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "input"
        if err["type"] == "missing":
            parts.append(f"{where}: required field missing: add {where!r}")
        else:
            parts.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)

"""Who is calling, with what authority, and which tool registry serves the call: the context
every tool call runs in. Standard library only, so the command line sets it up at start-up
without loading pydantic or a single tool.

Every call carries its actor. A caller that does not say who it is counts as the agent (least
privilege); the CLI runs its commands inside `operator_session()`; a skill acts for whoever ran
it (`ctx.for_skill(name)`), never with more authority. A call made while another tool runs (an SOP
step running the trainer's jobs) is held to the stricter of its own actor and the outer one,
and inherits the outer call's human approval, which the gate alone grants.

`serving(source)` makes a registry current for a command or a call (`trainops.tools.calls.call(...,
registry=R)` serves R for the call's duration), so governance looks a tool up in the registry that
called it; the CLI serves the agent's registry for each command, so `trainops approve` knows the
agent's tools.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Callable, Iterator, Literal

if TYPE_CHECKING:
    from trainops.tools.registry import Registry

Principal = Literal["operator", "agent"]
ACTOR_PATTERN = re.compile(r"operator|agent|skill:[a-z0-9][a-z0-9-]{0,63}")


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


_SERVING: ContextVar[Callable[[], Registry] | None] = ContextVar("trainops_serving_registry", default=None)


@contextmanager
def serving(source: Callable[[], Registry]) -> Iterator[None]:
    """Make `source()` (built only when first needed) the registry tools are looked up in."""
    reset = _SERVING.set(cache(source))
    try:
        yield
    finally:
        _SERVING.reset(reset)


def served() -> Registry | None:
    """The registry being served, or None when nothing is (`trainops.tools.catalog.current_registry`)."""
    source = _SERVING.get()
    return source() if source is not None else None

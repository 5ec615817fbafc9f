"""Calling a tool: the one way a declared tool runs, through the governance gate.

`run_call` validates the input, passes `gate.before_call`, runs the tool and records the outcome
with `gate.after_call`. Product code calls its own tools with `invoke(module.tool_fn, Input(...))`,
typed in and out, so a renamed tool or field fails where it is written. `call` does the same by
name, looking the tool up in the registry being served (`trainops.tools.catalog.current_registry`)
or, given `registry=`, serving that one for the call's duration: only where a name arrives from
outside (`trainops tool call`, a model's tool calls, scenario replay) and in tests. Declaring a
tool (`trainops.tools.base`) needs none of this, so this module sits above both the registry and
the gate.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from pydantic import BaseModel, ValidationError

from trainops.tools.base import ToolError, ToolSpec, explain
from trainops.tools.catalog import current_registry
from trainops.tools.context import CallContext, effective_context, running, serving
from trainops.tools.governance import gate
from trainops.tools.registry import Registry, spec_of

InT = TypeVar("InT", bound=BaseModel)
OutT = TypeVar("OutT", bound=BaseModel)


def invoke(fn: Callable[[InT], OutT], inp: InT, ctx: CallContext | None = None) -> OutT:
    """Call a declared tool function through the gate (see `run_call`): typed in, typed out. The
    gate, the audit log and approvals apply exactly as to a call by name."""
    return run_call(spec_of(fn), inp, ctx)  # type: ignore[return-value]


@contextmanager
def validating(fn: Callable[..., Any]) -> Iterator[None]:
    """Build `fn`'s Input inside this block from values that came from outside (the command line,
    a request, a dict assembled at run time): a bad value is then the ToolError `run_call` raises
    for it, naming the tool, the field and the value seen, not a bare ValidationError."""
    with _refused_as(spec_of(fn)):
        yield


@contextmanager
def _refused_as(spec: ToolSpec) -> Iterator[None]:
    try:
        yield
    except ValidationError as exc:
        raise ToolError(spec.name, f"invalid input: {explain(exc)}") from None


def get(name: str) -> ToolSpec:
    """A tool by name, from the registry in use (`trainops.tools.catalog.current_registry`)."""
    return current_registry().spec(name)


def call(name: str, inp: BaseModel | dict[str, Any] | None = None, ctx: CallContext | None = None, *,
         registry: Registry | None = None) -> BaseModel:
    """Call a tool by name through the gate (see `run_call`). With `registry`, the tool comes from
    that registry, which is served while the call runs, so governance and nested calls see it too."""
    if registry is None:
        return run_call(get(name), inp, ctx)
    with serving(lambda: registry):
        return run_call(registry.spec(name), inp, ctx)


def run_call(spec: ToolSpec, inp: BaseModel | dict[str, Any] | None = None,
             ctx: CallContext | None = None) -> BaseModel:
    """Validate the input, pass the gate, run, record. The only way a tool runs."""
    ctx = effective_context(ctx)
    if not isinstance(inp, spec.Input):
        with _refused_as(spec):
            inp = spec.Input.model_validate(inp or {})
    approved_call = gate.before_call(spec, inp, ctx)
    started = time.time()
    try:
        with running(ctx, approved_call):
            out = spec.fn(inp)
    except Exception as exc:
        gate.after_call(spec, inp, ctx, started=started, output=None, error=exc)
        if ctx.approval_token and approved_call is not None and not isinstance(exc, ToolError):
            why = str(exc) if isinstance(exc, (ValueError, OSError)) else f"{type(exc).__name__}: {exc}"
            raise ToolError(spec.name, f"approved call {approved_call} failed after its token was spent: {why}; "
                                       "the token is used up: fix the cause, then queue the call again and ask "
                                       "for a new approval") from None
        raise
    gate.after_call(spec, inp, ctx, started=started, output=out, error=None)
    return out

"""The tool contract: one declaration serves Python, the CLI and the agent.

A tool is a typed function: a pydantic `Input`, a pydantic `Output`, a risk class and a
description written for a language model. Every call goes through `call()`, which passes the
governance gate before and after `run` — there is no other way to run a tool.
"""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, get_type_hints

from pydantic import BaseModel, ValidationError

Risk = Literal["read", "mutate", "irreversible"]


class ToolError(Exception):
    """A tool failed in a way the caller should read: names the tool and what to do."""

    def __init__(self, tool: str, message: str):
        super().__init__(f"{tool}: {message}")
        self.tool = tool
        self.message = message


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


@dataclass
class CallContext:
    """Who is calling and with what authority; filled by the CLI, a skill or the agent."""

    actor: str = "cli"
    approval_token: str | None = None
    thread_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_REGISTRY: dict[str, ToolSpec] = {}


def tool(name: str, *, risk: Risk, approval_required: bool = False, tags: tuple[str, ...] = ()):
    """Register `fn(inp: Input) -> Output` as a tool; its docstring is the model-facing description."""

    def register(fn: Callable[[Any], BaseModel]) -> Callable[[Any], BaseModel]:
        hints = get_type_hints(fn)
        params = list(inspect.signature(fn).parameters)
        if len(params) != 1 or "return" not in hints:
            raise TypeError(f"tool {name}: signature must be fn(inp: Input) -> Output")
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"tool {name} is registered twice")
        _REGISTRY[name] = ToolSpec(
            name=name,
            description=inspect.cleandoc(fn.__doc__ or "").strip(),
            Input=hints[params[0]],
            Output=hints["return"],
            risk=risk,
            fn=fn,
            approval_required=approval_required or risk == "irreversible",
            tags=tags,
        )
        return fn

    return register


def registry() -> dict[str, ToolSpec]:
    """All tools, loading the catalogue on first use (tool modules import heavy libraries lazily)."""
    import trainops.tools.catalog  # noqa: F401  (registers every tool)

    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> ToolSpec:
    tools = registry()
    if name not in tools:
        raise ToolError(name, f"unknown tool; known tools: {', '.join(tools)}")
    return tools[name]


def call(name: str, inp: BaseModel | dict[str, Any] | None = None, ctx: CallContext | None = None) -> BaseModel:
    """Validate the input, pass the gate, run, record. The only way a tool runs."""
    from trainops.tools.governance import gate

    spec = get(name)
    ctx = ctx or CallContext()
    if not isinstance(inp, spec.Input):
        try:
            inp = spec.Input.model_validate(inp or {})
        except ValidationError as exc:
            raise ToolError(name, f"invalid input: {explain(exc)}") from None
    gate.before_call(spec, inp, ctx)
    started = time.time()
    try:
        out = spec.fn(inp)
    except Exception as exc:
        gate.after_call(spec, inp, ctx, started=started, output=None, error=exc)
        raise
    gate.after_call(spec, inp, ctx, started=started, output=out, error=None)
    return out


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

"""Declaring a tool: one declaration serves Python, the CLI and the agent.

A tool is a typed function: a pydantic `Input`, a pydantic `Output`, a risk class and a
description written for a language model. `@tool` only declares it; `trainops.tools.registry`
lists every tool in one place, and `trainops.tools.calls.run_call` is the one way one runs (through
the governance gate). This module is the contract they share, so it imports nothing of trainops.

Who calls, with what authority, is `trainops.tools.context`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Literal, get_type_hints

from pydantic import BaseModel, ValidationError

Risk = Literal["read", "mutate", "irreversible"]
CheckKind = Literal["forbidden", "invalid_input"]


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
    approval_from: Callable[[Any], str | None] | None = None


def tool(name: str, *, risk: Risk, approval_required: bool = False, tags: tuple[str, ...] = (),
         checks: tuple[InputCheck, ...] = (), approval_from: Callable[[Any], str | None] | None = None):
    """Declare `fn(inp: Input) -> Output` a tool (its docstring is the model-facing description),
    with the input `checks` the gate applies to it; `fn.tool_spec` carries the declaration for
    `trainops.tools.registry`. Nothing is registered. `approval_from(inp)` names the call id of an
    earlier human approval this input runs under (an SOP step on a session whose declaration a human
    approved); the gate checks that a human's token for that call was spent before it counts."""

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
            approval_from=approval_from,
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

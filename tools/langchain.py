"""The registry as LangChain structured tools, for the ops agent.

Each structured tool takes the tool's own pydantic `Input` as its args schema and runs through
`trainops.tools.calls.run_call`, so the agent passes the same gate (validation, approval, audit) as
the CLI. These tools serve a model, so every call is the agent's: whatever framework runs them, a
call of risk `mutate` or higher needs a human's token (from `ctx_factory`). A `ToolError` comes back
to the model as the tool's answer, so it can correct its input.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from trainops.tools.base import ToolError, explain
from trainops.tools.calls import run_call
from trainops.tools.catalog import tool_registry
from trainops.tools.context import CallContext
from trainops.tools.governance.gate import needs_approval
from trainops.tools.versions import envelope

if TYPE_CHECKING:
    from langchain_core.tools import StructuredTool

    from trainops.tools.registry import Registry


def _agent_context() -> CallContext:
    return CallContext(actor="agent")


def as_langchain_tools(
    names: Iterable[str] | None = None,
    ctx_factory: Callable[[], CallContext] = _agent_context,
    registry: Registry | None = None,
) -> list[StructuredTool]:
    """StructuredTools for `names` (default: every tool in `registry`, itself by default every
    trainops tool); `ctx_factory` supplies the agent's thread and approval token at call time."""
    from langchain_core.tools import StructuredTool, ToolException

    specs = registry if registry is not None else tool_registry()
    wanted = list(specs) if names is None else list(names)
    for name in wanted:
        specs.spec(name)  # an unknown name is a ToolError listing the known ones

    def make(name: str) -> StructuredTool:
        spec = specs[name]
        waits = ", needs human approval" if needs_approval(spec, _agent_context()) else ""

        def run(**kwargs: Any) -> dict[str, Any]:
            ctx = ctx_factory()
            try:
                if ctx.principal != "agent":
                    raise ToolError(name, f"ctx_factory returned actor {ctx.label!r}: LangChain tools serve a model, "
                                          "so their context is the agent's; return CallContext(actor='agent', ...)")
                return envelope(run_call(spec, kwargs, ctx), kwargs)  # the output, with the versions it was made by
            except ToolError as exc:
                raise ToolException(str(exc)) from exc

        return StructuredTool.from_function(
            func=run,
            name=name,
            description=f"[risk: {spec.risk}{waits}] {spec.description}",
            args_schema=spec.Input,
            handle_tool_error=True,
            handle_validation_error=lambda exc: f"{name}: invalid input: {explain(exc)}",
        )

    return [make(name) for name in wanted]

"""The registry as LangChain structured tools, for the ops agent.

Each structured tool takes the tool's own pydantic `Input` as its args schema and runs through
`trainops.tools.base.call`, so the agent passes the same gate (validation, approval, audit) as the CLI.
A `ToolError` comes back to the model as the tool's answer, so it can correct its input.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from trainops.tools.base import CallContext, ToolError, call, explain, registry

if TYPE_CHECKING:
    from langchain_core.tools import StructuredTool, ToolException


def _agent_context() -> CallContext:
    return CallContext(actor="agent")


def as_langchain_tools(
    names: Iterable[str] | None = None,
    ctx_factory: Callable[[], CallContext] = _agent_context,
) -> list[StructuredTool]:
    """StructuredTools for `names` (default: every registered tool); `ctx_factory` supplies the
    caller's identity and approval token at call time."""
    from langchain_core.tools import StructuredTool, ToolException

    specs = registry()
    wanted = list(specs) if names is None else list(names)
    unknown = [n for n in wanted if n not in specs]
    if unknown:
        raise ToolError(unknown[0], f"unknown tool; known tools: {', '.join(specs)}")

    def make(name: str) -> StructuredTool:
        spec = specs[name]

        def run(**kwargs: Any) -> dict[str, Any]:
            try:
                return call(name, kwargs, ctx_factory()).model_dump(mode="json")
            except ToolError as exc:
                raise ToolException(str(exc)) from exc

        return StructuredTool.from_function(
            func=run,
            name=name,
            description=f"[risk: {spec.risk}{', needs human approval' if spec.approval_required else ''}] {spec.description}",
            args_schema=spec.Input,
            handle_tool_error=True,
            handle_validation_error=lambda exc: f"{name}: invalid input: {explain(exc)}",
        )

    return [make(name) for name in wanted]

"""One non-interactive run of the ops agent, as the agent benchmark scores it: `run_agent` runs a
request on a fresh thread (gated calls are queued for a human, never approved, and end as
"pending"), and `trace_of` reads what it did from the graph's final state (agents/graph.py): each
call the model made in order with its outcome (ok, pending, refused and why, error) and the answer
it gave, as an `AgentTrace`. Only the benchmark (runner.py) and its tests run the agent this way."""
from __future__ import annotations

import time
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel, Field

from trainops.agents.answer import FINAL_ANSWER_TOOL, FinalAnswer
from trainops.agents.answer_flag import AnswerFlag, answer_flag
from trainops.agents.graph import build_graph
from trainops.agents.providers import load_settings, make_chat_model
from trainops.agents.session import new_thread_id
from trainops.redact import scrub


class AgentTrace(BaseModel):
    """What one agent run did, for scoring."""
    answer: FinalAnswer | None
    stop_reason: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list,
                                             description="{tool, args, status} in order; status ok, "
                                                         "refused:<reason>, error or pending.")
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    wall_s: float = 0.0
    detail: str = Field("", description="Why the run stopped, in words, when it did not answer.")
    answer_flag: AnswerFlag | None = Field(None, description="The answer could not stand: empty, free text "
                                                             "(no structured final_answer) or truncated.")
    prompt_tokens_per_turn: list[int] = Field(default_factory=list,
                                              description="Prompt tokens of each model turn, as the provider "
                                                          "reported them.")


def _calls(message: AIMessage) -> list[dict]:
    return [c for c in message.tool_calls if c["name"] != FINAL_ANSWER_TOOL]


def _status(message: ToolMessage | None) -> str:
    if message is None:
        return "pending"
    data = message.artifact if isinstance(message.artifact, dict) else {}
    if message.status == "success":
        return "ok"
    kind = data.get("kind")
    if kind == "pending":
        return "pending"
    if kind in ("refused", "gate_refused", "policy_refused", "rejected", "malformed"):
        return f"refused:{data.get('reason') or kind}"
    return "error"


def trace_of(values: dict[str, Any], provider: str = "offline") -> AgentTrace:
    """A run's trace from its final graph state: the calls in order with their outcome, the answer."""
    messages = values.get("messages", [])
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    calls = []
    for message in messages:
        if isinstance(message, AIMessage):
            for call in _calls(message):
                calls.append({"tool": call["name"], "args": call["args"], "status": _status(results.get(call["id"]))})
            for bad in message.invalid_tool_calls:
                calls.append({"tool": bad.get("name") or "", "args": {"raw": bad.get("args")},
                              "status": "refused:malformed"})
    final = values.get("final")
    answer = FinalAnswer.model_validate(final) if final else None
    last = messages[-1] if messages else None
    reason = values.get("stop_reason") or "error"
    if answer is None and reason == "answered" and isinstance(last, AIMessage) and last.text:
        answer = FinalAnswer(verdict="answered", confidence="low", summary=last.text)  # free text, nothing claimed
    return AgentTrace(answer=answer, stop_reason=reason, tool_calls=calls, tokens_in=values.get("tokens_in", 0),
                      tokens_out=values.get("tokens_out", 0), cost_usd=None, wall_s=0.0,
                      detail=values.get("stop_detail", ""), answer_flag=answer_flag(values, provider),
                      prompt_tokens_per_turn=[int((m.usage_metadata or {}).get("input_tokens", 0)) for m in messages
                                              if isinstance(m, AIMessage) and m.usage_metadata])


def run_agent(request: str, *, llm=None, settings=None, max_steps: int = 12, max_tokens: int = 60000) -> AgentTrace:
    """One non-interactive agent run on a fresh thread: gated calls are queued, not approved (they end
    as "pending"); the run stops at an accepted final answer or a budget, and says which."""
    started = time.perf_counter()
    settings = settings or load_settings()
    graph = build_graph(llm or make_chat_model(settings), InMemorySaver(), settings, interactive=False,
                        max_steps=max_steps, max_tokens=max_tokens)
    config = {"configurable": {"thread_id": "eval-" + new_thread_id()}, "recursion_limit": 8 * max_steps + 20}
    try:
        state = graph.invoke({"messages": [("human", request)]}, config)
    except Exception as exc:  # a provider or graph failure is the run's outcome, not a crash of the benchmark
        values = graph.get_state(config).values
        trace = trace_of(values, settings.provider)
        return trace.model_copy(update={"stop_reason": "error", "detail": scrub(f"{type(exc).__name__}: {exc}"),
                                        "wall_s": time.perf_counter() - started})
    return trace_of(state, settings.provider).model_copy(update={"wall_s": time.perf_counter() - started})

"""What an agent run did, read from its final graph state (agents/graph.py): each call the model
made in order with its outcome (ok, pending, refused and why, error) and the answer it gave, as an
AgentTrace the session reports and the evals score."""
from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from trainops.agents.answer import FINAL_ANSWER_TOOL, AgentTrace, FinalAnswer


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


def trace_of(values: dict[str, Any]) -> AgentTrace:
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
                      detail=values.get("stop_detail", ""))

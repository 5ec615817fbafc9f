"""Whether a request's last answer can stand as one, read from the graph's final state.

A model can end a turn without the structured `final_answer` (agents/answer.py) the report rules
check: with nothing at all, with free text, or cut off by its output limit (finish_reason
"length"). The graph shows such text as it is; this says what it was, so `trainops ask --json`
exits non-zero on it and the agent benchmark fails the scenario. The offline policy answers
plain requests in text it builds from the tools' outputs, so only its empty answers are flagged.
"""
from __future__ import annotations

from typing import Any, Literal

AnswerFlag = Literal["empty", "free_text", "truncated"]
FLAG_MEANING: dict[str, str] = {
    "empty": "the model ended the request with an empty answer",
    "free_text": "the model answered in free text, not with a structured final_answer the report rules check",
    "truncated": "the model's answer was cut off by its output limit (finish_reason 'length')",
}


def _model_turns(messages: list[Any]) -> list[Any]:
    """The model's own turns (a provider's reply carries its finish_reason in response_metadata)."""
    return [m for m in messages if getattr(m, "type", None) in ("ai", "AIMessageChunk")]


def _cut_off(message: Any) -> bool:
    return (getattr(message, "response_metadata", None) or {}).get("finish_reason") == "length"


def answer_flag(values: dict[str, Any], provider: str) -> AnswerFlag | None:
    """What is wrong with the answer a finished request gave, or None (a checked structured answer,
    the offline policy's text, or no answer at all: a spent budget or a pending approval says so itself)."""
    if values.get("stop_reason") != "answered":
        return None
    turns = _model_turns(values.get("messages") or [])
    if values.get("final") is not None:
        answered = [m for m in turns if any(c.get("name") == "final_answer" for c in getattr(m, "tool_calls", []))]
        return "truncated" if answered and _cut_off(answered[-1]) else None
    last = turns[-1] if turns else None
    if last is not None and _cut_off(last):
        return "truncated"
    text = getattr(last, "text", "") if last is not None else ""
    if not isinstance(text, str):  # older LangChain messages expose text() as a method only
        text = text()
    if not str(text or "").strip():
        return "empty"
    return None if provider == "offline" else "free_text"

"""The agent's structured final answer and the report rules it must pass.

A model ends a request by calling `final_answer` with a `FinalAnswer`; `answer_problems` holds it
against what the tools of that run returned before anyone sees it (a cause stated with medium or
high confidence needs evidence, every quote must be found in a tool's output, an inconclusive
verdict says what to collect next). `text_problems` holds any answer's text, free text included, to
the report rules and to R-ENV-1 as an answer meets it: an MFU figure is stated only when a tool of
this run returned it (a measured run, after the environment is declared); a model that states one
before S1 ran, or makes one up, is refused naming the rule.
"""
from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from trainops.agents.echo import unechoed
from trainops.tools.governance.text import check_text
from trainops.tools.reliability.causes import Cause

FINAL_ANSWER_TOOL = "final_answer"


class Evidence(BaseModel):
    source: str = Field(description="The tool that returned it and what, e.g. 'list_interruptions:rank 1 exit -9'.")
    quote: str = Field(description="The exact text or value cited, as the tool returned it.")


class ProposedAction(BaseModel):
    tool: str = Field(description="The registered tool a human should run (or approve).")
    args: dict[str, Any] = Field(default_factory=dict)
    why: str


class FinalAnswer(BaseModel):
    """The answer to one request: structured so a scorer and the report rules read it without a judge."""
    verdict: Literal["diagnosed", "inconclusive", "healthy", "answered"]
    fault_kind: str | None = Field(None, description="The fault's kind as the tools name it (list_interruptions' "
                                                     "fault_kind): crash, hang, straggler, nan, bitflip, "
                                                     "checkpoint-corruption, node-crash, partition, or mfu-regression.")
    cause_class: Cause | None = None
    ranks: list[int] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)
    proposed_actions: list[ProposedAction] = Field(default_factory=list)
    next_to_collect: list[str] = Field(default_factory=list, description="For inconclusive: what to gather next.")
    confidence: Literal["low", "medium", "high"]
    summary: str


def final_answer_schema() -> dict[str, Any]:
    """The `final_answer` tool as bound to the model (OpenAI function format)."""
    return {"type": "function", "function": {
        "name": FINAL_ANSWER_TOOL,
        "description": ("End the request with your structured answer. Cite as evidence the exact text or value a "
                        "tool returned in this conversation; a cause with medium or high confidence needs evidence; "
                        "an inconclusive verdict lists what to collect next. Proposed actions are advice: a "
                        "deterministic policy and a human decide what runs."),
        "parameters": FinalAnswer.model_json_schema()}}


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [] if value is None else [str(value)]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def answer_problems(answer: FinalAnswer, tool_outputs: dict[str, list[Any]]) -> list[str]:
    """Why `answer` may not be shown (empty: it may). `tool_outputs`: tool name -> the outputs it
    returned in this run, so a quote is checked against what the tools said, not what the model says."""
    problems = text_problems(answer.summary, tool_outputs)
    if answer.verdict == "diagnosed" and not (answer.cause_class or answer.fault_kind):
        problems.append("verdict diagnosed names neither cause_class nor fault_kind: name what was diagnosed, or "
                        "answer inconclusive")
    if answer.confidence in ("medium", "high") and (answer.cause_class or answer.fault_kind) and not answer.evidence:
        problems.append(f"cause stated with {answer.confidence} confidence and no evidence: cite what a tool returned, "
                        "or lower the confidence / answer inconclusive")
    if answer.verdict == "inconclusive" and not answer.next_to_collect:
        problems.append("verdict inconclusive without next_to_collect: say what to gather next")
    haystacks = {tool: _norm("\n".join(_leaves(outs)) + "\n" + json.dumps(outs, default=str))
                 for tool, outs in tool_outputs.items()}
    everything = "\n".join(haystacks.values())
    for item in answer.evidence:
        tool = item.source.split(":", 1)[0].strip()
        quote = _norm(item.quote)
        if not quote:
            problems.append(f"evidence from {item.source!r} quotes nothing: cite the exact text or value")
        elif tool in haystacks and quote not in haystacks[tool]:
            problems.append(f"evidence {item.quote[:80]!r} is not in what {tool} returned in this run: "
                            "quote it exactly")
        elif tool not in haystacks and quote not in everything:
            problems.append(f"evidence {item.quote[:80]!r} (source {item.source[:60]!r}) is not in any tool output of "
                            "this run: cite a tool you called and its exact words")
    return problems


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_NOT_IN_RANGE = r"(?<![\d.~～〜\-–])"  # a range (40~55%) is a basis-labelled statement (R-EVD-1), not a figure
_MFU_STATED = re.compile(rf"\bMFU\b[^;,|%\d\n]{{0,40}}{_NOT_IN_RANGE}(?P<a>\d+(?:\.\d+)?)\s?%(?!\s*[~～〜\-–]\d)"
                         rf"|{_NOT_IN_RANGE}(?P<b>\d+(?:\.\d+)?)\s?%\s+(?:of\s+peak\s+)?MFU\b", re.I)


def unmeasured_mfu(text: str, tool_outputs: dict[str, list[Any]]) -> list[str]:
    """R-ENV-1 on an answer: each MFU figure it states must be one a tool returned in this run (to the
    digits the answer writes), so no MFU is stated before S1 declared the environment and a run was
    measured on it. Each figure stated otherwise is a problem naming the rule and the step to run."""
    measured = [float(n) for n in _NUMBER.findall(json.dumps(tool_outputs, default=str))]
    problems = []
    for match in _MFU_STATED.finditer(text):
        stated = match["a"] or match["b"]
        digits = len(stated.partition(".")[2])
        if not any(abs(value - float(stated)) <= 0.5 * 10 ** -digits + 1e-9 for value in measured):
            problems.append(f"R-ENV-1: the answer states {match.group(0).strip()!r}, an MFU no tool measured in this "
                            "run: no MFU is stated before the environment is declared (S1, sop_declare) and a run "
                            "is measured on it (S2, sop_baseline, or summarize_run of a recorded run); quote the "
                            "figure a tool returned, or state none")
    return problems


def _is(message: Any, *types: str) -> bool:
    """A LangChain message's kind by its `type` (a chunk's too), so this module loads no LangChain."""
    return getattr(message, "type", None) in types


def tool_outputs(messages: list) -> dict[str, list[Any]]:
    """What each tool returned since the latest request, less what it echoed of its call (a model's own
    words passed as an argument): the only evidence an answer may cite."""
    start = max((i for i, m in enumerate(messages) if _is(m, "human", "HumanMessageChunk")), default=-1)
    args = {c["id"]: c["args"] for m in messages[start + 1:] if _is(m, "ai", "AIMessageChunk") for c in m.tool_calls}
    outputs: dict[str, list[Any]] = {}
    for message in messages[start + 1:]:
        if (_is(message, "tool", "ToolMessageChunk") and message.status == "success"
                and message.name != FINAL_ANSWER_TOOL):
            outputs.setdefault(message.name, []).append(unechoed(message.artifact, args.get(message.tool_call_id, {})))
    return outputs


def text_problems(text: str, tool_outputs: dict[str, list[Any]]) -> list[str]:
    """Why an answer's text may not be shown: the report rules (tools.governance.text) and R-ENV-1."""
    return [str(v) for v in check_text(text)] + unmeasured_mfu(text, tool_outputs)


def render(answer: FinalAnswer) -> str:
    """The answer as text for a person (chat, ask)."""
    lines = [answer.summary, "", f"Verdict: {answer.verdict} (confidence {answer.confidence})"]
    if answer.fault_kind or answer.cause_class:
        lines.append(f"Fault: {answer.fault_kind or '-'}; cause class: {answer.cause_class or '-'}")
    if answer.ranks or answer.nodes:
        lines.append(f"Ranks: {', '.join(map(str, answer.ranks)) or '-'}; nodes: {', '.join(answer.nodes) or '-'}")
    lines += [f"- evidence ({e.source}): {e.quote}" for e in answer.evidence]
    lines += [f"- proposed (needs the policy and a human): {a.tool} {json.dumps(a.args, sort_keys=True)}: {a.why}"
              for a in answer.proposed_actions]
    lines += [f"- collect next: {item}" for item in answer.next_to_collect]
    return "\n".join(lines)

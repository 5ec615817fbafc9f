"""A conversation with the ops agent: one thread, persisted in SQLite, resumable from any
process. The CLI's `chat` and `ask` are thin views over this module (`threads` over agents/threads.py)."""
from __future__ import annotations

import secrets
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from pydantic import BaseModel, Field

from trainops.agents.agent_tools import agent_registry
from trainops.agents.answer import FINAL_ANSWER_TOOL
from trainops.agents.answer_flag import AnswerFlag, answer_flag
from trainops.agents.graph import build_graph
from trainops.agents.providers import AgentSettings, load_settings, make_chat_model
from trainops.agents.sop_walk import landed
from trainops.tools.context import serving
from trainops.tools.governance import gate_api
from trainops.workspace import agent_db_path, check_id

if TYPE_CHECKING:
    from trainops.tools.governance.gate_api import SignableCall


def _sha(tool: Any, args: Any) -> str | None:
    """The input hash of `tool` called with `args`, None when that is not a valid call."""
    try:
        return gate_api.input_sha256(tool, args) if isinstance(tool, str) and isinstance(args, dict) else None
    except ValueError:
        return None


def new_thread_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


class Timing(BaseModel):
    """Where the time of one request (or one decision) went: the agent's own share is what
    is left after the tools (graph, model, checkpointing, gate checks)."""
    wall_s: float
    tool_s: float = Field(description="time inside tool calls, training jobs included")
    agent_overhead_s: float
    agent_overhead_pct: float


class ApprovalMismatch(ValueError):
    """The call a paused thread would resume is not the queued call a human would be shown."""
@dataclass(frozen=True)
class ApprovalRequest:
    """A paused call, checked against the approval queue: `call` is what a human is shown and what
    their key signs (None when the call was decided outside the thread: it can only be rejected)."""
    payload: dict[str, Any]
    call: SignableCall | None


class AgentSession:
    """Send requests and approval decisions to one thread; events stream as the graph runs.

    Events are dicts with `kind`: `tool_call` (tool, args), `tool_result` (tool, status,
    output, and for an SOP step its `finding` in one line and its `figures`, (name, value) rows, as
    the session recorded them), `approval`
    (tool, args, risk, ...: the graph is paused for a human), `answer`
    (text, after the governance report check) and, with `stream_tokens`, `token` (a draft
    chunk of the model's text as it streams, not yet checked: show it transiently)."""
    def __init__(self, thread_id: str | None = None, settings: AgentSettings | None = None, llm=None,
                 stream_tokens: bool = False):
        self.settings = settings or load_settings()
        self.thread_id = check_id("thread", thread_id) if thread_id else new_thread_id()
        self._conn = sqlite3.connect(str(agent_db_path()), check_same_thread=False)
        self.graph = build_graph(llm or make_chat_model(self.settings), SqliteSaver(self._conn), self.settings,
                                 max_steps=self.settings.max_turns, max_tokens=self.settings.max_tokens)
        # the turn budget (at most 200 model turns) stops a run before this limit of graph steps
        self.config = {"configurable": {"thread_id": self.thread_id},
                       "recursion_limit": 8 * self.settings.max_turns + 20}
        self.timing: Timing | None = None
        self.stream_tokens = stream_tokens

    def __enter__(self) -> "AgentSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def ask(self, text: str) -> Iterator[dict[str, Any]]:
        if self.pending():
            raise ValueError(f"thread {self.thread_id} is waiting for an approval decision; decide it first "
                             f"(trainops chat --thread {self.thread_id})")
        yield from self._stream({"messages": [HumanMessage(content=text)]})

    def decide(self, decision: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Resume a paused thread with {'decision': approve|edit|reject, 'approver', 'args', 'comment'}.
        The paused call is checked against the queue first; an approval carries the pending id and
        input hash of the call the human was shown (given, or the queued one), and the graph signs
        nothing else."""
        requests = self.approval_requests()
        if not requests:
            raise ValueError(f"thread {self.thread_id} has no pending approval")
        verdict = str(decision.get("decision", "reject")).lower()
        if verdict == "approve":
            decision = {**decision, **self._seen(requests[0], decision)}
        yield from self._stream(Command(resume=decision))

    def pending(self) -> list[dict[str, Any]]:
        return [dict(i.value) for i in self.graph.get_state(self.config).interrupts]

    def approval_requests(self) -> list[ApprovalRequest]:
        """The paused calls, each checked against its queued call before anyone is shown it: the
        thread's interrupt and the call the graph would resume must both be that exact call.
        Raises ApprovalMismatch, naming the thread and the pending id, on any difference."""
        with serving(agent_registry):
            return self._checked_requests()

    def _checked_requests(self) -> list[ApprovalRequest]:
        state = self.graph.get_state(self.config)
        resumed = (state.values.get("gated") or [None])[0]
        requests = []
        for interrupt in state.interrupts:
            payload = dict(interrupt.value) if isinstance(interrupt.value, dict) else {}
            pending_id = payload.get("pending_id")
            try:
                call = gate_api.queued(pending_id)
            except gate_api.NotQueued:
                requests.append(ApprovalRequest(payload, None))
                continue
            except ValueError as exc:
                raise self._mismatch(pending_id, str(exc)) from None
            views = [("the call it shows", payload.get("tool"), payload.get("args"), pending_id)]
            if resumed is not None:
                views.append(("the call it would resume", resumed.get("name"), resumed.get("args"),
                              resumed.get("pending_id")))
            for what, tool, args, named in views:
                if named != call.call_id or tool != call.item.tool or _sha(tool, args) != call.input_sha256:
                    raise self._mismatch(pending_id, f"{what} is not the queued {call.item.tool} call "
                                                     f"(input sha256 {call.input_sha256})")
            requests.append(ApprovalRequest(payload, call))
        return requests

    def _mismatch(self, pending_id: Any, why: str) -> ApprovalMismatch:
        return ApprovalMismatch(
            f"thread {self.thread_id} is paused on a call that does not match pending approval {pending_id!s}: "
            f"{why}. Nothing was shown or signed: the thread's saved state was changed after the call was "
            f"queued. Reject it with `trainops reject --pending {pending_id!s} --note WHY` and start a new thread")

    def _seen(self, request: ApprovalRequest, decision: dict[str, Any]) -> dict[str, str]:
        """The pending id and input hash an approval is for: the call shown to the approver."""
        if request.call is None:
            raise ValueError(f"pending approval {request.payload.get('pending_id')} of thread {self.thread_id} "
                             "is no longer queued (decided outside the thread): reject it here to close it")
        seen = {"tool": request.call.item.tool, "pending_id": request.call.call_id,
                "input_sha256": request.call.input_sha256}
        given = {k: decision[k] for k in seen if decision.get(k) is not None}
        if given and given != seen:
            raise ApprovalMismatch(f"thread {self.thread_id}: the call approved (pending {given.get('pending_id')}) "
                                   f"is not the one queued now (pending {seen['pending_id']}): nothing was signed; "
                                   "look at it again")
        return seen

    def final_answer(self) -> dict[str, Any] | None:
        """The last request's structured answer (agents/answer.FinalAnswer), when the model gave one."""
        return self.graph.get_state(self.config).values.get("final")

    def answer_flag(self) -> AnswerFlag | None:
        """What is wrong with the last request's answer (empty, free text, cut off), or None."""
        return answer_flag(self.graph.get_state(self.config).values, self.settings.provider)

    def stop_reason(self) -> str | None:
        """Why the last request ended: answered, or the budget that stopped it."""
        return self.graph.get_state(self.config).values.get("stop_reason")

    def answer(self) -> str:
        messages = self.graph.get_state(self.config).values.get("messages", [])
        last = messages[-1] if messages else None
        return last.text if isinstance(last, AIMessage) and not last.tool_calls else ""

    def _stream(self, graph_input) -> Iterator[dict[str, Any]]:
        started, tool_s = time.perf_counter(), 0.0
        modes = ["updates", "messages"] if self.stream_tokens else ["updates"]
        for mode, chunk in self.graph.stream(graph_input, self.config, stream_mode=modes):
            if mode == "messages":
                message, meta = chunk
                if meta.get("langgraph_node") == "model" and isinstance(message, AIMessageChunk) and message.text:
                    yield {"kind": "token", "text": message.text}
                continue
            for node, data in chunk.items():
                if node == "__interrupt__":
                    for item in data:
                        yield {"kind": "approval", **item.value}
                    continue
                for message in (data or {}).get("messages", []):
                    if isinstance(message, AIMessage) and node == "model":
                        for call in message.tool_calls:
                            if call["name"] != FINAL_ANSWER_TOOL:  # the answer event carries it
                                yield {"kind": "tool_call", "tool": call["name"], "args": call["args"]}
                    elif isinstance(message, ToolMessage) and message.name != FINAL_ANSWER_TOOL:
                        tool_s += message.response_metadata.get("elapsed_s", 0.0)
                        step = landed(message.name, message.artifact) if message.status == "success" else None
                        shown = {"finding": step.result, "figures": [(f.name, f.value) for f in step.figures]
                                 } if step else {}
                        yield {"kind": "tool_result", "tool": message.name, "status": message.status,
                               "output": message.artifact, **shown}
        wall_s = time.perf_counter() - started
        self.timing = Timing(wall_s=wall_s, tool_s=tool_s, agent_overhead_s=wall_s - tool_s,
                             agent_overhead_pct=100 * (wall_s - tool_s) / wall_s if wall_s else 0.0)
        if not self.pending():
            yield {"kind": "answer", "text": self.answer()}

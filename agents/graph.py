"""The ops agent as an explicit LangGraph `StateGraph`.

    START -> start -> model -+-> governance -+-> tools ----------+-> model ...
                             |               +-> human_approval -+
                             +-> report_check -+-> END
                             |                 +-> model (answer refused: rewrite it)
                             +-> stop -> END (a budget spent: says which)

The model chooses its skill: it sees every skill's name and description and calls `load_skill`;
the loaded body joins the system prompt. It ends with a `final_answer` call (agents/answer.py),
which `report_check` holds against the tools' outputs and the action policy before anyone sees
it; a refused answer goes back to the model. A malformed or unknown call, or an invalid input,
goes back to the model as an error up to `max_bad_calls` times, then the run stops; so do the step
and token budgets (`stop_reason` says which). Every call passes agents/action_policy.py (restart
budget, no restart over suspected corruption) before the gate: the model advises, code acts.

`governance` asks the gate (`trainops.tools.governance.gate_api`) about every proposed call
before anything runs: unknown tools, invalid inputs and what the gate refuses outright come back
to the model; calls the gate lets the agent make go to `tools`; every call the gate says needs a
human waits in `human_approval`, which `interrupt()`s for approve / edit / reject. An approval
mints the gate's token for that exact input; the call then runs. `report_check` passes
the final answer through the governance text rules before anyone sees it. Tool results go
back to the model wrapped as data, never as instructions. Non-interactive (the agent benchmark's
`run_agent`, benchmarks/agent_eval/agent_run.py), a gated call is queued for a human and the
model is told it is pending; nothing is approved.
"""
from __future__ import annotations

import json
import time
from typing import Annotated, Any, NotRequired, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from pydantic import ValidationError

from trainops.agents import action_policy, kinds, transcript
from trainops.agents.agent_tools import agent_registry
from trainops.agents.answer import (
    FINAL_ANSWER_TOOL,
    FinalAnswer,
    answer_problems,
    final_answer_schema,
    text_problems,
    tool_outputs,
)
from trainops.agents.answer import render as render_answer
from trainops.agents.diagnose import ask_back
from trainops.agents.policy import REQUEST_KEY
from trainops.agents.prompt import PromptSkill, load_skills, system_prompt
from trainops.agents.providers import AgentSettings, explain_provider_failure
from trainops.agents.sop_chat import not_this_threads, thread_sessions
from trainops.agents.understand import Request, observe_world, understand
from trainops.redact import scrub
from trainops.tools import calls
from trainops.tools.base import ToolError
from trainops.tools.context import CallContext, serving
from trainops.tools.governance import gate_api
from trainops.tools.governance.gate_api import Refused
from trainops.tools.langchain import as_langchain_tools
from trainops.tools.versions import envelope


class AgentState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    skill: NotRequired[str | None]
    ready: NotRequired[list[dict[str, Any]]]
    gated: NotRequired[list[dict[str, Any]]]
    report_violations: NotRequired[list[str]]
    steps: NotRequired[int]
    bad_calls: NotRequired[int]
    tokens_in: NotRequired[int]
    tokens_out: NotRequired[int]
    stop_reason: NotRequired[str | None]
    stop_detail: NotRequired[str]
    final: NotRequired[dict[str, Any] | None]
    request: NotRequired[dict[str, Any] | None]


def wrap_as_data(tool: str, payload: Any) -> str:
    """Tool output as a quoted data block; JSON escaping keeps injected text on one inert line."""
    body = json.dumps(payload, default=str, sort_keys=True).replace("</tool-output>", "<\\/tool-output>")
    return f'<tool-output tool="{tool}" trust="data">\n{body}\n</tool-output>'


def _thread(config: RunnableConfig) -> str | None:
    return config.get("configurable", {}).get("thread_id")


def _result(call: dict, status: str, data: Any) -> ToolMessage:
    return ToolMessage(content=wrap_as_data(call["name"], data), tool_call_id=call["id"], name=call["name"],
                       status=status, artifact=data)


def _call_tool(specs, call: dict, thread: str | None, token: str | None = None) -> ToolMessage:
    """Run one call the gate let through and turn any outcome, failures included, into a ToolMessage."""
    ctx = CallContext(actor="agent", approval_token=token, thread_id=thread)
    started = time.perf_counter()
    try:
        out = calls.call(call["name"], call["args"], ctx, registry=specs)
    except Refused as exc:
        message = _result(call, "error", {"error": scrub(exc), "kind": "gate_refused", "reason": exc.reason,
                                              "pending_id": exc.pending_id})
    except ToolError as exc:
        message = _result(call, "error", {"error": scrub(exc), "kind": "tool_error"})
    except Exception as exc:  # a backend failure is reported to the model, not raised at the user
        message = _result(call, "error", {"error": scrub(f"{type(exc).__name__}: {exc}"), "kind": "tool_error"})
    else:
        message = _result(call, "success", envelope(out, call["args"]))  # A-TOOL-1: with the versions it ran with
    message.response_metadata["elapsed_s"] = time.perf_counter() - started
    transcript.record(thread, "tool_result", tool=call["name"], call_id=call["id"], status=message.status,
                      elapsed_s=message.response_metadata["elapsed_s"], output=message.artifact)
    return message


def _waits_for_a_human(message: ToolMessage) -> bool:
    """The gate refused a call only for want of a human's token: ask the human."""
    data = message.artifact
    return isinstance(data, dict) and data.get("kind") == "gate_refused" and data.get("reason") == "missing_token"


def _not_what_was_shown(call: dict, decision: dict) -> str | None:
    """Why an approval does not cover the call the thread resumed with (its saved state rewritten
    after the human was shown the queued call), or None: the graph signs only what was shown."""
    try:
        sha = gate_api.input_sha256(call["name"], call["args"])
    except ValueError:
        sha = None
    seen = (decision.get("tool"), decision.get("pending_id"), decision.get("input_sha256"))
    if sha is not None and seen == (call["name"], call.get("pending_id"), sha):
        return None
    return (f"approval not signed: the {call['name']} call this thread resumed with is not the call the approver "
            f"was shown (pending {decision.get('pending_id')}); nothing was signed or run")


def acting_refusal(request: dict[str, Any] | None, tool: str, risk: str) -> str | None:
    """Why a call or proposal of `tool` is refused for this request: only an order for that very action
    may change the world; a question or a plan is answered from read-only tools."""
    if risk == "read" or request is None or kinds.may_act(request, tool):
        return None
    what = f"an order for {request.get('order')}" if request.get("act") == "order" else f"a {request.get('act')}"
    return (f"{tool} changes the world and the request is {what}: it is answered from read-only tools; say what a "
            "human might order under next_to_collect instead")


def after_start(state: AgentState) -> str:
    return END if state.get("stop_reason") == "answered" else "model"


def after_model(state: AgentState) -> str:
    """A spent budget stops; a final answer (or plain text) goes to the report rules; calls to the gate."""
    if state.get("stop_reason"):
        return "stop"
    last = state["messages"][-1]
    if any(c["name"] == FINAL_ANSWER_TOOL for c in last.tool_calls):
        return "report_check"
    return "governance" if last.tool_calls or last.invalid_tool_calls else "report_check"


def after_calls(state: AgentState) -> str:
    """Run what is allowed first, then ask a human about each gated call, one at a time, then reply."""
    if state.get("stop_reason"):
        return "stop"
    if state.get("ready"):
        return "tools"
    return "human_approval" if state.get("gated") else "model"


def after_report(state: AgentState) -> str:
    """An accepted answer ends the turn; a refused one goes back to the model, until the bad-call budget."""
    if state.get("stop_reason") in (None, "answered"):
        return END if state.get("stop_reason") == "answered" else "model"
    return "stop"


class AgentNodes:
    """The graph's nodes, sharing one registry, one tool-bound model, the settings, the skills and the budgets."""
    def __init__(self, specs, llm, settings: AgentSettings | None, skills: list[PromptSkill], *,
                 interactive: bool = True, max_steps: int = 25, max_tokens: int | None = None, max_bad_calls: int = 3):
        self.specs, self.llm, self.settings, self.skills = specs, llm, settings, skills
        self.schemas = {t.name: t for t in as_langchain_tools(registry=specs)}  # schemas only: calls run below
        self.risk = {name: spec.risk for name, spec in specs.items()}
        self.interactive, self.max_steps, self.max_tokens, self.max_bad_calls = (interactive, max_steps, max_tokens,
                                                                                  max_bad_calls)

    def start(self, state: AgentState, config: RunnableConfig) -> dict:
        """A new request: its budgets start afresh; a skill loaded earlier in the thread stays loaded."""
        text = next((str(m.content) for m in reversed(state["messages"]) if isinstance(m, HumanMessage)), "")
        transcript.record(_thread(config), "user", content=text, skill=state.get("skill"))
        with serving(lambda: self.specs):
            world = observe_world(CallContext(actor="agent", thread_id=_thread(config)))
            request = understand(text, world.model_copy(update={"sop_sessions": thread_sessions(state["messages"])}))
        transcript.record(_thread(config), "understood", act=request.act, request_kind=request.kind,
                          order=request.order,
                          entities=request.entities.model_dump(mode="json"))
        fresh = {"ready": [], "gated": [], "report_violations": [], "steps": 0, "bad_calls": 0, "tokens_in": 0,
                 "tokens_out": 0, "stop_reason": None, "stop_detail": "", "final": None,
                 "request": request.model_dump(mode="json")}
        if request.ambiguous:  # never a guess: every provider asks back with the candidates
            answer = FinalAnswer.model_validate(ask_back(request.ambiguous))
            return {**fresh, "messages": [AIMessage(content=render_answer(answer))],
                    "final": answer.model_dump(mode="json"), "stop_reason": "answered"}
        return fresh

    def offered(self, request: Request) -> list:
        """The tools of the request's kind (read-only ones for a question), and final_answer."""
        names = kinds.offered(kinds.BY_NAME.get(request.kind or ""), request.act, self.risk)
        return [*(self.schemas[n] for n in names), final_answer_schema()]

    def _budget_spent(self, state: AgentState) -> dict | None:
        if state.get("steps", 0) >= self.max_steps:
            return {"stop_reason": "step_budget",
                    "stop_detail": f"the step budget of {self.max_steps} model turns is spent"}
        used = state.get("tokens_in", 0) + state.get("tokens_out", 0)
        if self.max_tokens is not None and used >= self.max_tokens:
            return {"stop_reason": "token_budget",
                    "stop_detail": f"the token budget is spent ({used} of {self.max_tokens} tokens)"}
        return None

    def model(self, state: AgentState, config: RunnableConfig) -> dict:
        if spent := self._budget_spent(state):
            return spent
        request = Request.model_validate(state.get("request") or understand(""))
        prompt = SystemMessage(content=system_prompt(self.skills, state.get("skill"), request=request),
                               additional_kwargs={REQUEST_KEY: request.model_dump(mode="json")})
        try:
            reply = self.llm.bind_tools(self.offered(request)).invoke([prompt, *state["messages"]], config)
        except Exception as exc:
            better = explain_provider_failure(self.settings, exc) if self.settings else None
            if better:
                raise better from None
            raise
        usage = reply.usage_metadata or {}
        transcript.record(_thread(config), "assistant", content=reply.text, tool_calls=reply.tool_calls)
        return {"messages": [reply], "steps": state.get("steps", 0) + 1,
                "tokens_in": state.get("tokens_in", 0) + int(usage.get("input_tokens", 0)),
                "tokens_out": state.get("tokens_out", 0) + int(usage.get("output_tokens", 0))}

    def _bad_call(self, state: AgentState, count: int) -> dict:
        """Count malformed, unknown or invalid calls; past the budget the run stops and says why."""
        bad = state.get("bad_calls", 0) + count
        if count and bad > self.max_bad_calls:
            return {"bad_calls": bad, "stop_reason": "bad_tool_calls",
                    "stop_detail": f"{bad} malformed, unknown or refused calls or answers (the limit is "
                                   f"{self.max_bad_calls}); the last one is in the thread"}
        return {"bad_calls": bad}

    def _pending(self, call: dict, pending_id: str) -> ToolMessage:
        """Non-interactive: the call waits in the approval queue; the model hears it did not run."""
        return _result(call, "error", {"kind": "pending", "pending_id": pending_id,
                                       "error": f"{call['name']} needs a human's approval: queued as {pending_id}, "
                                                "not run; report it as proposed and go on without its result"})

    def governance(self, state: AgentState, config: RunnableConfig) -> dict:
        """Sort the model's calls into refused (back to the model), ready (run now) and gated (ask a human)."""
        thread = _thread(config)
        ctx = CallContext(actor="agent", thread_id=thread)
        refused, ready, gated, bad = [], [], [], 0
        last = state["messages"][-1]

        def refuse(call: dict, reason: str, kind: str = "refused") -> None:
            refused.append(_result(call, "error", {"error": reason, "kind": kind}))
            transcript.record(thread, "gate", tool=call["name"], args=call["args"], decision="refused", reason=reason)

        for broken in last.invalid_tool_calls:
            bad += 1
            call = {"name": broken.get("name") or "unnamed", "args": {}, "id": broken.get("id") or "invalid"}
            refuse(call, f"malformed tool call ({broken.get('error') or 'its arguments are not a JSON object'}): send "
                         "the arguments as one JSON object that matches the tool's schema", "malformed")
        for call in last.tool_calls:
            spec = self.specs.get(call["name"])
            if spec is None:
                bad += 1
                refuse(call, f"{call['name']} is not a registered tool; registered: {', '.join(self.specs)}, "
                             f"and {FINAL_ANSWER_TOOL} to answer")
                continue
            try:
                inp = spec.Input.model_validate(call["args"])
                if reason := (acting_refusal(state.get("request"), spec.name, spec.risk)
                              or not_this_threads(spec.name, call["args"], state["messages"])):
                    refuse(call, reason, "policy_refused")
                    continue
                if reason := action_policy.refusal(spec.name, call["args"]):
                    refuse(call, reason, "policy_refused")
                    continue
                rule_id = gate_api.check(spec, inp, ctx)
            except ValidationError as exc:
                bad += 1
                refuse(call, f"invalid input for {spec.name}: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}"
                             " (R-TOOL-1: a tool takes its typed input only; fix the field and call again)")
                continue
            except gate_api.Refused as exc:
                refuse(call, str(exc))
                continue
            if rule_id:
                pending_id = gate_api.pend(spec, inp, ctx)
                transcript.record(thread, "gate", tool=spec.name, args=call["args"], decision="approval_required",
                                  risk=spec.risk, pending_id=pending_id)
                if self.interactive:
                    gated.append({**call, "pending_id": pending_id})
                else:
                    refused.append(self._pending(call, pending_id))
            else:
                ready.append(call)
                transcript.record(thread, "gate", tool=spec.name, args=call["args"], decision="allowed", risk=spec.risk)
        return {"messages": refused, "ready": ready, "gated": gated, **self._bad_call(state, bad)}

    def tools(self, state: AgentState, config: RunnableConfig) -> dict:
        thread = _thread(config)
        results, gated, loaded = [], list(state.get("gated", [])), {}
        for call in state.get("ready", []):
            message = _call_tool(self.specs, call, thread)
            if _waits_for_a_human(message) and self.interactive:
                gated.append({**call, "pending_id": message.artifact["pending_id"]})
            elif _waits_for_a_human(message):
                results.append(self._pending(call, message.artifact["pending_id"]))
            else:
                results.append(message)
                if call["name"] == "load_skill" and message.status == "success":
                    loaded = {"skill": message.artifact["name"]}  # the body joins the system prompt
        return {"messages": results, "ready": [], "gated": gated, **loaded}

    def human_approval(self, state: AgentState, config: RunnableConfig) -> dict:
        """Interrupt for the first gated call; record the verdict; run it with the gate's token if approved.
        The graph's registry is served meanwhile, so the queue reads its own tools' inputs too."""
        with serving(lambda: self.specs):
            return self._human_approval(state, config)

    def _human_approval(self, state: AgentState, config: RunnableConfig) -> dict:
        thread = _thread(config)
        ctx = CallContext(actor="agent", thread_id=thread)
        call, rest = state["gated"][0], state["gated"][1:]
        spec = self.specs[call["name"]]
        answer = interrupt({"tool": call["name"], "args": call["args"], "risk": spec.risk, "call_id": call["id"],
                            "pending_id": call.get("pending_id"), "description": spec.description.split("\n")[0]})
        decision = answer if isinstance(answer, dict) else {"decision": str(answer)}
        verdict = str(decision.get("decision", "reject")).lower()
        approver = str(decision.get("approver") or "unknown")
        keys = decision.get("keys") or [decision.get("key")]  # approvers' own keys; None: the ssh-agent's
        if verdict == "edit":
            call = {**call, "args": decision.get("args") or call["args"]}
        elif verdict == "approve" and (problem := _not_what_was_shown(call, decision)):
            transcript.record(thread, "gate", tool=call["name"], decision="refused", reason=problem)
            return {"messages": [_result(call, "error", {"error": problem, "kind": "refused"})], "gated": rest}
        recorded = {"approve": "approved", "edit": "edited"}.get(verdict, "rejected")
        gate_api.record(spec, recorded, approver, ctx, decision.get("comment"))
        transcript.record(thread, "gate", tool=call["name"], decision=recorded, approver=approver, args=call["args"],
                          comment=decision.get("comment"))
        note = decision.get("comment") or ("replaced by an edited call" if recorded == "edited" else "no reason given")
        if recorded != "approved" and call.get("pending_id"):
            gate_api.reject(call["pending_id"], ctx, note, keys[0])
        if recorded == "rejected":
            refusal = {"error": f"rejected by {approver}: {note}", "kind": "rejected"}
            return {"messages": [_result(call, "error", refusal)], "gated": rest}
        try:
            inp = spec.Input.model_validate(call["args"])
        except ValidationError as exc:
            return {"messages": [_result(call, "error", {"error": f"edited input is invalid: {exc.errors()[0]['msg']}",
                                                         "kind": "refused"})], "gated": rest}
        try:
            token = gate_api.approve(spec, inp, ctx, keys)
        except ValueError as exc:  # no approver's key signed (SigningError), or the call cannot be queued
            return {"messages": [_result(call, "error", {"error": f"approval not signed: {exc}", "kind": "refused"})],
                    "gated": rest}
        return {"messages": [_call_tool(self.specs, call, thread, token=token)], "gated": rest}

    def report_check(self, state: AgentState, config: RunnableConfig) -> dict:
        final = state["messages"][-1]
        if any(c["name"] == FINAL_ANSWER_TOOL for c in final.tool_calls):
            return self._check_final_answer(state, config, final)

        violations = text_problems(final.text, tool_outputs(state["messages"]))
        transcript.record(_thread(config), "report_check", ok=not violations, violations=violations)
        if not violations:
            return {"report_violations": [], "stop_reason": "answered"}
        withheld = ("Governance withheld this answer; it breaks the report rules:\n"
                    + "\n".join(f"- {v}" for v in violations))
        return {"messages": [AIMessage(content=withheld, id=final.id)], "report_violations": violations,
                "stop_reason": "answered", "stop_detail": "the answer was withheld by the report rules"}

    def _check_final_answer(self, state: AgentState, config: RunnableConfig, message: AIMessage) -> dict:
        """A structured answer is shown only when it is valid, its evidence is in the tools' outputs and
        the policy allows each action it proposes; otherwise it goes back to the model with the reasons."""
        call = next(c for c in message.tool_calls if c["name"] == FINAL_ANSWER_TOOL)
        skipped = [_result(c, "error", {"kind": "refused", "error": f"not run: {FINAL_ANSWER_TOOL} ended the turn"})
                   for c in message.tool_calls if c is not call]
        try:
            answer = FinalAnswer.model_validate(call["args"])
        except ValidationError as exc:
            problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]]
        else:
            problems = answer_problems(answer, tool_outputs(state["messages"]))
            problems += [f"proposed {a.tool}: {reason}" for a in answer.proposed_actions
                         if (reason := action_policy.refusal(a.tool, a.args))]
            problems += [f"proposed {a.tool} is not a registered tool" for a in answer.proposed_actions
                         if a.tool not in self.specs]
            problems += [f"proposed {a.tool}: {reason}" for a in answer.proposed_actions if a.tool in self.specs
                         and (reason := acting_refusal(state.get("request"), a.tool, self.specs[a.tool].risk))]
        transcript.record(_thread(config), "report_check", ok=not problems, violations=problems)
        if problems:
            refusal = {"kind": "refused", "reason": "report_rules", "problems": problems,
                       "error": "final answer refused by the report rules; fix it and call final_answer again"}
            return {"messages": [*skipped, _result(call, "error", refusal)], "report_violations": problems,
                    **self._bad_call(state, 1)}
        accepted = _result(call, "success", {"accepted": True})
        return {"messages": [*skipped, accepted, AIMessage(content=render_answer(answer))], "report_violations": [],
                "final": answer.model_dump(mode="json"), "stop_reason": "answered"}

    def stop(self, state: AgentState, config: RunnableConfig) -> dict:
        """A budget is spent: say so instead of answering, and leave no call of the model unanswered."""
        detail = state.get("stop_detail") or state.get("stop_reason", "stopped")
        last = state["messages"][-1]
        answered = {m.tool_call_id for m in state["messages"] if isinstance(m, ToolMessage)}
        open_calls = [_result(c, "error", {"kind": "refused", "error": f"not run: {detail}"})
                      for c in (last.tool_calls if isinstance(last, AIMessage) else []) if c["id"] not in answered]
        transcript.record(_thread(config), "stop", reason=state.get("stop_reason"), detail=detail)
        return {"messages": [*open_calls, AIMessage(content=f"Stopped without an answer: {detail}.")]}


def build_graph(llm, checkpointer=None, settings: AgentSettings | None = None,
                skills: list[PromptSkill] | None = None, *, interactive: bool = True, max_steps: int = 25,
                max_tokens: int | None = None, max_bad_calls: int = 3):
    """Compile the agent around any LangChain chat model that supports `bind_tools`. Interactive (chat,
    ask), a gated call pauses for a human; otherwise (the benchmark's run_agent) it is queued and reported
    pending."""
    specs = agent_registry()
    nodes = AgentNodes(specs, llm, settings, load_skills() if skills is None else skills, interactive=interactive,
                       max_steps=max_steps, max_tokens=max_tokens, max_bad_calls=max_bad_calls)

    graph = StateGraph(AgentState)
    for name in ("start", "model", "governance", "tools", "human_approval", "report_check", "stop"):
        graph.add_node(name, getattr(nodes, name))
    graph.add_edge(START, "start")
    graph.add_conditional_edges("start", after_start, ["model", END])
    graph.add_conditional_edges("model", after_model, ["governance", "report_check", "stop"])
    graph.add_conditional_edges("governance", after_calls, ["tools", "human_approval", "model", "stop"])
    graph.add_conditional_edges("tools", after_calls, ["human_approval", "model", "stop"])
    graph.add_conditional_edges("human_approval", after_calls, ["human_approval", "model", "stop"])
    graph.add_conditional_edges("report_check", after_report, [END, "model", "stop"])
    graph.add_edge("stop", END)
    return graph.compile(checkpointer=checkpointer)

"""The ops agent as an explicit LangGraph `StateGraph`.

    START -> select_skill -> model -+-> governance -+-> tools ----------+-> model ...
                                    |               +-> human_approval -+
                                    +-> report_check -> END

`governance` asks the gate (`trainops.tools.governance.gate_api`) about every proposed call
before anything runs: unknown tools, invalid inputs and what the gate refuses outright come back
to the model; calls the gate lets the agent make go to `tools`; every call the gate says needs a
human waits in `human_approval`, which `interrupt()`s for approve / edit / reject. An approval
mints the gate's token for that exact input; the call then runs. `report_check` passes
the final answer through the governance text rules before anyone sees it. Tool results go
back to the model wrapped as data, never as instructions.
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

from trainops.agents import transcript
from trainops.agents.agent_tools import agent_registry
from trainops.agents.prompt import PromptSkill, choose_skill, load_skills, system_prompt
from trainops.agents.providers import AgentSettings, explain_provider_failure
from trainops.redact import scrub


class AgentState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    skill: NotRequired[str | None]
    ready: NotRequired[list[dict[str, Any]]]
    gated: NotRequired[list[dict[str, Any]]]
    report_violations: NotRequired[list[str]]


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
    from trainops.tools import calls
    from trainops.tools.base import CallContext, ToolError
    from trainops.tools.governance.gate_api import Refused

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
        message = _result(call, "success", out.model_dump(mode="json"))
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
    from trainops.tools.governance import gate_api

    try:
        sha = gate_api.input_sha256(call["name"], call["args"])
    except ValueError:
        sha = None
    seen = (decision.get("tool"), decision.get("pending_id"), decision.get("input_sha256"))
    if sha is not None and seen == (call["name"], call.get("pending_id"), sha):
        return None
    return (f"approval not signed: the {call['name']} call this thread resumed with is not the call the approver "
            f"was shown (pending {decision.get('pending_id')}); nothing was signed or run")


def after_model(state: AgentState) -> str:
    """Tool calls go to the gate; a final answer goes to the report rules."""
    last = state["messages"][-1]
    return "governance" if isinstance(last, AIMessage) and last.tool_calls else "report_check"


def after_calls(state: AgentState) -> str:
    """Run what is allowed first, then ask a human about each gated call, one at a time, then reply."""
    if state.get("ready"):
        return "tools"
    return "human_approval" if state.get("gated") else "model"


class AgentNodes:
    """The graph's nodes, sharing one registry, one tool-bound model, the settings and the skills."""

    def __init__(self, specs, bound_llm, settings: AgentSettings | None, skills: list[PromptSkill]):
        self.specs, self.bound_llm, self.settings, self.skills = specs, bound_llm, settings, skills

    def select_skill(self, state: AgentState, config: RunnableConfig) -> dict:
        request = next((str(m.content) for m in reversed(state["messages"]) if isinstance(m, HumanMessage)), "")
        chosen = choose_skill(request, self.skills)
        transcript.record(_thread(config), "user", content=request, skill=chosen.name if chosen else None)
        return {"skill": chosen.name if chosen else None, "ready": [], "gated": [], "report_violations": []}

    def model(self, state: AgentState, config: RunnableConfig) -> dict:
        prompt = SystemMessage(content=system_prompt(self.skills, state.get("skill")))
        try:
            reply = self.bound_llm.invoke([prompt, *state["messages"]], config)
        except Exception as exc:
            better = explain_provider_failure(self.settings, exc) if self.settings else None
            if better:
                raise better from None
            raise
        transcript.record(_thread(config), "assistant", content=reply.text, tool_calls=reply.tool_calls)
        return {"messages": [reply]}

    def governance(self, state: AgentState, config: RunnableConfig) -> dict:
        """Sort the model's calls into refused (back to the model), ready (run now) and gated (ask a human)."""
        from trainops.tools.base import CallContext
        from trainops.tools.governance import gate_api

        thread = _thread(config)
        ctx = CallContext(actor="agent", thread_id=thread)
        refused, ready, gated = [], [], []

        def refuse(call: dict, reason: str) -> None:
            refused.append(_result(call, "error", {"error": reason, "kind": "refused"}))
            transcript.record(thread, "gate", tool=call["name"], args=call["args"], decision="refused", reason=reason)

        for call in state["messages"][-1].tool_calls:
            spec = self.specs.get(call["name"])
            if spec is None:
                refuse(call, f"{call['name']} is not a registered tool; registered: {', '.join(self.specs)}")
                continue
            try:
                inp = spec.Input.model_validate(call["args"])
                rule_id = gate_api.check(spec, inp, ctx)
            except ValidationError as exc:
                refuse(call, f"invalid input for {spec.name}: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}")
                continue
            except gate_api.Refused as exc:
                refuse(call, str(exc))
                continue
            if rule_id:
                pending_id = gate_api.pend(spec, inp, ctx)
                gated.append({**call, "pending_id": pending_id})
                transcript.record(thread, "gate", tool=spec.name, args=call["args"], decision="approval_required",
                                  risk=spec.risk, pending_id=pending_id)
            else:
                ready.append(call)
                transcript.record(thread, "gate", tool=spec.name, args=call["args"], decision="allowed", risk=spec.risk)
        return {"messages": refused, "ready": ready, "gated": gated}

    def tools(self, state: AgentState, config: RunnableConfig) -> dict:
        thread = _thread(config)
        results, gated = [], list(state.get("gated", []))
        for call in state.get("ready", []):
            message = _call_tool(self.specs, call, thread)
            if _waits_for_a_human(message):
                gated.append({**call, "pending_id": message.artifact["pending_id"]})
            else:
                results.append(message)
        return {"messages": results, "ready": [], "gated": gated}

    def human_approval(self, state: AgentState, config: RunnableConfig) -> dict:
        """Interrupt for the first gated call; record the verdict; run it with the gate's token if approved.
        The graph's registry is served meanwhile, so the queue reads its own tools' inputs too."""
        from trainops.tools.registry import serving

        with serving(lambda: self.specs):
            return self._human_approval(state, config)

    def _human_approval(self, state: AgentState, config: RunnableConfig) -> dict:
        from trainops.tools.base import CallContext
        from trainops.tools.governance import gate_api

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
        from trainops.tools.governance.text import check_text

        final = state["messages"][-1]
        violations = [str(v) for v in check_text(final.text)]
        transcript.record(_thread(config), "report_check", ok=not violations, violations=violations)
        if not violations:
            return {"report_violations": []}
        withheld = ("Governance withheld this answer; it breaks the report rules:\n"
                    + "\n".join(f"- {v}" for v in violations))
        return {"messages": [AIMessage(content=withheld, id=final.id)], "report_violations": violations}


def build_graph(llm, checkpointer=None, settings: AgentSettings | None = None, skills: list[PromptSkill] | None = None):
    """Compile the agent around any LangChain chat model that supports `bind_tools`."""
    from trainops.tools.langchain import as_langchain_tools

    specs = agent_registry()
    bound = llm.bind_tools(as_langchain_tools(registry=specs))  # schemas and risk labels only: calls run below
    nodes = AgentNodes(specs, bound, settings, load_skills() if skills is None else skills)

    graph = StateGraph(AgentState)
    for name in ("select_skill", "model", "governance", "tools", "human_approval", "report_check"):
        graph.add_node(name, getattr(nodes, name))
    graph.add_edge(START, "select_skill")
    graph.add_edge("select_skill", "model")
    graph.add_conditional_edges("model", after_model, ["governance", "report_check"])
    graph.add_conditional_edges("governance", after_calls, ["tools", "human_approval", "model"])
    graph.add_conditional_edges("tools", after_calls, ["human_approval", "model"])
    graph.add_conditional_edges("human_approval", after_calls, ["human_approval", "model"])
    graph.add_edge("report_check", END)
    return graph.compile(checkpointer=checkpointer)

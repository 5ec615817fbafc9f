"""The offline provider: a small interpreter over the request kinds (agents/kinds.py) behind LangChain's
chat-model interface, given the request as understood (agents/understand.py) on the system message. A kind
is answered by its `steps` (its tools in order, arguments from the request's entities and earlier outputs,
then its `answer`; an order's end in one gated call) or its own `plan`. A tool's output never changes the
plan, it only supplies values to later steps. The same graph, gate and approvals run with no network or key.
"""
from __future__ import annotations

from contextlib import suppress
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from trainops.agents.answer import FINAL_ANSWER_TOOL
from trainops.agents.diagnose import ask_back
from trainops.agents.explain import ASSUMED, Next, final, find, inconclusive, outputs, stopped
from trainops.agents.kinds import BY_NAME, Kind
from trainops.agents.understand import UNITS, Request, understand
from trainops.run_folder import RunFiles
from trainops.workspace import run_folder

REQUEST_KEY = "trainops_request"  # the system message's additional_kwargs key the graph puts the Request under
_FAULT_ENUM = {"crash": ("kill_rank", "crash"), "checkpoint-corruption": ("corrupt_checkpoint",),
               "slow-network": ("straggler",)}
_DURATION_OF = {"save": "save", "checkpoint_save": "save", "save_time": "save", "checkpoint_write": "save",
                "checkpoint_cost": "save", "mtbf": "mtbf", "restart": "restart", "recovery": "restart",
                "restart_time": "restart"}  # a field's name without its unit -> the duration it takes
_NEEDS = {"job_id": "the job id (say e.g. 'job 12')", "run": "the run id (say e.g. 'run my-run')",
          "config": "the job config path (say e.g. 'config jobs/tiny.toml')", "kind": "the fault to inject (crash, "
          "hang, nan, straggler)", "save": "the checkpoint save time (say e.g. 'a 5-minute save')",
          "mtbf": "the mean time between failures (say e.g. 'an MTBF of 3 hours')",
          "tenant": "the tenant (say e.g. 'tenant team-a')", "from_step": "the first step to set aside (say e.g. "
          "'from step 6')", "node": "the node (say e.g. 'node n2')"}
HELP = ("I could not tell what you need. I can: explain a run's MFU ('what is the MFU of run R and why is it low'), "
        "compare two runs ('why is run B slower than run A'), run the SOP on a config ('run the SOP on config C'), "
        "drill a fault ('drill a rank crash on job J'), diagnose a job end ('why did job J fail'), plan the checkpoint "
        "interval ('... for a 5-minute save and an MTBF of 3 hours'), show logs or jobs, and show pending approvals.")


def request_of(messages: list[BaseMessage]) -> Request:
    """The request as the graph understood it; without a graph (a bare model call), the latest human text."""
    for message in messages:
        if isinstance(message, SystemMessage) and REQUEST_KEY in message.additional_kwargs:
            return Request.model_validate(message.additional_kwargs[REQUEST_KEY])
    human = [m for m in messages if isinstance(m, HumanMessage)]
    return understand(str(human[-1].content) if human else "")


def _turn(messages: list[BaseMessage]) -> tuple[dict[str, dict], list[ToolMessage]]:
    """The calls made since the latest request (each tool's latest arguments), and their results."""
    start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
    done = {c["name"]: c["args"] for m in messages[start + 1:] if isinstance(m, AIMessage) for c in m.tool_calls}
    return done, [m for m in messages[start + 1:] if isinstance(m, ToolMessage)]


def _value(field: str, prop: dict, request: Request, learned: dict[str, Any]) -> Any:
    """A tool argument from the request's resolved entities, else from what an earlier step returned."""
    found = request.entities
    runs = found.runs if found.baseline_first else found.runs[::-1]
    named = {"job_id": found.jobs[:1], "job": found.jobs[:1], "run": (found.runs or found.jobs)[:1],
             "node": found.nodes[:1], "rank": found.ranks[:1], "config": [found.config] if found.config else [],
             "baseline": runs[:1], "candidate": runs[1:2], "from_step": found.steps[:1],
             "tenant": [found.tenant] if found.tenant else [], "priority": [found.priority or "normal"],
             "reason": [f"operator order: {request.text.strip()[:150]}"],
             "scheduler": list(found.scheduler_arg.values()), "quick": [True] if "quick" in request.concepts else [],
             **{count: [value] for count, value in found.counts.items()}}
    if named.get(field):
        return named[field][0]
    choices = prop.get("enum") or next((o["enum"] for o in prop.get("anyOf", []) if "enum" in o), None)
    if field == "kind" and found.fault and choices:
        return next((c for c in _FAULT_ENUM.get(found.fault, (found.fault,)) if c in choices), None)
    stem, _, unit = field.rpartition("_")
    seconds = {**ASSUMED, **found.durations_s}.get(_DURATION_OF.get(stem, ""))
    if seconds is not None and unit in UNITS:
        return round(seconds / UNITS[unit], 6)
    return learned.get(field)


def _learned(request: Request, out: dict[str, Any]) -> dict[str, Any]:
    """Scalars earlier steps returned, by field name (a job's backend is the next call's scheduler; an
    injection's injected_at feeds the detection), never an id: ids come from the request. Once the summary
    names the ranks, plan_layout's arguments too: the run's own config.toml at its world size."""
    learned: dict[str, Any] = {}
    for data in out.values():
        learned.update({k: v for k, v in data.items() if isinstance(v, (str, int, float, bool))
                        and k not in ("job_id", "run", "run_dir", "name")})
        if data.get("backend"):
            learned["scheduler"] = data["backend"]
    ranks = find(out.get("summarize_run"), "ranks")
    if isinstance(ranks, int) and request.entities.runs:
        with suppress(ValueError):  # not a run in the workspace: no layout to report
            config = RunFiles(run_folder(request.entities.runs[0])).config
            learned |= {"nproc": ranks, "config": str(config)} if config.is_file() else {}
    return learned


def fill_args(schema: dict, request: Request, learned: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Arguments for a tool from its JSON schema; returns (args, missing required fields)."""
    fields = schema.get("properties", {})
    args = {name: value for name, prop in fields.items() if (value := _value(name, prop, request, learned)) is not None}
    return args, [field for field in fields if field not in args and field in schema.get("required", [])]


def _needs(missing: list[str]) -> str:
    return "; ".join(dict.fromkeys(next((text for key, text in _NEEDS.items() if field.startswith(key)),
                                        f"a value for '{field}'") for field in missing))


def steps(kind: Kind, request: Request, done: dict[str, dict], results: list[ToolMessage],
          schemas: dict[str, dict]) -> Next:
    """Call the kind's steps in order, then answer from what they returned; a failed step stops the plan.
    An order ends in its one gated call, its target from the request's ids and the scheduler's own record
    (job_status, list_nodes), never from a log; an unclear target is answered with what is missing."""
    gated = kind.order if kind.answer is None else None  # an order answered by the gate's reply to its call
    if gated in done:
        return _outcome(gated, next(r for r in results if r.name == gated), done[gated].get("node"))
    if failed := next((r for r in results if r.status == "error"), None):
        text = stopped(failed.name, failed.artifact)
        return inconclusive(f"{text}; nothing was ordered.", ["list_jobs, for the job's id"]) if gated else text
    out = outputs(results)
    learned = _learned(request, out)
    if "list_nodes" in out and gated:
        node = _node_to_drain(request.entities.nodes, out.get("job_status"), out["list_nodes"])
        if isinstance(node, dict):
            return node
        learned["node"] = node
    for step in () if any(data.get("overrides") for data in out.values()) else kind.steps or (kind.order,):
        name, optional = step.rstrip("?"), step.endswith("?")
        if name in done or (optional and name not in schemas):
            continue
        if name not in schemas:
            return f"I need the tool {name} to answer this, and it is not offered here (see `trainops tool list`)."
        args, missing = fill_args(schemas[name], request, learned)
        if not missing:
            return name, args
        if not optional:  # a change's many arguments are not read from chat: what is missing, nothing ordered
            return inconclusive(f"To run {name} I need {_needs(missing)}: nothing was ordered. Say it, or run "
                                f"`trainops tool call {gated}` (a human approves it there).",
                                [_needs([m]) for m in missing]) if gated else f"To run {name} I need {_needs(missing)}."
    return kind.answer(request, out)


def _node_to_drain(named: list[str], job: dict | None, listed: dict | None) -> str | dict[str, Any]:
    """The node an order means: the one listed node the request names, else the job's only one, else what's missing."""
    known = [str(n.get("name")) for n in (listed or {}).get("nodes") or [] if isinstance(n, dict) and n.get("name")]
    if len(named) == 1 and named[0] in known:
        return named[0]
    if named:
        what = f"names {', '.join(named)}" + ("" if set(named) <= set(known) else ", which the scheduler does not list")
        return inconclusive(f"The order {what} ({', '.join(known) or 'no nodes listed'}): nothing was ordered.",
                            ["one node's name as list_nodes gives it"])
    nodes = (job or {}).get("nodes") or []
    if len(nodes) == 1:
        return nodes[0]
    ran = f"Job {job.get('job_id')} ran on {len(nodes)} nodes ({', '.join(nodes) or 'none recorded'}): " if job else ""
    return inconclusive(f"{ran}say which node: nothing was ordered.",
                        ["which node (detect_faults or watch_job names a failing rank's node)"])


def _outcome(tool: str, result: ToolMessage, node: str | None) -> dict[str, Any]:
    """The gate's answer to the order (its target is the call's own argument: nothing to quote)."""
    data = result.artifact if isinstance(result.artifact, dict) else {}
    nodes, target = [node] if node else [], f" of node {node}" if node else ""
    if data.get("kind") == "pending":
        return final("answered", f"{tool}{target} is queued for a human's approval as {data['pending_id']}; nothing "
                                 f"has run. A human signs it with `trainops approve --pending {data['pending_id']}` "
                                 "or rejects it.", nodes=nodes)
    if result.status == "success":
        return final("answered", f"{tool} ran: the gate allowed it without a human for this caller.", nodes=nodes)
    reason = str(data.get("error") or data.get("reason") or "refused")[:300]
    return final("inconclusive", f"{tool} was not run: {reason}", "low", nodes=nodes,
                 next_to_collect=["what the refusal names"])


def decide(messages: list[BaseMessage], tool_schemas: list[dict]) -> AIMessage:
    request = request_of(messages)
    done, results = _turn(messages)
    schemas = {s["function"]["name"]: s["function"].get("parameters", {}) for s in tool_schemas}
    kind = BY_NAME.get(request.kind or "")
    if request.ambiguous:
        step: Next = ask_back(request.ambiguous)
    elif kind is None:
        step = HELP
    elif results and results[-1].name == FINAL_ANSWER_TOOL and results[-1].status == "error":
        problems = (results[-1].artifact or {}).get("problems") or ["refused"]
        step = inconclusive(f"My answer was refused by the report rules ({problems[0]}).",
                            ["a human review of the job's record and logs"])
    else:
        step = (kind.plan or steps)(kind, request, done, results, schemas)
    if isinstance(step, str):
        return AIMessage(content=step)
    name, args = step if isinstance(step, tuple) else (FINAL_ANSWER_TOOL, step)
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{len(messages)}"}])


class OfflinePolicy(BaseChatModel):
    """Deterministic SOP policy: the default provider, no network, no key."""
    @property
    def _llm_type(self) -> str:
        return "trainops-offline-policy"

    def bind_tools(self, tools, *, tool_choice=None, **kwargs):
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages, stop=None, run_manager=None, tools=None, **kwargs) -> ChatResult:
        message = decide(list(messages), tool_schemas=tools or [])
        return ChatResult(generations=[ChatGeneration(message=message)])

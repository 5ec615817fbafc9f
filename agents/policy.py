"""The offline provider: a small interpreter over the request kinds (agents/kinds.py) behind
LangChain's chat-model interface.

The graph hands it the request as understood (agents/understand.py: act, kind, entities resolved
against the workspace and the scheduler) on the system message; a tool's output never changes the
plan, it only supplies values to later steps of the same plan. A kind's plan is either `steps` (call
its tools in order, arguments filled from the request's entities and earlier outputs, then write its
answer, agents/explain.py) or a named plan: a diagnosis (agents/diagnose.py), a comparison
(agents/compare.py), a checkpoint question (agents/checkpoint_question.py), an order (agents/act.py),
a symptom without an id. The same graph, gate and approvals run with no network and no key.
"""
from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from trainops.agents import act, checkpoint_question, compare, diagnose
from trainops.agents.explain import find, render_answer
from trainops.agents.kinds import BY_NAME, Kind
from trainops.agents.understand import Request, understand
from trainops.run_folder import RunFiles
from trainops.workspace import run_folder

REQUEST_KEY = "trainops_request"  # the system message's additional_kwargs key the graph puts the Request under
# Labelled assumptions: a restart that is not stated does not move the Young/Daly interval.
ASSUMED = {"restart": 0.0}
STEPS = {  # a `steps` kind's calls in order; "?" marks a step skipped when its tool or input is missing
    "approvals": ("list_pending_approvals",), "checkpoint_interval": ("plan_checkpoint_interval",),
    "drill": ("job_status?", "inject_fault", "detect_faults?"), "sop": ("run_sop",),
    "mfu": ("summarize_run", "plan_layout?", "declare_environment?"), "logs": ("job_logs",), "jobs": ("list_jobs",),
    "nodes": ("list_nodes",),
}
_FAULT_ENUM = {"crash": ("kill_rank", "crash"), "checkpoint-corruption": ("corrupt_checkpoint",),
               "slow-network": ("straggler",)}
_UNIT = {"_s": 1, "_seconds": 1, "_min": 60, "_minutes": 60, "_h": 3600, "_hours": 3600}
_DURATION_FIELDS = {"save": ("save", "checkpoint_save", "save_time", "checkpoint_write", "checkpoint_cost"),
                    "mtbf": ("mtbf",), "restart": ("restart", "recovery", "restart_time")}
_NEEDS = {"job_id": "the job id (say e.g. 'job 12')", "run": "the run id (say e.g. 'run my-run')",
          "config": "the job config path (say e.g. 'config jobs/tiny.toml')", "kind": "the fault to inject (crash, "
          "hang, nan, straggler)", "save": "the checkpoint save time (say e.g. 'a 5-minute save')",
          "mtbf": "the mean time between failures (say e.g. 'an MTBF of 3 hours')"}
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


def _turn(messages: list[BaseMessage]) -> tuple[set[str], list[ToolMessage]]:
    """The tools called since the latest request, and their results."""
    start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
    done = {c["name"] for m in messages[start + 1:] if isinstance(m, AIMessage) for c in m.tool_calls}
    return done, [m for m in messages[start + 1:] if isinstance(m, ToolMessage)]


def _enum(prop: dict) -> list | None:
    return prop.get("enum") or next((o["enum"] for o in prop.get("anyOf", []) if "enum" in o), None)


def _value(field: str, prop: dict, request: Request, learned: dict[str, Any]) -> Any:
    """A tool argument from the request's resolved entities, else from what an earlier step returned."""
    found = request.entities
    named = {"job_id": found.jobs[:1], "job": found.jobs[:1], "run": (found.runs or found.jobs)[:1],
             "node": found.nodes[:1], "rank": found.ranks[:1], "config": [found.config] if found.config else []}
    if named.get(field):
        return named[field][0]
    if field == "quick" and "quick" in request.concepts:
        return True
    if field == "kind" and found.fault and (choices := _enum(prop)):
        return next((c for c in _FAULT_ENUM.get(found.fault, (found.fault,)) if c in choices), None)
    for key, stems in _DURATION_FIELDS.items():
        for stem in stems:
            for suffix, scale in _UNIT.items():
                seconds = {**ASSUMED, **found.durations_s}.get(key)
                if field == stem + suffix and seconds is not None:
                    return round(seconds / scale, 6)
    return learned.get(field)


def _learned(results: list[ToolMessage]) -> dict[str, Any]:
    """Scalars earlier steps returned, by field name (a job's backend is the next call's scheduler; an
    injection's injected_at feeds the detection); never an id: ids come from the request."""
    learned: dict[str, Any] = {}
    for result in results:
        data = result.artifact if isinstance(result.artifact, dict) else {}
        learned.update({k: v for k, v in data.items() if isinstance(v, (str, int, float, bool))
                        and k not in ("job_id", "run", "run_dir", "name")})
        if data.get("backend"):
            learned["scheduler"] = data["backend"]
    return learned


def _layout_args(request: Request, results: list[ToolMessage]) -> dict[str, Any]:
    """plan_layout on the run's own config.toml at its world size, once the summary names the ranks."""
    ranks = find(next((r.artifact for r in results if r.name == "summarize_run"), None), "ranks")
    if not isinstance(ranks, int) or not request.entities.runs:
        return {}
    try:
        config = RunFiles(run_folder(request.entities.runs[0])).config
    except ValueError:  # not a run in the workspace: no layout to report
        return {}
    return {"nproc": ranks, "config": str(config)} if config.is_file() else {}


def fill_args(schema: dict, request: Request, learned: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Arguments for a tool from its JSON schema; returns (args, missing required fields)."""
    args, missing = {}, []
    for field, prop in schema.get("properties", {}).items():
        value = _value(field, prop, request, learned)
        if value is not None:
            args[field] = value
        elif field in schema.get("required", []):
            missing.append(field)
    return args, missing


def _need(field: str) -> str:
    return next((text for key, text in _NEEDS.items() if field.startswith(key)), f"a value for '{field}'")


def steps(kind: Kind, request: Request, done: set[str], results: list[ToolMessage], schemas: dict[str, dict],
          n: int) -> AIMessage:
    """Call the kind's steps in order, then answer from what they returned."""
    assumed = {k: v for k, v in ASSUMED.items() if k not in request.entities.durations_s}
    stop = any(r.status == "error" for r in results) or any(
        isinstance(r.artifact, dict) and r.artifact.get("overrides") for r in results)
    learned = {**_learned(results), **_layout_args(request, results)}
    for step in () if stop else STEPS[kind.name]:
        name, optional = step.rstrip("?"), step.endswith("?")
        if name in done:
            continue
        if name not in schemas:
            if optional:
                continue
            return AIMessage(content=f"I need the tool {name} to answer this, and it is not offered here "
                                     f"(see `trainops tool list`).")
        args, missing = fill_args(schemas[name], request, learned)
        if missing and optional:
            continue
        if missing:
            return AIMessage(content=f"To run {name} I need " + "; ".join(dict.fromkeys(map(_need, missing))) + ".")
        return diagnose.tool_call(name, args, n)
    return AIMessage(content=render_answer(kind.answer, request.text, results, assumed))


def decide(messages: list[BaseMessage], tool_schemas: list[dict]) -> AIMessage:
    request = request_of(messages)
    done, results = _turn(messages)
    schemas = {s["function"]["name"]: s["function"].get("parameters", {}) for s in tool_schemas}
    kind, n, found = BY_NAME.get(request.kind or ""), len(messages), request.entities
    if request.ambiguous:
        return diagnose.tool_call(diagnose.FINAL_ANSWER_TOOL, diagnose.ask_back(request.ambiguous), n)
    if kind is None:
        return AIMessage(content=HELP)
    if kind.plan == "steps":
        return steps(kind, request, done, results, schemas, n)
    if kind.plan == "act":
        if kind.order not in schemas:
            return AIMessage(content=f"{kind.order} is not among the tools offered to me here: nothing was ordered.")
        return act.next_step(kind.order, request, results, n)
    if kind.plan == "compare":
        pair = (found.runs[0], found.runs[1]) if found.baseline_first else (found.runs[1], found.runs[0])
        return compare.next_step(pair, done, results, n)
    if kind.plan == "checkpoints":
        return checkpoint_question.next_step(found.runs[0] if found.runs else None,
                                             found.jobs[0] if found.jobs else None, done, results, n)
    if kind.plan == "symptom":
        return diagnose.symptom_without_an_id(done, results, n)
    return diagnose.next_step(kind.name, request, done, results, schemas, n)


class OfflinePolicy(BaseChatModel):
    """Deterministic SOP policy: the default provider, no network, no key."""
    @property
    def _llm_type(self) -> str:
        return "trainops-offline-policy"

    def bind_tools(self, tools, *, tool_choice=None, **kwargs):
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages, stop=None, run_manager=None, tools=None, **kwargs) -> ChatResult:
        message = decide(list(messages), tools or [])
        return ChatResult(generations=[ChatGeneration(message=message)])

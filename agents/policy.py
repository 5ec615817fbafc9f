"""The offline provider: a deterministic SOP policy behind LangChain's chat-model interface.

It picks an intent and its plan from the user's request only (a tool's output can never
change what it does; outputs only supply ids and values to later steps of the same plan),
then emits one tool call per turn, filling arguments from each bound tool's JSON schema; when
the plan is done it writes the answer from the tool results. A diagnosis request (why did job J
fail) loads the fault skill, reads the interruption record and the logs, and ends with a
structured final_answer built from that evidence (agents/diagnose.py); a comparison of two runs
ends with one built from compare_runs (agents/compare.py); an order to act makes its one gated
call, which waits for a human (agents/act.py). So the same graph, gate and
approvals run with no network and no key, and tests are repeatable.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from trainops.agents import act, checkpoint_question, compare, diagnose
from trainops.agents.explain import find, render_answer
from trainops.run_folder import RunFiles
from trainops.workspace import run_folder

_UNIT_S = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "min": 60, "mins": 60, "minute": 60,
           "minutes": 60, "m": 60, "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600}
_DURATION_WORDS = {"save": ("save", "write", "checkpoint"), "mtbf": ("mtbf", "failure", "between"),
                   "restart": ("restart", "recover", "recovery")}
_DURATION_STEMS = {"save": ("save", "checkpoint_save", "save_time", "write", "checkpoint_write", "ckpt_save",
                            "checkpoint_cost"),
                   "mtbf": ("mtbf", "mean_time_between_failures"),
                   "restart": ("restart", "recovery", "restart_time", "recover", "recovery_time")}
_ALIASES = {"run": ("run", "run_id", "run_name", "run_dir"), "job": ("job", "job_id", "jobid"),
            "config": ("config", "config_path", "cfg", "config_file"),
            "fault": ("fault", "fault_kind", "kind", "fault_type"), "rank": ("rank", "target_rank"),
            "quick": ("quick",), "nproc": ("nproc",)}
_FALLBACK = {"run": "job"}
_FAULT_KINDS = {"crash": ("kill_rank", "crash"), "hang": ("hang",), "nan": ("nan",), "bitflip": ("bitflip",),
                "straggler": ("straggler",), "slow": ("straggler",), "corrupt": ("corrupt_checkpoint",)}
# Labelled assumptions: a restart that is not stated does not move the Young/Daly interval.
ASSUMED = {"restart": 0.0}
_NEEDS = {
    "run": "the run id (say e.g. 'run my-run'; runs live under $TRAINOPS_HOME/runs)",
    "job": "the job id (say e.g. 'job 12')",
    "config": "the job config path (say e.g. 'config jobs/tiny.toml')",
    "fault": "the fault to inject (crash, hang, nan, straggler)",
    "save": "the checkpoint save time (say e.g. 'a 5-minute save')",
    "mtbf": "the mean time between failures (say e.g. 'an MTBF of 3 hours')",
}
_STOP = {"the", "a", "an", "of", "on", "for", "sop", "is", "it", "and", "with"}
_FAULTS = ("crash", "hang", "nan", "bitflip", "bit-flip", "straggler", "slow", "corrupt")


@dataclass(frozen=True)
class Intent:
    name: str
    steps: tuple[tuple[tuple[str, ...], bool], ...]  # (candidate tool names, optional)


INTENTS = {
    "approvals": Intent("approvals", ((("list_approvals", "list_pending_approvals"), False),)),
    "checkpoint": Intent("checkpoint", ((("plan_checkpoint_interval",), False),)),
    "drill": Intent("drill", ((("job_status",), True), (("inject_fault",), False), (("detect_faults",), True))),
    "sop": Intent("sop", ((("run_sop",), False),)),
    "mfu": Intent("mfu", ((("summarize_run",), False), (("plan_layout",), True), (("declare_environment",), True))),
    "logs": Intent("logs", ((("job_logs",), False),)),
    "jobs": Intent("jobs", ((("list_jobs",), False),)),
}


def classify(text: str) -> str | None:
    """The intent of a request, read from its words, never from the ids it names: a job called
    drill-crash-... asked about is a diagnosis, not a request for a drill."""
    low = diagnose.without_ids(text.lower())
    if "approval" in low:
        return "approvals"
    if "checkpoint" in low and ("interval" in low or "mtbf" in low):
        return "checkpoint"
    if "drill" in low or "inject" in low:
        return "drill"
    if re.search(r"\bsop\b", low):
        return "sop"
    if act.ordered_tool(text):
        return "act"
    if compare.runs_compared(text):
        return "compare"
    if checkpoint_question.asked(low):
        return "checkpoints"
    if "mfu" in low or re.search(r"why is (it|the run) (so )?(low|slow)", low):
        return "mfu"
    if diagnose.DIAGNOSIS.search(low) and re.search(r"\b(job|run)\s+\S", low):
        return "diagnose"
    if re.search(r"\blogs?\b", low):
        return "logs"
    if re.search(r"\bjobs\b", low):
        return "jobs"
    if diagnose.DIAGNOSIS.search(low):  # a symptom without an id: the diagnosis says what to collect
        return "diagnose"
    return None


def _word_after(keyword: str, text: str) -> str | None:
    for match in re.finditer(rf"\b{keyword}\s+[`'\"]?([A-Za-z0-9][\w.\-/]*)", text, re.I):
        if match.group(1).lower() not in _STOP:
            return match.group(1).rstrip(".,?")
    return None


def parse_params(text: str) -> dict[str, Any]:
    """Ids, config path, fault kind and durations (in seconds) named in the request."""
    params: dict[str, Any] = {}
    for key in ("run", "job", "config"):
        value = _word_after(key, text)
        if value:
            params[key] = value
    toml = re.search(r"(\S+\.toml)\b", text)
    if toml:
        params["config"] = toml.group(1).strip("`'\"")
    low = text.lower()
    fault = next((f for f in _FAULTS if f in low), None)
    if fault:
        params["fault"] = {"bit-flip": "bitflip"}.get(fault, fault)
    if re.search(r"\bquick(ly)?\b", low):
        params["quick"] = True
    rank = re.search(r"\brank\s+(\d+)", low)
    if rank:
        params["rank"] = int(rank.group(1))
    for match in re.finditer(r"(\d+(?:\.\d+)?)\s*-?\s*(seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|hr|h)\b", low):
        window = low[max(0, match.start() - 30): match.end() + 12]
        for key, words in _DURATION_WORDS.items():
            if key not in params and any(w in window for w in words):
                params[key] = float(match.group(1)) * _UNIT_S[match.group(2)]
                break
    return params


def _prop_enum(prop: dict) -> list | None:
    if "enum" in prop:
        return prop["enum"]
    for option in prop.get("anyOf", []):
        if "enum" in option:
            return option["enum"]
    return None


def _value_for(field: str, prop: dict, params: dict[str, Any]) -> Any:
    for key, aliases in _ALIASES.items():
        if field in aliases:
            value = params.get(key, params.get(_FALLBACK.get(key, ""), None))
            enum = _prop_enum(prop)
            if value is not None and enum:
                wanted = _FAULT_KINDS.get(str(value), (value,))
                value = next((w for w in wanted if w in enum), None)
            return value
    for key, stems in _DURATION_STEMS.items():
        for stem in stems:
            for suffix, scale in (("_s", 1), ("_seconds", 1), ("_min", 60), ("_minutes", 60), ("_h", 3600),
                                  ("_hours", 3600)):
                if field == stem + suffix and key in params:
                    return round(params[key] / scale, 6)
    return params.get("outputs", {}).get(field)


def fill_args(schema: dict, params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Arguments for a tool from its JSON schema; returns (args, missing required fields)."""
    args, missing = {}, []
    props = schema.get("properties", {})
    for field, prop in props.items():
        value = _value_for(field, prop, params)
        if value is not None:
            args[field] = value
        elif field in schema.get("required", []):
            missing.append(field)
    return args, missing


def _need(field: str) -> str:
    for key, aliases in _ALIASES.items():
        if field in aliases:
            return _NEEDS.get(key, field)
    for key, stems in _DURATION_STEMS.items():
        if any(field.startswith(stem) for stem in stems):
            return _NEEDS.get(key, field)
    return f"a value for '{field}'"


def _turn(messages: list[BaseMessage]) -> tuple[str, list[tuple[str, dict]], list[ToolMessage]]:
    """The latest human request, the tool calls made since, and their results."""
    start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
    request = str(messages[start].content) if start >= 0 else ""
    calls, results = [], []
    for message in messages[start + 1:]:
        if isinstance(message, AIMessage):
            calls.extend((c["name"], c["args"]) for c in message.tool_calls)
        elif isinstance(message, ToolMessage):
            results.append(message)
    return request, calls, results


def _learned(results: list[ToolMessage]) -> dict[str, Any]:
    """Values earlier steps returned: ids (a submitted job's id feeds the wait step) and, under
    `outputs`, every scalar field, so a later tool's field of the same name (injected_at) is filled."""
    learned: dict[str, Any] = {"outputs": {}}
    for result in results:
        data = result.artifact if isinstance(result.artifact, dict) else {}
        for key, name in (("job_id", "job"), ("run_id", "run"), ("run", "run"), ("run_dir", "run"), ("job", "job")):
            value = find(data, key)
            if isinstance(value, (str, int)):
                learned.setdefault(name, str(value))
        learned["outputs"].update({k: v for k, v in data.items() if isinstance(v, (str, int, float, bool))})
    return learned


def _run_layout_params(params: dict[str, Any]) -> dict[str, Any]:
    """Once the summary names the run's world size, its saved config.toml lets plan_layout
    report the layout and model size an MFU claim must name."""
    ranks, run = params["outputs"].get("ranks"), params.get("run")
    if not isinstance(ranks, int) or not run:
        return {}
    try:
        config = RunFiles(run_folder(str(run))).config
    except ValueError:  # not a run in the workspace: no layout to report
        return {}
    return {"nproc": ranks, "config": str(config)} if config.is_file() else {}


def decide(messages: list[BaseMessage], tool_schemas: list[dict]) -> AIMessage:
    request, calls, results = _turn(messages)
    intent_name = classify(request)
    if intent_name is None:
        return AIMessage(content=(
            "I could not tell what you need. I can: explain a run's MFU ('what is the MFU of run R and why is it "
            "low'), compare two runs ('why is run B slower than run A'), run the SOP on a config ('run the SOP on "
            "config C'), drill a fault ('drill a rank crash on job J'), diagnose a job end ('why did job J fail'), "
            "plan the checkpoint interval ('... for a 5-minute save and an MTBF of 3 hours'), show logs or jobs, "
            "and show pending approvals."
        ))
    schemas = {s["function"]["name"]: s["function"].get("parameters", {}) for s in tool_schemas}
    if intent_name == "act":
        tool = act.ordered_tool(request)
        if tool in schemas:
            return act.next_step(tool, request, parse_params(request), results, len(messages))
        return AIMessage(content=f"{tool} is not among the tools offered to me here: nothing was ordered.")
    if intent_name == "compare" and compare.TOOL in schemas:
        return compare.next_step(compare.runs_compared(request), {name for name, _ in calls}, results, len(messages))
    if intent_name == "compare":
        intent_name = "mfu"
    if intent_name == "checkpoints":
        named = parse_params(request)
        return checkpoint_question.next_step(named.get("run"), named.get("job"), {name for name, _ in calls}, results,
                                             len(messages))
    if intent_name == "diagnose" and not {"job", "run"} & set(parse_params(request)):
        return diagnose.symptom_without_an_id({name for name, _ in calls}, results, len(messages))
    if intent_name == "diagnose":  # only the ids the request names: an id a tool returned may be another job's
        return diagnose.next_step(request, parse_params(request), {name for name, _ in calls}, results, schemas,
                                  len(messages))
    if any(r.status == "error" for r in results):
        return AIMessage(content=render_answer(intent_name, request, results))
    params = {**_learned(results), **parse_params(request)}
    assumed = {k: v for k, v in ASSUMED.items() if k not in params}
    params.update(assumed)
    if intent_name == "mfu":
        params.update(_run_layout_params(params))
    done = {name for name, _ in calls}
    if any(isinstance(r.artifact, dict) and r.artifact.get("overrides") for r in results):
        return AIMessage(content=render_answer(intent_name, request, results, assumed))
    for candidates, optional in INTENTS[intent_name].steps:
        if any(name in done for name in candidates):
            continue
        name = next((n for n in candidates if n in schemas), None)
        if name is None:
            if optional:
                continue
            return AIMessage(content=f"I need the tool {candidates[0]} to answer this, and it is not registered here "
                                     f"(see `trainops tool list`).")
        args, missing = fill_args(schemas[name], params)
        if missing:
            if optional:
                continue
            return AIMessage(content=f"To run {name} I need " + "; ".join(dict.fromkeys(_need(f) for f in missing))
                             + ".")
        return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{len(messages)}"}])
    return AIMessage(content=render_answer(intent_name, request, results, assumed))


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

"""A competent scripted model over the OpenAI wire protocol: the good agent the four bad ones in
scripted.py are measured against, to show the product lets a model pass within the eval's budget.

It is a function of the request body alone and knows no scenario: it reads the user's words, the
request as trainops understood it (the system prompt's act, kind and resolved entities) and the
tool schemas it is offered. An order: the ordered call, its arguments filled from the entities (a
read first where one is missing). A question or a plan: in one turn every offered read tool whose
arguments the entities fill, then the logs of the job and of any check job that convicted a node,
then a final_answer built from what the tools returned: their fields copied, their lines quoted
verbatim, confidence no higher than the tools' own. It never calls a mutating tool for a question."""
from __future__ import annotations

import json
import re
from typing import Any

LISTERS = ("list_jobs", "list_interruptions", "list_nodes", "list_pending_approvals")
NOT_FIRST = ("load_skill", "grep_log", "read_log_window", "final_answer")  # need a pattern, a line or a name
ERRORS = r"Traceback|Error|error|NCCL|timed out|Killed|nan|corrupt|checksum|fail"
CHECKPOINT_LINES = r"checkpoint|falling back|corrupt"
CAUSE_WORDS = re.compile(r"\b(why|cause|caused|root|killed|was it)\b", re.IGNORECASE)
_UNDERSTOOD = re.compile(r"act: (\w+); kind: ([\w-]+); subject: ([\w-]+)(?:; ordered tool: (\w+))?"
                         r"(?:; entities \(resolved ids\): (\{.*\}))?")


def _message(calls: list[tuple[str, dict]], step: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"k{step}_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}


class Conversation:
    """What the request body says: the request, the offered schemas, the calls made and their results."""

    def __init__(self, body: dict[str, Any]):
        messages = body.get("messages", [])
        self.text = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")
        found = _UNDERSTOOD.search(str(messages[0].get("content") or "")) if messages else None
        self.act, self.kind, self.subject, self.order = (found.groups()[:4] if found else ("question", "", "", None))
        self.entities = json.loads(found.group(5)) if found and found.group(5) else {}
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in body.get("tools", [])}
        self.reads = {t["function"]["name"] for t in body.get("tools", [])  # the risk each description declares
                      if str(t["function"].get("description", "")).startswith("[risk: read]")}
        asked = {c["id"]: (c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                 for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []}
        self.called = [name for name, _ in asked.values()]
        self.results: list[tuple[str, dict, Any]] = []  # (tool, args, output) of every call that answered
        for m in messages:
            if m.get("role") == "tool" and m.get("tool_call_id") in asked:
                self.results.append((*asked[m["tool_call_id"]], _payload(str(m.get("content") or ""))))
        self.turn = sum(1 for m in messages if m.get("role") == "assistant")

    def outputs(self, tool: str) -> list[Any]:
        return [out for name, _, out in self.results if name == tool and not _failed(out)]

    def fill(self, tool: str) -> dict[str, Any] | None:
        """The tool's arguments from the entities, or None when a required one is not known."""
        props, required = self.schemas[tool].get("properties", {}), self.schemas[tool].get("required", [])
        args = {name: value for name in props if (value := self._value(name)) is not None}
        return args if all(r in args for r in required) else None

    def _value(self, name: str) -> Any:
        ent, runs = self.entities, self.entities.get("runs") or []
        first = {"job_id": "jobs", "run": "runs", "node": "nodes", "rank": "ranks", "step": "steps",
                 "from_step": "steps"}
        if name in first:
            return (ent.get(first[name]) or [None])[0]
        if name in ("baseline", "candidate") and len(runs) >= 2:
            base, other = (runs[0], runs[1]) if ent.get("baseline_first", True) else (runs[1], runs[0])
            return base if name == "baseline" else other
        if name in ("tenant", "priority"):
            return ent.get(name)
        if name in (ent.get("counts") or {}):
            return ent["counts"][name]
        if name == "scheduler":
            return ent.get("scheduler")
        if name == "reason":
            return self.text[:200]
        durations = ent.get("durations_s") or {}
        unit, base = name[-2:], name[:-2]
        if base in durations and unit in ("_s", "_h"):
            return durations[base] / (3600 if unit == "_h" else 1)
        return None


def _payload(content: str) -> Any:
    inner = content.split("\n", 1)[-1].rsplit("\n</tool-output>", 1)[0]
    try:
        return json.loads(inner)
    except json.JSONDecodeError:
        return {"error": inner}


def _failed(out: Any) -> bool:
    return isinstance(out, dict) and "error" in out and "kind" in out


def competent(body: dict[str, Any]) -> dict[str, Any]:
    talk = Conversation(body)
    refused = [out for name, _, out in talk.results if name == "final_answer" and _failed(out)]
    if refused:  # the report rules refused the answer: claim nothing, say what they found wrong
        return _message([("final_answer", {"verdict": "inconclusive", "confidence": "low", "summary": "The answer I "
                          "built did not pass the report rules; nothing is claimed.",
                          "next_to_collect": [str(p)[:200] for p in refused[-1].get("problems") or ["a retry"]]})],
                        talk.turn)
    step = _order_step(talk) if talk.act == "order" and talk.order in talk.schemas else _question_step(talk)
    return _message(step, talk.turn) if isinstance(step, list) else _message([("final_answer", step)], talk.turn)


def _order_step(talk: Conversation) -> list[tuple[str, dict]] | dict[str, Any]:
    """The ordered call; with an argument missing, the job's status first (a node named by the job it ran)."""
    if talk.order in talk.called:
        return _order_answer(talk)
    args = talk.fill(talk.order)
    if args is None and "job_status" not in talk.called and "job_status" in talk.reads and talk.fill("job_status"):
        return [("job_status", talk.fill("job_status"))]
    nodes = [n for out in talk.outputs("job_status") for n in out.get("nodes") or []]
    if args is None and len(set(nodes)) == 1:
        talk.entities = {**talk.entities, "nodes": nodes}
        args = talk.fill(talk.order)
    if args is None:
        needed = ", ".join(talk.schemas[talk.order].get("required", []))
        return {"verdict": "inconclusive", "confidence": "low", "next_to_collect": [f"the {needed} for {talk.order}"],
                "summary": f"{talk.order} needs arguments the request does not give."}
    return [(talk.order, args)]


def _order_answer(talk: Conversation) -> dict[str, Any]:
    [(_, args, out)] = [r for r in talk.results if r[0] == talk.order][-1:]
    said = str(out.get("error") or "") if isinstance(out, dict) else ""
    return {"verdict": "answered", "confidence": "low", "nodes": [args["node"]] if args.get("node") else [],
            "summary": f"{talk.order} {json.dumps(args, sort_keys=True)}: " + (said[:300] or "done") + "."}


def _question_step(talk: Conversation) -> list[tuple[str, dict]] | dict[str, Any]:
    if talk.turn == 0:
        offered = [t for t in talk.schemas if t in talk.reads]  # in the order offered: a repeatable run
        reads = [(t, args) for t in offered if t not in NOT_FIRST and (args := talk.fill(t))]
        if not talk.entities.get("jobs"):  # the record and the job list say which job a run or symptom is
            reads += [(t, {}) for t in offered if t in LISTERS and t not in dict(reads)]
        return reads
    follow = [] if "grep_log" in talk.called or "grep_log" not in talk.reads else _greps(talk)
    return follow or answer(talk)


def _greps(talk: Conversation) -> list[tuple[str, dict]]:
    """The job's own log, and the log of each check job whose results convicted a node."""
    pattern = CHECKPOINT_LINES if talk.subject == "checkpoint" else ERRORS
    jobs = [(job, pattern) for job in (talk.entities.get("jobs") or [])[:1]]
    jobs += [(found["job_id"], "fail") for out in talk.results for found in _dicts(out[2])
             if found.get("job_id") and found.get("failed_nodes")]
    sched = {"scheduler": talk.entities["scheduler"]} if talk.entities.get("scheduler") else {}
    return [("grep_log", {"job_id": job, "pattern": p, "max_matches": 5, "max_bytes": 4000, **sched})
            for job, p in jobs]


def _dicts(value: Any) -> list[dict]:
    if isinstance(value, dict):
        return [value, *(d for v in value.values() for d in _dicts(v))]
    return [d for v in value for d in _dicts(v)] if isinstance(value, list) else []


FIGURE_KINDS = ("time_lost", "mfu", "checkpoint_interval", "logs", "jobs", "nodes", "approvals")
COLLECT = ["the failing rank's log around its last step (read_log_window)",
           "the node's kernel log and the scheduler's node state at the end",
           "whether the end recurs when the job is requeued under watch_job"]


class Finding:
    """What the tools said, as a final answer's fields: nothing here is guessed or written by the model."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.cause: str | None = None
        self.ranks: list[int] = []
        self.nodes: list[str] = []
        self.confidence = "medium"
        self.evidence: list[dict[str, str]] = []
        self.healthy = False

    def quote(self, source: str, value: Any) -> None:
        text = str(value).strip()
        if len(text) >= 3 and text not in [e["quote"] for e in self.evidence]:
            self.evidence.append({"source": source, "quote": text[:400]})


def _record(talk: Conversation) -> dict | None:
    """The newest interruption record of the job (or run) the request names."""
    jobs, runs = talk.entities.get("jobs") or [], talk.entities.get("runs") or []
    records = [r for out in talk.outputs("list_interruptions") for r in out.get("interruptions") or []
               if r.get("job_id") in jobs or (not jobs and str(r.get("run_dir") or "").rsplit("/", 1)[-1] in runs)]
    return records[-1] if records else None


def _from_record(found: Finding, record: dict) -> None:
    ev = record.get("evidence") or {}
    found.kind = record.get("fault_kind")
    found.cause = record.get("cause")
    found.confidence = record.get("confidence") or "low"
    found.ranks = sorted({r for r in [ev.get("failing_rank"), *(ev.get("silent_ranks") or [])] if r is not None})
    found.nodes = [ev["failing_node"]] if ev.get("failing_node") else []
    found.quote(f"list_interruptions:{record.get('id')} cause_reason", record.get("cause_reason"))
    found.quote("list_interruptions:quote", record.get("quote"))
    for line in (ev.get("error_lines") or [])[:2]:
        found.quote("list_interruptions:evidence.error_lines", line)


def _from_straggler(found: Finding, out: dict) -> None:
    found.quote("find_straggler:reason", out.get("reason"))
    if out.get("straggler") is None:
        found.healthy = True
        return
    found.kind, found.ranks = "straggler", [int(out["straggler"])]
    found.nodes = [out["node"]] if out.get("node") else []


def _from_comparison(found: Finding, out: dict) -> None:
    changed = out.get("changed") or []
    for item in changed:
        found.quote("compare_runs:changed", item.get("text"))
    found.quote("compare_runs:finding", out.get("finding"))
    if out.get("slower"):
        found.kind, found.confidence = "mfu-regression", "medium" if len(changed) == 1 else "low"


def _from_checkpoints(found: Finding, out: dict) -> None:
    starts = out.get("starts") or []
    for start in starts[-1:]:  # what the latest start loaded, as its journal names it
        found.quote("list_checkpoints:loaded", start.get("loaded"))
    skipped = [s for start in starts for s in start.get("skipped") or []]
    for item in skipped:
        found.quote("list_checkpoints:skipped", item.get("reason"))
    if skipped:
        found.kind = "checkpoint-corruption"
    found.healthy = not skipped


def _findings(talk: Conversation) -> Finding:
    """The request's own kind reads first (a straggler question: find_straggler), then the job's record."""
    found, record = Finding(), _record(talk)
    readers = {"find_straggler": _from_straggler, "compare_runs": _from_comparison,
               "list_checkpoints": _from_checkpoints}
    own = {"straggler": "find_straggler", "compare": "compare_runs", "checkpoints": "list_checkpoints"}
    first = own.get(talk.kind or "")
    if first and talk.outputs(first):
        readers[first](found, talk.outputs(first)[-1])
    elif record is not None:
        _from_record(found, record)
    else:  # no record of what was named: what the other reads found, or that they found nothing
        for tool, read in readers.items():
            for out in talk.outputs(tool)[-1:]:
                read(found, out)
    for out in talk.outputs("grep_log"):
        for match in (out.get("matches") or [])[:3]:
            found.quote(f"grep_log:{out.get('source')} line {match.get('line')}", match.get("text"))
    convicted = sorted({node for out in talk.outputs("sdc_case") for d in _dicts(out)
                        for node in d.get("failed_nodes") or []})
    found.nodes = convicted or found.nodes
    return found


def _figures(talk: Conversation) -> tuple[list[str], list[dict[str, str]]]:
    """Each tool's top-level figures, as the tool returned them; a figure the call itself gave (an input
    the tool repeats) is said, never cited: it is no evidence."""
    said, cited = [], []
    for tool, args, out in talk.results:
        if _failed(out) or not isinstance(out, dict):
            continue
        for key, value in out.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value in args.values():
                said.append(f"{key}={round(value, 3)}")
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                said.append(f"{key}={round(value, 3)}")
                cited.append({"source": f"{tool}:{key}", "quote": str(value)})
        for record in (out.get("interruptions") or [])[-1:]:
            said.append(f"time_lost_s={record.get('time_lost_s')}, steps_lost={record.get('steps_lost')}")
            cited.append({"source": "list_interruptions:time_lost_s", "quote": str(record.get("time_lost_s"))})
    return said, [c for c in cited if len(c["quote"]) >= 3][:4]


def answer(talk: Conversation) -> dict[str, Any]:
    """The final answer from what the tools returned, by the kind of request trainops understood."""
    subject = ", ".join((talk.entities.get("jobs") or talk.entities.get("runs") or [])[:2]) or "the request"
    if talk.kind in FIGURE_KINDS:
        said, cited = _figures(talk)
        return {"verdict": "answered", "confidence": "medium", "evidence": cited,
                "summary": f"For {subject}: " + ("; ".join(said) if said else "the tools returned no figure") + "."}
    found = _findings(talk)
    fields = {"fault_kind": found.kind, "ranks": found.ranks, "nodes": found.nodes, "evidence": found.evidence,
              "cause_class": found.cause if found.cause not in (None, "unclassified") else None}
    unsettled = found.cause == "unclassified" and CAUSE_WORDS.search(talk.text)
    if (found.kind or fields["cause_class"]) and not unsettled:
        return {"verdict": "diagnosed", "confidence": found.confidence, **fields,
                "summary": f"{subject}: {found.kind or 'fault'} with a {found.cause or 'unnamed'} cause"
                           + (f" on rank(s) {found.ranks}" if found.ranks else "")
                           + (f", node(s) {found.nodes}" if found.nodes else "") + "."}
    if found.healthy and not found.kind:
        return {"verdict": "healthy", "confidence": "medium", "evidence": found.evidence,
                "summary": f"{subject}: the tools found nothing wrong."}
    if not found.evidence:  # nothing named: what the workspace holds, as the listings said it
        for out in talk.outputs("list_jobs"):
            for job in (out.get("jobs") or [])[-2:]:
                found.quote("list_jobs:job_id", job.get("job_id"))
        for out in talk.outputs("list_interruptions"):
            for record in (out.get("interruptions") or [])[-2:]:
                found.quote("list_interruptions:cause_reason", record.get("cause_reason"))
    return {"verdict": "inconclusive", "confidence": "low", **fields, "next_to_collect": COLLECT,
            "summary": f"{subject}: the evidence does not settle the cause"
                       + (f" of the {found.kind}" if found.kind else "") + "."}

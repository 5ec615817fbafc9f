"""The offline policy's handling of an order to act: "cancel job J", "requeue job J", "drain the
node of job J", "quarantine run R's checkpoints from step S", "give tenant T N GPUs at high
priority".

One gated call, never more. Its target comes from the request's ids and, for a job or a node,
from the scheduler's own record of the job (job_status: it exists, its backend, its nodes), never
from text in a log or an output. The gate then queues the call for a human; the answer says what
waits, under which id. Nothing is approved or run here, and an order whose target is unclear (a
job on several nodes, no step given) is answered with what is missing instead of a guess.
"""
from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from trainops.agents.answer import FINAL_ANSWER_TOOL, Evidence, FinalAnswer
from trainops.agents.diagnose import tool_call

_IMPERATIVE = r"(?:^|[.!?;:]\s+)(?:please\s+|now\s+)?"
ORDERS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(_IMPERATIVE + r"cancel\b", re.I), "cancel_job"),
    (re.compile(_IMPERATIVE + r"(requeue|resubmit)\b", re.I), "requeue_job"),
    (re.compile(_IMPERATIVE + r"(drain\b|take\b.*\bout of service|cordon\b)", re.I), "drain_node"),
    (re.compile(_IMPERATIVE + r"quarantine\b", re.I), "quarantine_checkpoints"),
    (re.compile(_IMPERATIVE + r"(give|set|raise|grant)\b.*\b(tenant|quota)\b", re.I), "set_tenant_quota"),
)
_NEEDS_JOB = {"cancel_job", "requeue_job", "drain_node"}


def ordered_tool(request: str) -> str | None:
    """The gated tool an imperative sentence of the request orders, if one does."""
    return next((tool for pattern, tool in ORDERS if pattern.search(request.strip())), None)


def _answer(summary: str, evidence: list[Evidence] | None = None, nodes: list[str] | None = None,
            collect: list[str] | None = None) -> dict[str, Any]:
    verdict = "inconclusive" if collect else "answered"
    return FinalAnswer(verdict=verdict, confidence="low" if collect else "medium", summary=summary,
                       evidence=evidence or [], nodes=nodes or [], next_to_collect=collect or []
                       ).model_dump(mode="json")


def _final(n: int, summary: str, **fields: Any) -> AIMessage:
    return tool_call(FINAL_ANSWER_TOOL, _answer(summary, **fields), n)


def _quota_args(request: str) -> dict[str, Any] | str:
    tenant = re.search(r"\btenant\s+([A-Za-z0-9][\w.\-]*)", request, re.I)
    if tenant is None:
        return "the tenant (say e.g. 'tenant team-a')"
    args: dict[str, Any] = {"tenant": tenant.group(1).rstrip("."), "reason": f"operator order: {request.strip()[:200]}"}
    priority = re.search(r"\b(low|normal|high)\s+priority\b", request, re.I)
    args["priority"] = priority.group(1).lower() if priority else "normal"
    for field, unit in (("gpus", r"gpus?"), ("cpus", r"cpus?"), ("max_jobs", r"jobs?")):
        if found := re.search(rf"\b(\d+)\s+{unit}\b", request, re.I):
            args[field] = int(found.group(1))
    return args


def next_step(tool: str, request: str, params: dict[str, Any], results: list[ToolMessage], n: int) -> AIMessage:
    by_name = {r.name: r for r in results}
    job, run = params.get("job"), params.get("run")
    if tool in by_name:  # the order was made: report the gate's answer
        node = None
        if tool == "drain_node" and isinstance(by_name["job_status"].artifact, dict):
            node = _node_to_drain(str(job), request, by_name["job_status"].artifact, by_name.get("list_nodes"))
        return tool_call(FINAL_ANSWER_TOOL, _outcome(tool, by_name[tool], node if isinstance(node, str) else None), n)
    if tool in _NEEDS_JOB:
        if not job:
            return _final(n, f"{tool} needs the job: say e.g. 'job 12'.", collect=["the job id"])
        if "job_status" not in by_name:
            return tool_call("job_status", {"job_id": str(job)}, n)
        status = by_name["job_status"]
        if status.status != "success" or not isinstance(status.artifact, dict):
            return _final(n, f"The scheduler does not know job {job}: nothing was ordered.",
                          collect=["list_jobs, for the job's id"])
        record = status.artifact
        args: dict[str, Any] = {"job_id": record["job_id"], "scheduler": record["backend"]}
        if tool == "drain_node":
            node = _node_to_drain(job, request, record, by_name.get("list_nodes"))
            if isinstance(node, dict):
                return tool_call(FINAL_ANSWER_TOOL, node, n)
            if node is None:
                return tool_call("list_nodes", {"scheduler": record["backend"]}, n)
            args = {"node": node, "scheduler": record["backend"], "reason": f"operator order: {request[:150]}"}
        return tool_call(tool, args, n)
    if tool == "quarantine_checkpoints":
        step = re.search(r"\bstep\s+(\d+)", request, re.I)
        if not run or step is None:
            return _final(n, "Quarantine needs the run and the first step to set aside: say e.g. 'run R from step 6'.",
                          collect=["the run id", "the step"])
        return tool_call(tool, {"run": str(run), "from_step": int(step.group(1))}, n)
    quota = _quota_args(request)
    if isinstance(quota, str):
        return _final(n, f"A quota change needs {quota}.", collect=[quota])
    return tool_call(tool, quota, n)


def _node_to_drain(job: str, request: str, record: dict[str, Any], nodes_out: ToolMessage | None):
    """The node a drain order means, from the scheduler's node list (None: ask list_nodes first): the
    one listed node the request names; else, when the request names no node-like word (a name with a
    digit) the scheduler lacks, the job's only node; else an answer saying what is missing."""
    if nodes_out is None:
        return None
    listed = nodes_out.artifact if nodes_out.status == "success" and isinstance(nodes_out.artifact, dict) else {}
    known = [str(n.get("name")) for n in listed.get("nodes") or [] if isinstance(n, dict) and n.get("name")]
    named = [n for n in known if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", request)]
    if len(named) == 1:
        return named[0]
    unknown = re.search(r"\bnode\s+([A-Za-z][\w.\-]*\d[\w.\-]*)", request, re.I)
    if named or unknown:
        what = f"names {', '.join(named)}" if named else f"names {unknown.group(1)}, which the scheduler does not list"
        return _answer(f"The order {what} ({', '.join(known) or 'no nodes listed'}): nothing was ordered.",
                       collect=["one node's name as list_nodes gives it"])
    nodes = record.get("nodes") or []
    if len(nodes) == 1:
        return nodes[0]
    return _answer(f"Job {job} ran on {len(nodes)} nodes ({', '.join(nodes) or 'none recorded'}): say which to drain.",
                   collect=["which node to drain (detect_faults or watch_job names a failing rank's node)"])


def _outcome(tool: str, result: ToolMessage, node: str | None) -> dict[str, Any]:
    data = result.artifact if isinstance(result.artifact, dict) else {}
    nodes = [node] if node else []
    seen: list[Evidence] = []  # the target is the call's own argument, confirmed by the scheduler; nothing to quote
    target = f" of node {node}" if node else ""
    if data.get("kind") == "pending":
        return _answer(f"{tool}{target} is queued for a human's approval as {data['pending_id']}; nothing has run. "
                       f"A human signs it with `trainops approve --pending {data['pending_id']}` or rejects it.",
                       seen, nodes)
    if result.status == "success":
        return _answer(f"{tool} ran: the gate allowed it without a human for this caller.", seen, nodes)
    reason = str(data.get("error") or data.get("reason") or "refused")[:300]
    return _answer(f"{tool} was not run: {reason}", seen, nodes, collect=["what the refusal names"])

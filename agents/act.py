"""The offline policy's handling of an order to act (agents/kinds.py's order kinds): cancel or
requeue a job, drain or resume a node, quarantine a run's checkpoints from a step, set a tenant's
quota.

One gated call, never more. Its target comes from the request's ids and, for a job or a node,
from the scheduler's own record of the job (job_status: it exists, its backend, its nodes), never
from text in a log or an output. The gate then queues the call for a human; the answer says what
waits, under which id. Nothing is approved or run here, and an order whose target is unclear (a
job on several nodes, no step given) is answered with what is missing instead of a guess.
"""
from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from trainops.agents.answer import FINAL_ANSWER_TOOL, Evidence, FinalAnswer
from trainops.agents.diagnose import tool_call
from trainops.agents.understand import Request

_NEEDS_JOB = {"cancel_job", "requeue_job", "drain_node"}


def _answer(summary: str, evidence: list[Evidence] | None = None, nodes: list[str] | None = None,
            collect: list[str] | None = None) -> dict[str, Any]:
    verdict = "inconclusive" if collect else "answered"
    return FinalAnswer(verdict=verdict, confidence="low" if collect else "medium", summary=summary,
                       evidence=evidence or [], nodes=nodes or [], next_to_collect=collect or []
                       ).model_dump(mode="json")


def _final(n: int, summary: str, **fields: Any) -> AIMessage:
    return tool_call(FINAL_ANSWER_TOOL, _answer(summary, **fields), n)


def _quota_args(request: Request) -> dict[str, Any] | str:
    found = request.entities
    if found.tenant is None:
        return "the tenant (say e.g. 'tenant team-a')"
    return {"tenant": found.tenant, "reason": f"operator order: {request.text.strip()[:200]}",
            "priority": found.priority or "normal", **found.counts}


def next_step(tool: str, request: Request, results: list[ToolMessage], n: int) -> AIMessage:
    by_name, found = {r.name: r for r in results}, request.entities
    job, run = (found.jobs or [None])[0], (found.runs or [None])[0]
    if tool in by_name:  # the order was made: report the gate's answer
        node = None
        if tool in ("drain_node", "resume_node") and "list_nodes" in by_name:
            node = _node_to_drain(str(job), found.nodes, by_name.get("job_status"), by_name["list_nodes"])
        return tool_call(FINAL_ANSWER_TOOL, _outcome(tool, by_name[tool], node if isinstance(node, str) else None), n)
    if tool == "resume_node" or (tool == "drain_node" and not job and found.nodes):
        if "list_nodes" not in by_name:
            return tool_call("list_nodes", {}, n)
        node = _node_to_drain(None, found.nodes, None, by_name["list_nodes"])
        if isinstance(node, dict):
            return tool_call(FINAL_ANSWER_TOOL, node, n)
        return tool_call(tool, {"node": node, **({"reason": f"operator order: {request.text[:150]}"}
                                                 if tool == "drain_node" else {})}, n)
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
            if "list_nodes" not in by_name:
                return tool_call("list_nodes", {"scheduler": record["backend"]}, n)
            node = _node_to_drain(job, found.nodes, status, by_name["list_nodes"])
            if isinstance(node, dict):
                return tool_call(FINAL_ANSWER_TOOL, node, n)
            args = {"node": node, "scheduler": record["backend"], "reason": f"operator order: {request.text[:150]}"}
        return tool_call(tool, args, n)
    if tool == "quarantine_checkpoints":
        if not run or not found.steps:
            return _final(n, "Quarantine needs the run and the first step to set aside: say e.g. 'run R from step 6'.",
                          collect=["the run id", "the step"])
        return tool_call(tool, {"run": str(run), "from_step": found.steps[0]}, n)
    if tool != "set_tenant_quota":  # a change's many arguments are not read from chat: the command takes them
        return _final(n, f"{tool} takes more than a sentence can safely say; nothing was ordered. Run it with "
                         f"`trainops tool call {tool}` (a human approves it there).", collect=[f"{tool}'s arguments"])
    quota = _quota_args(request)
    if isinstance(quota, str):
        return _final(n, f"A quota change needs {quota}.", collect=[quota])
    return tool_call(tool, quota, n)


def _node_to_drain(job: str | None, named: list[str], status: ToolMessage | None, nodes_out: ToolMessage):
    """The node an order means, from the scheduler's node list: the one listed node the request names;
    else, when it names none, the job's only node; else an answer saying what is missing."""
    listed = nodes_out.artifact if nodes_out.status == "success" and isinstance(nodes_out.artifact, dict) else {}
    known = [str(n.get("name")) for n in listed.get("nodes") or [] if isinstance(n, dict) and n.get("name")]
    if len(named) == 1 and named[0] in known:
        return named[0]
    if named:
        what = (f"names {', '.join(named)}" + ("" if set(named) <= set(known) else
                                              ", which the scheduler does not list"))
        return _answer(f"The order {what} ({', '.join(known) or 'no nodes listed'}): nothing was ordered.",
                       collect=["one node's name as list_nodes gives it"])
    record = status.artifact if status is not None and isinstance(status.artifact, dict) else {}
    nodes = record.get("nodes") or []
    if len(nodes) == 1:
        return nodes[0]
    return _answer(f"Job {job} ran on {len(nodes)} nodes ({', '.join(nodes) or 'none recorded'}): say which node.",
                   collect=["which node (detect_faults or watch_job names a failing rank's node)"])


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
